"""One rank of the MPI communicator tests (run under ``mpiexec -n 2``); writes ``OUT/rank<r>.json``.

Modes: ``ops`` (every collective, ``RING``, mismatch detection), ``stuck``
(rank 1 sleeps past rank 0's timeout), ``tree`` (the ``tree`` all-reduce of
:func:`tree_buffer` on any number of ranks, its bits in hex).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from graphdist.errors import CollectiveTimeoutError
from graphdist.runtime.comm.mpi import CollectiveMismatchError, CommunicatorBrokenError, MPICommunicator


def ops() -> dict:
    comm = MPICommunicator(timeout=30, rank_names=["worker 0", "worker 1"])
    r = comm.rank
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * r
    ints = np.array([3 + r, -3 - r], np.int64)
    out = np.empty_like(x)
    result = {
        "rank": r,
        "sum": comm.all_reduce(x).tolist(),
        "sum_out_is_out": comm.all_reduce(x, out=out) is out,
        "ring": comm.all_reduce(x, algorithm="ring").tolist(),
        "mean": comm.all_reduce(x, "MEAN").tolist(),
        "max": comm.all_reduce(x, "max").tolist(),
        "min": comm.all_reduce(x, "MIN").tolist(),
        "int_mean": comm.all_reduce(ints, "MEAN").tolist(),
        "bool_sum": comm.all_reduce(np.array([r == 1, False]), "SUM").tolist(),
        "scalar": float(comm.all_reduce(np.float64(r + 1))),
        "gather0": comm.all_gather(x, 0).tolist(),
        "gather1": comm.all_gather(x, axis=-1).tolist(),
        "bcast": comm.broadcast(x.copy(), root=1).tolist(),
        "alltoall": comm.all_to_all(np.arange(8, dtype=np.int64).reshape(2, 4) + 100 * r, 1, 0).tolist(),
        "scatter": comm.reduce_scatter(np.arange(5, dtype=np.float64) * (r + 1)).tolist(),
        "objects": comm.allgather_object({"rank": r}),
        "transposed": comm.all_reduce(x.T).tolist(),  # not C-contiguous: copied once
    }
    comm.barrier()
    try:
        comm.all_reduce(np.ones(3 + r, np.float32), name="grads")
    except CollectiveMismatchError as err:
        result["mismatch"] = str(err)
    try:
        comm.all_reduce(x)
    except CommunicatorBrokenError as err:
        result["broken"] = str(err)
    return result


def tree_buffer(rank: int) -> np.ndarray:
    """Rank ``rank``'s buffer: magnitudes from 1e-3 to 1e3, so the order of the additions shows in the bits."""
    rng = np.random.default_rng(rank)
    return (rng.standard_normal(1000) * 10.0 ** rng.integers(-3, 4, 1000)).astype(np.float32)


def tree() -> dict:
    comm = MPICommunicator(timeout=60)
    x = tree_buffer(comm.rank)
    return {"rank": comm.rank, "sum": comm.all_reduce(x, algorithm="tree").tobytes().hex(),
            "mean": comm.all_reduce(x, "MEAN", algorithm="tree").tobytes().hex()}


def stuck() -> dict:
    comm = MPICommunicator(timeout=1.5)
    comm.barrier()
    if comm.rank == 1:
        time.sleep(4)
        return {"rank": 1}
    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(4), name="loss")
    except CollectiveTimeoutError as err:
        return {"rank": 0, "error": str(err), "seconds": time.monotonic() - start}
    return {"rank": 0, "error": None}


if __name__ == "__main__":
    result = {"ops": ops, "tree": tree, "stuck": stuck}[sys.argv[1]]()
    Path(sys.argv[2], f"rank{result['rank']}.json").write_text(json.dumps(result))
