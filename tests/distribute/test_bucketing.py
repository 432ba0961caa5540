"""Gradient bucketing (``cross_device_ops`` with ``num_packs`` / ``bytes_per_pack``):
MirroredStrategy training with bucketing equals one-device training and training
without bucketing, and the plan has fewer all-reduce tasks."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

SIZES = (64, 24, 16, 16, 10)  # 4 layers: 8 gradients of 16..6144 bytes


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


def _train(strategy, optimizer_fn, steps: int = 4, batch: int = 32, sizes=SIZES):
    data = digits()
    with strategy.scope():
        model = MLP(sizes, seed=0, trainable=True)
        optimizer = optimizer_fn()
    step = model.make_train_step(optimizer, batch)
    dataset = gd.data.Dataset.from_tensor_slices((data.x_train[: batch * steps], data.y_train[: batch * steps]))
    losses = []
    for x, y in strategy.experimental_distribute_dataset(dataset.batch(batch)):
        losses.append(float(strategy.reduce("SUM", strategy.run(step, args=(x, y)), axis=None)))
    return [v.numpy() for v in model.trainable_variables], losses, (strategy, step, x, y)


def _all_reduce_tasks(setup) -> list:
    strategy, step, x, y = setup
    plan = strategy._function_for(step).get_concrete_function(x, y).plan
    return [c for c in plan.comms if c.op == "AllReduce"]


def _sgd():
    return gd.optimizers.SGD(0.1, momentum=0.9)


#: Gradient bytes in the order the backward pass produces them (last layer first, bias
#: before kernel): 40, 640, 64, 1024, 64, 1536, 96, 6144 (9608 in all).
BUCKETED = {  # name: (cross_device_ops, all-reduce tasks in the plan)
    "one_pack": (lambda: gd.NcclAllReduce(num_packs=1), 1),
    "three_packs": (lambda: gd.NcclAllReduce(num_packs=3), 3),  # first 6 | 96 | 6144
    "bytes_2k": (lambda: gd.NcclAllReduce(bytes_per_pack=2048), 3),  # 1832 | 1632 | 6144
    "bytes_1k": (lambda: gd.NcclAllReduce(bytes_per_pack=1024), 6),  # 744 | 1024 | 64 | 1536 | 96 | 6144
    "tiny_packs": (lambda: gd.NcclAllReduce(bytes_per_pack=1), 8),  # every gradient alone: unchanged
    "bytes_huge": (lambda: gd.NcclAllReduce(bytes_per_pack=1 << 30), 1),
    "hierarchical_2": (lambda: gd.HierarchicalCopyAllReduce(num_packs=2), 2),
}


@pytest.fixture(scope="module")
def one_device():
    return _train(gd.OneDeviceStrategy("cpu:0"), _sgd)


@pytest.fixture(scope="module", params=[2, 4], ids=["2dev", "4dev"])
def unbucketed(request):
    # every gradient all-reduced alone (an explicit cross_device_ops: no sums at the readers)
    return request.param, _train(gd.MirroredStrategy(_devices(request.param), gd.NcclAllReduce()), _sgd)


@pytest.mark.parametrize("config", list(BUCKETED), ids=list(BUCKETED))
def test_bucketed_training_equals_one_device_and_unbucketed(config, one_device, unbucketed) -> None:
    replicas, (plain, plain_losses, plain_setup) = unbucketed
    expected, expected_losses, _ = one_device
    make, expected_tasks = BUCKETED[config]
    got, losses, setup = _train(gd.MirroredStrategy(_devices(replicas), make()), _sgd)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # against the same strategy without bucketing: same reductions, only fused
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    for a, b in zip(got, plain):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if replicas == 2:  # a sum of two buffers does not depend on the order: bitwise equal
        for a, b in zip(got, plain):
            np.testing.assert_array_equal(a, b)
    tasks, plain_tasks = _all_reduce_tasks(setup), _all_reduce_tasks(plain_setup)
    assert len(plain_tasks) == 2 * (len(SIZES) - 1)
    assert all(len(t.devices) == replicas for t in tasks)
    assert len(tasks) == expected_tasks
    total = sum(v.nbytes for v in got)
    assert sum(setup[0]._function_for(setup[1]).get_concrete_function(*setup[2:]).plan.graph_value(t.inputs[0]).nbytes
               for t in tasks) == total  # every gradient byte is reduced exactly once


def test_bucketed_adam_equals_one_device() -> None:
    expected, _, _ = _train(gd.OneDeviceStrategy("cpu:0"), lambda: gd.optimizers.Adam(0.01))
    got, _, setup = _train(gd.MirroredStrategy(_devices(2), gd.NcclAllReduce(bytes_per_pack=2048)),
                           lambda: gd.optimizers.Adam(0.01))
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert len(_all_reduce_tasks(setup)) == 3


def test_packs_are_reduced_in_backward_order() -> None:
    """Packs are contiguous in backward order, and the first communication task holds the
    last layer's gradients (produced first)."""
    _, _, setup = _train(gd.MirroredStrategy(_devices(2), gd.NcclAllReduce(bytes_per_pack=2048)), _sgd, steps=1)
    strategy, step, x, y = setup
    graph = strategy._function_for(step).get_concrete_function(x, y).graph("rewritten")
    members = {n.attrs["group_key"]: n.meta.get("bucket_members", [n.attrs["group_key"]]) for n in graph.nodes
               if n.qualified_op == "graphdist.AllReduce"}
    # apply_gradients all-reduces in variable order (kernel, bias per layer): group "all_reduceK.i" is variable i
    order = [[int(key.rsplit(".", 1)[1]) for key in members[task.name]] for task in _all_reduce_tasks(setup)]
    assert order == [[7, 6, 5, 4, 3], [2, 1], [0]]  # 1832 | 1632 | 6144 bytes


def test_mixed_collectives_in_one_function() -> None:
    """Groups of other dtypes and reduce ops are packed only with their kind; results stay exact."""
    strategy = gd.MirroredStrategy(_devices(4), gd.NcclAllReduce(num_packs=1))

    @gd.function
    def step():
        def replica_fn():
            ctx = gd.get_replica_context()
            rid = ctx.replica_id_in_sync_group
            ones = np.ones((2, 3), np.float32)
            total, biggest, count = ctx.all_reduce("sum", (ones * rid.astype(np.float32),
                                                           np.full(4, 1.0, np.float32) + rid.astype(np.float32),
                                                           rid + np.int32(1)))
            mean = ctx.all_reduce("mean", np.float32(2.0) * rid.astype(np.float32))
            top = ctx.all_reduce("max", np.arange(3, dtype=np.float32) * rid.astype(np.float32))
            return total, biggest, count, mean, top

        return strategy.run(replica_fn)

    total, biggest, count, mean, top = (r.values[0] for r in step())
    np.testing.assert_array_equal(total, np.full((2, 3), 6.0, np.float32))
    np.testing.assert_array_equal(biggest, np.full(4, 10.0, np.float32))
    assert int(count) == 10 and float(mean) == 3.0
    np.testing.assert_array_equal(top, np.arange(3, dtype=np.float32) * 3)
    plan = step.get_concrete_function().plan
    kinds = sorted((c.attrs["reduce_op"], str(plan.graph_value(c.inputs[0]).dtype)) for c in plan.comms)
    assert kinds == [("MAX", "float32"), ("MEAN", "float32"), ("SUM", "float32"), ("SUM", "int32")]


def test_cross_device_ops_settings() -> None:
    assert gd.NcclAllReduce().bucketing() is None
    assert gd.NcclAllReduce(num_packs=0).bucketing() is None
    assert gd.NcclAllReduce(bytes_per_pack=0).bucketing() is None
    assert gd.NcclAllReduce(num_packs=0, bytes_per_pack=4096).bucketing() is None
    assert gd.NcclAllReduce(num_packs=2).bucketing() == {"num_packs": 2}
    assert gd.HierarchicalCopyAllReduce(bytes_per_pack=4096).bucketing() == {"bytes_per_pack": 4096}
    assert gd.ReductionToOneDevice().bucketing() is None
    assert repr(gd.NcclAllReduce()) == "NcclAllReduce()"
    assert repr(gd.NcclAllReduce(num_packs=2)) == "NcclAllReduce(num_packs=2)"
    assert repr(gd.NcclAllReduce(bytes_per_pack=64)) == "NcclAllReduce(bytes_per_pack=64)"
    with pytest.raises(gd.InvalidArgumentError, match="not both"):
        gd.NcclAllReduce(num_packs=2, bytes_per_pack=1024)
    with pytest.raises(gd.InvalidArgumentError, match="bytes_per_pack must be a non-negative int"):
        gd.NcclAllReduce(bytes_per_pack=-1)
    with pytest.raises(gd.InvalidArgumentError, match="num_packs must be a non-negative int"):
        gd.HierarchicalCopyAllReduce(num_packs=1.5)


def test_benchmark_smoke(tmp_path) -> None:
    from benchmarks import bench_bucketing as bench

    results = bench.run(quick=True, cases=[("tiny MLP", (8, 8, 8, 4), 8, 1, 2)])
    assert results["goal_met"]
    (case,) = results["cases"]
    assert case["tasks"][bench._OFF] == 6 and case["tasks"]["one pack (num_packs=1)"] == 1
    assert all(np.isfinite(v) and v > 0 for v in case["us"].values())
    text = bench.markdown(results)
    assert text.startswith("## Gradient bucketing") and "| one pack (num_packs=1) | 1 |" in text
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# title\n\n<!-- begin other -->\nkeep\n<!-- end other -->\n")
    bench.write_section("first", doc)
    bench.write_section("second", doc)
    assert doc.read_text() == ("# title\n\n<!-- begin other -->\nkeep\n<!-- end other -->\n\n"
                               "<!-- begin bucketing -->\nsecond\n<!-- end bucketing -->\n")
