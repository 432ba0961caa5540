"""Balanced variable updates (BalanceVariableUpdatesPass) under Mirrored(2): the updates run on both devices,
the weights and optimizer slots after 3 steps are bitwise those of the unbalanced pipeline (every update
written back from the last replica) and equal a OneDevice run on the same global batches; the plan summary's
"updated on" column shows the new placement."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.pipeline import build_pipeline
from graphdist.models.mlp import MLP

SIZES = (6, 8, 8, 3)
BATCH = 16
RNG = np.random.default_rng(5)
X = RNG.standard_normal((3, BATCH, SIZES[0])).astype(np.float32)
LABELS = RNG.integers(0, SIZES[-1], (3, BATCH))
FUNCTION_MODULE = importlib.import_module("graphdist.compile.function")  # graphdist.compile.function is gd.function
OPTIMIZERS = {"sgd": lambda: gd.optimizers.SGD(0.1), "momentum": lambda: gd.optimizers.SGD(0.1, momentum=0.9),
              "adam": lambda: gd.optimizers.Adam(0.05)}


def _train(strategy: gd.Strategy, optimizer: str) -> tuple[list[np.ndarray], gd.Plan]:
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        opt = OPTIMIZERS[optimizer]()
    replica_step = model.make_train_step(opt, BATCH)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    for i in range(len(X)):
        dataset = gd.data.Dataset.from_tensors((X[i], LABELS[i]))
        args = next(iter(strategy.experimental_distribute_dataset(dataset)))
        train(*args)
    plan = train.get_concrete_function(*args).plan
    return [np.array(v.numpy()) for v in (*model.trainable_variables, *opt.variables())], plan


def _mirrored() -> gd.Strategy:
    return gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=gd.NcclAllReduce(num_packs=2))


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_balanced_updates_train_bitwise_like_the_unbalanced_pipeline(optimizer: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    balanced, plan = _train(_mirrored(), optimizer)
    with monkeypatch.context() as patch:
        patch.setattr(FUNCTION_MODULE, "build_pipeline", lambda config: build_pipeline(config).with_slot(
            "balance_updates"))
        unbalanced, old_plan = _train(_mirrored(), optimizer)
    one_device, _ = _train(gd.OneDeviceStrategy("cpu:0"), optimizer)
    for new, old, one in zip(balanced, unbalanced, one_device):
        assert new.dtype == old.dtype and np.array_equal(new, old)
        np.testing.assert_allclose(new, one, rtol=1e-5, atol=1e-6)

    def updated_on(plan: gd.Plan) -> set[str]:
        graph = plan.graph
        outputs = {v.name: v for v in graph.outputs}
        return {outputs[name].producer.device for name, _ in graph.meta.variable_updates}

    assert updated_on(old_plan) == {"cpu:1"}
    assert updated_on(plan) == {"cpu:0", "cpu:1"}
    rows = plan.summary().split("variables (")[1].splitlines()[3:]
    assert {row.split()[-1] for row in rows if row.startswith("  ")} >= {"cpu:0", "cpu:1"}
