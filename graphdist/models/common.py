"""Shared pieces of the trainable models (:mod:`graphdist.models.convnet`, :mod:`graphdist.models.transformer`).

:class:`Classifier` is the small base class both models derive from. A
subclass creates its parameters with :meth:`Classifier.add_variable` (as
``gd.Variable`` s, through whatever strategy scope is current) and defines
:meth:`Classifier.forward`; the base class supplies the loss, the replica
training step and evaluation helpers::

    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = ConvNet()
        optimizer = gd.optimizers.Adam(0.01)
    step = model.make_train_step(optimizer)          # build once, reuse: traced once
    x, labels = model.example_data()
    for i in range(0, 512, 64):
        loss = strategy.run(step, args=(x[i:i + 64], labels[i:i + 64]))

The initialisers return numpy arrays from a ``numpy.random.Generator`` so
that a model's parameters depend only on its ``seed``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

import graphdist as gd

__all__ = ["Classifier", "accuracy", "dense", "distributed_step", "glorot_uniform", "he_normal", "float_dtype"]


def float_dtype(dtype: Any, owner: str) -> np.dtype:
    """``dtype`` as a numpy dtype, checked to be floating point.

    Raises:
        ValueError: ``dtype`` is not a floating-point type.
    """
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"{owner} dtype must be a floating-point type such as np.float32, got {dtype}")
    return dtype


def glorot_uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int,
                   dtype: Any) -> np.ndarray:
    """Uniform in ``[-l, l]`` with ``l = sqrt(6 / (fan_in + fan_out))`` (Keras' default kernel init)."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


def he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, dtype: Any) -> np.ndarray:
    """Normal with standard deviation ``sqrt(2 / fan_in)`` (for layers followed by ReLU)."""
    return (rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(dtype)


def dense(x: Any, w: Any, b: Any = None) -> Any:
    """``x @ w + b`` over the last axis of ``x`` (numpy; traceable)."""
    y = x @ w
    return y if b is None else y + b


def accuracy(logits: Any, labels: Any) -> float:
    """Fraction of rows whose arg-max logit is the label (eager numpy)."""
    logits, labels = np.asarray(logits), np.asarray(labels)
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


class Classifier:
    """Base class of a classifier holding ``gd.Variable`` parameters.

    Args:
        name: Prefix of the variable names (``"convnet"`` gives ``"convnet/conv1/kernel"``).
        num_classes: Number of output logits.
        dtype: Floating-point dtype of the parameters.

    Attributes:
        name: The name prefix.
        num_classes: Number of classes.
        dtype: The parameters' dtype.
    """

    def __init__(self, name: str, num_classes: int, dtype: Any) -> None:
        if int(num_classes) < 2:
            raise ValueError(f"{type(self).__name__}: num_classes must be at least 2, got {num_classes}")
        self.name = name
        self.num_classes = int(num_classes)
        self.dtype = float_dtype(dtype, type(self).__name__)
        self._variables: list[gd.Variable] = []

    # ---------------------------------------------------------- parameters
    def add_variable(self, initial_value: np.ndarray, name: str) -> gd.Variable:
        """Creates a trainable ``gd.Variable`` named ``"<model name>/<name>"`` in the current strategy."""
        variable = gd.Variable(np.asarray(initial_value, dtype=self.dtype), name=f"{self.name}/{name}")
        self._variables.append(variable)
        return variable

    @property
    def trainable_variables(self) -> list[gd.Variable]:
        """The parameters, in creation order."""
        return [v for v in self._variables if v.trainable]

    @property
    def variables(self) -> list[gd.Variable]:
        """All the model's variables (the optimizer's slots are the optimizer's)."""
        return list(self._variables)

    @property
    def num_parameters(self) -> int:
        """Total number of scalar parameters."""
        return sum(int(np.prod(v.shape, dtype=np.int64)) for v in self._variables)

    # ------------------------------------------------------------- compute
    def forward(self, x: Any, training: bool = False) -> Any:
        """Logits ``(batch, num_classes)`` of a batch (defined by subclasses)."""
        raise NotImplementedError

    def __call__(self, x: Any, training: bool = False) -> Any:
        return self.forward(x, training=training)

    def per_example_loss(self, x: Any, labels: Any, training: bool = False) -> Any:
        """Softmax cross entropy of each example, shape ``(batch,)``.

        Args:
            x: A batch of inputs for :meth:`forward`.
            labels: Integer class indices, shape ``(batch,)``.
            training: Passed to :meth:`forward`.
        """
        return gd.nn.sparse_softmax_cross_entropy(labels, self.forward(x, training=training))

    def loss(self, x: Any, labels: Any, global_batch_size: int | None = None, training: bool = False) -> Any:
        """Mean cross entropy over the global batch (``gd.nn.compute_average_loss``).

        Inside ``strategy.run`` with ``global_batch_size=None`` the denominator
        is this replica's batch times ``num_replicas_in_sync``, so the losses of
        all replicas sum to the mean over the global batch. Eagerly inside a
        strategy's scope (cross-replica context) pass ``global_batch_size``.
        """
        per_example = self.per_example_loss(x, labels, training=training)
        return gd.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)

    def make_train_step(self, optimizer: Any, global_batch_size: int | None = None
                        ) -> Callable[[Any, Any], Any]:
        """A replica step ``step(x, labels) -> loss`` for ``strategy.run(step, args=(x, labels))``.

        The step computes :meth:`loss` under a ``gd.GradientTape``, takes the
        gradients of :attr:`trainable_variables` and applies them with
        ``optimizer.apply_gradients`` (which sums them over replicas in a sync
        strategy). It returns this replica's loss (its share of the global mean:
        reduce the per-replica results with ``"SUM"``).

        Build the step once and reuse the same function object: graphdist
        caches the traced and compiled step per function and input signature.

        Args:
            optimizer: A ``gd.optimizers`` optimizer (e.g. ``Adam``, ``SGD``).
            global_batch_size: Denominator of the loss; ``None``: the replica
                batch times the number of replicas.
        """
        variables = self.trainable_variables

        def train_step(x: Any, labels: Any) -> Any:
            with gd.GradientTape() as tape:
                loss = self.loss(x, labels, global_batch_size=global_batch_size, training=True)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
            return loss

        train_step.__name__ = f"{self.name}_train_step"
        train_step.__qualname__ = train_step.__name__
        return train_step

    def predict(self, x: Any) -> np.ndarray:
        """Arg-max class of each example (eager numpy)."""
        return np.argmax(np.asarray(self.forward(x)), axis=-1)

    def accuracy(self, x: Any, labels: Any) -> float:
        """Fraction of ``x`` classified as ``labels`` (eager numpy)."""
        return accuracy(self.forward(x), labels)


def distributed_step(strategy: Any, train_step: Any, x: np.ndarray, labels: np.ndarray, name: str) -> tuple[Any, tuple]:
    """The tools' whole training step: ``strategy.run(train_step)`` + ``strategy.reduce("SUM")``.

    Returns:
        ``(step, example_args)``: the ``gd.function`` and the global batch
        ``(x, labels)`` distributed across the replicas (one dataset element).
    """

    @gd.function(name=name)
    def step(x: Any, labels: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(train_step, args=(x, labels)), axis=None)

    batches = strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))
    return step, tuple(next(iter(batches)))

