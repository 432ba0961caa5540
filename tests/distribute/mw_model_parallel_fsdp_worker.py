"""One worker of the ModelParallelStrategy-across-workers test (``graphdist launch --workers 2 -- python THIS
DIR POSITIONS MODEL``).

``ModelParallelStrategy`` on a mesh (POSITIONS, MODEL) whose ``batch`` axis spans the 2 workers, MLP weights
laid out over ``batch`` (FSDP across the workers) and, with MODEL 2, the first kernel over ``model`` (split
within each worker): 5 Adam steps compared with OneDeviceStrategy on the same
global batches; this process must store only its shards of every weight and slot; a checkpoint saved by every
worker is restored by the chief into OneDevice. Prints ``worker W ok ...`` with the numbers (the test reads
them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import graphdist as gd
from tests.distribute.mw_zero1_worker import Trainer, largest_difference


def strategy(positions: int, model: int) -> gd.experimental.ModelParallelStrategy:
    """Mesh (positions, model); with model 1 every weight FSDP, with model 2 the first kernel split over
    ``model`` (within each worker) and the second kernel FSDP over ``batch`` (across the workers)."""
    mesh = gd.experimental.DeviceMesh((positions, model), ("batch", "model"))
    layout_map = gd.experimental.LayoutMap(mesh)
    if model == 1:
        layout_map["kernel"] = ("batch", None)
        layout_map["bias"] = ("batch",)
    else:
        layout_map["dense_0/kernel"] = ("model", None)
        layout_map["dense_1/kernel"] = ("batch", None)
    return gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")


def main(directory: Path, positions: int, model: int) -> None:
    mp = strategy(positions, model)
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
    largest_part = max(part.nbytes for part in sharded.model.trainable_variables[0]._value)  # first kernel
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
          f"local {len(mp.extended.worker_devices)} part0 {largest_part}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
