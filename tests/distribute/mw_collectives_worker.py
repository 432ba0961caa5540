"""One worker of the multi-process collective tests (run under ``graphdist launch``).

Every replica contributes ``10 * global replica id + [0, 1]`` (rows of a
(2, 2) batch); the worker writes what the traced all-reduce / all-gather and
the eager and traced ``strategy.reduce`` / ``strategy.gather`` returned, the ``InputContext`` its
``dataset_fn`` got and its role to ``--out/rank<r>.npz``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import graphdist as gd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = gd.MultiWorkerMirroredStrategy(gd.CommunicationImplementation.RING)
    rank = strategy.communicator.rank
    contexts = []

    def dataset_fn(context):
        contexts.append([context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync])
        return gd.data.Dataset.range(8).shard(context.num_input_pipelines, context.input_pipeline_id).batch(1)

    def replica_fn(x):
        ctx = gd.get_replica_context()
        x = x + np.float32(10) * ctx.replica_id_in_sync_group.astype(np.float32)
        return (ctx.all_reduce("SUM", x), ctx.all_reduce("MEAN", x), ctx.all_reduce("MAX", x),
                ctx.all_gather(x, axis=0), x)

    @gd.function
    def step(x):
        return strategy.run(replica_fn, args=(x,))

    @gd.function
    def mean_step(x):
        return strategy.reduce("MEAN", strategy.run(lambda v: replica_fn(v)[-1], args=(x,)), axis=0)

    @gd.function
    def gather_step(x):  # strategy.gather inside a compiled step spans every worker's replicas too
        return strategy.gather(strategy.run(lambda v: replica_fn(v)[-1], args=(x,)), axis=0)

    batch = gd.data.Dataset.from_tensors(np.tile(np.arange(2, dtype=np.float32), (2 * strategy.num_replicas_in_sync,
                                                                                   1)))
    (x,) = [b for b in strategy.experimental_distribute_dataset(batch)]
    total, mean, largest, gathered, own = step(x)
    local = strategy.experimental_local_results
    per_replica = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))
    # An exported plan runs again in the same job (its cross-worker tasks use the job's communicator).
    concrete = mean_step.get_concrete_function(x)
    loaded = gd.load_plan(concrete.export(Path(args.out) / f"plan{rank}"))
    reloaded_mean = loaded(np.concatenate(local(x)))  # this worker's part, split between its replicas
    np.savez(Path(args.out) / f"rank{rank}.npz", reloaded_mean=reloaded_mean,
             sum=local(total)[0], mean=local(mean)[-1], max=local(largest)[0],
             gathered=local(gathered)[-1], reduce_sum=strategy.reduce("SUM", own, axis=None),
             reduce_mean_axis=strategy.reduce("MEAN", own, axis=0), gather=strategy.gather(own, axis=0),
             traced_gather=gather_step(x),
             traced_mean_axis=mean_step(x), replicas=strategy.num_replicas_in_sync, input_context=contexts[0],
             first_elements=[int(np.asarray(v)[0]) for v in local(per_replica)],
             task_type=strategy.cluster_resolver.task_type, chief=strategy.extended.should_checkpoint)


if __name__ == "__main__":
    main()
