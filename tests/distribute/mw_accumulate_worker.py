"""One worker of the multi-worker gradient accumulation test (run by ``graphdist launch --workers 2``):
trains an MLP with Adam for 3 steps with ``accumulate_steps`` 1 and 4 on the same global batches and prints
the largest weight difference (every worker prints its own)."""

from __future__ import annotations

import numpy as np

import graphdist as gd
from graphdist.models.mlp import MLP

RNG = np.random.default_rng(2)
X = RNG.standard_normal((3, 64, 16)).astype(np.float32)
LABELS = RNG.integers(0, 5, (3, 64))


def train(strategy: gd.Strategy, steps: int) -> list[np.ndarray]:
    with strategy.scope():
        model = MLP((16, 8, 5), seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(0.01)
    replica_step = model.make_train_step(optimizer)
    step = gd.function(lambda x, y: strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None),
                       accumulate_steps=steps)
    for x, labels in zip(X, LABELS):
        step(*next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels))))))
    return [v.numpy() for v in model.trainable_variables]


def main() -> None:
    strategy = gd.MultiWorkerMirroredStrategy()
    whole, accumulated = train(strategy, 1), train(strategy, 4)
    difference = max(float(np.abs(a - b).max()) for a, b in zip(whole, accumulated))
    print(f"worker {strategy.cluster_resolver.task_id} difference {difference:.1e}", flush=True)


if __name__ == "__main__":
    main()
