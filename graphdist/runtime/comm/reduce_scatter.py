"""Reduce-scatter between the logical devices of one process (``graphdist.ReduceScatter`` tasks).

Participant ``i`` of a group gets shard ``i`` of the reduction of the
participants' buffers, read flat (row-major; a buffer of higher rank is
viewed flat, not copied). Devices of one process share host memory, so
the reduction is computed once, by the local communicator's all-reduce (each
element is combined once, as a ring reduce-scatter would), and every
participant receives a read-only view of its own shard: no shard is copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError
from graphdist.runtime.comm import local

__all__ = ["reduce_scatter", "run_reduce_scatter_task"]


def reduce_scatter(buffers: Sequence[np.ndarray], reduce_op: Any = "SUM", algorithm: str = "ring") -> list[np.ndarray]:
    """Reduces ``buffers`` and returns shard ``i`` of the flat result for participant ``i``.

    Args:
        buffers: One array per participant, all of one dtype and shape, the
            element count a multiple of the participant count.
        reduce_op: ``"SUM"``, ``"MEAN"``, ``"MAX"`` or ``"MIN"``.
        algorithm: The local communicator's all-reduce algorithm.

    Returns:
        One read-only array of ``len(buffer) / len(buffers)`` elements per participant.

    Raises:
        InvalidArgumentError: A buffer is a scalar, or its element count does not split evenly.
    """
    count = len(buffers)
    for buffer in buffers:
        if np.ndim(buffer) == 0 or count == 0 or np.size(buffer) % count:
            raise InvalidArgumentError(
                f"reduce-scatter needs buffers whose element count is a multiple of the {count} participants, got "
                f"shape {np.shape(buffer)}; pad the value to a multiple of the group size")
    total = local.all_reduce(list(buffers), reduce_op, algorithm)[0].reshape(-1)  # a view: the result is contiguous
    shard = total.shape[0] // count
    return [total[i * shard:(i + 1) * shard] for i in range(count)]


def run_reduce_scatter_task(op: str, attrs: dict[str, Any], buffers: list[np.ndarray]) -> list[np.ndarray]:
    """Runs a plan's ``ReduceScatter`` task (the scheduler's handler, ``graphdist.runtime.comm.handlers``)."""
    return reduce_scatter(buffers, attrs.get("reduce_op", "SUM"), str(attrs.get("algorithm", "ring")))

