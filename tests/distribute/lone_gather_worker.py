"""One worker of a 2-worker job whose chief alone reads a weight sharded across the workers (FSDP): a collective
the other worker, which has finished, never joins. The chief must fail at once naming it, not wait or hang.

Run by tests/distribute/test_tf_config_tasks.py (tasks started with TF_CONFIG) and
tests/runtime/test_comm_mpi.py (graphdist launch).
"""

from __future__ import annotations

import numpy as np

import graphdist as gd
from graphdist.models.mlp import MLP

mesh = gd.experimental.DeviceMesh((2,), ("batch",))
layout_map = gd.experimental.LayoutMap(mesh)
layout_map["kernel"] = ("batch", None)
strategy = gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")
with strategy.scope():
    model = MLP((16, 8, 4), seed=0, trainable=True)
    optimizer = gd.optimizers.SGD(0.1)
replica_step = model.make_train_step(optimizer, 8)


@gd.function
def train(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)


rng = np.random.default_rng(0)
batch = (rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 4, 8))
dataset = gd.data.Dataset.from_tensors(batch)
print("loss", float(train(*next(iter(strategy.experimental_distribute_dataset(dataset))))), flush=True)
if strategy.extended.should_checkpoint:  # the mistake: a sharded weight read by the chief only
    print("chief reads", float(np.abs(model.trainable_variables[0].numpy()).sum()), flush=True)
print("finished", flush=True)
