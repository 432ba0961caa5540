"""Tests for graphdist.runtime.comm.local: the in-process all-reduce and all-gather."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest

import graphdist as gd
from graphdist.errors import InvalidArgumentError
from graphdist.runtime.comm import algorithms, local
from graphdist.trace.variables import Variable

ALGORITHMS = local.ALGORITHMS
OPS = ("SUM", "MEAN", "MAX", "MIN")
DTYPES = (np.float32, np.float64, np.int32, np.int64)
COUNTS = (1, 2, 3, 4)


@pytest.fixture(autouse=True)
def _restore_settings():
    previous = local.settings()
    yield
    local.configure(**previous)


@pytest.fixture
def small_blocks(monkeypatch):
    """Makes blocking, threading and output reuse kick in on small buffers."""
    monkeypatch.setattr(local, "BLOCK_BYTES", 256)
    monkeypatch.setattr(local, "PARALLEL_MIN_BYTES", 512)
    monkeypatch.setattr(local, "REUSE_MIN_BYTES", 512)


def _buffers(count: int, dtype, shape=(5, 7), seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(shape).astype(dtype) * 10 for _ in range(count)]
    return [rng.integers(-1000, 1000, size=shape).astype(dtype) for _ in range(count)]


def _numpy_reduce(buffers: list[np.ndarray], op: str) -> np.ndarray:
    stacked = np.stack(buffers)
    dtype = buffers[0].dtype
    if op == "MAX":
        return stacked.max(axis=0)
    if op == "MIN":
        return stacked.min(axis=0)
    total = stacked.sum(axis=0, dtype=dtype)
    if op == "SUM":
        return total
    return total // len(buffers) if dtype.kind in "iu" else (total / len(buffers)).astype(dtype)


def _in_order(buffers: list[np.ndarray], op: str, algorithm: str, root: int = 0) -> np.ndarray:
    """The documented summation order, written out plainly (whole arrays, no blocking)."""
    combine = {"SUM": np.add, "MEAN": np.add, "MAX": np.maximum, "MIN": np.minimum}[op]
    count = len(buffers)
    flats = [b.reshape(-1) for b in buffers]
    if count == 1:
        out = flats[0].copy()
    elif algorithm == "ring":
        out = np.empty_like(flats[0])
        size = out.size
        for chunk in range(count):
            lo, hi = chunk * size // count, (chunk + 1) * size // count
            order = [(chunk + k) % count for k in range(1, count + 1)]
            acc = flats[order[0]][lo:hi]
            for index in order[1:]:
                acc = combine(acc, flats[index][lo:hi])
            out[lo:hi] = acc
    elif algorithm == "hierarchical_copy":
        level = list(flats)
        while len(level) > 1:
            nxt = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        out = level[0]
    else:
        out = flats[root]
        for index in range(count):
            if index != root:
                out = combine(out, flats[index])
    if op == "MEAN" and count > 1:
        out = out // count if out.dtype.kind in "iu" else out / out.dtype.type(count)
    return out.reshape(buffers[0].shape)


# ------------------------------------------------------------ correctness
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_all_reduce_equals_numpy(algorithm, op, dtype, count) -> None:
    buffers = _buffers(count, dtype)
    results = local.all_reduce(buffers, op, algorithm, root=count - 1)
    expected = _numpy_reduce(buffers, op)
    assert len(results) == count
    assert all(r is results[0] for r in results)
    result = results[0]
    assert result.shape == buffers[0].shape and result.dtype == np.dtype(dtype)
    if np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal(result, expected)
    else:
        np.testing.assert_allclose(result, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-4)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", (2, 3, 4, 5, 8))
@pytest.mark.parametrize("threads", (1, 2))
def test_blocked_and_threaded_paths_keep_the_order_bitwise(small_blocks, algorithm, op, dtype, count, threads) -> None:
    local.configure(threads=threads)
    buffers = _buffers(count, dtype, shape=(37, 29), seed=count)  # 1073 elements: many uneven blocks
    root = count // 2
    result = local.all_reduce(buffers, op, algorithm, root=root)[0]
    np.testing.assert_array_equal(result, _in_order(buffers, op, algorithm, root))
    if np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal(result, _numpy_reduce(buffers, op))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("count", (2, 3, 4, 7))
def test_default_path_keeps_the_order_bitwise(algorithm, count) -> None:
    buffers = _buffers(count, np.float32, shape=(3, 11), seed=7)
    for op in ("SUM", "MEAN"):
        np.testing.assert_array_equal(local.all_reduce(buffers, op, algorithm, root=1)[0],
                                      _in_order(buffers, op, algorithm, root=1))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_large_buffers_every_path(algorithm) -> None:
    """Real sizes: past BLOCK_BYTES, PARALLEL_MIN_BYTES and REUSE_MIN_BYTES."""
    size = (local.PARALLEL_MIN_BYTES // 4) + 12345
    for count, threads, op in [(2, 1, "SUM"), (2, 2, "MEAN"), (3, 2, "SUM"), (4, 1, "MEAN"), (4, 2, "MAX")]:
        local.configure(threads=threads)
        buffers = _buffers(count, np.float32, shape=(size,), seed=count)
        result = local.all_reduce(buffers, op, algorithm, root=count - 1)[0]
        np.testing.assert_array_equal(result, _in_order(buffers, op, algorithm, root=count - 1))


def test_mean_of_integers_is_floor_division() -> None:
    buffers = [np.array([-3, 3, 5, -5, 7], np.int32), np.array([0, 0, 0, 0, 0], np.int32)]
    for algorithm in ALGORITHMS:
        (result, _) = local.all_reduce(buffers, "MEAN", algorithm)
        np.testing.assert_array_equal(result, [-2, 1, 2, -3, 3])
        assert result.dtype == np.int32
    three = [np.array([1, -1], np.int64), np.array([1, -1], np.int64), np.array([0, 0], np.int64)]
    np.testing.assert_array_equal(local.all_reduce(three, "MEAN")[0], [0, -1])
    unsigned = [np.array([7, 8], np.uint8), np.array([0, 1], np.uint8)]
    np.testing.assert_array_equal(local.all_reduce(unsigned, "MEAN")[0], [3, 4])


def test_float_mean_divides_in_the_dtype() -> None:
    buffers = [np.full(4, 1.0, np.float32), np.full(4, 2.0, np.float32), np.full(4, 0.5, np.float32)]
    result = local.all_reduce(buffers, "MEAN")[0]
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, np.full(4, np.float32(3.5) / np.float32(3)))


def test_integer_sum_wraps_like_numpy() -> None:
    big = np.array([np.iinfo(np.int32).max], np.int32)
    np.testing.assert_array_equal(local.all_reduce([big, big], "SUM")[0], big + big)


def test_other_dtypes_and_reduce_op_spellings() -> None:
    halves = [np.array([1.5, -2.0], np.float16), np.array([0.25, 4.0], np.float16)]
    np.testing.assert_array_equal(local.all_reduce(halves, "sum")[0], np.array([1.75, 2.0], np.float16))
    complexes = [np.array([1 + 2j]), np.array([3 - 1j])]
    np.testing.assert_array_equal(local.all_reduce(complexes, gd.ReduceOp.MEAN)[0], [2 + 0.5j])
    flags = [np.array([True, False, False]), np.array([True, True, False])]
    np.testing.assert_array_equal(local.all_reduce(flags, "SUM")[0], [True, True, False])
    np.testing.assert_array_equal(local.all_reduce(flags, "MIN")[0], [True, False, False])


def test_scalars_and_empty_buffers() -> None:
    for algorithm in ALGORITHMS:
        result = local.all_reduce([np.float32(1.5), np.float32(2.0), np.float32(3.0)], "SUM", algorithm)[0]
        assert result.shape == () and result == np.float32(6.5)
        empty = local.all_reduce([np.zeros((0, 3), np.int64)] * 3, "MAX", algorithm)[0]
        assert empty.shape == (0, 3) and empty.dtype == np.int64


def test_accepts_array_likes_and_tuples() -> None:
    result = local.all_reduce(([1.0, 2.0], np.array([3.0, 4.0])), "SUM")
    np.testing.assert_array_equal(result[0], [4.0, 6.0])


# ------------------------------------------------------------ non-contiguous
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("layout", ("transposed", "strided", "fortran", "strided_1d", "mixed"))
def test_non_contiguous_inputs(algorithm, layout) -> None:
    rng = np.random.default_rng(3)
    bases = [rng.standard_normal((8, 12)).astype(np.float32) for _ in range(3)]
    if layout == "transposed":
        buffers = [b.T for b in bases]
    elif layout == "strided":
        buffers = [b[::2, 1::3] for b in bases]
    elif layout == "fortran":
        buffers = [np.asfortranarray(b) for b in bases]
    elif layout == "strided_1d":
        buffers = [b.reshape(-1)[::5] for b in bases]
    else:
        buffers = [bases[0].T, np.ascontiguousarray(bases[1].T), bases[2].T.copy(order="F")]
    contiguous = [np.ascontiguousarray(b) for b in buffers]
    for op in OPS:
        result = local.all_reduce(buffers, op, algorithm)[0]
        assert result.shape == buffers[0].shape and result.flags.c_contiguous
        # bitwise equal to the same values laid out contiguously
        np.testing.assert_array_equal(result, local.all_reduce(contiguous, op, algorithm)[0])
        np.testing.assert_allclose(result, _numpy_reduce(contiguous, op), rtol=1e-5, atol=1e-5)


def test_non_contiguous_inputs_large(small_blocks) -> None:
    local.configure(threads=2)
    bases = _buffers(4, np.float64, shape=(40, 30), seed=9)
    buffers = [b[:, ::2] for b in bases]
    for algorithm in ALGORITHMS:
        result = local.all_reduce(buffers, "SUM", algorithm)[0]
        np.testing.assert_array_equal(result, _in_order([np.ascontiguousarray(b) for b in buffers], "SUM", algorithm))


# ------------------------------------------------------------ aliasing
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("count", COUNTS)
def test_result_is_read_only_and_never_aliases_inputs(algorithm, count) -> None:
    buffers = _buffers(count, np.float64)
    originals = [b.copy() for b in buffers]
    result = local.all_reduce(buffers, "SUM", algorithm)[0]
    assert not result.flags.writeable
    with pytest.raises(ValueError):
        result[0, 0] = 1.0
    for buffer, original in zip(buffers, originals):
        np.testing.assert_array_equal(buffer, original)  # inputs untouched
        assert not np.shares_memory(result, buffer)
    snapshot = result.copy()
    for buffer in buffers:
        buffer += 100.0
    np.testing.assert_array_equal(result, snapshot)


@pytest.mark.parametrize("size", (1000, (local.REUSE_MIN_BYTES // 8) + 1))
def test_results_not_mutated_by_later_calls(size) -> None:
    first_inputs = _buffers(3, np.float64, shape=(size,), seed=1)
    kept = local.all_reduce(first_inputs, "SUM")
    snapshot = kept[0].copy()
    view = kept[0][::3]
    view_snapshot = view.copy()
    for seed in range(2, 6):
        for algorithm in ALGORITHMS:
            local.all_reduce(_buffers(3, np.float64, shape=(size,), seed=seed), "MAX", algorithm)
    np.testing.assert_array_equal(kept[0], snapshot)
    del kept
    for seed in range(6, 9):
        local.all_reduce(_buffers(3, np.float64, shape=(size,), seed=seed), "MIN")
    np.testing.assert_array_equal(view, view_snapshot)  # a view keeps its memory from being reused


def test_memoryview_export_keeps_the_buffer() -> None:
    size = local.REUSE_MIN_BYTES // 4
    exported = memoryview(local.all_reduce(_buffers(2, np.float32, shape=(size,)), "SUM")[0])
    snapshot = np.array(exported, copy=True)
    for seed in range(3):
        local.all_reduce(_buffers(2, np.float32, shape=(size,), seed=seed + 10), "SUM")
    np.testing.assert_array_equal(np.asarray(exported), snapshot)


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="output reuse needs CPython reference counts")
def test_released_outputs_are_reused() -> None:
    size = local.REUSE_MIN_BYTES // 4
    buffers = _buffers(2, np.float32, shape=(size,))
    address = local.all_reduce(buffers, "SUM")[0].__array_interface__["data"][0]
    again = local.all_reduce(buffers, "SUM")[0]
    assert again.__array_interface__["data"][0] == address
    local.configure(pool_bytes=0)
    assert local._pool.nbytes() == 0
    fresh = local.all_reduce(buffers, "SUM")[0]
    np.testing.assert_array_equal(fresh, again)


def test_pool_respects_its_capacity() -> None:
    local.clear_pool()
    size = local.REUSE_MIN_BYTES // 4
    local.configure(pool_bytes=2 * local.REUSE_MIN_BYTES)
    held = [local.all_reduce(_buffers(2, np.float32, shape=(size,), seed=s), "SUM")[0] for s in range(4)]
    assert local._pool.nbytes() <= 2 * local.REUSE_MIN_BYTES
    assert len({h.__array_interface__["data"][0] for h in held}) == 4
    del held
    local.configure(pool_bytes=local.REUSE_MIN_BYTES)
    assert local._pool.nbytes() <= local.REUSE_MIN_BYTES


def test_concurrent_callers_get_private_results() -> None:
    from concurrent.futures import ThreadPoolExecutor

    local.configure(threads=2)
    size = local.REUSE_MIN_BYTES // 4 + 7

    def job(seed: int) -> bool:
        ok = True
        for step in range(4):
            buffers = [np.full(size, seed * 100 + step + k, np.float32) for k in range(3)]
            results = [local.all_reduce(buffers, "SUM", algorithm)[0] for algorithm in ALGORITHMS]
            expected = np.float32(3 * (seed * 100 + step) + 3)
            ok &= all(bool((r == expected).all()) for r in results)
        return ok

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(job, range(8)))


def test_variable_write_copies_a_shared_result() -> None:
    buffers = _buffers(2, np.float32, shape=(3, 4))
    results = local.all_reduce(buffers, "SUM")
    first, second = Variable(np.zeros((3, 4), np.float32)), Variable(np.zeros((3, 4), np.float32))
    first.write_back(results[0])
    second.write_back(results[1])
    assert first._value is not results[0] and first._value.flags.writeable
    assert not np.shares_memory(first._value, second._value)
    first._value += 1.0  # in-place writes stay private to the variable
    np.testing.assert_array_equal(second._value, results[0])


# ------------------------------------------------------------ all-gather
@pytest.mark.parametrize("axis", (0, 1, 2, -1, -3))
@pytest.mark.parametrize("count", COUNTS)
def test_all_gather_any_axis(axis, count) -> None:
    rng = np.random.default_rng(count)
    buffers = []
    for index in range(count):
        shape = [2, 3, 4]
        shape[axis] = index + 1  # uneven sizes along the gather axis
        buffers.append(rng.standard_normal(shape).astype(np.float32))
    results = local.all_gather(buffers, axis)
    assert len(results) == count and all(r is results[0] for r in results)
    np.testing.assert_array_equal(results[0], np.concatenate(buffers, axis=axis))
    assert not results[0].flags.writeable
    assert not any(np.shares_memory(results[0], b) for b in buffers)


def test_all_gather_large_and_non_contiguous() -> None:
    rows = local.REUSE_MIN_BYTES // (4 * 64) + 3
    buffers = [b.T for b in _buffers(2, np.int32, shape=(64, rows))]
    result = local.all_gather(buffers, 0)[0]
    np.testing.assert_array_equal(result, np.concatenate(buffers, axis=0))
    snapshot = result.copy()
    local.all_gather([b + 1 for b in buffers], 0)
    np.testing.assert_array_equal(result, snapshot)


def test_all_gather_errors() -> None:
    with pytest.raises(InvalidArgumentError, match=r"axis 2 is out of range for rank-2"):
        local.all_gather([np.zeros((2, 3))] * 2, 2)
    with pytest.raises(InvalidArgumentError, match="rank >= 1"):
        local.all_gather([np.float32(1.0)] * 2)
    with pytest.raises(InvalidArgumentError, match=r"replica 0: float32 \(2, 3\), replica 1: float32 \(2, 4\)"):
        local.all_gather([np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)], 0)
    with pytest.raises(InvalidArgumentError, match=r"replica 1: float64 \(2, 3\)"):
        local.all_gather([np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64)], 0)
    with pytest.raises(InvalidArgumentError, match="at least one"):
        local.all_gather([], 0)


# ------------------------------------------------------------ all-to-all
@pytest.mark.parametrize(("split_axis", "concat_axis"), [(0, 1), (1, 0), (2, 0), (-1, 1), (1, 1)])
@pytest.mark.parametrize("count", COUNTS)
def test_all_to_all_equals_the_op_reference(split_axis, concat_axis, count) -> None:
    """Participant j gets chunk j of every participant's buffer, joined in participant order: the op's numpy
    reference (graphdist.ir.comm_ops), written independently of the communicator, and a hand-made case agree."""
    from graphdist.ir.graph import GRAPHDIST_DOMAIN
    from graphdist.ir.ops import get_opdef

    shape = [2 * count, 3 * count, 4 * count]
    buffers = [np.random.default_rng(i).standard_normal(shape).astype(np.float32) for i in range(count)]
    results = local.all_to_all(buffers, split_axis, concat_axis)
    reference = get_opdef("AllToAll", GRAPHDIST_DOMAIN).reference(*buffers, split_axis=split_axis,
                                                                   concat_axis=concat_axis)
    assert len(results) == len(reference) == count
    for got, want in zip(results, reference):
        np.testing.assert_array_equal(got, want)
        assert not got.flags.writeable
        assert not any(np.shares_memory(got, b) for b in buffers)
    expected = list(shape)
    expected[split_axis] //= count
    expected[concat_axis] *= count
    assert all(r.shape == tuple(expected) for r in results)


def test_all_to_all_moves_a_column_split_to_a_row_split() -> None:
    whole = np.arange(24, dtype=np.int64).reshape(4, 6)
    columns = [whole[:, :3], whole[:, 3:]]  # non-contiguous blocks, as a column split holds them
    rows = local.all_to_all(columns, split_axis=0, concat_axis=1)
    np.testing.assert_array_equal(rows[0], whole[:2])
    np.testing.assert_array_equal(rows[1], whole[2:])
    out = _through_handler([whole[:2], whole[2:]], {"split_axis": 1, "concat_axis": 0})
    np.testing.assert_array_equal(np.concatenate(out, axis=1), whole)


def _through_handler(buffers: list, attrs: dict) -> list:
    from graphdist.runtime.comm.handlers import comm_handler

    return comm_handler("AllToAll")("AllToAll", attrs, buffers)


def test_all_to_all_large_outputs_are_private() -> None:
    rows = local.REUSE_MIN_BYTES // (4 * 8) + 8
    buffers = _buffers(2, np.float32, shape=(rows, 8))
    first = local.all_to_all(buffers, 1, 0)
    snapshot = [r.copy() for r in first]
    second = local.all_to_all([b + 1 for b in buffers], 1, 0)
    assert not np.shares_memory(first[0], first[1]) and not np.shares_memory(first[0], second[0])
    for got, want in zip(first, snapshot):
        np.testing.assert_array_equal(got, want)


def test_all_to_all_errors() -> None:
    with pytest.raises(InvalidArgumentError, match=r"split_axis 1 of shape \(2, 3\) does not split into 2"):
        local.all_to_all([np.zeros((2, 3))] * 2, 1, 0)
    with pytest.raises(InvalidArgumentError, match="concat_axis 2 is out of range for rank-2"):
        local.all_to_all([np.zeros((2, 4))] * 2, 1, 2)
    with pytest.raises(InvalidArgumentError, match="rank >= 1"):
        local.all_to_all([np.float32(1.0)] * 2)
    with pytest.raises(InvalidArgumentError, match=r"replica 1: float32 \(2, 6\)"):
        local.all_to_all([np.zeros((2, 4), np.float32), np.zeros((2, 6), np.float32)], 1, 0)


# ------------------------------------------------------------ errors
def test_all_reduce_shape_mismatch_names_every_replica() -> None:
    buffers = [np.zeros((4, 3), np.float32), np.zeros((4, 3), np.float32), np.zeros((4,), np.float32)]
    with pytest.raises(InvalidArgumentError) as info:
        local.all_reduce(buffers, "SUM")
    message = str(info.value)
    assert "replica 0: float32 (4, 3)" in message and "replica 2: float32 (4,)" in message
    assert "one shape and dtype" in message


def test_all_reduce_dtype_mismatch_names_them() -> None:
    with pytest.raises(InvalidArgumentError, match=r"replica 0: float32 \(3,\), replica 1: int64 \(3,\)"):
        local.all_reduce([np.zeros(3, np.float32), np.zeros(3, np.int64)], "SUM")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"algorithm": "nccl"}, r"unknown algorithm 'nccl'; use one of ring, hierarchical_copy, reduce_to_one"),
        ({"reduce_op": "PROD"}, r"unknown reduce op 'PROD'; use one of SUM, MEAN, MAX, MIN"),
        ({"reduce_op": None}, r"unknown reduce op None"),
        ({"algorithm": "reduce_to_one", "root": 2}, r"root=2 is not a replica index \(0\.\.1\)"),
        ({"algorithm": "reduce_to_one", "root": -1}, r"root=-1"),
    ],
)
def test_all_reduce_argument_errors(kwargs, pattern) -> None:
    with pytest.raises(InvalidArgumentError, match=pattern):
        local.all_reduce([np.zeros(3), np.zeros(3)], **kwargs)


def test_all_reduce_bad_buffers() -> None:
    with pytest.raises(InvalidArgumentError, match="at least one"):
        local.all_reduce([], "SUM")
    with pytest.raises(InvalidArgumentError, match="needs a list with one array per replica, got ndarray"):
        local.all_reduce(np.zeros((2, 3)), "SUM")
    with pytest.raises(InvalidArgumentError, match="MEAN of bool"):
        local.all_reduce([np.array([True]), np.array([False])], "MEAN")
    with pytest.raises(InvalidArgumentError, match="dtype <U1 cannot be combined"):
        local.all_reduce([np.array(["a"]), np.array(["b"])], "SUM")
    assert isinstance(InvalidArgumentError("x"), ValueError)


def test_configure_validates_and_restores() -> None:
    with pytest.raises(InvalidArgumentError, match="threads must be at least 1"):
        local.configure(threads=0)
    with pytest.raises(InvalidArgumentError, match="pool_bytes must be at least 0"):
        local.configure(pool_bytes=-1)
    previous = local.configure(threads=3)
    assert local.settings()["threads"] == 3
    local.configure(**previous)
    assert local.settings() == previous


# ------------------------------------------------------------ schedules
@pytest.mark.parametrize("count", range(2, 12))
def test_pairwise_tree_uses_few_scratch_slots(count) -> None:
    steps = algorithms._pairwise(count)
    assert len(steps) == count - 1
    depth = (count - 1).bit_length()  # levels of the pairwise tree
    assert max(dest for dest, _, _ in steps) <= max(0, depth - 1)
    # Replaying the steps with sets of inputs instead of numbers gives every input once, in a tree.
    slots: dict[int, frozenset] = {}
    for dest, a, b in steps:
        left = frozenset([a]) if a >= 0 else slots[~a]
        right = frozenset([b]) if b >= 0 else slots[~b]
        assert not left & right
        slots[dest] = left | right
    assert slots[0] == frozenset(range(count))
    used = sorted(op for _, a, b in steps for op in (a, b) if op >= 0)
    assert used == list(range(count))


def test_many_replicas() -> None:
    buffers = _buffers(9, np.int64, shape=(50,))
    for algorithm, op in itertools.product(ALGORITHMS, OPS):
        np.testing.assert_array_equal(local.all_reduce(buffers, op, algorithm, root=4)[0],
                                      _numpy_reduce(buffers, op))


# ------------------------------------------------------------ benchmark
def test_allreduce_benchmark_smoke() -> None:
    from benchmarks import bench_allreduce as bench

    results = bench.run(rounds=2, quick=True, sizes=(4 << 10, 64 << 10), replicas=(2, 3))
    assert len(results["cases"]) == 4
    for case in results["cases"]:
        assert case["bound_us"] > 0
        assert set(case["ratio"]) == set(ALGORITHMS)
        assert all(np.isfinite(r) and r > 0 for r in case["ratio"].values())
    assert results["worst"] is None and results["goal_met"]  # no large buffers measured
    text = bench.markdown(results)
    assert text.startswith("## All-reduce vs the physical bound") and "### 3 replicas" in text
    assert "ring" in bench.table(results)
