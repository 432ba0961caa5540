"""In-process communicator for logical devices of one process.

Buffers are numpy arrays, one per replica. Every collective returns one
result per replica; the replicas share one result array, since they live in
one address space. The shared result is read-only (``flags.writeable`` is
False): writing into it would change every replica's value, so code that
wants to own it copies it (``Variable.write_back`` does so for read-only arrays).
A result never aliases an input, and later calls never write into a result
that is still referenced (see "output buffers" below).

All-reduce algorithms (``algorithm``) differ in the order in which each
element's contributions are combined, like their namesakes in
``tf.distribute``:

* ``"ring"``: the flat buffer is cut into one chunk per replica (chunk ``c``
  is ``[c * size // n, (c + 1) * size // n)``); chunk ``c`` is accumulated
  starting at replica ``c + 1`` and going round the ring to replica ``c``
  (reduce-scatter), then shared (all-gather);
* ``"hierarchical_copy"``: pairwise tree, ``((b0 + b1) + (b2 + b3)) + ...``;
* ``"reduce_to_one"``: ``root`` first, then the other replicas in index order.

Results of different algorithms therefore agree to float tolerance, not
bitwise; each algorithm's result is deterministic (independent of block
size and threads). ``MAX`` and ``MIN`` (and integer ``SUM``) are exact in any
order.

Reduce ops: ``SUM``, ``MEAN``, ``MAX``, ``MIN`` (any case). The result has
the inputs' dtype. ``MEAN`` divides the sum by the number of replicas in
place: floats round as ``np.divide`` does in that dtype; integers use floor
division (``np.floor_divide``: -3 // 2 == -2), like ``Strategy.reduce``.
Integer sums wrap on overflow, as numpy's do. ``SUM`` of booleans is a
logical or (numpy's ``add``); ``MEAN`` of booleans is an error.

How the work is done (none of it changes the results):

* no copies: the first combine writes straight into the output buffer
  (``np.add(a, b, out=result)``) and the rest accumulate into it in place
  (``MEAN`` divides in place too). Only multi-dimensional inputs that are not
  C-contiguous are copied once, since the ring's chunks are ranges of the
  flat C-order buffer;
* cache blocking: with three or more replicas (or ``MEAN``) a large buffer is
  processed in blocks of :data:`BLOCK_BYTES`: every contribution to a block is
  combined (and the mean divided) while the block is in cache, so memory
  traffic is about one read of each input and one write of the result,
  instead of a read-modify-write of the whole result per replica;
* threads: outputs of at least :data:`PARALLEL_MIN_BYTES` are split between
  :func:`configure` ``(threads=...)`` threads (numpy releases the GIL inside
  ufunc loops). The default is 1: on the 2-core development machine, shared
  with other work, a second thread was not faster (BENCHMARKS.md, all-reduce);
* scratch: the tree's intermediate sums go to per-thread scratch blocks kept
  between calls, never to fresh temporaries;
* output buffers: a fresh large array costs page faults (the kernel zeroes
  every page on first touch), which for a 64 MB result takes about as long
  as the additions. Outputs of at least :data:`REUSE_MIN_BYTES` are therefore taken
  from a small pool of earlier outputs, and an earlier output is reused only
  when nothing but the pool refers to it any more (its reference count,
  which counts views and buffer exports too). Nobody can observe the reuse,
  so results are never mutated while anyone holds them. The pool keeps at
  most ``configure(pool_bytes=...)`` bytes of outputs (256 MiB by default;
  0 disables it).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError
from graphdist.runtime.comm import algorithms
from graphdist.runtime.comm.algorithms import Piece

__all__ = [
    "ALGORITHMS",
    "REDUCE_OPS",
    "BLOCK_BYTES",
    "PARALLEL_MIN_BYTES",
    "REUSE_MIN_BYTES",
    "all_reduce",
    "all_gather",
    "all_to_all",
    "run_all_reduce_task",
    "run_all_gather_task",
    "run_all_to_all_task",
    "configure",
    "settings",
    "clear_pool",
]

#: The algorithms that run between logical devices (the registry, graphdist.runtime.comm.algorithms).
ALGORITHMS = algorithms.algorithm_names("local")
REDUCE_OPS = ("SUM", "MEAN", "MAX", "MIN")
_COMBINE = {"SUM": np.add, "MEAN": np.add, "MAX": np.maximum, "MIN": np.minimum}

#: Block size of the cache-blocked loop (fits in a core's 1 MB L2 with room
#: for the streamed inputs).
BLOCK_BYTES = 1 << 20
#: Outputs at least this big are split between the configured threads.
PARALLEL_MIN_BYTES = 4 << 20
#: Outputs at least this big come from the reuse pool.
REUSE_MIN_BYTES = 1 << 20

_settings: dict[str, int] = {"threads": 1, "pool_bytes": 256 << 20}


# ----------------------------------------------------------------- settings
def configure(threads: int | None = None, pool_bytes: int | None = None) -> dict[str, int]:
    """Changes how collectives execute (never what they compute).

    Args:
        threads: Threads that share one large collective (1: the calling
            thread only). The environment variable
            ``GRAPHDIST_COMM_THREADS`` sets the initial value.
        pool_bytes: Most bytes of earlier outputs kept for reuse (0 turns
            reuse off and releases the pool). ``GRAPHDIST_COMM_POOL_BYTES``
            sets the initial value.

    Returns:
        The settings before the call (pass them back to restore).

    Raises:
        InvalidArgumentError: ``threads`` < 1 or ``pool_bytes`` < 0.
    """
    previous = dict(_settings)
    if threads is not None:
        if int(threads) < 1:
            raise InvalidArgumentError(f"configure: threads must be at least 1, got {threads}")
        _settings["threads"] = int(threads)
    if pool_bytes is not None:
        if int(pool_bytes) < 0:
            raise InvalidArgumentError(f"configure: pool_bytes must be at least 0, got {pool_bytes}")
        _settings["pool_bytes"] = int(pool_bytes)
        _pool.trim(int(pool_bytes))
    return previous


def settings() -> dict[str, int]:
    """The current settings: ``{"threads": ..., "pool_bytes": ...}``."""
    return dict(_settings)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        warnings.warn(f"ignoring environment variable {name}={value!r}: not an integer (using {default})",
                      RuntimeWarning, stacklevel=2)
        return default


# -------------------------------------------------------------- output pool
def _probe_free_refs() -> int:
    holder = [np.empty(1)]
    return sys.getrefcount(holder[0])


class _Pool:
    """Earlier output buffers (flat uint8), reused once nothing else refers to them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_size: dict[int, list[np.ndarray]] = {}  # per size: least recently used first
        self._total = 0
        # Reference count of a pooled buffer that only the pool holds (the list
        # entry plus getrefcount's argument on CPython); reuse needs CPython's
        # exact reference counts.
        self._free = _probe_free_refs() if sys.implementation.name == "cpython" else -1

    def take(self, nbytes: int, capacity: int) -> np.ndarray:
        if capacity < nbytes or self._free < 0:
            return np.empty(nbytes, np.uint8)
        free = self._free
        with self._lock:
            buffers = self._by_size.get(nbytes)
            if buffers:
                for index in range(len(buffers) - 1, -1, -1):  # most recently used first
                    if sys.getrefcount(buffers[index]) == free:
                        buffers.append(buffers.pop(index))
                        return buffers[-1]
            self._trim_locked(capacity - nbytes)
            fresh = np.empty(nbytes, np.uint8)
            if self._total + nbytes <= capacity:
                self._by_size.setdefault(nbytes, []).append(fresh)
                self._total += nbytes
            return fresh

    def _trim_locked(self, limit: int) -> None:
        free = self._free
        for nbytes in list(self._by_size):  # sizes first used longest ago first
            if self._total <= limit:
                return
            buffers = self._by_size[nbytes]
            index = 0
            while self._total > limit and index < len(buffers):
                if sys.getrefcount(buffers[index]) == free:
                    del buffers[index]
                    self._total -= nbytes
                else:
                    index += 1
            if not buffers:
                del self._by_size[nbytes]

    def trim(self, limit: int) -> None:
        with self._lock:
            self._trim_locked(limit)
            if limit == 0:  # forget in-use buffers too: they stay alive through their users
                self._by_size.clear()
                self._total = 0

    def nbytes(self) -> int:
        """Bytes the pool refers to (free buffers and results still in use)."""
        with self._lock:
            return self._total


_pool = _Pool()


def clear_pool() -> None:
    """Drops every pooled output buffer (results still in use stay valid)."""
    _pool.trim(0)


def _empty(size: int, dtype: np.dtype) -> np.ndarray:
    """A flat uninitialised output of ``size`` elements, pooled when large."""
    nbytes = size * dtype.itemsize
    if nbytes < REUSE_MIN_BYTES or not _settings["pool_bytes"]:
        return np.empty(size, dtype)
    return _pool.take(nbytes, _settings["pool_bytes"]).view(dtype)


# ------------------------------------------------------------------ scratch
_local = threading.local()


def _scratch(slots: int, dtype: np.dtype) -> list[np.ndarray]:
    """``slots`` scratch blocks of BLOCK_BYTES for the calling thread, kept between calls.

    Fresh memory is expensive (the kernel zeroes every page on first touch),
    so tree reductions reuse these instead of allocating temporaries.
    """
    blocks: list[np.ndarray] = getattr(_local, "blocks", None) or []
    if len(blocks) < slots or (blocks and blocks[0].nbytes != BLOCK_BYTES):
        blocks = [b for b in blocks if b.nbytes == BLOCK_BYTES]
        blocks += [np.empty(BLOCK_BYTES, np.uint8) for _ in range(slots - len(blocks))]
        _local.blocks = blocks
    count = BLOCK_BYTES // dtype.itemsize
    return [b[: count * dtype.itemsize].view(dtype) for b in blocks[:slots]]


# ------------------------------------------------------------------ threads
_helpers: ThreadPoolExecutor | None = None
_helpers_size = 0
_helpers_lock = threading.Lock()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _helpers, _helpers_size
    with _helpers_lock:
        if _helpers is None or _helpers_size < workers:
            if _helpers is not None:
                _helpers.shutdown(wait=False)
            _helpers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="graphdist-comm")
            _helpers_size = workers
        return _helpers


# ---------------------------------------------------------------- schedules
# The algorithms' schedules (which contributions each range of the flat buffer combines, in which order)
# live in graphdist.runtime.comm.algorithms, the registry; cached here per call shape.
@lru_cache(maxsize=256)
def _plan(algorithm: str, count: int, root: int, size: int) -> tuple[Piece, ...]:
    """(lo, hi, schedule) ranges of the flat buffer for ``algorithm``."""
    schedule = algorithms.check_algorithm(algorithm, "local").local
    assert schedule is not None  # (check_algorithm returned a local one)
    return schedule(count, root, size)


# ------------------------------------------------------------------ kernels
def _run_pieces(pieces: Sequence[Piece], flats: list[np.ndarray], out: np.ndarray, combine: np.ufunc,
                divisor: int, integer: bool) -> None:
    """Executes (lo, hi, schedule) pieces of the flat output."""
    scratch: list[np.ndarray] = []
    whole = out.size
    for lo, hi, (order, steps) in pieces:
        if lo == 0 and hi == whole:
            o, views = out, flats
        else:
            o, views = out[lo:hi], [f[lo:hi] for f in flats]
        if steps is None:
            combine(views[order[0]], views[order[1]], out=o)
            for index in order[2:]:
                combine(o, views[index], out=o)
        else:
            need = max(dest for dest, _, _ in steps)
            if len(scratch) < need:
                scratch = _scratch(need, out.dtype)
            slots = [o] + [s[:hi - lo] for s in scratch[:need]]
            for dest, a, b in steps:
                combine(views[a] if a >= 0 else slots[~a], views[b] if b >= 0 else slots[~b], out=slots[dest])
        if divisor > 1:
            if integer:
                np.floor_divide(o, divisor, out=o)
            else:
                np.divide(o, divisor, out=o)


def _split(ranges: Sequence[Piece], size: int, workers: int, block: int) -> list[list[Piece]]:
    """Cuts ``ranges`` at worker boundaries (equal shares) and into blocks."""
    cuts = [w * size // workers for w in range(workers + 1)]
    shares: list[list[Piece]] = []
    for w in range(workers):
        first, last = cuts[w], cuts[w + 1]
        share = []
        for lo, hi, schedule in ranges:
            lo, hi = max(lo, first), min(hi, last)
            for start in range(lo, hi, block):
                share.append((start, min(start + block, hi), schedule))
        shares.append(share)
    return shares


def _reduce(flats: list[np.ndarray], out: np.ndarray, combine: np.ufunc, algorithm: str, root: int,
            mean: bool) -> None:
    count, size = len(flats), out.size
    ranges = _plan(algorithm, count, root, size)
    divisor = count if mean else 1
    integer = out.dtype.kind in "iu"
    nbytes = out.nbytes
    if nbytes <= BLOCK_BYTES:
        _run_pieces(ranges, flats, out, combine, divisor, integer)
        return
    threads = _settings["threads"] if nbytes >= PARALLEL_MIN_BYTES else 1
    # Blocking pays off when a block is revisited (several accumulations, a
    # scratch operand, the division); a single add streams best unblocked.
    blocked = count > 2 or mean
    block = max(1, BLOCK_BYTES // out.dtype.itemsize) if blocked else size
    shares = _split(ranges, size, threads, block)
    if threads == 1:
        _run_pieces(shares[0], flats, out, combine, divisor, integer)
        return
    pool = _executor(threads - 1)
    futures = [pool.submit(_run_pieces, share, flats, out, combine, divisor, integer) for share in shares[1:]]
    try:
        _run_pieces(shares[0], flats, out, combine, divisor, integer)
    finally:
        for future in futures:
            future.result()


# ------------------------------------------------------------------- checks
def _describe(buffers: Sequence[np.ndarray]) -> str:
    parts = [f"replica {i}: {b.dtype} {tuple(b.shape)}" for i, b in enumerate(buffers[:8])]
    if len(buffers) > 8:
        parts.append(f"... ({len(buffers)} replicas)")
    return ", ".join(parts)


def _arrays(buffers: Sequence[Any], what: str) -> list[np.ndarray]:
    """``buffers`` as a list of arrays; checks that there is at least one."""
    if type(buffers) is not list:
        if isinstance(buffers, np.ndarray) or not isinstance(buffers, Sequence):
            raise InvalidArgumentError(
                f"{what} needs a list with one array per replica, got {type(buffers).__name__}")
        buffers = list(buffers)
    if not buffers:
        raise InvalidArgumentError(f"{what} needs at least one replica's buffer, got none")
    for array in buffers:
        if type(array) is not np.ndarray:
            return [b if type(b) is np.ndarray else np.asarray(b) for b in buffers]
    return buffers


def _check_numeric(array: np.ndarray, what: str) -> None:
    if array.dtype.kind not in "biufc":
        raise InvalidArgumentError(f"{what}: buffers of dtype {array.dtype} cannot be combined; collectives "
                                   "need numeric (bool, int, uint, float, complex) buffers")


def _reduce_op(reduce_op: Any) -> str:
    name = getattr(reduce_op, "value", reduce_op)  # gd.ReduceOp members carry their name as value
    if isinstance(name, str) and name.upper() in _COMBINE:
        return name.upper()
    raise InvalidArgumentError(f"all-reduce: unknown reduce op {reduce_op!r}; use one of {', '.join(REDUCE_OPS)}")


# --------------------------------------------------------------- collectives
def all_reduce(buffers: Sequence[np.ndarray], reduce_op: Any = "SUM", algorithm: str = "ring",
               root: int = 0) -> list[np.ndarray]:
    """Reduces ``buffers`` (one per replica); returns the result for every replica.

    Args:
        buffers: One array per replica, all of one shape and dtype.
        reduce_op: ``"SUM"``, ``"MEAN"``, ``"MAX"`` or ``"MIN"`` (any case,
            or a ``gd.ReduceOp``).
        algorithm: One of :data:`ALGORITHMS`: ``"ring"``, ``"hierarchical_copy"``
            or ``"reduce_to_one"`` (the summation order; see the module docstring).
        root: The replica ``reduce_to_one`` accumulates into.

    Returns:
        A list with one entry per replica, all the same read-only array of
        the inputs' shape and dtype. It never aliases an input.

    Raises:
        InvalidArgumentError: no buffers, shapes or dtypes differ (the message
            lists every replica's), a non-numeric dtype, ``MEAN`` of booleans,
            an unknown reduce op or algorithm, or ``root`` out of range.
    """
    arrays = _arrays(buffers, "all-reduce")
    op = reduce_op if type(reduce_op) is str and reduce_op in _COMBINE else _reduce_op(reduce_op)
    uses_root = algorithms.check_algorithm(algorithm, "local", "all-reduce").uses_root
    first = arrays[0]
    shape, dtype = first.shape, first.dtype
    for array in arrays:
        if array.shape != shape or array.dtype != dtype:
            raise InvalidArgumentError(
                f"all-reduce needs one shape and dtype on every replica, got {_describe(arrays)}; "
                "per-replica values must have matching structures")
    _check_numeric(first, "all-reduce")
    count = len(arrays)
    if uses_root and not 0 <= root < count:
        raise InvalidArgumentError(f"all-reduce: root={root} is not a replica index (0..{count - 1})")
    if op == "MEAN" and dtype.kind == "b":
        raise InvalidArgumentError("all-reduce: MEAN of bool buffers is undefined; cast to a number first")
    out = _empty(first.size, dtype)
    result = out.reshape(shape)
    if count == 1:
        np.copyto(result, first)  # SUM, MEAN, MAX or MIN of one value is the value
    else:
        flats = arrays if len(shape) == 1 else [a.reshape(-1) for a in arrays]  # copies only non-contiguous ones
        _reduce(flats, out, _COMBINE[op], algorithm, root, op == "MEAN")
    result.flags.writeable = False
    return [result] * count


def all_gather(buffers: Sequence[np.ndarray], axis: int = 0) -> list[np.ndarray]:
    """Concatenates ``buffers`` along ``axis``; returns the result for every replica.

    Args:
        buffers: One array per replica: one dtype and rank, the same shape
            except along ``axis``.
        axis: Concatenation axis (negative counts from the end).

    Returns:
        A list with one entry per replica, all the same read-only array.

    Raises:
        InvalidArgumentError: no buffers, scalars, dtypes or ranks differ,
            shapes differ off ``axis``, or ``axis`` is out of range.
    """
    arrays = _arrays(buffers, "all-gather")
    first = arrays[0]
    _check_numeric(first, "all-gather")
    ndim = first.ndim
    if ndim == 0:
        raise InvalidArgumentError("all-gather needs buffers of rank >= 1 (scalars cannot be concatenated)")
    if not -ndim <= axis < ndim:
        raise InvalidArgumentError(f"all-gather: axis {axis} is out of range for rank-{ndim} buffers")
    axis %= ndim
    for array in arrays:
        if (array.dtype != first.dtype or array.ndim != ndim
                or array.shape[:axis] + array.shape[axis + 1:] != first.shape[:axis] + first.shape[axis + 1:]):
            raise InvalidArgumentError(
                f"all-gather along axis {axis} needs one dtype and the same shape off that axis on every replica, "
                f"got {_describe(arrays)}")
    shape = list(first.shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    out = _empty(int(np.prod(shape)), first.dtype).reshape(shape)
    np.concatenate(arrays, axis=axis, out=out)
    out.flags.writeable = False
    return [out] * len(arrays)


def all_to_all(buffers: Sequence[np.ndarray], split_axis: int = 0, concat_axis: int = 0) -> list[np.ndarray]:
    """Replica ``j`` gets chunk ``j`` (along ``split_axis``) of every replica's buffer, joined along ``concat_axis``.

    Args:
        buffers: One array per replica, all of one dtype and shape, ``split_axis`` a multiple of the replica count.
        split_axis: The axis each buffer is cut along into one equal chunk per replica.
        concat_axis: The axis a replica's received chunks are joined along, in replica order.

    Returns:
        One read-only array per replica (each its own: replicas get different results), ``split_axis``
        ``len(buffers)`` times shorter and ``concat_axis`` as many times longer than the inputs.

    Raises:
        InvalidArgumentError: no buffers, scalars, shapes or dtypes differ, an axis is out of range, or
            ``split_axis`` does not split into equal chunks.
    """
    arrays = _arrays(buffers, "all-to-all")
    first = arrays[0]
    _check_numeric(first, "all-to-all")
    ndim, count = first.ndim, len(arrays)
    if ndim == 0:
        raise InvalidArgumentError("all-to-all needs buffers of rank >= 1 (scalars cannot be split)")
    for name, axis in (("split_axis", split_axis), ("concat_axis", concat_axis)):
        if not -ndim <= axis < ndim:
            raise InvalidArgumentError(f"all-to-all: {name} {axis} is out of range for rank-{ndim} buffers")
    split_axis, concat_axis = split_axis % ndim, concat_axis % ndim
    for array in arrays:
        if array.shape != first.shape or array.dtype != first.dtype:
            raise InvalidArgumentError(
                f"all-to-all needs one shape and dtype on every replica, got {_describe(arrays)}")
    if first.shape[split_axis] % count:
        raise InvalidArgumentError(
            f"all-to-all: split_axis {split_axis} of shape {first.shape} does not split into {count} equal chunks; "
            "pad it to a multiple of the replica count")
    chunk = first.shape[split_axis] // count
    shape = list(first.shape)
    shape[split_axis] = chunk
    shape[concat_axis] *= count
    index = [slice(None)] * ndim
    results = []
    for j in range(count):  # each replica's chunks are views; one copy, into its own output
        index[split_axis] = slice(j * chunk, (j + 1) * chunk)
        out = _empty(int(np.prod(shape)), first.dtype).reshape(shape)
        np.concatenate([array[tuple(index)] for array in arrays], axis=concat_axis, out=out)
        out.flags.writeable = False
        results.append(out)
    return results


# ------------------------------------------------------- scheduler handlers
def run_all_reduce_task(op: str, attrs: dict[str, Any], buffers: list[np.ndarray]) -> list[np.ndarray]:
    """Runs a plan's ``AllReduce`` task (the scheduler's handler, ``graphdist.runtime.comm.handlers``)."""
    return all_reduce(buffers, attrs.get("reduce_op", "SUM"), attrs.get("algorithm", "ring"), int(attrs.get("root", 0)))


def run_all_gather_task(op: str, attrs: dict[str, Any], buffers: list[np.ndarray]) -> list[np.ndarray]:
    """Runs a plan's ``AllGather`` task (the scheduler's handler, ``graphdist.runtime.comm.handlers``)."""
    return all_gather(buffers, int(attrs.get("axis", 0)))


def run_all_to_all_task(op: str, attrs: dict[str, Any], buffers: list[np.ndarray]) -> list[np.ndarray]:
    """Runs a plan's ``AllToAll`` task (the scheduler's handler, ``graphdist.runtime.comm.handlers``)."""
    return all_to_all(buffers, int(attrs.get("split_axis", 0)), int(attrs.get("concat_axis", 0)))


_settings["threads"] = max(1, _env_int("GRAPHDIST_COMM_THREADS", _settings["threads"]))
_settings["pool_bytes"] = max(0, _env_int("GRAPHDIST_COMM_POOL_BYTES", _settings["pool_bytes"]))
