"""Weight initialisers of ``gd.keras`` layers, drawn from one seedable generator.

Keras draws initial weights at random; here every draw comes from one
``numpy.random.Generator`` owned by this module, so
:func:`graphdist.keras.utils.set_random_seed` makes a model's initial weights
(and ``fit``'s shuffling order) reproducible: two models built after the same
seed are identical, whatever strategy they are built under.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError

__all__ = ["Initializer", "get", "set_seed", "generator", "glorot_uniform", "he_normal", "zeros", "ones",
           "random_uniform"]

_state: dict[str, np.random.Generator] = {"rng": np.random.default_rng()}

Initializer = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def set_seed(seed: int) -> None:
    """Restarts the generator of initial weights from ``seed``."""
    _state["rng"] = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    """The module's generator (shared by every initialiser)."""
    return _state["rng"]


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) < 1:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


def glorot_uniform(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Uniform in ``[-l, l]``, ``l = sqrt(6 / (fan_in + fan_out))`` (Keras' default kernel initialiser)."""
    fan_in, fan_out = _fans(shape)
    limit = math.sqrt(6.0 / max(fan_in + fan_out, 1))
    return generator().uniform(-limit, limit, size=shape).astype(dtype)


def he_normal(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Normal with standard deviation ``sqrt(2 / fan_in)`` (for layers followed by ReLU)."""
    fan_in, _ = _fans(shape)
    return (generator().standard_normal(shape) * math.sqrt(2.0 / max(fan_in, 1))).astype(dtype)


def random_uniform(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Uniform in ``[-0.05, 0.05]`` (Keras' default for embeddings)."""
    return generator().uniform(-0.05, 0.05, size=shape).astype(dtype)


def zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """All zeros."""
    return np.zeros(shape, dtype)


def ones(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """All ones."""
    return np.ones(shape, dtype)


_BY_NAME: dict[str, Initializer] = {"glorot_uniform": glorot_uniform, "he_normal": he_normal, "zeros": zeros,
                                    "ones": ones, "random_uniform": random_uniform}


def get(identifier: str | Initializer, what: str) -> tuple[str, Initializer]:
    """``(name, function)`` of an initialiser given by name or as a callable ``f(shape, dtype)``.

    Raises:
        InvalidArgumentError: Unknown name or not callable.
    """
    if isinstance(identifier, str):
        function = _BY_NAME.get(identifier)
        if function is None:
            raise InvalidArgumentError(f"{what}: unknown initializer {identifier!r}; use one of {sorted(_BY_NAME)} "
                                       "or a callable f(shape, dtype) -> array")
        return identifier, function
    if callable(identifier):
        return getattr(identifier, "__name__", "custom"), identifier
    raise InvalidArgumentError(f"{what}: an initializer must be a name or a callable, got {type(identifier).__name__}")
