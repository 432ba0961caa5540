"""Per-example weights of ``fit``/``evaluate``: ``sample_weight`` and ``class_weight``, as in Keras.

Every function here runs on the host on concrete numpy arrays, before a batch
reaches a compiled step:

* :func:`standardize` checks a ``sample_weight`` array (numeric, one weight
  per example: shape ``(samples,)`` or ``(samples, 1)``, finite; negative
  weights are allowed, as Keras allows them) and casts it to the model's
  dtype as a vector;
* :func:`class_weight_table` turns a ``class_weight`` dict
  ``{class id: weight}`` into a dense lookup table (classes it leaves out
  weigh 1, as in Keras 3);
* :func:`class_weights_of` looks up each example's class weight from its
  labels: integer labels of shape ``(samples,)`` / ``(samples, 1)`` (integral
  floats such as binary ``0.``/``1.`` targets included), or one-hot
  ``(samples, classes)`` rows (the arg-max class, as Keras does);
* :func:`combine` multiplies both, as Keras does when both are given;
* :func:`check_class_ids` checks the dict's class ids against the model's
  number of classes once the model is built.

The weighted loss is then ``sum(w_i * loss_i) / global batch size`` (Keras'
``SUM_OVER_BATCH_SIZE``), see :mod:`graphdist.keras.training`.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.errors import InvalidArgumentError

__all__ = ["standardize", "class_weight_table", "class_weights_of", "combine", "check_class_ids", "num_classes"]

logger = logging.getLogger(__name__)


def standardize(weight: Any, samples: int, dtype: np.dtype, where: str) -> np.ndarray:
    """``weight`` as a finite vector of ``samples`` weights of ``dtype``.

    Args:
        weight: Array-like of shape ``(samples,)`` or ``(samples, 1)``.
        samples: The number of examples it must weigh.
        dtype: The model's floating-point dtype.
        where: Prefix of error messages (``"fit: sample_weight"``...).

    Raises:
        InvalidArgumentError: Not numeric, wrong rank or length, or NaN/inf values.
    """
    array = np.asarray(weight)
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise InvalidArgumentError(f"{where}: weights must be numbers, got dtype {array.dtype}; give a float array "
                                   "of one weight per example")
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise InvalidArgumentError(
            f"{where}: expected one weight per example, shape ({samples},) or ({samples}, 1), got shape "
            f"{array.shape}; per-output or per-timestep weights are not supported")
    if len(array) != samples:
        raise InvalidArgumentError(f"{where}: has {len(array)} weights but there are {samples} examples; give one "
                                   "weight per example (the same first dimension as x and y)")
    array = array.astype(dtype)
    if not np.all(np.isfinite(array)):
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise InvalidArgumentError(f"{where}: weights must be finite, got {array[bad]} at example {bad}; replace "
                                   "NaN/inf weights (a weight of 0 drops an example from the loss)")
    return np.ascontiguousarray(array)


def _class_id(key: Any, where: str) -> int:
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (numbers.Integral, np.integer)):
        raise InvalidArgumentError(f"class_weight: keys must be integer class ids, got {key!r} in {where}")
    if key < 0:
        raise InvalidArgumentError(f"class_weight: class ids must be >= 0, got {key} in {where}")
    return int(key)


def _class_value(value: Any, key: int) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.number)):
        raise InvalidArgumentError(f"class_weight: the weight of class {key} must be a number, got {value!r}")
    if not np.isfinite(value):
        raise InvalidArgumentError(f"class_weight: the weight of class {key} must be finite, got {value}")
    return float(value)


def class_weight_table(class_weight: Any, where: str = "fit") -> np.ndarray:
    """A float64 table ``table[class id] = weight`` from a ``{class id: weight}`` dict.

    Classes the dict leaves out (below its largest id) weigh 1.

    Raises:
        InvalidArgumentError: Not a non-empty dict, a key that is not a
            non-negative int, or a weight that is not a finite number.
    """
    if not isinstance(class_weight, dict):
        raise InvalidArgumentError(f"{where}: class_weight must be a dict {{class id: weight}}, got "
                                   f"{type(class_weight).__name__}")
    if not class_weight:
        raise InvalidArgumentError(f"{where}: class_weight is an empty dict; give {{class id: weight}} entries or "
                                   "leave it None")
    weights = {_class_id(key, where): _class_value(value, key) for key, value in class_weight.items()}
    table = np.ones(max(weights) + 1, np.float64)
    for key, value in weights.items():
        table[key] = value
    logger.debug("%s: class weights %s (classes left out weigh 1)", where, table.tolist())
    return table


def _labels_of(y: Any, where: str) -> np.ndarray:
    """The single target array a class weight is looked up from."""
    leaves = nest.flatten(y)[0]
    if len(leaves) != 1:
        raise InvalidArgumentError(f"{where}: class_weight needs a single target array y, got {len(leaves)}; "
                                   "pass per-example weights as sample_weight instead")
    return np.asarray(leaves[0])


def class_ids(y: Any, where: str) -> np.ndarray:
    """Each example's class id (int64) from integer labels or one-hot rows, as Keras reads them.

    Raises:
        InvalidArgumentError: Several target arrays, targets of rank > 2,
            non-numeric or fractional labels, or negative labels.
    """
    labels = _labels_of(y, where)
    if labels.dtype == object or labels.dtype.kind not in "biuf":
        raise InvalidArgumentError(f"{where}: class_weight needs numeric labels, got dtype {labels.dtype}")
    if labels.ndim == 2 and labels.shape[1] > 1:
        return np.argmax(labels, axis=1).astype(np.int64)  # one-hot (or smoothed) rows: the arg-max class
    if labels.ndim == 2:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise InvalidArgumentError(
            f"{where}: class_weight needs class labels of shape (samples,), (samples, 1) or one-hot "
            f"(samples, classes), got targets of shape {labels.shape}; pass sample_weight instead")
    if labels.dtype.kind == "f" and labels.size and not np.all(np.mod(labels, 1) == 0):
        raise InvalidArgumentError(f"{where}: class_weight needs integer class labels, got fractional targets "
                                   "(a regression target has no class); pass sample_weight instead")
    if labels.size and labels.min() < 0:
        raise InvalidArgumentError(f"{where}: class_weight needs class ids >= 0, got label {labels.min()}")
    return labels.astype(np.int64)


def class_weights_of(table: np.ndarray, y: Any, where: str) -> np.ndarray:
    """Each example's class weight (float64); labels past the table weigh 1."""
    ids = class_ids(y, where)
    weights = np.ones(len(ids), np.float64)
    known = ids < len(table)
    weights[known] = table[ids[known]]
    return weights


def combine(sample_weight: np.ndarray | None, table: np.ndarray | None, y: Any, dtype: np.dtype,
            where: str) -> np.ndarray | None:
    """``sample_weight * class weight`` of one batch (either may be missing; ``None`` when both are)."""
    if table is None:
        return sample_weight
    weights = class_weights_of(table, y, where)
    if sample_weight is not None:
        weights = weights * sample_weight
    return np.ascontiguousarray(weights.astype(dtype))


def num_classes(output_shape: tuple[int, ...]) -> int:
    """The classes a model with outputs of ``output_shape`` tells apart (one unit: binary, 2)."""
    units = int(output_shape[-1]) if len(output_shape) > 1 else 1
    return max(units, 2)


def check_class_ids(class_weight: dict[Any, Any] | None, output_shape: tuple[int, ...] | None) -> None:
    """Raises when a ``class_weight`` key is not a class of the model's outputs.

    Raises:
        InvalidArgumentError: A class id ``>=`` the number of classes.
    """
    if class_weight is None or output_shape is None:
        return
    classes = num_classes(output_shape)
    out_of_range = sorted(int(key) for key in class_weight if int(key) >= classes)
    if out_of_range:
        raise InvalidArgumentError(
            f"fit: class_weight has class ids {out_of_range} but the model outputs {classes} classes (ids 0 to "
            f"{classes - 1}); remove those keys or give the last layer more units")
