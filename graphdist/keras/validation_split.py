"""``fit(validation_split=...)``: the last fraction of the arrays held out as validation data, as in Keras.

Keras cuts the arrays at ``floor(n * (1 - validation_split))`` rows, before any
shuffling, so the validation rows are the same every epoch; a dataset cannot be
split this way (its length is not known up front) and is refused with a hint.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.data.dataset import Dataset
from graphdist.errors import InvalidArgumentError

__all__ = ["check_validation_split", "split_for_validation"]


def check_validation_split(split: Any) -> float:
    """``split`` as a float after checking it is a fraction in ``[0, 1)`` (0: no validation split).

    Raises:
        InvalidArgumentError: It is not a number in that range.
    """
    if isinstance(split, (bool, np.bool_)) or not isinstance(split, (int, float, np.integer, np.floating)) or not (
            0.0 <= float(split) < 1.0):
        raise InvalidArgumentError(f"fit: validation_split must be a fraction in [0, 1), e.g. 0.1, got {split!r}")
    return float(split)


def split_for_validation(x: Any, y: Any, sample_weight: Any, split: Any) -> tuple[Any, Any, Any, tuple]:
    """Keras' ``validation_split``: ``(x, y, sample_weight)`` of the first rows and the validation data
    ``(x_val, y_val[, val_sample_weight])`` of the last ``split`` fraction (``floor(n * (1 - split))`` rows kept
    for training), cut before any shuffling.

    Raises:
        InvalidArgumentError: ``split`` is not in ``[0, 1)``; ``x`` is a dataset or ``y`` is missing; the arrays
            differ in length; one side of the cut would be empty.
    """
    split = check_validation_split(split)
    if isinstance(x, Dataset) or not isinstance(x, (np.ndarray, np.generic, list, tuple, dict)):
        raise InvalidArgumentError(
            f"fit: validation_split works with arrays only (x is a {type(x).__name__}); split a dataset yourself, "
            "e.g. validation_data=dataset.take(n) and x=dataset.skip(n)")
    if y is None:
        raise InvalidArgumentError("fit: validation_split needs the targets y with the arrays x")
    leaves = [np.asarray(leaf) for leaf in nest.flatten((x, y, sample_weight))[0] if leaf is not None]
    lengths = sorted({len(leaf) for leaf in leaves})
    if len(lengths) != 1:
        raise InvalidArgumentError(f"fit: x, y and sample_weight must have one row per example to split off "
                                   f"validation_split, got lengths {lengths}")
    samples = lengths[0]
    cut = int(math.floor(samples * (1.0 - split)))
    if cut in (0, samples):
        raise InvalidArgumentError(
            f"fit: validation_split={split} of {samples} samples leaves {cut} for training and {samples - cut} for "
            "validation; both need at least one: give more data or another validation_split")

    def rows(value: Any, part: slice) -> Any:
        return None if value is None else nest.map_structure(lambda leaf: np.asarray(leaf)[part], value)

    head, tail = slice(0, cut), slice(cut, samples)
    validation = (rows(x, tail), rows(y, tail)) + ((rows(sample_weight, tail),) if sample_weight is not None else ())
    return rows(x, head), rows(y, head), rows(sample_weight, head), validation
