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
from tests.distribute.mw_fsdp_worker import train_and_compare


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
    sharded, line = train_and_compare(mp, directory / f"mp-fsdp-worker{mp.cluster_resolver.task_id}.npz")
    largest_part = max(part.nbytes for part in sharded.model.trainable_variables[0]._value)  # first kernel
    print(f"{line} replicas {mp.num_replicas_in_sync} local {len(mp.extended.worker_devices)} part0 {largest_part}",
          flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
