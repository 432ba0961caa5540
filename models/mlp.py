"""A multi-layer perceptron written as plain numpy code (forward pass only).

:class:`MLP` holds its weights as numpy arrays (He initialisation) and its
:meth:`MLP.forward` is ordinary numpy: ``x @ W + b`` per layer, ReLU between
layers, logits out. The same method runs eagerly on arrays and is traced by
graphdist (``gd.trace``, ``gd.function``, ``strategy.run``), where the weights
become graph constants::

    import graphdist as gd
    from models.mlp import MLP

    model = MLP(sizes=(784, 512, 512, 10))
    (x,) = model.example_inputs(batch=256)
    logits = gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(x,))

The module-level :func:`forward` and :func:`example_inputs` use a small
default model (sizes ``DEFAULT_SIZES``) so tools can inspect it quickly::

    graphdist inspect models.mlp:forward

:meth:`MLP.reference_forward` is an independent plain-numpy implementation
used to check traced results.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_SIZES", "MLP", "default_model", "example_inputs", "forward", "reference_forward"]

logger = logging.getLogger(__name__)

#: Layer sizes of the module-level default model (input, hidden..., classes).
DEFAULT_SIZES: tuple[int, ...] = (64, 32, 10)


class MLP:
    """A fully connected network: ReLU hidden layers, linear logits.

    Args:
        sizes: Layer widths, input first and number of outputs last; at least
            two entries (one layer).
        seed: Seed of the weight initialisation.
        dtype: Floating-point dtype of the weights (and of example inputs).

    Attributes:
        sizes: The layer widths.
        dtype: The weights' dtype.
        weights: One ``(fan_in, fan_out)`` matrix per layer, He-initialised
            (normal with standard deviation ``sqrt(2 / fan_in)``).
        biases: One zero vector of length ``fan_out`` per layer.

    Raises:
        ValueError: ``sizes`` has fewer than two entries or a non-positive
            width, or ``dtype`` is not a floating-point type.
    """

    def __init__(self, sizes: Sequence[int] = (784, 512, 512, 10), seed: int = 0,
                 dtype: Any = np.float32) -> None:
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) < 2:
            raise ValueError(f"MLP sizes needs at least an input and an output width, got {sizes}")
        if any(s <= 0 for s in sizes):
            raise ValueError(f"MLP sizes must all be positive, got {sizes}")
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise ValueError(f"MLP dtype must be a floating-point type such as np.float32, got {dtype}")
        self.sizes = sizes
        self.dtype = dtype
        rng = np.random.default_rng(seed)
        self.weights: list[np.ndarray] = []
        self.biases: list[np.ndarray] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            scale = np.sqrt(2.0 / fan_in)
            self.weights.append((rng.standard_normal((fan_in, fan_out)) * scale).astype(dtype))
            self.biases.append(np.zeros(fan_out, dtype=dtype))
        logger.debug("built MLP %s (%d parameters)", sizes, self.num_parameters)

    @property
    def num_parameters(self) -> int:
        """Total number of weights and biases."""
        return sum(w.size + b.size for w, b in zip(self.weights, self.biases))

    def forward(self, x: Any) -> Any:
        """Computes the logits of a batch.

        Plain numpy operations only, so the method runs on arrays and is
        traced by graphdist on traced tensors.

        Args:
            x: Inputs of shape ``(batch, sizes[0])``.

        Returns:
            Logits of shape ``(batch, sizes[-1])``.

        Raises:
            ValueError: The last dimension of ``x`` is not ``sizes[0]``.
        """
        self._check_input(x)
        h = x
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if i < last:
                h = np.maximum(h, 0)
        return h

    def reference_forward(self, x: np.ndarray) -> np.ndarray:
        """The same function as :meth:`forward`, written independently in
        eager numpy (``np.dot``, ``np.where``), to check traced results.

        Args:
            x: Input array of shape ``(batch, sizes[0])``.

        Returns:
            Logits as a numpy array of the model's dtype.
        """
        x = np.asarray(x, dtype=self.dtype)
        self._check_input(x)
        h = x
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = np.dot(h, w) + b
            if i + 1 < len(self.weights):
                h = np.where(h > 0, h, np.zeros((), self.dtype))
        return h

    def example_inputs(self, batch: int = 256, seed: int = 0) -> tuple[np.ndarray]:
        """A random batch for :meth:`forward`.

        Args:
            batch: Number of rows.
            seed: Seed of the generator.

        Returns:
            A one-element tuple: standard-normal inputs of shape
            ``(batch, sizes[0])`` in the model's dtype.
        """
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        rng = np.random.default_rng(seed)
        return (rng.standard_normal((batch, self.sizes[0])).astype(self.dtype),)

    def _check_input(self, x: Any) -> None:
        shape = tuple(x.shape)
        if len(shape) != 2 or shape[-1] != self.sizes[0]:
            raise ValueError(
                f"MLP{self.sizes} expects inputs of shape (batch, {self.sizes[0]}), got {shape}; "
                f"reshape the batch to (batch, {self.sizes[0]})"
            )

    def __repr__(self) -> str:
        return f"MLP(sizes={self.sizes}, dtype={self.dtype.name})"


_default: MLP | None = None


def default_model() -> MLP:
    """The module's default model: ``MLP(DEFAULT_SIZES, seed=0)`` (built once)."""
    global _default
    if _default is None:
        _default = MLP(DEFAULT_SIZES, seed=0)
    return _default


def forward(x: Any) -> Any:
    """:meth:`MLP.forward` of :func:`default_model` (inputs ``(batch, 64)``)."""
    return default_model().forward(x)


def reference_forward(x: np.ndarray) -> np.ndarray:
    """:meth:`MLP.reference_forward` of :func:`default_model`."""
    return default_model().reference_forward(x)


def example_inputs(batch: int = 8, seed: int = 0) -> tuple[np.ndarray]:
    """Example inputs for :func:`forward`: a ``(batch, 64)`` float32 batch."""
    return default_model().example_inputs(batch=batch, seed=seed)
