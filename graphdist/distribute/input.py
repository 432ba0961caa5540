"""Distributed input: ``experimental_distribute_dataset``,
``distribute_datasets_from_function`` and ``InputContext``.

A :class:`DistributedDataset` turns a dataset of numpy nests into one that
yields, per step, the inputs of every local replica: with several local
replicas each element is the dataset's structure with a
:class:`~graphdist.trace.values.PerReplica` at every leaf (like
``tf.distribute``); with one replica the element itself.

``experimental_distribute_dataset(dataset)`` *rebatches*: every element of
``dataset`` is one global batch, split along axis 0 into one slice per
replica in sync. Let ``B`` be the size of a full global batch (the
``batch(B)`` of a :class:`~graphdist.data.Dataset`, else the largest batch
seen so far, normally the first) and ``N`` the number of replicas in sync;
each replica gets ``ceil(B / N)`` examples, filled in replica order, so a
partial last batch goes to the first replicas and the replicas past its end
get empty arrays of shape ``(0, ...)`` with the right trailing shape and
dtype. E.g. global batch 8 on 2 replicas: a last batch of 6 becomes
``[0, 1, 2, 3]`` and ``[4, 5]``, one of 3 becomes ``[0, 1, 2]`` and ``[]``
(``strategy.reduce(op, value, axis=0)`` then uses the right denominator).

``distribute_datasets_from_function(dataset_fn)`` does not batch or split:
``dataset_fn(InputContext(...))`` is called once per worker (here: once) and
every step dequeues one element per local replica, replica ``i`` getting the
``i``-th. If the dataset ends in the middle of a step, the replicas left
without data get empty batches shaped like the last element.

Both prefetch in a background thread (see ``gd.data.Dataset.prefetch``):
``num_local_replicas`` steps ahead (times ``options.experimental_per_replica_buffer_size``
when ``options`` has it); exceptions of the pipeline are re-raised by
``next()``.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.data.dataset import Dataset, as_dataset, prefetch_iterator
from graphdist.data.split import split_global_batch
from graphdist.errors import InvalidArgumentError
from graphdist.trace.tracer import TensorSpec
from graphdist.trace.values import DistributedValues, PerReplica

__all__ = [
    "InputContext",
    "DistributedDataset",
    "DistributedIterator",
    "distribute_dataset",
    "distribute_datasets_from_function",
]


class InputContext:
    """What a ``dataset_fn`` given to ``distribute_datasets_from_function`` receives.

    Args:
        num_input_pipelines: Number of input pipelines (workers calling ``dataset_fn``).
        input_pipeline_id: This pipeline's index in ``[0, num_input_pipelines)``;
            use it to shard: ``ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)``.
        num_replicas_in_sync: Number of replicas in sync over all pipelines.
    """

    def __init__(self, num_input_pipelines: int = 1, input_pipeline_id: int = 0, num_replicas_in_sync: int = 1) -> None:
        self._num_input_pipelines = _int(num_input_pipelines, "num_input_pipelines", 1)
        self._input_pipeline_id = _int(input_pipeline_id, "input_pipeline_id", 0)
        self._num_replicas_in_sync = _int(num_replicas_in_sync, "num_replicas_in_sync", 1)
        if self._input_pipeline_id >= self._num_input_pipelines:
            raise InvalidArgumentError(
                f"InputContext: input_pipeline_id must be in [0, num_input_pipelines) = "
                f"[0, {self._num_input_pipelines}), got {self._input_pipeline_id}")

    @property
    def num_input_pipelines(self) -> int:
        """Number of input pipelines."""
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """This input pipeline's index."""
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        """Number of replicas in sync."""
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size // num_replicas_in_sync``.

        Raises:
            InvalidArgumentError: (a ``ValueError``) ``global_batch_size`` is
                not divisible by ``num_replicas_in_sync``.
        """
        size = _int(global_batch_size, "global_batch_size", 0)
        if size % self._num_replicas_in_sync:
            raise InvalidArgumentError(
                f"get_per_replica_batch_size: the global_batch_size {size} is not divisible by "
                f"num_replicas_in_sync {self._num_replicas_in_sync}; choose a global batch size that is a "
                f"multiple of {self._num_replicas_in_sync}")
        return size // self._num_replicas_in_sync

    def __repr__(self) -> str:
        return (f"InputContext(num_input_pipelines={self._num_input_pipelines}, "
                f"input_pipeline_id={self._input_pipeline_id}, num_replicas_in_sync={self._num_replicas_in_sync})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InputContext):
            return NotImplemented
        return repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))


def _int(value: Any, name: str, minimum: int) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if number < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {number}")
    return number


# ------------------------------------------------------------ strategy info
def _layout(strategy: Any) -> tuple[int, int, int]:
    """``(num_replicas_in_sync, num_input_workers, this_worker)`` of ``strategy``.

    A multi-worker strategy may define ``_input_workers() -> (count, index)``;
    the default is one worker holding every replica.
    """
    total = int(strategy.num_replicas_in_sync)
    hook = getattr(strategy, "_input_workers", None)
    workers, index = hook() if callable(hook) else (1, 0)
    if total % workers:
        raise InvalidArgumentError(
            f"{type(strategy).__name__}: {total} replicas cannot be divided among {workers} input workers")
    return total, int(workers), int(index)


def _buffer_size(options: Any, local: int) -> int:
    per_replica = getattr(options, "experimental_per_replica_buffer_size", None)
    per_replica = 1 if per_replica is None else _int(per_replica, "options.experimental_per_replica_buffer_size", 0)
    return per_replica * local


def _regroup_leaves(treedef: nest.TreeDef, per_replica_leaves: list[list[Any]]) -> Any:
    """One structure with a PerReplica at each leaf (the plain structure for one replica)."""
    if len(per_replica_leaves) == 1:
        return nest.unflatten(treedef, per_replica_leaves[0])
    columns = zip(*per_replica_leaves)
    return nest.unflatten(treedef, [PerReplica(column) for column in columns])


# ---------------------------------------------------------- distributed data
_DATASET_METHODS = frozenset(
    name for name in dir(Dataset) if not name.startswith("_") and name not in ("cardinality",)
)


class _NoTransformationsError(InvalidArgumentError, AttributeError):
    """A dataset transformation was called on a distributed dataset."""


class DistributedDataset:
    """A distributed dataset: iterate it (``for x in ds``, ``iter``/``next``)
    to get one step's per-replica inputs at a time.

    Each ``iter()`` starts the input over. Transformations (``map``,
    ``batch``...) cannot be added: apply them to the dataset before
    distributing it.
    """

    _graphdist_dataset = True  # gd.function refuses datasets as step arguments (it cannot import this)

    def __init__(self, make_steps: Callable[[], Iterator[Any]], strategy: Any, buffer_size: int,
                 description: str) -> None:
        # Private: created by the strategy's distribute methods.
        self._make_steps = make_steps
        self._strategy = strategy
        self._buffer_size = buffer_size
        self._description = description

    def __iter__(self) -> DistributedIterator:
        if self._buffer_size > 0:
            return DistributedIterator(prefetch_iterator(self._make_steps, self._buffer_size))
        return DistributedIterator(self._make_steps())

    @property
    def element_spec(self) -> Any:
        """The structure of one step's inputs, with a ``gd.TensorSpec`` per array (like TF's).

        A leaf split across several local replicas is a ``PerReplica`` of the replicas' specs (TF's
        ``PerReplicaSpec``). The batch dimension is ``None``, as in TF for a dataset batched without
        ``drop_remainder`` (the last batch may be smaller). Read from the first element of a fresh pass
        over the data.

        Raises:
            InvalidArgumentError: The dataset is empty (there is no element to describe).
        """
        steps = self._make_steps()
        try:
            first = next(steps)
        except StopIteration:
            raise InvalidArgumentError(f"element_spec: the distributed dataset {self._description} has no "
                                       "elements to describe") from None
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
        leaves, treedef = nest.flatten(first, is_leaf=lambda v: isinstance(v, DistributedValues))
        return nest.unflatten(treedef, [_spec_of(leaf) for leaf in leaves])

    def __getattr__(self, name: str) -> Any:
        if name in _DATASET_METHODS:
            raise _NoTransformationsError(
                f"a distributed dataset cannot be transformed further ({name!r}); apply {name}() to the dataset "
                "before passing it to experimental_distribute_dataset (or inside dataset_fn)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<DistributedDataset {self._description} on {self._strategy!r}>"


def _spec_of(leaf: Any) -> Any:
    if isinstance(leaf, DistributedValues):
        return PerReplica([_spec_of(value) for value in leaf.values])
    array = np.asarray(leaf)
    shape = (None, *array.shape[1:]) if array.ndim else ()
    return TensorSpec(shape, array.dtype)


class DistributedIterator:
    """Iterator over a :class:`DistributedDataset`; ``next()`` raises
    ``StopIteration`` at the end.
    """

    _graphdist_dataset = True  # gd.function refuses datasets as step arguments (it cannot import this)

    def __init__(self, steps: Iterator[Any]) -> None:
        self._steps = steps

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        return next(self._steps)

    def get_next(self) -> Any:
        """The next step's inputs (like ``next(iterator)``)."""
        return next(self)

    def close(self) -> None:
        """Stops prefetching; further ``next()`` calls raise ``StopIteration``."""
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()


def _check_not_distributed(dataset: Any, what: str) -> None:
    if isinstance(dataset, (DistributedDataset, DistributedIterator)):
        raise InvalidArgumentError(f"{what}: the dataset is already distributed; pass the original dataset")


def distribute_dataset(strategy: Any, dataset: Any, options: Any = None) -> DistributedDataset:
    """``strategy.experimental_distribute_dataset(dataset, options)``: see the module docstring.

    Args:
        strategy: The strategy whose replicas receive the data.
        dataset: A :class:`~graphdist.data.Dataset` or any iterable of numpy
            nests; each element is one global batch.
        options: Accepted for compatibility; ``experimental_per_replica_buffer_size``
            is honoured if present.

    Raises:
        InvalidArgumentError: ``dataset`` is not a dataset or iterable; when
            iterating with several replicas, an element has a scalar leaf
            (not batched) or leaves of different batch sizes.
    """
    what = "experimental_distribute_dataset"
    _check_not_distributed(dataset, what)
    source = as_dataset(dataset, what)
    total, workers, worker = _layout(strategy)
    local = total // workers
    known_batch = source._batch_size

    def steps() -> Iterator[Any]:
        if total == 1:
            yield from source
            return
        full = known_batch or 0
        for index, element in enumerate(source):
            leaves, treedef = nest.flatten(element)
            batch = _batch_dimension(leaves, element, index, total)
            full = max(full, batch)
            parts = split_global_batch(leaves, full, total, range(worker * local, (worker + 1) * local))
            yield _regroup_leaves(treedef, parts)

    return DistributedDataset(steps, strategy, _buffer_size(options, local), source._description)


def _batch_dimension(leaves: list[Any], element: Any, index: int, total: int) -> int:
    hint = (f"batch the dataset by the global batch size before distributing it "
            f"(e.g. dataset.batch(per_replica_batch_size * {total})) so it can be split among {total} replicas")
    if not leaves:
        raise InvalidArgumentError(f"experimental_distribute_dataset: element {index} has no arrays; {hint}")
    for leaf in leaves:
        if np.ndim(leaf) == 0:
            raise InvalidArgumentError(
                f"experimental_distribute_dataset: element {index} has a scalar component "
                f"({_short(leaf)}), not a batch; {hint}")
    sizes = sorted({np.shape(leaf)[0] for leaf in leaves})
    if len(sizes) > 1:
        shapes = ", ".join(str(np.shape(leaf)) for leaf in leaves)
        raise InvalidArgumentError(
            f"experimental_distribute_dataset: the components of element {index} have different batch sizes "
            f"{sizes} (shapes {shapes}); every component of a global batch needs the same first dimension")
    return sizes[0]


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def distribute_datasets_from_function(strategy: Any, dataset_fn: Callable[[InputContext], Any],
                                      options: Any = None) -> DistributedDataset:
    """``strategy.distribute_datasets_from_function(dataset_fn, options)``: see the module docstring.

    ``dataset_fn`` is called now, once for this worker, with an
    :class:`InputContext`; it should return a dataset (or iterable) already
    batched by the per-replica batch size and sharded.

    Raises:
        InvalidArgumentError: ``dataset_fn`` is not callable or returns no
            dataset; when iterating, the replicas' elements of a step differ
            in structure, or the data ends mid-step with unbatched elements.
    """
    what = "distribute_datasets_from_function"
    if not callable(dataset_fn):
        raise InvalidArgumentError(f"{what}: dataset_fn must be callable with an InputContext argument, "
                                   f"got {type(dataset_fn).__name__}")
    total, workers, worker = _layout(strategy)
    local = total // workers
    context = InputContext(num_input_pipelines=workers, input_pipeline_id=worker, num_replicas_in_sync=total)
    dataset = dataset_fn(context)
    if dataset is None:
        raise InvalidArgumentError(f"{what}: dataset_fn returned None; it must return a gd.data.Dataset")
    _check_not_distributed(dataset, what)
    source = as_dataset(dataset, f"{what}: the value returned by dataset_fn")

    def steps() -> Iterator[Any]:
        iterator = iter(source)
        try:
            for step in itertools.count():
                elements = list(itertools.islice(iterator, local))
                if not elements:
                    return
                if local == 1:
                    yield elements[0]
                    continue
                flat = [nest.flatten(e) for e in elements]
                treedef = flat[0][1]
                for replica, (_, other) in enumerate(flat[1:], start=1):
                    if other != treedef:
                        raise InvalidArgumentError(
                            f"{what}: step {step}: replica {replica}'s element has structure "
                            f"{_short(elements[replica])} but replica 0's has {_short(elements[0])}; "
                            "every element of the dataset must have the same structure")
                parts = [leaves for leaves, _ in flat]
                if len(parts) < local:
                    parts.extend(_empty_like(parts[-1], step) for _ in range(local - len(parts)))
                yield _regroup_leaves(treedef, parts)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    return DistributedDataset(steps, strategy, _buffer_size(options, local), source._description)


def _empty_like(leaves: list[Any], step: int) -> list[Any]:
    for leaf in leaves:
        if np.ndim(leaf) == 0:
            raise InvalidArgumentError(
                f"distribute_datasets_from_function: the dataset ended in the middle of step {step} and its "
                "elements are not batched, so the remaining replicas cannot get empty batches; batch the "
                "dataset by the per-replica batch size or give it a multiple of num_replicas_in_sync elements")
    return [np.asarray(leaf)[:0] for leaf in leaves]
