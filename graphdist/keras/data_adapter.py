"""Turns what ``fit``/``evaluate``/``predict`` are given into global batches.

Two kinds of input, as in Keras:

* numpy arrays ``x`` (and ``y``, and optionally one ``sample_weight`` per
  example): checked for equal lengths, floating-point leaves cast once to
  the model's dtype, cut into global batches of ``batch_size`` rows (default
  32) in a fresh order per epoch when ``shuffle`` (the order of epoch ``e``
  is a permutation drawn from ``(seed, e)``, so an epoch can be replayed
  after a restart), the last batch partial;
* a ``gd.data.Dataset`` (or any iterable) whose elements are already global
  batches ``(x, y)`` or ``(x, y, sample_weight)`` (or ``x`` for
  ``predict``); ``y``, ``batch_size`` and ``sample_weight`` must not be
  given.

``class_weight`` (``fit`` only) turns each batch's labels into per-example
weights, multiplied into its sample weights (see
:mod:`graphdist.keras.sample_weights`).

:meth:`DataSource.epoch` returns one epoch's global batches as a
``gd.data.Dataset`` of ``(x, y, sample_weight or None)`` triples (``x`` alone
for ``predict``); the trainer (:mod:`graphdist.keras.training`) splits each
among the replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.data.dataset import Dataset, as_dataset
from graphdist.distribute.input import DistributedDataset, DistributedIterator
from graphdist.distribute.run_args import convert_lists
from graphdist.errors import InvalidArgumentError
from graphdist.keras import sample_weights as weights_lib

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
        has_targets: Whether batches are ``(x, y, sample_weight)`` triples.
    """

    def __init__(self, make_epoch: Any, steps: int | None, has_targets: bool, description: str,
                 peek: Any = None) -> None:
        self._make_epoch = make_epoch
        self._peek = peek
        self.steps = steps
        self.has_targets = has_targets
        self.description = description

    def epoch(self, epoch: int) -> Dataset:
        """The global batches of epoch ``epoch`` (0-based)."""
        return self._make_epoch(epoch)

    def first(self) -> Any:
        """The first global batch (``None`` when there is none), without taking it from epoch 0."""
        if self._peek is not None:
            return self._peek()
        return next(iter(self.epoch(0)), None)


def make_source(x: Any, y: Any, batch_size: int | None, shuffle: bool, seed: int, dtype: np.dtype, what: str,
                need_targets: bool, steps: int | None = None, sample_weight: Any = None,
                class_weight: dict[Any, Any] | None = None) -> DataSource:
    """A :class:`DataSource` for ``fit``/``evaluate`` (``need_targets``) or ``predict``.

    Args:
        x: Arrays (a nest of them) or a dataset of global batches.
        y: Targets for arrays ``x`` (``None`` with a dataset).
        batch_size: Rows per global batch of arrays (default 32).
        shuffle: Shuffle arrays' rows every epoch.
        seed: Seed of the shuffling orders.
        dtype: The model's floating-point dtype.
        what: Prefix of error messages (``"fit"``...).
        need_targets: Batches carry targets (``fit``/``evaluate``).
        steps: Batches per epoch of a dataset (required when it is infinite).
        sample_weight: One weight per example of arrays ``x``.
        class_weight: ``{class id: weight}``, applied to the labels.

    Raises:
        InvalidArgumentError: ``x``/``y``/``sample_weight`` lengths differ,
            ``y`` is missing or given with a dataset, ``batch_size`` or
            ``sample_weight`` is bad or given with a dataset, a bad
            ``class_weight``, or an infinite dataset comes without ``steps``.
    """
    if isinstance(x, (DistributedDataset, DistributedIterator)):
        raise InvalidArgumentError(f"{what}: pass the gd.data.Dataset itself, not a distributed dataset; the model "
                                   "distributes it with its strategy")
    if x is None:
        raise InvalidArgumentError(f"{what}: x is None; pass arrays (x, y) or a gd.data.Dataset of (x, y) batches")
    table = None if class_weight is None else weights_lib.class_weight_table(class_weight, what)
    if _is_dataset(x):
        if sample_weight is not None:
            raise InvalidArgumentError(f"{what}: sample_weight must not be given when x is a dataset; make its "
                                       "elements (x, y, sample_weight) batches instead")
        return _dataset_source(x, y, batch_size, dtype, what, need_targets, steps, table)
    # As Keras: a list of numbers (rows given as lists) is one array, not a nest of scalar inputs.
    x, y = convert_lists(x, f"{what}: x"), convert_lists(y, f"{what}: y")
    sample_weight = convert_lists(sample_weight, f"{what}: sample_weight")
    return _array_source(x, y, batch_size, shuffle, seed, dtype, what, need_targets, sample_weight, table)


def _batch_size(batch_size: Any, what: str) -> int:
    if batch_size is None:
        return DEFAULT_BATCH_SIZE
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InvalidArgumentError(f"{what}: batch_size must be a positive int, got {batch_size!r}")
    return int(batch_size)


def _array_weights(y: Any, samples: int, sample_weight: Any, table: np.ndarray | None, dtype: np.dtype,
                   what: str) -> np.ndarray | None:
    """Every example's weight (``sample_weight`` times its class weight), ``None`` when neither is given."""
    if (sample_weight is not None or table is not None) and y is None:
        raise InvalidArgumentError(f"{what}: sample_weight and class_weight weigh the loss, which needs targets y")
    weights = None
    if sample_weight is not None:
        weights = weights_lib.standardize(sample_weight, samples, dtype, f"{what}: sample_weight")
    return weights_lib.combine(weights, table, y, dtype, what)


def _array_source(x: Any, y: Any, batch_size: Any, shuffle: bool, seed: int, dtype: np.dtype, what: str,
                  need_targets: bool, sample_weight: Any = None, table: np.ndarray | None = None) -> DataSource:
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
    weights = _array_weights(y, samples, sample_weight, table, dtype, what)
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
                yield xb, nest.unflatten(y_def, [leaf[pick] for leaf in y_leaves]), (
                    None if weights is None else weights[pick])
            else:
                yield xb

    def make_epoch(epoch: int) -> Dataset:
        return Dataset(lambda: batches(epoch), steps, f"arrays[{samples}].batch({size})", batch_size=size)

    return DataSource(make_epoch, steps, has_targets, f"{samples} samples in batches of {size}")


def _dataset_source(dataset: Any, y: Any, batch_size: Any, dtype: np.dtype, what: str, need_targets: bool,
                    steps: int | None, table: np.ndarray | None = None) -> DataSource:
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
        return _stepped_source(source, int(steps), dtype, what, need_targets, table)

    def make_epoch(epoch: int) -> Dataset:
        return _checked(source, dtype, what, need_targets, table)

    known = cardinality if cardinality >= 0 else None
    return DataSource(make_epoch, known, need_targets, repr(source))


def _stepped_source(source: Dataset, steps: int, dtype: np.dtype, what: str, need_targets: bool,
                    table: np.ndarray | None) -> DataSource:
    """``steps`` batches per epoch from one iterator that carries on across epochs (as Keras does)."""
    state: dict[str, Iterator[Any]] = {}

    def take(epoch: int) -> Iterator[Any]:
        iterator = state.get("it")
        if iterator is None:
            iterator = state["it"] = iter(_checked(source, dtype, what, need_targets, table))
        for _ in range(steps):
            try:
                yield next(iterator)
            except StopIteration:
                state.pop("it", None)
                return

    def make_epoch(epoch: int) -> Dataset:
        return Dataset(lambda: take(epoch), steps, f"{source!r}.take({steps})", batch_size=source._batch_size)

    def peek() -> Any:
        # A fresh iterator: the shared one must not lose its first batch to the model's build.
        return next(iter(_checked(source, dtype, what, need_targets, table)), None)

    return DataSource(make_epoch, steps, need_targets, f"{source!r}, {steps} steps per epoch", peek=peek)


def _weighted_element(element: Any, index: int, dtype: np.dtype, what: str, table: np.ndarray | None) -> Any:
    """One dataset element as ``(x, y, sample_weight or None)``, cast and its weights checked."""
    if not (isinstance(element, tuple) and len(element) in (2, 3)):
        raise InvalidArgumentError(f"{what}: element {index} of the dataset is not an (x, y) pair or an (x, y, "
                                   "sample_weight) triple; map it to (features, targets[, weights]) batches")
    x, y = nest.map_structure(lambda leaf: _cast(leaf, dtype, f"{what}: dataset element"), element[:2])
    weight = element[2] if len(element) == 3 else None
    where = f"{what}: batch {index}"
    if weight is not None:
        x_leaves = nest.flatten(x)[0]
        samples = len(x_leaves[0]) if x_leaves else 0
        weight = weights_lib.standardize(weight, samples, dtype, f"{where}: sample_weight")
    return x, y, weights_lib.combine(weight, table, y, dtype, where)


def _checked(source: Dataset, dtype: np.dtype, what: str, need_targets: bool,
             table: np.ndarray | None = None) -> Dataset:
    """The dataset's elements as ``(x, y, sample_weight or None)`` triples (``fit``/``evaluate``) or ``x``
    (``predict``), floating-point leaves cast to the model's dtype, ``class_weight`` applied.
    """

    def cast(value: Any) -> Any:
        return nest.map_structure(lambda leaf: _cast(leaf, dtype, f"{what}: dataset element"), value)

    def elements() -> Iterator[Any]:
        for index, element in enumerate(source):
            if need_targets:
                yield _weighted_element(element, index, dtype, what, table)
            else:
                yield cast(element[0] if isinstance(element, tuple) and len(element) in (1, 2, 3) else element)

    return Dataset(elements, source.cardinality(), repr(source), batch_size=source._batch_size)
