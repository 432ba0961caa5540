"""One worker of the multi-process ParameterServerStrategy tests (run by ``graphdist launch --ps M``, or
by hand with TF_CONFIG: then a ps task serves with ``gd.Server``).

Trains a small MLP on this worker's shard of digits with SGD, then writes
to ``--out/worker<i>.npz``: the test accuracy (with the variables pulled
from the ps tasks), the steps it ran, the global step held by the ps, and
where the compiled plan pulls/pushes each variable shard (``ps``/``key``
attributes of its PSPull/PSPush tasks) next to the strategy's placement.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--shards", type=int, default=0, help="FixedShardsPartitioner(shards) when > 0")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--die-at-step", type=int, default=-1, help="worker 1 kills itself (SIGKILL) at this step")
    args = parser.parse_args()

    resolver = gd.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type == "ps":  # a job started by hand (graphdist launch runs its own server)
        gd.Server(resolver.cluster_spec(), job_name="ps", task_index=resolver.task_id).join()
        return
    partitioner = gd.FixedShardsPartitioner(args.shards) if args.shards else None
    strategy = gd.ParameterServerStrategy(variable_partitioner=partitioner,
                                          devices=[f"cpu:{i}" for i in range(args.devices)])
    print(f"worker {strategy.worker_index} joined", flush=True)
    with strategy.scope():
        model = MLP((64, 32, 10), seed=strategy.worker_index, trainable=True)
        optimizer = gd.optimizers.SGD(0.3)
    train_step = model.make_train_step(optimizer, global_batch_size=BATCH)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(train_step, args=(x, labels)), axis=None)

    data = digits()
    dataset = (gd.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
               .shard(strategy.num_workers, strategy.worker_index)
               .shuffle(1024, seed=strategy.worker_index).batch(BATCH, drop_remainder=True))
    steps = 0
    for _ in range(args.epochs):
        for x, labels in strategy.experimental_distribute_dataset(dataset):
            if steps == args.die_at_step and strategy.worker_index == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            step(x, labels)
            steps += 1
    x, labels = next(iter(strategy.experimental_distribute_dataset(dataset)))
    plan = step.get_concrete_function(x, labels).plan
    tasks = [{"op": c.op, "ps": int(c.attrs["ps"]), "key": c.attrs["key"], "variable": c.attrs["variable"]}
             for c in plan.comms if c.op in ("PSPull", "PSPush")]
    placement = {v._name: [[s.ps, s.key, s.start, s.stop] for s in v.shards]
                 for v in [*model.trainable_variables, optimizer.iterations]}
    # Every local replica gets the whole test set (a non-distributed argument); replica 0's logits suffice.
    logits = strategy.experimental_local_results(strategy.run(model.forward, args=(data.x_test,)))[0]
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == data.y_test))
    out = Path(args.out)
    np.savez(out / f"worker{strategy.worker_index}.npz", accuracy=accuracy, steps=steps,
             global_step=np.asarray(optimizer.iterations.numpy()),
             plan_tasks=json.dumps(tasks), placement=json.dumps(placement), summary=plan.summary())
    print(f"worker {strategy.worker_index}: {steps} steps, test accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
