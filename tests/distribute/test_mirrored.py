"""MirroredStrategy: variables, the seeds' dataset examples, and training equivalence with
one device on the same global batch (the strategy-api examples on every strategy are in
test_seed_examples.py)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


def test_mirrored_variable_repr_and_access() -> None:
    strategy = gd.MirroredStrategy(["GPU:0", "GPU:1"] if gd.config.num_gpus() >= 2 else ["cpu:0", "cpu:1"])
    with strategy.scope():
        mirrored_variable = gd.Variable(1.0)
    assert repr(mirrored_variable) == (
        "MirroredVariable:{\n"
        "  0: <gd.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>,\n"
        "  1: <gd.Variable 'Variable/replica_1:0' shape=() dtype=float32, numpy=1.0>\n"
        "}"
    )
    regular_variable = gd.Variable(1.0)
    assert repr(regular_variable) == "<gd.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"
    mirrored_variable.assign(3.0)  # outside the scope
    assert [float(np.asarray(c)) for c in strategy.experimental_local_results(mirrored_variable)] == [3.0, 3.0]
    assert strategy.extended.variable_created_in_scope(mirrored_variable)




def test_distributed_dataset_example() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    dist_dataset = strategy.experimental_distribute_dataset(gd.data.Dataset.range(4).batch(2))
    result = [strategy.run(lambda x: x * 2, args=(x,)) for x in dist_dataset]
    assert [[v.tolist() for v in r.values] for r in result] == [[[0], [2]], [[4], [6]]]


def test_partial_batch_mean_uses_the_real_denominator() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    dist = strategy.experimental_distribute_dataset(gd.data.Dataset.range(6).batch(8))
    (x,) = list(dist)
    per_replica = strategy.run(lambda v: v.astype(np.float32), args=(x,))
    assert strategy.reduce("MEAN", per_replica, axis=0) == 2.5


def _train(strategy, optimizer_fn, steps: int = 4, batch: int = 32) -> tuple[list[np.ndarray], list[float]]:
    data = digits()
    with strategy.scope():
        model = MLP((64, 32, 10), seed=0, trainable=True)
        optimizer = optimizer_fn()
    step = model.make_train_step(optimizer, batch)
    dataset = gd.data.Dataset.from_tensor_slices((data.x_train[: batch * steps], data.y_train[: batch * steps]))
    losses = []
    for x, y in strategy.experimental_distribute_dataset(dataset.batch(batch)):
        losses.append(float(strategy.reduce("SUM", strategy.run(step, args=(x, y)), axis=None)))
    return [v.numpy() for v in model.trainable_variables], losses


@pytest.mark.parametrize("cross_device_ops", [gd.NcclAllReduce(), gd.HierarchicalCopyAllReduce(),
                                              gd.ReductionToOneDevice(), gd.ReductionToOneDevice("cpu:1")],
                         ids=["ring", "hierarchical", "to_one", "to_cpu1"])
@pytest.mark.parametrize("replicas", [2, 4])
def test_mirrored_training_equals_one_device(replicas: int, cross_device_ops) -> None:
    expected, expected_losses = _train(gd.OneDeviceStrategy("cpu:0"), lambda: gd.optimizers.SGD(0.1, momentum=0.9))
    got, losses = _train(gd.MirroredStrategy(_devices(replicas), cross_device_ops),
                         lambda: gd.optimizers.SGD(0.1, momentum=0.9))
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_mirrored_adam_equals_one_device() -> None:
    expected, _ = _train(gd.OneDeviceStrategy("cpu:0"), lambda: gd.optimizers.Adam(0.01))
    got, _ = _train(gd.MirroredStrategy(["cpu:0", "cpu:1"]), lambda: gd.optimizers.Adam(0.01))
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cross_device_ops", [None, gd.NcclAllReduce()], ids=["default", "nccl"])
def test_plan_has_a_segment_per_device_and_all_reduces(cross_device_ops) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=cross_device_ops)
    with strategy.scope():
        model = MLP((8, 4, 3), seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    step = model.make_train_step(optimizer, 4)
    x = gd.PerReplica((np.ones((2, 8), np.float32),) * 2)
    y = gd.PerReplica((np.array([0, 1]), np.array([2, 1])))
    concrete = strategy._function_for(step).get_concrete_function(x, y)
    plan = concrete.plan
    assert {s.device for s in plan.segments} == {"cpu:0", "cpu:1"}
    reduces = [c for c in plan.comms if c.op == "AllReduce"]
    if cross_device_ops is None:  # each gradient summed on the replica that updates it
        assert not reduces
        sums = concrete.graph("partitioned").find_nodes("Sum")
        assert len(sums) == len(model.trainable_variables) and {s.device for s in sums} == {"cpu:0", "cpu:1"}
        moved = [c for c in plan.comms if c.op == "Transfer"]  # the other replica's gradient, to each reader
        assert {d for c in moved for d in c.devices} == {"cpu:0", "cpu:1"}
    else:
        assert len(reduces) == len(model.trainable_variables)
        assert all(c.devices == ["cpu:0", "cpu:1"] and c.attrs["algorithm"] == "ring" for c in reduces)
    gd.verify(concrete.graph("partitioned"))


def test_bad_input() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="more than once"):
        gd.MirroredStrategy(["cpu:0", "/cpu:0"])
    with pytest.raises(gd.InvalidArgumentError, match="cross_device_ops"):
        gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops="ring")
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with pytest.raises(gd.InvalidArgumentError, match="2 replicas"):
        strategy.run(lambda v: v, args=(gd.PerReplica((np.ones(2),) * 3),))
    mismatched = gd.PerReplica((np.ones(2, np.float32), np.ones(3, np.float32)))
    with pytest.raises(gd.GraphError, match=r"different shapes or dtypes \(replica 0: float32\[2\], replica 1"):
        strategy.run(lambda v: gd.get_replica_context().all_reduce("sum", v), args=(mismatched,))
    structures = gd.PerReplica((np.ones(2, np.float32), (np.ones(2, np.float32),)))
    with pytest.raises(gd.InvalidArgumentError, match="different structures"):
        strategy.run(lambda v: v, args=(structures,))
