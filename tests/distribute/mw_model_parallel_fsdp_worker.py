"""One worker of the ModelParallelStrategy-across-workers test (``graphdist launch --workers 2 -- python THIS
DIR POSITIONS``).

``ModelParallelStrategy`` on a mesh (POSITIONS, 1) whose ``batch`` axis spans the 2 workers, every MLP weight
laid out over ``batch`` (FSDP across the workers): 5 Adam steps compared with OneDeviceStrategy on the same
global batches; this process must store only its shards of every weight and slot; a checkpoint saved by every
worker is restored by the chief into OneDevice. Prints ``worker W ok ...`` with the numbers (the test reads
them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import graphdist as gd
from tests.distribute.mw_zero1_worker import Trainer, largest_difference


def strategy(positions: int) -> gd.experimental.ModelParallelStrategy:
    mesh = gd.experimental.DeviceMesh((positions, 1), ("batch", "model"))
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["kernel"] = ("batch", None)
    layout_map["bias"] = ("batch",)
    return gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")


def main(directory: Path, positions: int) -> None:
    mp = strategy(positions)
    worker = mp.cluster_resolver.task_id
    sharded, single = Trainer(mp), Trainer(gd.OneDeviceStrategy("cpu:0"))
    for i in range(5):
        sharded.step(i)
        single.step(i)
    trained = largest_difference(sharded.state(), single.state())
    rewritten = sharded.train.get_concrete_function(*sharded.batch(0)).graph("rewritten")
    gathers = len(rewritten.find_nodes("CrossWorkerAllGather", gd.ir.GRAPHDIST_DOMAIN))
    scatters = len(rewritten.find_nodes("CrossWorkerReduceScatter", gd.ir.GRAPHDIST_DOMAIN))
    weights = [v for v in sharded.model.trainable_variables if v.worker_shard is not None]
    stored = sum(v._stored_nbytes for v in sharded.model.trainable_variables)
    whole = sum(v.numpy().nbytes for v in sharded.model.trainable_variables)  # numpy() gathers: every worker
    saved = sharded.checkpoint().save(directory / f"mp-fsdp-worker{worker}.npz")
    restored = 0.0
    if worker == 0:
        moved = Trainer(gd.OneDeviceStrategy("cpu:0"))
        moved.checkpoint().restore(saved)
        moved.step(0)  # creates the slots, which the restore then fills: compare with one more step on each side
        single.step(0)
        restored = largest_difference(moved.state(), single.state())
    print(f"worker {worker} ok trained {trained:.1e} restored {restored:.1e} gathers {gathers} scatters {scatters} "
          f"weights {len(weights)} stored {stored} whole {whole} replicas {mp.num_replicas_in_sync} "
          f"local {len(mp.extended.worker_devices)}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
