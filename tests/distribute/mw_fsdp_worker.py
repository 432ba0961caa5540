"""One worker of the FSDP-across-workers test (``graphdist launch --workers 2 [--devices-per-worker 2] --
python THIS DIR``).

Under a MultiWorkerMirroredStrategy whose pipeline shards every weight of an MLP (``shard_parameters``, what
a layout map with the batch axis across the workers will give) it trains 5 Adam steps and compares weights
and Adam moments with OneDeviceStrategy on the same global batches; checks that this process stores only its
shards of every weight and slot; saves a checkpoint (every worker: a save gathers the shards), which the chief
restores into OneDevice. Prints ``worker W ok ...`` with the numbers (the test reads them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import graphdist as gd
from graphdist.compile.pipeline import PipelineConfig
from tests.distribute.mw_zero1_worker import Trainer, largest_difference

WEIGHTS = ("mlp/dense_0/kernel", "mlp/dense_0/bias", "mlp/dense_1/kernel", "mlp/dense_1/bias")


class FSDPStrategy(gd.MultiWorkerMirroredStrategy):
    """MultiWorkerMirroredStrategy whose pipeline stores every MLP weight sharded (FSDP)."""

    def pipeline_config(self) -> PipelineConfig:
        return super().pipeline_config().replace(shard_parameters=WEIGHTS)


def train_and_compare(strategy: gd.Strategy, checkpoint: Path) -> tuple[Trainer, str]:
    """Trains 5 Adam steps under ``strategy`` and under OneDevice; saves a checkpoint at ``checkpoint`` (every
    worker: a save gathers the shards), which the chief restores into OneDevice. Returns the sharded trainer and
    the ``worker W ok ...`` line of numbers the tests read (more may be appended)."""
    worker = strategy.cluster_resolver.task_id
    sharded, single = Trainer(strategy), Trainer(gd.OneDeviceStrategy("cpu:0"))
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
    saved = sharded.checkpoint().save(checkpoint)
    restored = 0.0
    if worker == 0:
        moved = Trainer(gd.OneDeviceStrategy("cpu:0"))
        moved.checkpoint().restore(saved)
        moved.step(0)  # creates the slots, which the restore then fills: compare with one more step on each side
        single.step(0)
        restored = largest_difference(moved.state(), single.state())
    return sharded, (f"worker {worker} ok trained {trained:.1e} restored {restored:.1e} gathers {gathers} "
                     f"scatters {scatters} weights {len(weights)} stored {stored} whole {whole}")


def main(directory: Path) -> None:
    strategy = FSDPStrategy()
    _, line = train_and_compare(strategy, directory / f"fsdp-worker{strategy.cluster_resolver.task_id}.npz")
    print(line, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
