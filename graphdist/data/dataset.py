"""``gd.data.Dataset``: input pipelines of numpy nests, like ``tf.data.Dataset``.

An element is a *nest* (see :mod:`graphdist.nest`) of numpy arrays and numpy
scalars: a single array, a tuple ``(features, labels)``, a dict, or any
nesting of those. Values given to the constructors are converted with
``np.asarray`` (numpy dtypes: a Python float becomes float64, a Python int
int64; pass ``np.float32`` arrays for float32 data). As in ``tf.data``, a
Python *list* inside a structure is a value, not a structure:
``from_tensor_slices([[1, 2], [3, 4]])`` yields ``[1, 2]`` then ``[3, 4]``;
use a tuple for a structure.

A dataset is a lazy, re-iterable description of a pipeline: every ``iter()``
starts the pipeline over (and, with ``shuffle(..., reshuffle_each_iteration=True)``,
in a new order). Transformations return new datasets and never change the
one they are called on::

    ds = gd.data.Dataset.from_tensor_slices((x, y)).shuffle(100, seed=0).batch(32).prefetch(2)
    for features, labels in ds:
        ...

Elements come out as numpy values: 0-d results are numpy scalars
(``np.int64(3)``), everything else ``np.ndarray``.
"""

from __future__ import annotations

import itertools
import operator
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.errors import InvalidArgumentError

__all__ = ["Dataset", "DatasetLengthError", "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "as_dataset"]

#: ``cardinality()`` of a dataset that never ends (like ``tf.data.INFINITE_CARDINALITY``).
INFINITE_CARDINALITY = -1
#: ``cardinality()`` of a dataset whose length is not known without iterating it.
UNKNOWN_CARDINALITY = -2
#: ``prefetch(gd.data.AUTOTUNE)`` lets graphdist pick the buffer size (it uses
#: :data:`_AUTOTUNE_BUFFER` elements).
AUTOTUNE = -1
_AUTOTUNE_BUFFER = 2

_INF = INFINITE_CARDINALITY
_UNKNOWN = UNKNOWN_CARDINALITY


# ------------------------------------------------------------------ elements
def _to_leaf(value: Any, what: str) -> Any:
    array = np.asarray(value)
    if array.dtype == object:
        raise InvalidArgumentError(
            f"{what}: cannot convert {type(value).__name__} {_short(value)} to a numpy array of numbers or "
            "strings (ragged lists or arbitrary objects are not supported); give arrays of one shape"
        )
    return array[()] if array.ndim == 0 else array


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten_value(structure: Any) -> tuple[list[Any], nest.TreeDef]:
    """Flattens with Python lists as values (tf.data treats a list as a tensor)."""
    return nest.flatten(structure, is_leaf=lambda v: isinstance(v, list))


def _normalize(structure: Any, what: str) -> Any:
    """Converts every leaf of a user-given structure to a numpy value."""
    leaves, treedef = _flatten_value(structure)
    return nest.unflatten(treedef, [_to_leaf(leaf, what) for leaf in leaves])


def _normalize_element(element: Any, what: str) -> Any:
    """Like :func:`_normalize` but keeps lists as structures (for plain Python iterables)."""
    leaves, treedef = nest.flatten(element)
    if all(isinstance(leaf, (np.ndarray, np.generic)) for leaf in leaves):
        return element
    return nest.unflatten(treedef, [_to_leaf(leaf, what) for leaf in leaves])


def _call_unpacked(fn: Callable[..., Any], element: Any) -> Any:
    # Like tf.data: a tuple element is passed as positional arguments (not a namedtuple or a list).
    return fn(*element) if type(element) is tuple else fn(element)


def _check_count(value: Any, name: str, minimum: int) -> int:
    try:
        count = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if count < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {count}")
    return count


class DatasetLengthError(InvalidArgumentError, TypeError):
    """``len()`` of a dataset whose length is infinite or unknown (a ``TypeError``
    as Python's ``len`` protocol expects, so ``list(ds)`` still works).
    """


# ------------------------------------------------------------------ dataset
class Dataset:
    """A re-iterable input pipeline whose elements are numpy nests.

    Create one with :meth:`range`, :meth:`from_tensor_slices`,
    :meth:`from_tensors` or :meth:`from_generator` and chain transformations
    (:meth:`batch`, :meth:`shuffle`, :meth:`repeat`, :meth:`map`,
    :meth:`filter`, :meth:`shard`, :meth:`take`, :meth:`skip`,
    :meth:`prefetch`). Iterate with ``for element in ds`` or
    :meth:`as_numpy_iterator`; every iteration starts from the beginning.
    """

    _graphdist_dataset = True  # gd.function refuses datasets as step arguments (it cannot import this)

    def __init__(self, factory: Callable[[], Iterable[Any]], cardinality: int = _UNKNOWN,
                 description: str = "Dataset", batch_size: int | None = None) -> None:
        # Private: build datasets with the classmethods and transformations.
        self._factory = factory
        self._cardinality = int(cardinality)
        self._description = description
        #: Number of examples per element when the pipeline ends in ``batch`` (full batches).
        self._batch_size = batch_size

    def _derive(self, factory: Callable[[], Iterable[Any]], cardinality: int, step: str,
                keep_batch_size: bool = True) -> Dataset:
        return Dataset(factory, cardinality, f"{self._description}.{step}",
                       self._batch_size if keep_batch_size else None)

    # ---------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Any]:
        return iter(self._factory())

    def as_numpy_iterator(self) -> Iterator[Any]:
        """An iterator over the elements (already numpy values), like ``tf.data``'s."""
        return iter(self)

    def cardinality(self) -> int:
        """Number of elements: an int, or :data:`INFINITE_CARDINALITY` (-1) for a
        dataset that never ends, or :data:`UNKNOWN_CARDINALITY` (-2) when it is not
        known without iterating (``filter``, ``from_generator``).
        """
        return self._cardinality

    def __len__(self) -> int:
        if self._cardinality == _INF:
            raise DatasetLengthError("the dataset is infinite (repeat() without a count); it has no length")
        if self._cardinality == _UNKNOWN:
            raise DatasetLengthError("the dataset's length is unknown (filter or from_generator); "
                                       "iterate it to count its elements")
        return self._cardinality

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        card = {_INF: "infinite", _UNKNOWN: "unknown"}.get(self._cardinality, str(self._cardinality))
        return f"<Dataset {self._description} cardinality={card}>"

    # ------------------------------------------------------- constructors
    @staticmethod
    def range(*args: int, dtype: Any = np.int64) -> Dataset:
        """Elements of ``range(*args)`` (``stop``, ``start, stop`` or
        ``start, stop, step``) as numpy scalars of ``dtype`` (default int64).
        """
        if not 1 <= len(args) <= 3:
            raise InvalidArgumentError(f"Dataset.range takes 1 to 3 arguments (start, stop, step), got {len(args)}")
        bounds = [_check_count(a, "Dataset.range argument", -(2**63)) for a in args]
        if len(bounds) == 3 and bounds[2] == 0:
            raise InvalidArgumentError("Dataset.range: step must not be zero")
        rng = range(*bounds)
        scalar = np.dtype(dtype).type

        def factory() -> Iterator[Any]:
            return (scalar(i) for i in rng)

        return Dataset(factory, len(rng), f"range({', '.join(map(str, bounds))})")

    @staticmethod
    def from_tensors(tensors: Any) -> Dataset:
        """A dataset with ``tensors`` (a nest) as its single element."""
        element = _normalize(tensors, "Dataset.from_tensors")
        return Dataset(lambda: iter((element,)), 1, "from_tensors(...)")

    @staticmethod
    def from_tensor_slices(tensors: Any) -> Dataset:
        """One element per slice of ``tensors`` along axis 0.

        Every array in the nest ``tensors`` must have the same length in
        dimension 0; element ``i`` has the structure of ``tensors`` with each
        array replaced by its ``i``-th row (a numpy scalar for 1-D arrays).

        Raises:
            InvalidArgumentError: A component is a scalar, the nest has no
                arrays, or the lengths in dimension 0 differ.
        """
        what = "Dataset.from_tensor_slices"
        leaves, treedef = _flatten_value(tensors)
        leaves = [_to_leaf(leaf, what) for leaf in leaves]
        if not leaves:
            raise InvalidArgumentError(f"{what}: the structure {_short(tensors)} contains no arrays to slice")
        for index, leaf in enumerate(leaves):
            if np.ndim(leaf) == 0:
                raise InvalidArgumentError(
                    f"{what}: component {index} is a scalar ({_short(leaf)}); every component needs at least one "
                    "dimension to slice along; use Dataset.from_tensors for a single element"
                )
        lengths = [leaf.shape[0] for leaf in leaves]
        if len(set(lengths)) > 1:
            described = ", ".join(f"component {i}: {n} (shape {leaves[i].shape})" for i, n in enumerate(lengths))
            raise InvalidArgumentError(
                f"{what}: all components must have the same length in dimension 0, got {described}; "
                "slice arrays with matching first dimensions"
            )
        count = lengths[0]

        def factory() -> Iterator[Any]:
            for i in range(count):
                yield nest.unflatten(treedef, [leaf[i] for leaf in leaves])

        return Dataset(factory, count, f"from_tensor_slices(<{count} slices>)")

    @staticmethod
    def from_generator(generator: Callable[..., Iterable[Any]], output_signature: Any = None,
                       args: tuple[Any, ...] | None = None) -> Dataset:
        """Elements produced by ``generator(*args)``, called anew for every iteration.

        ``generator`` is a callable returning an iterable (a generator
        function, not a generator object, so the dataset can be iterated more
        than once). ``output_signature`` is accepted for compatibility and not
        checked. Leaves are converted to numpy values.
        """
        if not callable(generator):
            raise InvalidArgumentError(
                f"Dataset.from_generator: generator must be callable (a generator function), got "
                f"{type(generator).__name__}; pass the function, not the generator object it returns"
            )
        call_args = tuple(args) if args is not None else ()
        name = getattr(generator, "__name__", "generator")

        def factory() -> Iterator[Any]:
            for element in generator(*call_args):
                yield _normalize(element, f"Dataset.from_generator({name})")

        return Dataset(factory, _UNKNOWN, f"from_generator({name})")

    @staticmethod
    def zip(*datasets: Any) -> Dataset:
        """Tuples of elements of several datasets, ending with the shortest.

        ``Dataset.zip(a, b)`` and ``Dataset.zip((a, b))`` are the same.
        """
        if len(datasets) == 1 and isinstance(datasets[0], tuple):
            datasets = datasets[0]
        members = tuple(as_dataset(d, "Dataset.zip") for d in datasets)
        if not members:
            raise InvalidArgumentError("Dataset.zip needs at least one dataset")
        cards = [d.cardinality() for d in members]
        if _UNKNOWN in cards:
            card = 0 if 0 in cards else _UNKNOWN
        elif all(c == _INF for c in cards):
            card = _INF
        else:
            card = min(c for c in cards if c >= 0)

        def factory() -> Iterator[Any]:
            return zip(*members)

        return Dataset(factory, card, f"zip({len(members)} datasets)")

    # ----------------------------------------------------- transformations
    def batch(self, batch_size: int, drop_remainder: bool = False, num_parallel_calls: Any = None,
              deterministic: Any = None) -> Dataset:
        """Stacks ``batch_size`` consecutive elements (``np.stack`` per leaf).

        The last batch may be smaller unless ``drop_remainder`` is true, in
        which case it is dropped. ``num_parallel_calls`` and ``deterministic``
        are accepted for compatibility.

        Raises:
            InvalidArgumentError: ``batch_size < 1``; when iterating, elements
                whose structures or shapes differ.
        """
        size = _check_count(batch_size, "batch: batch_size", 1)
        drop = bool(drop_remainder)
        source = self

        def factory() -> Iterator[Any]:
            pending: list[Any] = []
            for element in source:
                pending.append(element)
                if len(pending) == size:
                    yield _stack(pending, size)
                    pending = []
            if pending and not drop:
                yield _stack(pending, size)

        card = self._cardinality
        if card >= 0:
            card = card // size if drop else -(-card // size)
        step = f"batch({size}{', drop_remainder=True' if drop else ''})"
        return Dataset(factory, card, f"{self._description}.{step}", batch_size=size)

    def shuffle(self, buffer_size: int, seed: int | None = None, reshuffle_each_iteration: bool = True) -> Dataset:
        """Randomly shuffles elements with a buffer of ``buffer_size``, like ``tf.data``.

        The buffer is filled with the first ``buffer_size`` elements; each
        output is drawn uniformly from the buffer and its place is taken by
        the next input element. A buffer at least as large as the dataset
        gives a uniform permutation; a smaller one only mixes nearby elements.

        Determinism: with a ``seed`` the orders are reproducible: the ``k``-th
        iteration of this dataset object uses a generator seeded with
        ``(seed, k)`` when ``reshuffle_each_iteration`` is true (a new order
        each epoch, the same sequence of orders every run), and ``seed``
        alone otherwise (the same order every epoch). Without a seed a
        random seed is drawn: once at creation when
        ``reshuffle_each_iteration`` is false, per iteration otherwise.
        """
        size = _check_count(buffer_size, "shuffle: buffer_size", 1)
        if seed is not None:
            seed = _check_count(seed, "shuffle: seed", 0)
        reshuffle = bool(reshuffle_each_iteration)
        if seed is None and not reshuffle:
            seed = int(np.random.SeedSequence().entropy % (2**63))
        epochs = itertools.count()
        source = self

        def factory() -> Iterator[Any]:
            if seed is None:
                rng = np.random.default_rng()
            elif reshuffle:
                rng = np.random.default_rng([seed, next(epochs)])
            else:
                rng = np.random.default_rng(seed)
            buffer: list[Any] = []
            for element in source:
                if len(buffer) < size:
                    buffer.append(element)
                    continue
                index = int(rng.integers(size))
                yield buffer[index]
                buffer[index] = element
            while buffer:
                index = int(rng.integers(len(buffer)))
                buffer[index], buffer[-1] = buffer[-1], buffer[index]
                yield buffer.pop()

        return self._derive(factory, self._cardinality, f"shuffle({size}, seed={seed})")

    def repeat(self, count: int | None = None) -> Dataset:
        """Repeats the dataset ``count`` times (forever for ``None`` or -1).

        Each repetition iterates the input anew (so a shuffle before
        ``repeat`` gives a new order per repetition). Repeating an empty
        dataset forever yields nothing (it stops instead of spinning).
        """
        times = -1 if count is None else _check_count(count, "repeat: count", -1)
        source = self

        def factory() -> Iterator[Any]:
            epoch = 0
            while times < 0 or epoch < times:
                produced = False
                for element in source:
                    produced = True
                    yield element
                if not produced:
                    return
                epoch += 1

        card = self._cardinality
        if times == 0 or card == 0:
            card = 0
        elif times < 0:
            card = _UNKNOWN if card == _UNKNOWN else _INF
        elif card >= 0:
            card = card * times
        return self._derive(factory, card, f"repeat({'' if times < 0 else times})")

    def map(self, map_func: Callable[..., Any], num_parallel_calls: Any = None, deterministic: Any = None,
            name: str | None = None) -> Dataset:
        """Applies ``map_func`` to every element.

        A tuple element is passed as positional arguments (``lambda x, y: ...``
        for ``(x, y)`` elements), anything else as one argument. The result's
        leaves are converted to numpy values. ``num_parallel_calls``,
        ``deterministic`` and ``name`` are accepted for compatibility; the
        function runs eagerly on numpy values, in order.
        """
        if not callable(map_func):
            raise InvalidArgumentError(f"map: map_func must be callable, got {type(map_func).__name__}")
        label = getattr(map_func, "__name__", "fn")
        source = self

        def factory() -> Iterator[Any]:
            for element in source:
                yield _normalize(_call_unpacked(map_func, element), f"map({label})")

        return self._derive(factory, self._cardinality, f"map({label})", keep_batch_size=False)

    def filter(self, predicate: Callable[..., Any]) -> Dataset:
        """Keeps the elements for which ``predicate`` (called like :meth:`map`'s function) is true."""
        if not callable(predicate):
            raise InvalidArgumentError(f"filter: predicate must be callable, got {type(predicate).__name__}")
        label = getattr(predicate, "__name__", "fn")
        source = self

        def factory() -> Iterator[Any]:
            for element in source:
                keep = np.asarray(_call_unpacked(predicate, element))
                if keep.shape != ():
                    raise InvalidArgumentError(
                        f"filter({label}): the predicate must return a scalar bool, got shape {keep.shape}")
                if bool(keep):
                    yield element

        card = _INF if self._cardinality == _INF else _UNKNOWN
        return self._derive(factory, card, f"filter({label})")

    def shard(self, num_shards: int, index: int) -> Dataset:
        """Keeps every ``num_shards``-th element starting at ``index`` (elements
        ``i`` with ``i % num_shards == index``).

        Raises:
            InvalidArgumentError: ``num_shards < 1`` or ``index`` not in
                ``[0, num_shards)``.
        """
        shards = _check_count(num_shards, "shard: num_shards", 1)
        position = _check_count(index, "shard: index", 0)
        if position >= shards:
            raise InvalidArgumentError(f"shard: index must be in [0, num_shards) = [0, {shards}), got {position}")
        source = self

        def factory() -> Iterator[Any]:
            return itertools.islice(source, position, None, shards)

        card = self._cardinality
        if card >= 0:
            card = max(0, (card - position + shards - 1) // shards)
        return self._derive(factory, card, f"shard({shards}, {position})")

    def take(self, count: int) -> Dataset:
        """The first ``count`` elements (all of them for -1)."""
        n = _check_count(count, "take: count", -1)
        source = self

        def factory() -> Iterator[Any]:
            return iter(source) if n < 0 else itertools.islice(source, n)

        card = self._cardinality
        if n >= 0:
            card = n if card == _INF else (min(card, n) if card >= 0 else (0 if n == 0 else _UNKNOWN))
        return self._derive(factory, card, f"take({n})")

    def skip(self, count: int) -> Dataset:
        """All but the first ``count`` elements (none for -1)."""
        n = _check_count(count, "skip: count", -1)
        source = self

        def factory() -> Iterator[Any]:
            if n < 0:
                return iter(())
            return itertools.islice(source, n, None)

        card = self._cardinality
        if n < 0:
            card = 0
        elif card >= 0:
            card = max(0, card - n)
        return self._derive(factory, card, f"skip({n})")

    def prefetch(self, buffer_size: int) -> Dataset:
        """Produces elements ahead of the consumer in a background thread.

        Up to ``buffer_size`` elements (:data:`AUTOTUNE`: 2) wait in a
        bounded queue while the consumer works on the current one; 0 is a
        pass-through. The pipeline before ``prefetch`` runs in that thread
        (functions given to ``map`` see no strategy scope of the consumer).
        An exception raised by the pipeline is re-raised by the consumer's
        ``next()`` with its original type, after the elements produced
        before it. Abandoning the iteration (``break``, or dropping the
        iterator) stops the thread; nothing waits forever.
        """
        if buffer_size == AUTOTUNE:
            size = _AUTOTUNE_BUFFER
        else:
            size = _check_count(buffer_size, "prefetch: buffer_size (or gd.data.AUTOTUNE)", 0)
        source = self
        if size == 0:
            return self._derive(lambda: iter(source), self._cardinality, "prefetch(0)")
        return self._derive(lambda: prefetch_iterator(lambda: iter(source), size), self._cardinality,
                            f"prefetch({size})")


def _stack(elements: list[Any], batch_size: int) -> Any:
    first_leaves, treedef = nest.flatten(elements[0])
    columns: list[list[Any]] = [[leaf] for leaf in first_leaves]
    for position, element in enumerate(elements[1:], start=1):
        leaves, other = nest.flatten(element)
        if other != treedef:
            raise InvalidArgumentError(
                f"batch({batch_size}): element {position} of a batch has structure {_short(element)} but element 0 "
                f"has {_short(elements[0])}; every element must have the same structure")
        for column, leaf in zip(columns, leaves):
            column.append(leaf)
    stacked = []
    for index, column in enumerate(columns):
        shapes = {np.shape(v) for v in column}
        if len(shapes) > 1:
            raise InvalidArgumentError(
                f"batch({batch_size}): component {index} has different shapes within one batch: "
                f"{sorted(shapes)}; batch needs elements of one shape (pad or resize them first, e.g. with map)")
        stacked.append(np.stack(column))
    return nest.unflatten(treedef, stacked)


# ------------------------------------------------------------------ prefetch
_ITEM, _END, _ERROR = "item", "end", "error"
_POLL_S = 0.05


def prefetch_iterator(make_source: Callable[[], Iterator[Any]], buffer_size: int) -> Iterator[Any]:
    """Iterates ``make_source()`` in a daemon thread, ``buffer_size`` elements ahead.

    Exceptions from the source are re-raised here; closing the returned
    generator (or letting it be collected) stops the thread and closes the
    source iterator.
    """
    items: queue.Queue = queue.Queue(maxsize=buffer_size)
    stop = threading.Event()

    def put(entry: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                items.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = None
        try:
            source = make_source()
            for element in source:
                if not put((_ITEM, element)):
                    return
            final = (_END, None)
        except BaseException as error:  # noqa: BLE001 - forwarded to the consumer
            final = (_ERROR, error)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing must not mask the pipeline's result
                    pass
        put(final)

    thread = threading.Thread(target=produce, name="graphdist-prefetch", daemon=True)

    def consume() -> Iterator[Any]:
        thread.start()
        try:
            while True:
                try:
                    kind, payload = items.get(timeout=_POLL_S)
                except queue.Empty:
                    if not thread.is_alive() and items.empty():
                        raise RuntimeError("prefetch: the producer thread ended without a result") from None
                    continue
                if kind == _ITEM:
                    yield payload
                elif kind == _END:
                    return
                else:
                    raise payload
        finally:
            stop.set()

    return consume()


# ------------------------------------------------------------------ iterables
def as_dataset(value: Any, what: str = "dataset") -> Dataset:
    """A :class:`Dataset` as is; any other iterable of numpy nests wrapped in one.

    The wrapper calls ``iter(value)`` per iteration: a list or tuple can be
    iterated many times, a generator or iterator only once. Non-numpy leaves
    of its elements are converted with ``np.asarray``; lists inside elements
    are structures here (as in :mod:`graphdist.nest`).

    Raises:
        InvalidArgumentError: ``value`` is not iterable, or is a numpy array,
            dict or string (ambiguous: use ``Dataset.from_tensor_slices``).
    """
    if isinstance(value, Dataset):
        return value
    if isinstance(value, (np.ndarray, np.generic, dict, str, bytes)):
        raise InvalidArgumentError(
            f"{what}: got a {type(value).__name__}, not a dataset; wrap arrays with "
            "gd.data.Dataset.from_tensor_slices(value).batch(global_batch_size)")
    if not isinstance(value, Iterable):
        raise InvalidArgumentError(
            f"{what}: expected a gd.data.Dataset or an iterable of numpy nests, got {type(value).__name__}")
    card = len(value) if hasattr(value, "__len__") else _UNKNOWN

    def factory() -> Iterator[Any]:
        for element in value:
            yield _normalize_element(element, what)

    return Dataset(factory, card, f"from_iterable({type(value).__name__})")
