"""gd.data.Dataset: constructors, transformations, cardinality and prefetch."""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import pytest

import graphdist as gd
from graphdist.data import AUTOTUNE, INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, as_dataset


def values(ds) -> list:
    return [v.tolist() if isinstance(v, np.ndarray) else v for v in ds]


# ----------------------------------------------------------------- range
def test_range_yields_int64_scalars_and_is_reiterable() -> None:
    ds = Dataset.range(4)
    items = list(ds)
    assert items == [0, 1, 2, 3]
    assert all(type(v) is np.int64 for v in items)
    assert list(ds) == items  # each iter() starts over
    assert ds.cardinality() == 4 and len(ds) == 4


def test_range_start_stop_step_and_dtype() -> None:
    assert list(Dataset.range(2, 10, 3)) == [2, 5, 8]
    assert list(Dataset.range(5, 1, -2)) == [5, 3]
    assert Dataset.range(2, 10, 3).cardinality() == 3
    assert all(type(v) is np.int32 for v in Dataset.range(3, dtype=np.int32))
    with pytest.raises(gd.InvalidArgumentError, match="step"):
        Dataset.range(0, 4, 0)
    with pytest.raises(gd.InvalidArgumentError, match="1 to 3"):
        Dataset.range()


def test_empty_dataset_through_every_op() -> None:
    empty = Dataset.range(0)
    assert list(empty) == []
    assert empty.cardinality() == 0
    chained = empty.shuffle(4, seed=0).map(lambda x: x + 1).batch(2).repeat().take(3).prefetch(2)
    assert list(chained) == []
    assert list(empty.repeat()) == []  # infinite repeat of nothing stops
    assert empty.repeat().cardinality() == 0
    assert list(empty.shard(2, 1)) == []


# ------------------------------------------------------ from_tensor_slices
def test_from_tensor_slices_array_and_list() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    rows = list(Dataset.from_tensor_slices(x))
    assert len(rows) == 3 and rows[1].dtype == np.float32
    np.testing.assert_array_equal(rows[2], [4.0, 5.0])
    # A Python list is a value (like tf.data), not a structure.
    assert values(Dataset.from_tensor_slices([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    scalars = list(Dataset.from_tensor_slices(np.array([1.5, 2.5])))
    assert type(scalars[0]) is np.float64


def test_from_tensor_slices_tuples_and_dicts() -> None:
    x = np.arange(3)
    y = np.array([10.0, 20.0, 30.0], np.float32)
    pairs = list(Dataset.from_tensor_slices((x, y)))
    assert pairs[1] == (1, np.float32(20.0)) and isinstance(pairs[1], tuple)
    records = list(Dataset.from_tensor_slices({"a": x, "b": (y, x * 2)}))
    assert records[2]["a"] == 2 and records[2]["b"] == (30.0, 4)


def test_from_tensor_slices_length_mismatch_names_lengths() -> None:
    with pytest.raises(gd.InvalidArgumentError, match=r"3 \(shape \(3,\)\).*4 \(shape \(4, 2\)\)") as info:
        Dataset.from_tensor_slices((np.arange(3), np.zeros((4, 2))))
    assert isinstance(info.value, ValueError)
    with pytest.raises(gd.InvalidArgumentError, match="scalar"):
        Dataset.from_tensor_slices((np.arange(3), 5))
    with pytest.raises(gd.InvalidArgumentError, match="no arrays"):
        Dataset.from_tensor_slices(())


def test_from_tensors_single_element() -> None:
    ds = Dataset.from_tensors(([1.0], [2.0]))
    (element,) = list(ds)
    assert isinstance(element, tuple)
    np.testing.assert_array_equal(element[0], [1.0])
    assert ds.cardinality() == 1
    assert type(list(Dataset.from_tensors(7))[0]) is np.int64


def test_from_generator_reiterable_and_checks_callable() -> None:
    def gen():
        yield from ((i, [i, i]) for i in range(3))

    ds = Dataset.from_generator(gen)
    first = list(ds)
    assert len(first) == 3 and len(list(ds)) == 3
    np.testing.assert_array_equal(first[2][1], [2, 2])
    assert ds.cardinality() == UNKNOWN_CARDINALITY
    with pytest.raises(gd.InvalidArgumentError, match="callable"):
        Dataset.from_generator(gen())


# ----------------------------------------------------------------- batch
def test_batch_keeps_partial_last_batch() -> None:
    ds = Dataset.range(7).batch(3)
    assert values(ds) == [[0, 1, 2], [3, 4, 5], [6]]
    assert ds.cardinality() == 3
    assert list(ds)[0].dtype == np.int64


def test_batch_drop_remainder() -> None:
    ds = Dataset.range(7).batch(3, drop_remainder=True)
    assert values(ds) == [[0, 1, 2], [3, 4, 5]]
    assert ds.cardinality() == 2
    assert list(Dataset.range(2).batch(3, drop_remainder=True)) == []


def test_batch_of_structures_stacks_per_leaf() -> None:
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    batches = list(Dataset.from_tensor_slices({"x": x, "y": np.arange(4)}).batch(2))
    assert batches[1]["x"].shape == (2, 2) and batches[1]["y"].tolist() == [2, 3]


def test_batch_rejects_bad_sizes_and_ragged_elements() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="batch_size"):
        Dataset.range(3).batch(0)
    ragged = Dataset.from_generator(lambda: iter([np.zeros(2), np.zeros(3)])).batch(2)
    with pytest.raises(gd.InvalidArgumentError, match=r"different shapes.*\(2,\).*\(3,\)"):
        list(ragged)


# ---------------------------------------------------------------- shuffle
def test_shuffle_is_a_deterministic_permutation_for_a_seed() -> None:
    a = list(Dataset.range(50).shuffle(10, seed=7))
    b = list(Dataset.range(50).shuffle(10, seed=7))
    assert a == b
    assert sorted(a) == list(range(50))
    assert a != list(range(50))
    assert list(Dataset.range(50).shuffle(10, seed=8)) != a


def test_shuffle_reshuffles_each_iteration_reproducibly() -> None:
    ds = Dataset.range(20).shuffle(20, seed=3)
    epochs = [list(ds) for _ in range(3)]
    assert epochs[0] != epochs[1]
    assert all(sorted(e) == list(range(20)) for e in epochs)
    again = Dataset.range(20).shuffle(20, seed=3)
    assert [list(again) for _ in range(3)] == epochs
    fixed = Dataset.range(20).shuffle(20, seed=3, reshuffle_each_iteration=False)
    assert list(fixed) == list(fixed)
    unseeded_fixed = Dataset.range(20).shuffle(20, reshuffle_each_iteration=False)
    assert list(unseeded_fixed) == list(unseeded_fixed)


def test_shuffle_buffer_one_keeps_order_and_small_buffer_stays_local() -> None:
    assert list(Dataset.range(10).shuffle(1, seed=0)) == list(range(10))
    out = list(Dataset.range(100).shuffle(2, seed=0))
    assert sorted(out) == list(range(100))
    # With a buffer of 2 an element can come out at most one place early.
    assert all(out.index(v) >= v - 1 for v in range(100))
    with pytest.raises(gd.InvalidArgumentError, match="buffer_size"):
        Dataset.range(3).shuffle(0)


def test_shuffle_then_repeat_gives_new_orders() -> None:
    out = list(Dataset.range(10).shuffle(10, seed=1).repeat(2))
    assert sorted(out[:10]) == sorted(out[10:]) == list(range(10))
    assert out[:10] != out[10:]


# ---------------------------------------------------------- repeat / take / skip
def test_repeat_and_take() -> None:
    assert list(Dataset.range(3).repeat(2)) == [0, 1, 2, 0, 1, 2]
    assert Dataset.range(3).repeat(2).cardinality() == 6
    infinite = Dataset.range(3).repeat()
    assert infinite.cardinality() == INFINITE_CARDINALITY
    assert list(infinite.take(7)) == [0, 1, 2, 0, 1, 2, 0]
    assert infinite.take(7).cardinality() == 7
    assert list(Dataset.range(3).repeat(0)) == []
    assert list(Dataset.range(3).take(-1)) == [0, 1, 2]
    assert list(Dataset.range(3).take(10)) == [0, 1, 2] and Dataset.range(3).take(10).cardinality() == 3
    with pytest.raises(gd.InvalidArgumentError, match="infinite"):
        len(infinite)
    with pytest.raises(TypeError, match="unknown"):  # like tf.data, so list(ds) keeps working
        len(Dataset.range(3).filter(lambda x: x > 0))


def test_skip() -> None:
    assert list(Dataset.range(5).skip(2)) == [2, 3, 4]
    assert Dataset.range(5).skip(2).cardinality() == 3
    assert list(Dataset.range(5).skip(9)) == [] and Dataset.range(5).skip(9).cardinality() == 0
    assert list(Dataset.range(5).skip(-1)) == []


# ------------------------------------------------------------------ map / filter
def test_map_unpacks_tuples_only() -> None:
    pairs = Dataset.from_tensor_slices((np.arange(3), np.arange(3) * 10))
    assert list(pairs.map(lambda x, y: x + y)) == [0, 11, 22]
    assert [type(v) for v in pairs.map(lambda x, y: (y, x))] == [tuple] * 3
    records = Dataset.from_tensor_slices({"a": np.arange(2)})
    assert list(records.map(lambda d: d["a"] * 2)) == [0, 2]
    Point = collections.namedtuple("Point", "x y")
    points = Dataset.from_generator(lambda: iter([Point(np.int64(1), np.int64(2))]))
    assert list(points.map(lambda p: p.x + p.y)) == [3]  # a namedtuple is passed whole
    out = list(Dataset.range(2).map(lambda x: [x, x]))  # a returned list becomes an array
    assert isinstance(out[1], np.ndarray) and out[1].tolist() == [1, 1]
    with pytest.raises(gd.InvalidArgumentError, match="callable"):
        Dataset.range(2).map(3)


def test_map_then_batch_and_filter() -> None:
    ds = Dataset.range(6).map(lambda x: x * x).batch(4)
    assert values(ds) == [[0, 1, 4, 9], [16, 25]]
    evens = Dataset.range(10).filter(lambda x: x % 2 == 0)
    assert list(evens) == [0, 2, 4, 6, 8]
    assert evens.cardinality() == UNKNOWN_CARDINALITY


def test_zip() -> None:
    zipped = Dataset.zip(Dataset.range(3), Dataset.range(10, 20))
    assert list(zipped) == [(0, 10), (1, 11), (2, 12)]
    assert zipped.cardinality() == 3
    assert list(Dataset.zip((Dataset.range(2), [np.float32(1), np.float32(2)]))) == [(0, 1.0), (1, 2.0)]


# ------------------------------------------------------------------ shard
def test_shard_partitions_elements() -> None:
    ds = Dataset.range(10)
    shards = [list(ds.shard(3, i)) for i in range(3)]
    assert shards == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [ds.shard(3, i).cardinality() for i in range(3)] == [4, 3, 3]
    with pytest.raises(gd.InvalidArgumentError, match=r"index must be in \[0, num_shards\)"):
        ds.shard(3, 3)
    with pytest.raises(gd.InvalidArgumentError, match="num_shards"):
        ds.shard(0, 0)


# --------------------------------------------------------------- prefetch
def test_prefetch_preserves_order_and_reiterates() -> None:
    ds = Dataset.range(100).map(lambda x: x + 1).prefetch(3)
    assert list(ds) == list(range(1, 101))
    assert list(ds) == list(range(1, 101))
    assert list(Dataset.range(5).prefetch(AUTOTUNE)) == [0, 1, 2, 3, 4]
    assert list(Dataset.range(5).prefetch(0)) == [0, 1, 2, 3, 4]
    assert Dataset.range(5).prefetch(2).cardinality() == 5


def test_prefetch_propagates_exceptions_after_earlier_elements() -> None:
    def explode(x):
        if x == 3:
            raise KeyError("bad element 3")
        return x

    it = iter(Dataset.range(10).map(explode).prefetch(2))
    assert [next(it), next(it), next(it)] == [0, 1, 2]
    with pytest.raises(KeyError, match="bad element 3"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_prefetch_error_in_iteration_start_propagates() -> None:
    def broken():
        raise RuntimeError("cannot open the input")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError, match="cannot open the input"):
        list(Dataset.from_generator(broken).prefetch(1))


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "graphdist-prefetch"]


def test_prefetch_of_infinite_dataset_stops_when_abandoned() -> None:
    before = len(_prefetch_threads())
    ds = Dataset.range(3).repeat().prefetch(2).prefetch(1)
    for count, _ in enumerate(ds):
        if count == 5:
            break
    it = iter(ds)
    next(it)
    it.close()
    deadline = time.monotonic() + 5
    while len(_prefetch_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_prefetch_threads()) <= before


def test_prefetch_consumer_slower_than_producer_does_not_hang() -> None:
    ds = Dataset.range(20).prefetch(1)
    out = []
    for x in ds:
        out.append(x)
        if x % 5 == 0:
            time.sleep(0.01)
    assert out == list(range(20))


# ------------------------------------------------------------------ misc
def test_as_numpy_iterator_repr_and_as_dataset() -> None:
    ds = Dataset.range(3).batch(2)
    assert values(ds.as_numpy_iterator()) == [[0, 1], [2]]
    assert "range(3).batch(2)" in repr(ds)
    wrapped = as_dataset([(np.zeros(2), 1.5)])
    (element,) = list(wrapped)
    assert type(element[1]) is np.float64 and wrapped.cardinality() == 1
    assert as_dataset(ds) is ds
    with pytest.raises(gd.InvalidArgumentError, match="from_tensor_slices"):
        as_dataset(np.zeros(3))
    with pytest.raises(gd.InvalidArgumentError, match="iterable"):
        as_dataset(5)
