"""Losses of ``gd.keras`` (``loss="mse"``, ``SparseCategoricalCrossentropy(from_logits=True)``...).

A loss object computes one loss per example (:meth:`Loss.per_example`, traced
or eager). Called directly it reduces them as its ``reduction`` says (Keras'
default: the mean over the batch; ``Reduction.NONE``: per example, for custom
training loops that divide by the global batch size with
``gd.nn.compute_average_loss``); a ``sample_weight`` multiplies each
example's loss first, and the mean still divides by the number of examples
(not by the sum of the weights), as Keras' ``SUM_OVER_BATCH_SIZE`` does.
``fit`` always sums the (weighted) per-example losses and divides by the
global batch size, so replicas' gradients add up to the gradient of the mean
over the global batch (Mirrored equals one device).

:meth:`Loss.check_targets` validates concrete targets against the model's
output (shape, dtype, class range) before ``fit`` runs a step, so the error
comes before any work; inside a traced step (a custom training loop) the
sparse losses check their labels when the compiled step runs
(:func:`graphdist.trace.checks.check_class_labels`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import GraphdistError, InvalidArgumentError
from graphdist.trace import nn
from graphdist.trace.checks import CLASS_LABEL_DTYPES, check_class_labels

__all__ = [
    "Reduction",
    "Loss",
    "MeanSquaredError",
    "MeanAbsoluteError",
    "SparseCategoricalCrossentropy",
    "BinaryCrossentropy",
    "CategoricalCrossentropy",
    "Huber",
    "get",
    "serialize",
]

_EPSILON = 1e-7  # Keras' backend epsilon, clips probabilities away from 0 and 1


class Reduction:
    """How a loss object reduces per-example losses (``tf.keras.losses.Reduction``)."""

    NONE = "none"
    SUM = "sum"
    SUM_OVER_BATCH_SIZE = "sum_over_batch_size"
    AUTO = "auto"
    ALL = (NONE, SUM, SUM_OVER_BATCH_SIZE, AUTO)


def _float(value: Any, dtype: Any) -> Any:
    return value if value.dtype == dtype else value.astype(dtype)


class Loss:
    """Base class: per-example loss, reduction, target checks.

    Args:
        reduction: One of :class:`Reduction` (default: mean over the batch).
        name: The loss's name.
    """

    def __init__(self, reduction: str = Reduction.AUTO, name: str | None = None) -> None:
        if reduction not in Reduction.ALL:
            raise InvalidArgumentError(f"{type(self).__name__}: reduction must be one of {Reduction.ALL}, "
                                       f"got {reduction!r}")
        self.reduction = reduction
        self.name = name or type(self).__name__

    def per_example(self, y_true: Any, y_pred: Any) -> Any:
        """One loss per example, shape ``(batch,)``."""
        raise NotImplementedError

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        """The loss of a batch, reduced as :attr:`reduction` says.

        Args:
            y_true: Targets.
            y_pred: Predictions.
            sample_weight: Optional weight per example (shape ``(batch,)``),
                multiplied into the per-example losses before the reduction;
                the mean still divides by the batch size, as in Keras.
        """
        try:
            losses = self.per_example(y_true, y_pred)
        except ValueError as err:  # numpy broadcasting; graphdist's own errors pass through
            if isinstance(err, GraphdistError):
                raise
            raise InvalidArgumentError(f"{self.name}: targets of shape {tuple(np.shape(y_true))} do not go with "
                                       f"predictions of shape {tuple(np.shape(y_pred))} ({err}); give one target "
                                       "per prediction") from None
        if sample_weight is not None:
            losses = losses * weigh_like(sample_weight, losses)
        if self.reduction == Reduction.NONE:
            return losses
        total = np.sum(losses)
        if self.reduction == Reduction.SUM:
            return total
        count = max(int(losses.shape[0]), 1)
        return total / np.asarray(count, dtype=losses.dtype)

    def check_targets(self, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
        """Raises a clear error when concrete targets cannot go with outputs of ``output_shape``."""

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-able)."""
        return {"reduction": self.reduction, "name": self.name}


def weigh_like(sample_weight: Any, values: Any) -> Any:
    """``sample_weight`` (one weight per example) in ``values``' dtype, shaped to broadcast against them."""
    weight = sample_weight if hasattr(sample_weight, "dtype") else np.asarray(sample_weight)
    weight = _float(weight, values.dtype)
    rank = len(values.shape)
    count, examples = (weight.shape[0] if len(weight.shape) else None), (values.shape[0] if rank else None)
    if isinstance(count, int) and isinstance(examples, int) and count not in (1, examples):
        raise InvalidArgumentError(f"sample_weight has {count} weights for {examples} examples; give one weight "
                                   "per example (shape (batch,))")
    if len(weight.shape) == 2 and weight.shape[1] == 1 and rank != 2:
        weight = np.reshape(weight, (weight.shape[0],))
    if rank > 1 and len(weight.shape) == 1:
        weight = np.reshape(weight, (weight.shape[0],) + (1,) * (rank - 1))
    return weight


def _check_same_size(loss: Loss, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
    if y_true.dtype.kind not in "fiub":
        raise InvalidArgumentError(f"{where}: {loss.name} needs numeric targets, got dtype {y_true.dtype}")
    per_example = tuple(output_shape[1:])
    got = tuple(y_true.shape[1:])
    if got != per_example and not (got == () and per_example == (1,)):
        raise InvalidArgumentError(
            f"{where}: {loss.name} compares targets with the model's outputs, but each target has shape {got} and "
            f"each output {per_example}; give y the shape (batch, {', '.join(map(str, per_example))})")


class MeanSquaredError(Loss):
    """``mean((y_true - y_pred) ** 2)`` over the last axis, per example."""

    def per_example(self, y_true: Any, y_pred: Any) -> Any:
        y_true = _float(y_true, y_pred.dtype)
        if len(y_true.shape) < len(y_pred.shape):
            y_true = np.reshape(y_true, tuple(y_pred.shape))
        diff = y_pred - y_true
        return np.mean(diff * diff, axis=-1)

    def check_targets(self, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
        _check_same_size(self, y_true, output_shape, where)


class MeanAbsoluteError(Loss):
    """``mean(|y_true - y_pred|)`` over the last axis, per example."""

    def per_example(self, y_true: Any, y_pred: Any) -> Any:
        y_true = _float(y_true, y_pred.dtype)
        if len(y_true.shape) < len(y_pred.shape):
            y_true = np.reshape(y_true, tuple(y_pred.shape))
        return np.mean(np.abs(y_pred - y_true), axis=-1)

    def check_targets(self, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
        _check_same_size(self, y_true, output_shape, where)


def sparse_labels(y_true: Any) -> Any:
    """Integer labels of shape ``(batch,)`` from ``(batch,)`` or ``(batch, 1)`` targets.

    As Keras does, other dtypes become int64: float targets, and the integer dtypes the label check of a
    compiled step does not run on (uint64, uint32, int16, uint16: see
    :data:`graphdist.trace.checks.CLASS_LABEL_DTYPES`). ``fit`` checks the values' range before that.
    """
    if len(y_true.shape) == 2 and y_true.shape[1] == 1:
        y_true = np.reshape(y_true, (y_true.shape[0],))
    if y_true.dtype.kind not in "iu" or np.dtype(y_true.dtype).name not in CLASS_LABEL_DTYPES:
        y_true = y_true.astype(np.int64)
    return y_true


class SparseCategoricalCrossentropy(Loss):
    """Cross entropy between integer class labels and predictions.

    Args:
        from_logits: Predictions are unnormalised logits (softmax applied
            here, numerically stable); otherwise probabilities (Keras'
            default), clipped to ``[1e-7, 1 - 1e-7]``.
        reduction: See :class:`Loss`.
        name: The loss's name.
    """

    def __init__(self, from_logits: bool = False, reduction: str = Reduction.AUTO, name: str | None = None) -> None:
        super().__init__(reduction, name or "sparse_categorical_crossentropy")
        self.from_logits = bool(from_logits)

    def per_example(self, y_true: Any, y_pred: Any) -> Any:
        labels = sparse_labels(y_true)
        if self.from_logits:
            return nn.sparse_softmax_cross_entropy(labels, y_pred)
        classes = int(y_pred.shape[-1])
        check_class_labels(labels, classes, self.name, f"the model outputs {classes} classes")
        probabilities = y_pred / np.sum(y_pred, axis=-1, keepdims=True)
        eps = y_pred.dtype.type(_EPSILON)
        log_p = np.log(np.clip(probabilities, eps, y_pred.dtype.type(1) - eps))
        one_hot = (np.arange(classes, dtype=labels.dtype) == labels[..., None]).astype(y_pred.dtype)
        return -np.sum(one_hot * log_p, axis=-1)

    def check_targets(self, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
        classes = output_shape[-1]
        shape = tuple(y_true.shape)
        if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
            raise InvalidArgumentError(f"{where}: {self.name} needs one integer class label per example (shape "
                                       f"(batch,) or (batch, 1)), got targets of shape {shape}")
        if y_true.dtype.kind == "f" and y_true.size and not np.all(np.mod(y_true, 1) == 0):
            raise InvalidArgumentError(f"{where}: {self.name} needs integer class labels, got fractional values")
        if y_true.dtype.kind not in "fiu":
            raise InvalidArgumentError(f"{where}: {self.name} needs integer class labels, got dtype {y_true.dtype}")
        if y_true.size and (y_true.min() < 0 or y_true.max() >= classes):
            raise InvalidArgumentError(
                f"{where}: labels must be class indices in [0, {classes}) (the model outputs {classes} classes); got "
                f"values from {y_true.min()} to {y_true.max()}. Fix the labels or give the last layer more units")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}


class BinaryCrossentropy(Loss):
    """Binary cross entropy, averaged over the last axis, per example.

    Args:
        from_logits: Predictions are logits (stable ``softplus`` form);
            otherwise probabilities, clipped to ``[1e-7, 1 - 1e-7]``.
        reduction: See :class:`Loss`.
        name: The loss's name.
    """

    def __init__(self, from_logits: bool = False, reduction: str = Reduction.AUTO, name: str | None = None) -> None:
        super().__init__(reduction, name or "binary_crossentropy")
        self.from_logits = bool(from_logits)

    def per_example(self, y_true: Any, y_pred: Any) -> Any:
        y_true = _float(y_true, y_pred.dtype)
        if len(y_true.shape) < len(y_pred.shape):
            y_true = np.reshape(y_true, tuple(y_pred.shape))
        if self.from_logits:
            # max(z, 0) - z * y + log(1 + exp(-|z|)), stable for large |z|
            losses = np.maximum(y_pred, 0) - y_pred * y_true + np.log(1 + np.exp(-np.abs(y_pred)))
        else:
            eps = y_pred.dtype.type(_EPSILON)
            p = np.clip(y_pred, eps, y_pred.dtype.type(1) - eps)
            losses = -(y_true * np.log(p) + (1 - y_true) * np.log(1 - p))
        return np.mean(losses, axis=-1)

    def check_targets(self, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
        _check_same_size(self, y_true, output_shape, where)
        if y_true.size and (y_true.min() < 0 or y_true.max() > 1):
            raise InvalidArgumentError(f"{where}: {self.name} needs targets in [0, 1], got values from "
                                       f"{y_true.min()} to {y_true.max()}")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}


class CategoricalCrossentropy(Loss):
    """Cross entropy between one-hot (or soft) targets and predictions over the last axis.

    Args:
        from_logits: Predictions are logits (``log_softmax`` here); otherwise
            probabilities, normalised and clipped to ``[1e-7, 1 - 1e-7]``.
        label_smoothing: In ``[0, 1]``: targets become ``y * (1 - s) + s / classes``.
        reduction: See :class:`Loss`.
        name: The loss's name.
    """

    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0, reduction: str = Reduction.AUTO,
                 name: str | None = None) -> None:
        super().__init__(reduction, name or "categorical_crossentropy")
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise InvalidArgumentError(f"CategoricalCrossentropy: label_smoothing must be in [0, 1], got "
                                       f"{label_smoothing!r}")
        self.from_logits, self.label_smoothing = bool(from_logits), float(label_smoothing)

    def per_example(self, y_true: Any, y_pred: Any) -> Any:
        kind = y_pred.dtype.type
        y_true = _float(y_true, y_pred.dtype)
        if self.label_smoothing:
            classes = int(y_pred.shape[-1])
            y_true = y_true * kind(1 - self.label_smoothing) + kind(self.label_smoothing / classes)
        if self.from_logits:
            log_p = nn.log_softmax(y_pred, axis=-1)
        else:
            probabilities = y_pred / np.sum(y_pred, axis=-1, keepdims=True)
            log_p = np.log(np.clip(probabilities, kind(_EPSILON), kind(1) - kind(_EPSILON)))
        return -np.sum(y_true * log_p, axis=-1)

    def check_targets(self, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
        if tuple(y_true.shape[1:]) != tuple(output_shape[1:]):
            raise InvalidArgumentError(
                f"{where}: {self.name} needs one-hot targets shaped like the outputs {tuple(output_shape[1:])}, got "
                f"{tuple(y_true.shape[1:])}; for integer labels use sparse_categorical_crossentropy")
        _check_same_size(self, y_true, output_shape, where)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing}


class Huber(Loss):
    """Huber loss, averaged over the last axis: ``x^2 / 2`` where ``|x| <= delta``, else
    ``delta * (|x| - delta / 2)`` (``x = y_pred - y_true``).

    Args:
        delta: Where the quadratic part becomes linear (> 0).
        reduction: See :class:`Loss`.
        name: The loss's name.
    """

    def __init__(self, delta: float = 1.0, reduction: str = Reduction.AUTO, name: str | None = None) -> None:
        super().__init__(reduction, name or "huber_loss")
        if not float(delta) > 0:
            raise InvalidArgumentError(f"Huber: delta must be > 0, got {delta!r}")
        self.delta = float(delta)

    def per_example(self, y_true: Any, y_pred: Any) -> Any:
        kind = y_pred.dtype.type
        y_true = _float(y_true, y_pred.dtype)
        if len(y_true.shape) < len(y_pred.shape):
            y_true = np.reshape(y_true, tuple(y_pred.shape))
        error = np.abs(y_pred - y_true)
        delta = kind(self.delta)
        quadratic = np.minimum(error, delta)
        return np.mean(kind(0.5) * quadratic * quadratic + delta * (error - quadratic), axis=-1)

    def check_targets(self, y_true: np.ndarray, output_shape: tuple[int, ...], where: str) -> None:
        _check_same_size(self, y_true, output_shape, where)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "delta": self.delta}


_BY_NAME: dict[str, type[Loss]] = {
    "mse": MeanSquaredError, "mean_squared_error": MeanSquaredError,
    "mae": MeanAbsoluteError, "mean_absolute_error": MeanAbsoluteError,
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "huber": Huber, "huber_loss": Huber,
}
_CLASSES = {cls.__name__: cls for cls in (MeanSquaredError, MeanAbsoluteError, SparseCategoricalCrossentropy,
                                          BinaryCrossentropy, CategoricalCrossentropy, Huber)}


def get(identifier: Any) -> Loss:
    """A loss object from a name (``"mse"``, ``"sparse_categorical_crossentropy"``...) or a loss object.

    Raises:
        InvalidArgumentError: Unknown name or unsupported value.
    """
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.lower())
        if cls is None:
            raise InvalidArgumentError(f"compile: unknown loss {identifier!r}; use one of {sorted(_BY_NAME)} or a "
                                       "gd.keras.losses object")
        return cls()
    raise InvalidArgumentError(
        f"compile: loss must be a name or a gd.keras.losses.Loss, got {type(identifier).__name__}")


def serialize(loss: Loss) -> dict[str, Any]:
    """``{"class_name", "config"}`` of a built-in loss (for saved models)."""
    if type(loss).__name__ not in _CLASSES:
        raise InvalidArgumentError(f"a custom loss ({type(loss).__name__}) cannot be saved in a model config")
    return {"class_name": type(loss).__name__, "config": loss.get_config()}


def deserialize(data: dict[str, Any]) -> Loss:
    """The loss :func:`serialize` described."""
    cls = _CLASSES.get(data.get("class_name"))
    if cls is None:
        raise InvalidArgumentError(f"unknown loss class {data.get('class_name')!r} in a saved model")
    return cls(**data.get("config", {}))
