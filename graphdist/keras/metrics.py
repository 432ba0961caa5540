"""Metrics of ``gd.keras`` (``metrics=["accuracy"]``) that aggregate correctly across replicas.

A metric is a running ``total / count``. Inside a compiled step each replica
computes its batch's partial sums (:meth:`Metric.batch_totals`, traced); the
step reduces them with ``strategy.reduce("SUM")`` over the replicas and the
host adds the global sums into the metric (:meth:`Metric.merge`), in float64.
The result over an epoch is therefore exactly the metric of all the epoch's
examples, whatever the replica count and however a partial last batch was
split. Eagerly, :meth:`Metric.update_state` / :meth:`Metric.result` /
:meth:`Metric.reset_state` work as in Keras.

Inside a traced step (TensorFlow's custom training loop:
``train_accuracy.update_state(labels, predictions)`` in the replica function
given to ``strategy.run`` under ``gd.function``) the state lives in a
variable ``[total, count]`` (float64) created through the running strategy on
the first traced update (as an optimizer's slots are). Each update computes
the replica's partial sums, all-reduces them over the replicas (one
``SUM`` all-reduce, as TF sums its metric variables over replicas) and adds
them to the variable, so every replica keeps the same value. ``result()`` and
``reset_state()`` then work outside the step (inside it they are traced too).
Once the variable exists, eager updates and ``fit``'s merges go to it as well:
there is one state.

With a ``sample_weight`` (one weight per example) a metric is the weighted
mean ``sum(w * value) / sum(w)``, as Keras' metrics compute it; ``fit`` and
``evaluate`` pass the sample weights to the ``weighted_metrics`` of
``compile`` only (its plain ``metrics`` stay unweighted, as in Keras).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.distribute.replica_context import get_replica_context
from graphdist.errors import InvalidArgumentError
from graphdist.keras import losses as losses_lib
from graphdist.trace.tracer import current_trace
from graphdist.trace.variables import Variable, read_variable

__all__ = ["Metric", "Mean", "SparseCategoricalAccuracy", "CategoricalAccuracy", "BinaryAccuracy", "Accuracy",
           "MeanSquaredError", "MeanAbsoluteError", "get", "serialize", "deserialize"]


class Metric:
    """A running ``total / count``.

    Args:
        name: The name used in ``fit`` logs and ``History``.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name or type(self).__name__
        self._state: Variable | None = None  # [total, count], made by the first traced update
        self.reset_state()

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        """``(total, count)`` of one batch (traced or eager numpy).

        Args:
            y_true: The batch's targets.
            y_pred: The batch's predictions.
            sample_weight: Optional weight per example; ``total`` is then the
                weighted sum of the values and ``count`` the sum of the weights.
        """
        raise NotImplementedError

    def merge(self, total: float, count: float) -> None:
        """Adds reduced partial sums (eagerly, in float64)."""
        if self._state is not None:
            self._state.assign(self._state.numpy() + np.array([float(total), float(count)]))
            return
        self._total += float(total)
        self._count += float(count)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Adds a batch (weighted by ``sample_weight``, one weight per example, when given).

        Eagerly the sums are added on the host; inside a traced step (``strategy.run`` under
        ``gd.function``) they are all-reduced over the replicas and added to the metric's variable.
        """
        if current_trace() is not None:
            self._add_traced(self.batch_totals(y_true, y_pred) if sample_weight is None
                             else self.batch_totals(y_true, y_pred, sample_weight=sample_weight))
            return
        if sample_weight is None:
            total, count = self.batch_totals(np.asarray(y_true), np.asarray(y_pred))
        else:
            total, count = self.batch_totals(np.asarray(y_true), np.asarray(y_pred),
                                             sample_weight=np.asarray(sample_weight, dtype=np.float32))
        self.merge(total, count)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``update_state(*args, **kwargs)``, then :meth:`result` (as Keras' ``metric(y_true, y_pred)``)."""
        self.update_state(*args, **kwargs)
        return self.result()

    def result(self) -> Any:
        """``total / count`` (0 before any update); a traced scalar inside a traced step."""
        if current_trace() is not None:
            state = read_variable(self._variable())
            return state[0] / np.maximum(state[1], np.float64(np.finfo(np.float64).tiny))
        if self._state is not None:
            total, count = self._state.numpy().tolist()
            return total / count if count else 0.0
        return self._total / self._count if self._count else 0.0

    def reset_state(self) -> None:
        """Forgets every update (in its variable too, traced inside a traced step)."""
        self._total = 0.0
        self._count = 0.0
        if current_trace() is not None:
            self._variable().assign(np.zeros(2, np.float64))
        elif self._state is not None:
            self._state.assign(np.zeros(2, np.float64))

    # ------------------------------------------------------------ traced state
    def _variable(self) -> Variable:
        """The ``[total, count]`` variable, created through the current strategy on first use; it starts
        from what eager updates added so far.
        """
        if self._state is None:
            self._state = Variable(np.array([self._total, self._count], np.float64), name=f"{self.name}/state",
                                   trainable=False)
        return self._state

    def _add_traced(self, totals: tuple[Any, Any]) -> None:
        """Adds a replica's traced ``(total, count)``, summed over the replicas, to the variable."""
        partial = np.stack([np.reshape(_float32(t), ()) for t in totals])
        context = get_replica_context()
        summed = context.all_reduce("SUM", partial) if context is not None else partial
        self._variable().assign_add(summed.astype(np.float64))

    @property
    def variables(self) -> list[Variable]:
        """The metric's variables (``[]`` until a traced step has updated it)."""
        return [] if self._state is None else [self._state]

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-able)."""
        return {"name": self.name}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}={self.result():.4g}>"


def _float32(value: Any) -> Any:
    """``value`` as float32: traced tensors and numpy values through ``astype``, Python numbers through numpy."""
    return value.astype(np.float32) if hasattr(value, "astype") else np.asarray(value, np.float32)


def _totals(values: Any, sample_weight: Any) -> tuple[Any, Any]:
    """``(sum of values, number of values)``, or with weights (one per example, broadcast over the other
    axes as Keras does) ``(sum of w * values, sum of the broadcast weights)``, in float32.
    """
    if values.dtype == np.bool_:
        values = values.astype(np.float32)
    if sample_weight is None:
        size = int(np.prod(values.shape, dtype=np.int64))
        return np.sum(values).astype(np.float32), np.asarray(size, dtype=np.float32)
    weight = losses_lib.weigh_like(sample_weight, values)
    per_example = np.asarray(int(np.prod(values.shape[1:], dtype=np.int64)), dtype=np.float32)
    return np.sum(values * weight).astype(np.float32), np.sum(weight).astype(np.float32) * per_example


class Mean(Metric):
    """The mean of the values given (``update_state(values)``; in a step, of ``y_pred``)."""

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        return _totals(y_pred, sample_weight)

    def update_state(self, values: Any, y_pred: Any = None, sample_weight: Any = None) -> None:  # type: ignore[override]
        """Adds values (``update_state(values, sample_weight=None)``, as Keras' ``Mean``)."""
        if current_trace() is not None:
            values = values if y_pred is None else y_pred
            self._add_traced(_totals(_float32(values), sample_weight))
            return
        values = np.asarray(values if y_pred is None else y_pred, dtype=np.float64)
        if sample_weight is None:
            self.merge(values.sum(), values.size)
            return
        weight = np.broadcast_to(losses_lib.weigh_like(np.asarray(sample_weight), values), values.shape)
        self.merge((values * weight).sum(), weight.sum())


class SparseCategoricalAccuracy(Metric):
    """Fraction of examples whose arg-max prediction is the integer label."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name or "sparse_categorical_accuracy")

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        labels = losses_lib.sparse_labels(y_true)
        predicted = np.argmax(y_pred, axis=-1)
        return _totals(predicted == labels.astype(predicted.dtype), sample_weight)


class CategoricalAccuracy(Metric):
    """Fraction of examples whose arg-max prediction is the arg-max of their one-hot target."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name or "categorical_accuracy")

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        return _totals(np.argmax(y_pred, axis=-1) == np.argmax(y_true, axis=-1), sample_weight)


class BinaryAccuracy(Metric):
    """Fraction of predictions on the same side of ``threshold`` as their 0/1 target (per example: the
    mean over the last axis).

    Args:
        threshold: Probabilities above it count as 1 (0.5; use 0.0 for logits).
        name: The metric's name.
    """

    def __init__(self, threshold: float = 0.5, name: str | None = None) -> None:
        super().__init__(name or "binary_accuracy")
        self.threshold = float(threshold)

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        y_true = np.reshape(y_true, tuple(y_pred.shape)) if len(y_true.shape) < len(y_pred.shape) else y_true
        predicted = y_pred > y_pred.dtype.type(self.threshold)
        correct = (predicted == (y_true > np.asarray(0.5, dtype=y_true.dtype))).astype(y_pred.dtype)
        return _totals(np.mean(correct, axis=-1), sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "threshold": self.threshold}


class Accuracy(Metric):
    """Fraction of predictions equal to the targets (elementwise)."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name or "accuracy")

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        y_true = np.reshape(y_true, tuple(y_pred.shape)) if len(y_true.shape) < len(y_pred.shape) else y_true
        return _totals(y_pred == y_true.astype(y_pred.dtype), sample_weight)


class MeanSquaredError(Metric):
    """Mean over examples of the per-example mean squared error."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name or "mean_squared_error")

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        return _totals(losses_lib.MeanSquaredError().per_example(y_true, y_pred), sample_weight)


class MeanAbsoluteError(Metric):
    """Mean over examples of the per-example mean absolute error."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name or "mean_absolute_error")

    def batch_totals(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> tuple[Any, Any]:
        return _totals(losses_lib.MeanAbsoluteError().per_example(y_true, y_pred), sample_weight)


_CLASSES = {cls.__name__: cls for cls in (Mean, SparseCategoricalAccuracy, CategoricalAccuracy, BinaryAccuracy,
                                          Accuracy, MeanSquaredError, MeanAbsoluteError)}


def get(identifier: Any, loss: Any) -> Metric:
    """A metric from a name or object. ``"accuracy"``/``"acc"`` follow the loss, as in Keras:
    sparse class labels give :class:`SparseCategoricalAccuracy` (named ``"accuracy"``).

    Raises:
        InvalidArgumentError: Unknown name or value.
    """
    if isinstance(identifier, Metric):
        return identifier
    if not isinstance(identifier, str):
        raise InvalidArgumentError(f"compile: a metric must be a name or a gd.keras.metrics.Metric, got "
                                   f"{type(identifier).__name__}")
    name = identifier.lower()
    if name in ("accuracy", "acc"):
        if isinstance(loss, losses_lib.SparseCategoricalCrossentropy):
            return SparseCategoricalAccuracy(name=identifier)
        if isinstance(loss, losses_lib.CategoricalCrossentropy):
            return CategoricalAccuracy(name=identifier)
        if isinstance(loss, losses_lib.BinaryCrossentropy):
            # Keras thresholds at 0.5 even for logits; the threshold of a logit is 0.
            return BinaryAccuracy(0.0 if loss.from_logits else 0.5, name=identifier)
        return Accuracy(name=identifier)
    simple = {"sparse_categorical_accuracy": SparseCategoricalAccuracy,
              "categorical_accuracy": CategoricalAccuracy, "binary_accuracy": BinaryAccuracy, "mse": MeanSquaredError,
              "mean_squared_error": MeanSquaredError, "mae": MeanAbsoluteError,
              "mean_absolute_error": MeanAbsoluteError}
    cls = simple.get(name)
    if cls is None:
        raise InvalidArgumentError(f"compile: unknown metric {identifier!r}; use one of "
                                   f"{sorted(['accuracy', *simple])} or a gd.keras.metrics object")
    return cls(name=identifier)


def serialize(metric: Metric) -> dict[str, Any]:
    """``{"class_name", "config"}`` of a built-in metric."""
    if type(metric).__name__ not in _CLASSES:
        raise InvalidArgumentError(f"a custom metric ({type(metric).__name__}) cannot be saved in a model config")
    return {"class_name": type(metric).__name__, "config": metric.get_config()}


def deserialize(data: dict[str, Any]) -> Metric:
    """The metric :func:`serialize` described."""
    cls = _CLASSES.get(data.get("class_name"))
    if cls is None:
        raise InvalidArgumentError(f"unknown metric class {data.get('class_name')!r} in a saved model")
    return cls(**data.get("config", {}))
