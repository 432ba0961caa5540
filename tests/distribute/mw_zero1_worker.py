"""One worker of the ZeRO-1-across-workers test (``graphdist launch --workers 2 [--devices-per-worker 2] --
python THIS DIR``).

Under ``MultiWorkerMirroredStrategy(shard_optimizer_state=True)`` it trains an MLP with Adam for 5 steps
and compares weights and Adam moments with the unsharded strategy on the same global batches; checks
that this process stores only its shards of every slot; saves a checkpoint on every worker after 2
steps, restores it on the chief into a OneDevice optimizer, trains one step there and saves again;
every worker restores that into a sharded optimizer, trains the last 2 steps and compares with the
5-step run. Prints ``worker W ok ...`` with the numbers (the test reads them). Then Keras ``fit`` under the
sharded strategy with ``ModelCheckpoint`` and ``BackupAndRestore``, whose chief-only saves gather the slots
with the other worker taking part (``worker W keras ...``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

import graphdist as gd
from graphdist.models.mlp import MLP

SIZES = (16, 7, 5)  # biases of 7 and 5 elements: padded to 8 and 6 over 2 workers
GLOBAL_BATCH = 32
RNG = np.random.default_rng(4)
X = RNG.standard_normal((5, GLOBAL_BATCH, SIZES[0])).astype(np.float32)
LABELS = RNG.integers(0, SIZES[-1], (5, GLOBAL_BATCH))


class Trainer:
    """The MLP with Adam (or ``optimizer()``) under ``strategy``; ``step(i)`` trains on global batch ``i``."""

    def __init__(self, strategy: gd.Strategy, optimizer: Any = None) -> None:
        self.strategy = strategy
        with strategy.scope():
            self.model = MLP(SIZES, seed=0, trainable=True)
            self.optimizer = optimizer() if optimizer else gd.optimizers.Adam(0.05)
        replica_step = self.model.make_train_step(self.optimizer, GLOBAL_BATCH)
        self.train = gd.function(
            lambda x, y: strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None))

    def batch(self, i: int) -> tuple:
        dataset = gd.data.Dataset.from_tensors((X[i], LABELS[i]))
        return next(iter(self.strategy.experimental_distribute_dataset(dataset)))

    def step(self, i: int) -> None:
        self.train(*self.batch(i))

    def checkpoint(self) -> gd.train.Checkpoint:
        return gd.train.Checkpoint(model=self.model, optimizer=self.optimizer)

    def state(self) -> list[np.ndarray]:
        """Weights and slots, whole (a sharded slot is gathered from every worker)."""
        return [v.numpy() for v in (*self.model.trainable_variables, *self.optimizer.variables())]


def largest_difference(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    assert len(got) == len(want) and all(a.shape == b.shape for a, b in zip(got, want))
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - b))) if np.size(a) else 0.0
               for a, b in zip(got, want))


def main(directory: Path) -> None:
    sharded_strategy = gd.MultiWorkerMirroredStrategy(shard_optimizer_state=True)
    worker = sharded_strategy.cluster_resolver.task_id
    plain, sharded = Trainer(gd.MultiWorkerMirroredStrategy()), Trainer(sharded_strategy)
    for i in range(5):
        plain.step(i)
        sharded.step(i)
    trained = largest_difference(sharded.state(), plain.state())
    # SGD: no slots, but each worker still updates its shard of every weight. Each variable's gather used to
    # be numbered before the next one's scatter while one segment held both updates: no step could finish.
    sgd_plain = Trainer(gd.MultiWorkerMirroredStrategy(), lambda: gd.optimizers.SGD(0.1))
    sgd_sharded = Trainer(gd.MultiWorkerMirroredStrategy(shard_optimizer_state=True), lambda: gd.optimizers.SGD(0.1))
    for i in range(3):
        sgd_plain.step(i)
        sgd_sharded.step(i)
    sgd = largest_difference(sgd_sharded.state(), sgd_plain.state())
    rewritten = sharded.train.get_concrete_function(*sharded.batch(0)).graph("rewritten")
    scatters = len(rewritten.find_nodes("CrossWorkerReduceScatter", gd.ir.GRAPHDIST_DOMAIN))
    slots = [v for v in sharded.optimizer.variables() if v._worker_shard is not None]
    stored = sum(v._stored_nbytes for v in slots)
    whole = sum(int(np.prod(v.shape)) * v.dtype.itemsize for v in slots)

    first = Trainer(gd.MultiWorkerMirroredStrategy(shard_optimizer_state=True))
    first.step(0)
    first.step(1)
    saved = first.checkpoint().save(directory / f"zero-worker{worker}.npz")  # every worker: gathers the chunks
    moved = directory / "one_device.npz"
    if worker == 0:
        single = Trainer(gd.OneDeviceStrategy("cpu:0"))
        single.checkpoint().restore(saved)
        single.step(2)
        single.checkpoint().save(moved)
    sharded_strategy.communicator.barrier(name="one-device checkpoint written")
    back = Trainer(gd.MultiWorkerMirroredStrategy(shard_optimizer_state=True))
    back.checkpoint().restore(moved)
    back.step(3)
    back.step(4)
    resumed = largest_difference(back.state(), sharded.state())
    print(f"worker {worker} ok trained {trained:.1e} resumed {resumed:.1e} scatters {scatters} slots {len(slots)} "
          f"stored {stored} whole {whole} sgd {sgd:.1e}", flush=True)


def keras_fit(directory: Path) -> None:
    strategy = gd.MultiWorkerMirroredStrategy(shard_optimizer_state=True)
    with strategy.scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(5, activation="relu", input_shape=(8,)),
                                     gd.keras.layers.Dense(3)])
        model.compile(optimizer=gd.keras.optimizers.Adam(0.01),
                      loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [gd.keras.callbacks.ModelCheckpoint(str(directory / "keras_{epoch}")),
                 gd.keras.callbacks.BackupAndRestore(str(directory / "backup"))]
    model.fit(RNG.standard_normal((64, 8)).astype(np.float32), RNG.integers(0, 3, 64), batch_size=16, epochs=2,
              callbacks=callbacks, verbose=0)
    sharded = sum(v._worker_shard is not None for v in model.optimizer.variables())
    print(f"worker {strategy.cluster_resolver.task_id} keras sharded {sharded}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    keras_fit(Path(sys.argv[1]))
