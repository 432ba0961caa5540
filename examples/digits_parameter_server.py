"""Digits with ``ParameterServerStrategy``: workers train asynchronously against ps tasks.

Run it through ``graphdist launch``::

    graphdist launch --workers 2 --ps 1 -- python examples/digits_parameter_server.py
    graphdist launch --workers 2 --ps 2 -- python examples/digits_parameter_server.py --shards 2

``graphdist launch`` starts the ps tasks as the built-in server
(``gd.Server``) and runs this program on every worker. Or start every task
by hand, each with its ``TF_CONFIG`` (as the seeds do, on any hosts): a ps
task runs ``gd.Server(...).join()`` here, the workers train. Variables live on the
ps tasks (round-robin; ``--shards N`` splits each along its first axis with
``gd.FixedShardsPartitioner``); each step pulls them, and pushes the
optimizer's update, which the ps applies as it arrives. Each worker reads
its own shard of the data. Every worker reports its test accuracy (exit
status 1 below 90%).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

TARGET_ACCURACY = 0.90


def main() -> int:
    """Trains and checks the accuracy; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="batch size of each worker step")
    parser.add_argument("--shards", type=int, default=0, help="shard every variable over N ps tasks")
    args = parser.parse_args()

    resolver = gd.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type == "ps":  # started by hand with TF_CONFIG: this task serves variables
        gd.Server(resolver.cluster_spec(), job_name="ps", task_index=resolver.task_id).join()
        return 0
    partitioner = gd.FixedShardsPartitioner(args.shards) if args.shards else None
    strategy = gd.ParameterServerStrategy(variable_partitioner=partitioner)
    with strategy.scope():
        model = MLP((64, 64, 10), seed=strategy.worker_index, trainable=True)
        optimizer = gd.optimizers.SGD(0.3)
    train_step = model.make_train_step(optimizer, global_batch_size=args.batch)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(train_step, args=(x, labels)), axis=None)

    data = digits()
    dataset = (gd.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
               .shard(strategy.num_workers, strategy.worker_index)
               .shuffle(1024, seed=strategy.worker_index).batch(args.batch, drop_remainder=True))
    if strategy.worker_index == 0:
        for variable in [*model.trainable_variables, optimizer.iterations]:
            print(f"{variable.name:24s} on " + ", ".join(f"ps {s.ps} (rows {s.start}:{s.stop})"
                                                        for s in variable.shards))
    for epoch in range(args.epochs):
        losses = [float(step(x, labels)) for x, labels in strategy.experimental_distribute_dataset(dataset)]
        print(f"worker {strategy.worker_index} epoch {epoch + 1}: loss {np.mean(losses):.4f}")
    logits = strategy.experimental_local_results(strategy.run(model.forward, args=(data.x_test,)))[0]
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == data.y_test))
    print(f"worker {strategy.worker_index}: test accuracy {accuracy:.3f}, global step (all workers) "
          f"{int(optimizer.iterations.numpy())}")
    return 0 if accuracy >= TARGET_ACCURACY else 1


if __name__ == "__main__":
    sys.exit(main())
