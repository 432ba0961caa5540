"""``cross_device_ops=gd.ReduceScatterAllGather()``: the pipeline lowers every all-reduce into a reduce-scatter
and an all-gather (``LowerOpsPass`` with the registered ``AllReduce`` lowering), and training equals
OneDeviceStrategy on the same global batches (an MLP on scikit-learn's digits, 5 Adam steps)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.pipeline import PipelineConfig, build_pipeline
from graphdist.errors import InvalidArgumentError
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

SIZES = (64, 32, 10)
BATCH = 32
DATA = digits()


def _train(strategy: gd.Strategy, steps: int = 5) -> tuple[list[float], list[np.ndarray], object]:
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(0.01)
    replica_step = model.make_train_step(optimizer, BATCH)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    def batch(i: int) -> tuple:
        rows = slice(i * BATCH, (i + 1) * BATCH)
        dataset = gd.data.Dataset.from_tensors((DATA.x_train[rows], DATA.y_train[rows]))
        return next(iter(strategy.experimental_distribute_dataset(dataset)))

    losses = [float(train(*batch(i))) for i in range(steps)]
    state = [v.numpy() for v in (*model.trainable_variables, *optimizer.variables())]
    return losses, state, train.get_concrete_function(*batch(0))


@pytest.fixture(scope="module")
def one_device() -> tuple:
    return _train(gd.OneDeviceStrategy("cpu:0"))


@pytest.mark.parametrize("devices", [2, 4])
def test_training_with_lowered_all_reduces_equals_one_device(devices: int, one_device) -> None:
    want_losses, want_state, _ = one_device
    strategy = gd.MirroredStrategy([f"cpu:{i}" for i in range(devices)],
                                   cross_device_ops=gd.ReduceScatterAllGather())
    losses, state, concrete = _train(strategy)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for got, want in zip(state, want_state):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    rewritten = concrete.graph("rewritten")
    ops = [n.op_type for n in rewritten.nodes if n.domain == gd.ir.GRAPHDIST_DOMAIN]
    # Each of the 4 gradients splits evenly into 2 and 4 shards except the 10-element bias over 4 devices;
    # it and the scalar loss sum stay ring all-reduces (the lowering declines a group that does not split).
    uneven = 1 if devices == 4 else 0
    assert ops.count("ReduceScatter") == ops.count("AllGather") == (4 - uneven) * devices
    assert ops.count("AllReduce") == (1 + uneven) * devices
    summary = concrete.plan.summary()
    assert "ReduceScatter" in summary and "AllGather" in summary


def test_the_pipeline_lowers_after_the_collectives_and_refuses_an_unknown_lowering() -> None:
    pipeline = gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=gd.ReduceScatterAllGather()).pipeline()
    assert "lower_ops: LowerOpsPass({'AllReduce': 'reduce_scatter_all_gather'})" in pipeline.describe()
    names = [p.name for p in pipeline]
    assert names.index("LowerCollectivesPass") < names.index("LowerOpsPass") < names.index("PartitionPass")
    assert "lower_ops" not in gd.MirroredStrategy(["cpu:0", "cpu:1"]).pipeline().describe()
    with pytest.raises(InvalidArgumentError, match="no lowering 'butterfly' for op 'AllReduce'; choose one of: "
                                                   "reduce_scatter_all_gather"):
        build_pipeline(PipelineConfig(devices=("cpu:0", "cpu:1"), lowerings={"AllReduce": "butterfly"}))
