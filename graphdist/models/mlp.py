"""A multi-layer perceptron written as plain numpy code.

:class:`MLP` holds its weights as numpy arrays (He initialisation), or as
``gd.Variable``s with ``trainable=True`` (then it also has a loss and a
replica training step), and its
:meth:`MLP.forward` is ordinary numpy: ``x @ W + b`` per layer, ReLU between
layers, logits out. The same method runs eagerly on arrays and is traced by
graphdist (``gd.trace``, ``gd.function``, ``strategy.run``), where the weights
become graph constants::

    import graphdist as gd
    from graphdist.models.mlp import MLP

    model = MLP(sizes=(784, 512, 512, 10))
    (x,) = model.example_inputs(batch=256)
    logits = gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(x,))

The module-level :func:`forward` and :func:`example_inputs` use a small
default model (sizes ``DEFAULT_SIZES``) so tools can inspect it quickly::

    graphdist inspect graphdist.models.mlp:forward

:meth:`MLP.reference_forward` is an independent plain-numpy implementation
used to check traced results.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_SIZES", "MLP", "default_model", "example_inputs", "forward", "reference_forward"]

import graphdist as gd  # noqa: E402 - after __all__ for readability of the public names
from graphdist.models.common import distributed_step  # noqa: E402

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
        trainable: Hold the parameters as ``gd.Variable``s (created through
            the current strategy, named ``mlp/dense_<i>/kernel`` and ``.../bias``)
            so :meth:`make_train_step` can update them.

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
                 dtype: Any = np.float32, trainable: bool = False) -> None:
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
        self.trainable = trainable
        self.weights: list[Any] = []
        self.biases: list[Any] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            scale = np.sqrt(2.0 / fan_in)
            kernel = (rng.standard_normal((fan_in, fan_out)) * scale).astype(dtype)
            bias = np.zeros(fan_out, dtype=dtype)
            if trainable:
                kernel = gd.Variable(kernel, name=f"mlp/dense_{i}/kernel")
                bias = gd.Variable(bias, name=f"mlp/dense_{i}/bias")
            self.weights.append(kernel)
            self.biases.append(bias)
        logger.debug("built MLP %s (%d parameters)", sizes, self.num_parameters)

    @property
    def num_parameters(self) -> int:
        """Total number of weights and biases."""
        return sum(int(np.prod(w.shape)) + int(np.prod(b.shape)) for w, b in zip(self.weights, self.biases))

    @property
    def trainable_variables(self) -> list[Any]:
        """The parameters, kernel then bias per layer (``gd.Variable``s when trainable)."""
        return [p for pair in zip(self.weights, self.biases) for p in pair]

    def per_example_loss(self, x: Any, labels: Any) -> Any:
        """Softmax cross-entropy of the logits against integer ``labels``, per example."""
        return gd.nn.sparse_softmax_cross_entropy(labels, self.forward(x))

    def loss(self, x: Any, labels: Any, global_batch_size: int | None = None) -> Any:
        """Mean cross-entropy over the global batch (``gd.nn.compute_average_loss``)."""
        return gd.nn.compute_average_loss(self.per_example_loss(x, labels), global_batch_size)

    def make_train_step(self, optimizer: Any, global_batch_size: int | None = None) -> Any:
        """A replica step ``step(x, labels) -> loss`` for ``strategy.run``.

        Computes the loss under a ``gd.GradientTape`` and applies the
        gradients with ``optimizer`` (which sums them over replicas).

        Raises:
            ValueError: The model was not built with ``trainable=True``.
        """
        if not self.trainable:
            raise ValueError("make_train_step needs MLP(..., trainable=True): the parameters must be gd.Variables")
        variables = self.trainable_variables

        def train_step(x: Any, labels: Any) -> Any:
            with gd.GradientTape() as tape:
                loss = self.loss(x, labels, global_batch_size)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
            return loss

        return train_step

    def accuracy(self, x: np.ndarray, labels: np.ndarray, strategy: Any = None) -> float:
        """Fraction of ``x`` classified as ``labels`` (predictions run through ``strategy``)."""
        strategy = strategy or gd.get_strategy()
        logits = strategy.run(self.forward, args=(np.asarray(x, dtype=self.dtype),))
        return float(np.mean(np.argmax(logits, axis=-1) == labels))

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
            h = np.dot(h, np.asarray(w)) + np.asarray(b)
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
        return f"MLP(sizes={self.sizes}, dtype={self.dtype.name}, trainable={self.trainable})"


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


def make_step(strategy: Any, batch: int = 16, seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """A whole distributed training step of a default-sized MLP under ``strategy`` (for tools).

    ``graphdist inspect graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1``
    (and ``graphdist export``) call it: the model and an SGD optimizer are
    created in ``strategy.scope()``; the step runs :meth:`MLP.make_train_step`
    on every replica and returns the loss summed over replicas (the mean over
    the global batch).

    Returns:
        ``(step, example_args)``: the ``gd.function`` and one global batch
        ``(x, labels)`` of ``batch`` rows, distributed across the replicas.
    """
    with strategy.scope():
        model = MLP(DEFAULT_SIZES, seed=seed, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    (x,) = model.example_inputs(batch=batch, seed=seed)
    labels = np.random.default_rng(seed).integers(0, DEFAULT_SIZES[-1], batch)
    return distributed_step(strategy, model.make_train_step(optimizer), x, labels, "mlp_train_step")


__all__ += ["make_step"]
