"""Turns what ``fit``/``evaluate``/``predict`` are given into global batches.

Two kinds of input, as in Keras:

* numpy arrays ``x`` (and ``y``): checked for equal lengths, floating-point
  leaves cast once to the model's dtype, cut into global batches of
  ``batch_size`` rows (default 32) in a fresh order per epoch when
  ``shuffle`` (the order of epoch ``e`` is a permutation drawn from
  ``(seed, e)``, so an epoch can be replayed after a restart), the last batch
  partial;
* a ``gd.data.Dataset`` (or any iterable) whose elements are already global
  batches ``(x, y)`` (or ``x`` for ``predict``); ``y`` and ``batch_size``
  must not be given.

:meth:`DataSource.epoch` returns one epoch's global batches as a
``gd.data.Dataset``; the trainer (:mod:`graphdist.keras.training`) splits
each among the replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.data.dataset import Dataset, as_dataset
from graphdist.distribute.input import DistributedDataset, DistributedIterator
from graphdist.errors import InvalidArgumentError

__all__ = ["DataSource", "make_source", "DEFAULT_BATCH_SIZE"]

DEFAULT_BATCH_SIZE = 32
_INFINITE = -1


def _is_dataset(value: Any) -> bool:
    return isinstance(value, Dataset) or (
        not isinstance(value, (np.ndarray, np.generic, list, tuple, dict)) and hasattr(value, "__iter__"))


def _cast(leaf: Any, dtype: np.dtype, what: str) -> np.ndarray:
    array = np.asarray(leaf)
    if array.dtype == object or array.dtype.kind in "USV":
        raise InvalidArgumentError(f"{what}: arrays must be numeric, got dtype {array.dtype}")
    if array.ndim == 0:
        raise InvalidArgumentError(f"{what}: got a scalar; give one row per example (shape (samples, ...))")
    if array.dtype.kind == "f" and array.dtype != dtype:
        array = array.astype(dtype)
    return np.ascontiguousarray(array)


class DataSource:
    """Global batches of one input for several epochs.

    Attributes:
        steps: Batches per epoch (``None`` when unknown until iterated).
        has_targets: Whether batches are ``(x, y)`` pairs.
    """

    def __init__(self, make_epoch: Any, steps: int | None, has_targets: bool, description: str) -> None:
        self._make_epoch = make_epoch
        self.steps = steps
        self.has_targets = has_targets
        self.description = description

    def epoch(self, epoch: int) -> Dataset:
        """The global batches of epoch ``epoch`` (0-based)."""
        return self._make_epoch(epoch)


def make_source(x: Any, y: Any, batch_size: int | None, shuffle: bool, seed: int, dtype: np.dtype, what: str,
                need_targets: bool, steps: int | None = None) -> DataSource:
    """A :class:`DataSource` for ``fit``/``evaluate`` (``need_targets``) or ``predict``.

    Raises:
        InvalidArgumentError: ``x``/``y`` lengths differ, ``y`` is missing or
            given with a dataset, ``batch_size`` is bad or given with a
            dataset, or an infinite dataset comes without ``steps``.
    """
    if isinstance(x, (DistributedDataset, DistributedIterator)):
        raise InvalidArgumentError(f"{what}: pass the gd.data.Dataset itself, not a distributed dataset; the model "
                                   "distributes it with its strategy")
    if x is None:
        raise InvalidArgumentError(f"{what}: x is None; pass arrays (x, y) or a gd.data.Dataset of (x, y) batches")
    if _is_dataset(x):
        return _dataset_source(x, y, batch_size, dtype, what, need_targets, steps)
    return _array_source(x, y, batch_size, shuffle, seed, dtype, what, need_targets)


def _batch_size(batch_size: Any, what: str) -> int:
    if batch_size is None:
        return DEFAULT_BATCH_SIZE
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InvalidArgumentError(f"{what}: batch_size must be a positive int, got {batch_size!r}")
    return int(batch_size)


def _array_source(x: Any, y: Any, batch_size: Any, shuffle: bool, seed: int, dtype: np.dtype, what: str,
                  need_targets: bool) -> DataSource:
    size = _batch_size(batch_size, what)
    if need_targets and y is None:
        raise InvalidArgumentError(f"{what}: y is missing; pass targets y with the arrays x (or a dataset of "
                                   "(x, y) batches)")
    x_leaves, x_def = nest.flatten(x)
    x_leaves = [_cast(leaf, dtype, f"{what}: x") for leaf in x_leaves]
    y_leaves, y_def = nest.flatten(y) if y is not None else ([], None)
    y_leaves = [_cast(leaf, dtype, f"{what}: y") for leaf in y_leaves]
    lengths = {len(leaf) for leaf in x_leaves}
    if len(lengths) > 1:
        raise InvalidArgumentError(f"{what}: the arrays of x have different numbers of samples {sorted(lengths)}")
    (samples,) = lengths or {0}
    for leaf in y_leaves:
        if len(leaf) != samples:
            raise InvalidArgumentError(
                f"{what}: x has {samples} samples but y has {len(leaf)}; x and y need one row per example each "
                "(the same first dimension)")
    if samples == 0:
        raise InvalidArgumentError(f"{what}: x has no samples")
    steps = -(-samples // size)
    has_targets = y is not None

    def batches(epoch: int) -> Iterator[Any]:
        order = np.random.default_rng([seed, epoch]).permutation(samples) if shuffle else None
        for start in range(0, samples, size):
            if order is None:
                pick: Any = slice(start, start + size)
            else:
                pick = order[start:start + size]
            xb = nest.unflatten(x_def, [leaf[pick] for leaf in x_leaves])
            if has_targets:
                yield xb, nest.unflatten(y_def, [leaf[pick] for leaf in y_leaves])
            else:
                yield xb

    def make_epoch(epoch: int) -> Dataset:
        return Dataset(lambda: batches(epoch), steps, f"arrays[{samples}].batch({size})", batch_size=size)

    return DataSource(make_epoch, steps, has_targets, f"{samples} samples in batches of {size}")


def _dataset_source(dataset: Any, y: Any, batch_size: Any, dtype: np.dtype, what: str, need_targets: bool,
                    steps: int | None) -> DataSource:
    if y is not None:
        raise InvalidArgumentError(f"{what}: y must not be given when x is a dataset; its elements are the "
                                   "(x, y) batches")
    if batch_size is not None:
        raise InvalidArgumentError(f"{what}: batch_size must not be given with a dataset, which is already "
                                   "batched (dataset.batch(global_batch_size))")
    source = as_dataset(dataset, what)
    cardinality = source.cardinality()
    if cardinality == _INFINITE and steps is None:
        raise InvalidArgumentError(f"{what}: the dataset repeats forever; pass steps_per_epoch (fit) or steps "
                                   "(evaluate/predict) to say how many batches make an epoch")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise InvalidArgumentError(f"{what}: steps must be a positive int, got {steps!r}")
        return _stepped_source(source, int(steps), dtype, what, need_targets)

    def make_epoch(epoch: int) -> Dataset:
        return _checked(source, dtype, what, need_targets)

    known = cardinality if cardinality >= 0 else None
    return DataSource(make_epoch, known, need_targets, repr(source))


def _stepped_source(source: Dataset, steps: int, dtype: np.dtype, what: str, need_targets: bool) -> DataSource:
    """``steps`` batches per epoch from one iterator that carries on across epochs (as Keras does)."""
    state: dict[str, Iterator[Any]] = {}

    def take(epoch: int) -> Iterator[Any]:
        iterator = state.get("it")
        if iterator is None:
            iterator = state["it"] = iter(_checked(source, dtype, what, need_targets))
        for _ in range(steps):
            try:
                yield next(iterator)
            except StopIteration:
                state.pop("it", None)
                return

    def make_epoch(epoch: int) -> Dataset:
        return Dataset(lambda: take(epoch), steps, f"{source!r}.take({steps})", batch_size=source._batch_size)

    return DataSource(make_epoch, steps, need_targets, f"{source!r}, {steps} steps per epoch")


def _checked(source: Dataset, dtype: np.dtype, what: str, need_targets: bool) -> Dataset:
    """The dataset's elements as ``(x, y)`` pairs (``fit``/``evaluate``) or ``x`` (``predict``),
    floating-point leaves cast to the model's dtype.
    """

    def cast(value: Any) -> Any:
        return nest.map_structure(lambda leaf: _cast(leaf, dtype, f"{what}: dataset element"), value)

    def elements() -> Iterator[Any]:
        for index, element in enumerate(source):
            if isinstance(element, tuple) and len(element) == 3:
                raise NotImplementedError(f"{what}: element {index} is (x, y, sample_weight); sample weights are "
                                          "not supported yet: give (x, y) batches")
            if need_targets:
                if not (isinstance(element, tuple) and len(element) == 2):
                    raise InvalidArgumentError(f"{what}: element {index} of the dataset is not an (x, y) pair; "
                                               "map it to (features, targets) batches")
                yield cast(element)
            else:
                yield cast(element[0] if isinstance(element, tuple) and len(element) in (1, 2) else element)

    return Dataset(elements, source.cardinality(), repr(source), batch_size=source._batch_size)
