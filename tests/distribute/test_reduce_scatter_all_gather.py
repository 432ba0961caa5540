"""``cross_device_ops=gd.ReduceScatterAllGather()``: the pipeline lowers every all-reduce into a reduce-scatter
and an all-gather (``LowerOpsPass`` with the registered ``AllReduce`` lowering), and training equals
OneDeviceStrategy on the same global batches (an MLP on scikit-learn's digits, 5 Adam steps)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.pipeline import PipelineConfig, build_pipeline
from graphdist.errors import InvalidArgumentError
from tests.distribute.digits_training import DigitsTrainer, assert_same_state

STEPS = 5


def _train(strategy: gd.Strategy) -> tuple[list[float], list, DigitsTrainer]:
    trainer = DigitsTrainer(strategy)
    losses = [trainer.step(i) for i in range(STEPS)]
    return losses, trainer.state(), trainer


@pytest.fixture(scope="module")
def one_device() -> tuple:
    return _train(gd.OneDeviceStrategy("cpu:0"))


@pytest.mark.parametrize("devices", [2, 4])
def test_training_with_lowered_all_reduces_equals_one_device(devices: int, one_device) -> None:
    want_losses, want_state, _ = one_device
    strategy = gd.MirroredStrategy([f"cpu:{i}" for i in range(devices)],
                                   cross_device_ops=gd.ReduceScatterAllGather())
    losses, state, trainer = _train(strategy)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert_same_state(state, want_state)
    rewritten = trainer.rewritten()
    ops = [n.op_type for n in rewritten.nodes if n.domain == gd.ir.GRAPHDIST_DOMAIN]
    # Each of the 4 gradients splits evenly into 2 and 4 shards except the 10-element bias over 4 devices;
    # it and the scalar loss sum stay ring all-reduces (the lowering declines a group that does not split).
    uneven = 1 if devices == 4 else 0
    assert ops.count("ReduceScatter") == ops.count("AllGather") == (4 - uneven) * devices
    assert ops.count("AllReduce") == (1 + uneven) * devices
    summary = trainer.train.get_concrete_function(*trainer.batch(0)).plan.summary()
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
