"""Digits on several workers with ``MultiWorkerMirroredStrategy``.

Run it through ``graphdist launch``::

    graphdist launch --workers 2 -- python examples/digits_multi_worker.py
    graphdist launch --workers 2 --devices-per-worker 2 -- python examples/digits_multi_worker.py

Every worker runs this same program. The strategy reads its role from
``GRAPHDIST_CONFIG`` (written by ``graphdist launch``), broadcasts worker 0's
initial weights, and gives each worker its own slice of every global batch;
gradients are all-reduced over the local devices, then over the workers
through MPI. The chief prints progress, writes the checkpoint and checks
the test accuracy (exit status 1 below 90%). Started without ``graphdist
launch`` it trains on this process's devices alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

TARGET_ACCURACY = 0.90


def main() -> int:
    """Trains and checks the accuracy; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch size (all workers together)")
    parser.add_argument("--checkpoint", default="build/examples/digits_multi_worker.npz")
    args = parser.parse_args()

    strategy = gd.MultiWorkerMirroredStrategy()
    chief = strategy.extended.should_checkpoint
    with strategy.scope():
        model = MLP((64, 64, 10), seed=strategy.cluster_resolver.task_id or 0, trainable=True)
        optimizer = gd.optimizers.SGD(0.5)
    train_step = model.make_train_step(optimizer, global_batch_size=args.batch)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(train_step, args=(x, labels)), axis=None)

    data = digits()
    dataset = (gd.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).shuffle(2048, seed=0)
               .batch(args.batch, drop_remainder=True))
    if chief:
        print(f"{strategy!r}: {strategy.num_replicas_in_sync} replicas in sync, global batch {args.batch}")
    start = time.perf_counter()
    for epoch in range(args.epochs):
        losses = [float(step(x, labels)) for x, labels in strategy.experimental_distribute_dataset(dataset)]
        if chief:
            print(f"epoch {epoch + 1}: loss {np.mean(losses):.4f}")
    logits = strategy.experimental_local_results(strategy.run(model.forward, args=(data.x_test,)))[0]
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == data.y_test))
    if not chief:
        return 0
    print(f"trained in {time.perf_counter() - start:.2f} s; test accuracy {accuracy:.3f}")
    Path(args.checkpoint).parent.mkdir(parents=True, exist_ok=True)
    gd.train.Checkpoint(model=model, optimizer=optimizer).save(args.checkpoint)
    print(f"checkpoint written by the chief to {args.checkpoint}")
    return 0 if accuracy >= TARGET_ACCURACY else 1


if __name__ == "__main__":
    sys.exit(main())
