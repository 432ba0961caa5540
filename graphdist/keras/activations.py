"""Activation functions of ``gd.keras`` layers (``activation="relu"`` and friends).

Each one works on traced tensors and eagerly on numpy arrays (through
``gd.nn`` and numpy), so a layer's forward pass runs both ways.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphdist.errors import InvalidArgumentError
from graphdist.trace import nn

__all__ = ["get", "serialize", "linear", "relu", "sigmoid", "tanh", "softmax", "gelu"]

Activation = Callable[[Any], Any]


def linear(x: Any) -> Any:
    """The identity."""
    return x


def relu(x: Any) -> Any:
    """``max(x, 0)``."""
    return nn.relu(x)


def sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))``."""
    return nn.sigmoid(x)


def tanh(x: Any) -> Any:
    """Hyperbolic tangent."""
    return nn.tanh(x)


def softmax(x: Any) -> Any:
    """Softmax over the last axis."""
    return nn.softmax(x, axis=-1)


def gelu(x: Any) -> Any:
    """Gaussian error linear unit (exact form)."""
    return nn.gelu(x)


_BY_NAME: dict[str, Activation] = {"linear": linear, "relu": relu, "sigmoid": sigmoid, "tanh": tanh,
                                   "softmax": softmax, "gelu": gelu}


def get(identifier: str | Activation | None, what: str = "activation") -> Activation:
    """The activation named ``identifier`` (``None``: linear), or the callable itself.

    Raises:
        InvalidArgumentError: An unknown name or a non-callable value.
    """
    if identifier is None:
        return linear
    if isinstance(identifier, str):
        function = _BY_NAME.get(identifier.lower())
        if function is None:
            raise InvalidArgumentError(f"{what}: unknown activation {identifier!r}; use one of {sorted(_BY_NAME)} "
                                       "or a function of one tensor")
        return function
    if callable(identifier):
        return identifier
    raise InvalidArgumentError(f"{what}: expected an activation name or function, got {type(identifier).__name__}")


def serialize(function: Activation) -> str:
    """The name of a built-in activation (for saved model configs).

    Raises:
        InvalidArgumentError: ``function`` is not one of the named activations.
    """
    for name, candidate in _BY_NAME.items():
        if candidate is function:
            return name
    raise InvalidArgumentError(f"activation {getattr(function, '__name__', function)!r} is a custom function; only "
                               f"the named activations {sorted(_BY_NAME)} can be saved in a model config")

