"""In-process communicator for logical devices of one process.

Buffers are numpy arrays, one per replica. Every algorithm returns one result
per replica; replicas share the result array (read-only by convention) since
they live in one address space. The summation order follows the algorithm,
so results of different algorithms agree to float tolerance, not bitwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphdist.errors import InvalidArgumentError

__all__ = ["all_reduce", "all_gather", "ALGORITHMS"]

_COMBINE = {"SUM": np.add, "MEAN": np.add, "MAX": np.maximum, "MIN": np.minimum}
ALGORITHMS = ("ring", "hierarchical_copy", "reduce_to_one")


def _check(buffers: Sequence[np.ndarray]) -> None:
    shapes = {b.shape for b in buffers}
    dtypes = {b.dtype for b in buffers}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise InvalidArgumentError(
            f"all-reduce needs one shape and dtype on every replica, got shapes {sorted(map(str, shapes))} "
            f"and dtypes {sorted(map(str, dtypes))}; per-replica values must have matching structures"
        )


def _ring(buffers: Sequence[np.ndarray], combine: np.ufunc) -> np.ndarray:
    """Reduce-scatter over chunks in ring order, then all-gather the chunks."""
    count = len(buffers)
    flats = [b.reshape(-1) for b in buffers]
    bounds = np.linspace(0, flats[0].size, count + 1).astype(int)
    out = np.empty_like(flats[0])
    for chunk in range(count):
        lo, hi = bounds[chunk], bounds[chunk + 1]
        target = out[lo:hi]
        np.copyto(target, flats[(chunk + 1) % count][lo:hi])
        for step in range(2, count + 1):
            combine(target, flats[(chunk + step) % count][lo:hi], out=target)
    return out.reshape(buffers[0].shape)


def _tree(buffers: Sequence[np.ndarray], combine: np.ufunc) -> np.ndarray:
    level = [np.array(b, copy=True) for b in buffers]
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            combine(level[i], level[i + 1], out=level[i])
            nxt.append(level[i])
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _to_one(buffers: Sequence[np.ndarray], combine: np.ufunc, root: int) -> np.ndarray:
    out = np.array(buffers[root], copy=True)
    for index, buffer in enumerate(buffers):
        if index != root:
            combine(out, buffer, out=out)
    return out


def all_reduce(buffers: Sequence[np.ndarray], reduce_op: str = "SUM", algorithm: str = "ring",
               root: int = 0) -> list[np.ndarray]:
    """Reduces ``buffers`` (one per replica); returns the result for every replica."""
    _check(buffers)
    combine = _COMBINE[reduce_op]
    if len(buffers) == 1:
        result = np.array(buffers[0], copy=True)
    elif algorithm == "ring":
        result = _ring(buffers, combine)
    elif algorithm == "hierarchical_copy":
        result = _tree(buffers, combine)
    elif algorithm == "reduce_to_one":
        result = _to_one(buffers, combine, root)
    else:
        raise InvalidArgumentError(f"unknown all-reduce algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if reduce_op == "MEAN":
        result = (result / len(buffers)).astype(result.dtype) if result.dtype.kind == "f" else \
            (result // len(buffers)).astype(result.dtype)
    return [result] * len(buffers)


def all_gather(buffers: Sequence[np.ndarray], axis: int = 0) -> list[np.ndarray]:
    """Concatenates ``buffers`` along ``axis``; returns the result for every replica."""
    result = np.concatenate(list(buffers), axis=axis)
    return [result] * len(buffers)
