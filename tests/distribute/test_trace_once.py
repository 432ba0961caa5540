"""A step is traced once, as one replica, whatever the strategy; passes make it distributed.

The traced graph holds one copy of the replica computation and abstract
cross-replica nodes; the rewritten graph holds the replicas and collectives.
merge_call has TensorFlow's semantics, strategy.reduce/gather work in a
gd.function without the strategy's scope, and per-replica arguments of
different shapes (a partial batch) are traced once per shape.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.ir import assert_structural_equal, structural_diff
from graphdist.models.mlp import MLP

RNG = np.random.default_rng(7)


def _two_layer_step(strategy: gd.Strategy, per_replica_batch: int = 4) -> gd.ConcreteFunction:
    """A two-layer MLP training step (SGD) under ``strategy``, each replica on ``per_replica_batch`` rows."""
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        model = MLP((6, 5, 3), seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    # No global batch size: compute_average_loss divides by the batch times a NumReplicas node, so nothing
    # in the traced graph depends on the replica count.
    step = model.make_train_step(optimizer)

    @gd.function
    def train(x, y):
        losses = strategy.run(step, args=(x, y))
        return strategy.reduce("SUM", losses, axis=None)

    x = RNG.standard_normal((per_replica_batch, 6)).astype(np.float32)
    y = np.arange(per_replica_batch) % 3
    if replicas > 1:
        x, y = gd.PerReplica((x,) * replicas), gd.PerReplica((y,) * replicas)
    return train.get_concrete_function(x, y)


def _count(graph: gd.Graph, op: str, domain: str = "") -> int:
    return len(graph.find_nodes(op, domain))


def test_traced_graph_is_one_replica_under_any_strategy() -> None:
    one = _two_layer_step(gd.OneDeviceStrategy("cpu:0"))
    four = _two_layer_step(gd.MirroredStrategy([f"cpu:{i}" for i in range(4)]))
    traced_one, traced_four = one.graph("traced"), four.graph("traced")
    assert _count(traced_four, "MatMul") == _count(traced_one, "MatMul") == 2  # the forward pass, once
    assert not traced_four.find_nodes("AllReduce", "graphdist") and not traced_four.find_nodes("AllGather",
                                                                                              "graphdist")
    assert _count(traced_four, "ReplicaAllReduce", "graphdist") == 4  # the 4 gradients' aggregation, abstract
    assert _count(traced_four, "CrossReplicaReduce", "graphdist") == 1  # strategy.reduce of the loss
    # Same graph, node for node (names, group keys and the variables' uids aside).
    assert_structural_equal(traced_four, traced_one)
    # The pipeline makes the replicas and the collectives.
    rewritten = four.graph("rewritten")
    assert _count(rewritten, "MatMul") == 4 * _count(one.graph("rewritten"), "MatMul")
    # (4 gradients + the loss), each read by one replica (its balanced update; replica 0 for the loss):
    # summed there from the 4 replicas' values, no all-reduce left
    assert not rewritten.find_nodes("AllReduce", "graphdist")
    sums = rewritten.find_nodes("Sum")
    assert len(sums) == 5 and all(len(s.inputs) == 4 for s in sums)
    assert {n.replica for n in rewritten.nodes} == {0, 1, 2, 3}


def _objects(value, path: str = "meta"):
    """Every leaf of a meta tree that is not plain data (numbers, strings, arrays, ir dataclasses), with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _objects(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            yield from _objects(item, f"{path}[{index}]")
    elif not (value is None or isinstance(value, (str, bytes, int, float, bool, np.ndarray, np.generic, np.dtype))
              or type(value).__module__.startswith(("graphdist.ir.", "graphdist.passes."))
              or isinstance(value, type) and value.__module__ == "builtins"):  # a result tree's containers
        yield path, type(value)


def test_graphs_hold_placement_as_data_not_python_objects() -> None:
    """The traced and rewritten graphs' meta (placement, variables, replication...) holds plain data and ir
    records, never a gd.Variable or a strategy: what a plan stores and a re-plan rebuilds."""
    for strategy, kind in ((gd.MirroredStrategy(["cpu:0", "cpu:1"]), "mirrored"),
                           (gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:0"), "central")):
        concrete = _two_layer_step(strategy)
        for stage in ("traced", "rewritten", "partitioned"):
            graph = concrete.graph(stage)
            assert list(_objects(vars(graph.meta))) == [], stage
            for node in graph.nodes:
                assert list(_objects(node.meta, f"{node.name}.meta")) == [], stage
        placement = concrete.graph("rewritten").meta.placement
        assert {p.kind for p in placement.variables.values()} == {kind}


def test_replicated_step_trains_like_one_device() -> None:
    strategies = [gd.OneDeviceStrategy("cpu:0"), gd.MirroredStrategy(["cpu:0", "cpu:1"]),
                  gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:9")]
    x = RNG.standard_normal((8, 6)).astype(np.float32)
    y = np.arange(8) % 3
    finals = []
    for strategy in strategies:
        with strategy.scope():
            model = MLP((6, 5, 3), seed=1, trainable=True)
            optimizer = gd.optimizers.Adam(0.01)
        step = model.make_train_step(optimizer, 8)
        dataset = strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, y)))
        (batch,) = list(dataset)
        for _ in range(3):
            strategy.run(step, args=batch)
        finals.append([v.numpy() for v in model.trainable_variables])
    for other in finals[1:]:
        for got, want in zip(other, finals[0]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_merge_call_runs_once_in_cross_replica_context_with_per_replica_values() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    calls: list[object] = []

    def merge_fn(merge_strategy, value):
        calls.append(value)
        assert merge_strategy is strategy and gd.in_cross_replica_context()
        assert gd.get_replica_context() is None
        return merge_strategy.reduce("SUM", value, axis=None)

    def replica_fn():
        context = gd.get_replica_context()
        value = (context.replica_id_in_sync_group + 1).astype(np.float32)
        return context.merge_call(merge_fn, args=(value,))

    result = strategy.run(replica_fn)
    assert [float(v) for v in result.values] == [3.0, 3.0]  # (0 + 1) + (1 + 1) on both replicas
    assert len(calls) == 1 and isinstance(calls[0], gd.PerReplica) and len(calls[0].values) == 2


def test_merge_call_result_feeds_replica_code() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])

    def replica_fn(x):
        context = gd.get_replica_context()
        total = context.merge_call(lambda s, v: s.reduce("MEAN", v, axis=None), args=(x,))
        return x - total

    x = gd.PerReplica(tuple(np.full(2, r, np.float32) for r in range(3)))
    result = strategy.run(replica_fn, args=(x,))
    assert [v.tolist() for v in result.values] == [[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]]


@pytest.mark.parametrize("operation", ["gather", "reduce"])
def test_gather_and_reduce_in_a_function_without_the_scope(operation: str) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])  # never entered

    @gd.function
    def step(x):
        doubled = strategy.run(lambda v: v * 2.0, args=(x,))
        if operation == "gather":
            return strategy.gather(doubled, axis=0)
        return strategy.reduce("SUM", doubled, axis=0)

    x = gd.PerReplica((np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)))
    result = step(x)
    if operation == "gather":
        np.testing.assert_array_equal(result, np.concatenate([np.full((2, 3), 2.0), np.full((2, 3), 4.0)]))
    else:
        np.testing.assert_array_equal(result, np.full(3, 12.0, np.float32))
    traced = step.get_concrete_function(x).graph("traced")
    assert traced.find_nodes("CrossReplicaGather" if operation == "gather" else "CrossReplicaReduce", "graphdist")


def test_local_results_in_a_function_read_each_replica() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(x):
        per_replica = strategy.run(lambda v: v + 10.0, args=(x,))
        first, second = strategy.experimental_local_results(per_replica)
        return second - first

    x = gd.PerReplica((np.zeros(2, np.float32), np.full(2, 5.0, np.float32)))
    np.testing.assert_array_equal(step(x), [5.0, 5.0])
    traced = step.get_concrete_function(x).graph("traced")
    assert [n.attrs["replica"] for n in traced.find_nodes("ReadReplica", "graphdist")] == [0, 1]


def test_uneven_per_replica_shapes_are_traced_once_per_shape() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])

    @gd.function
    def step(x):
        sums = strategy.run(lambda v: np.sum(v * 2.0, axis=0) + gd.get_replica_context().all_reduce("SUM", v.shape[0]),
                            args=(x,))
        return sums, strategy.reduce("MEAN", strategy.run(lambda v: v, args=(x,)), axis=0)

    parts = (np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32), np.full((1, 3), 3.0, np.float32))
    sums, mean = step(gd.PerReplica(parts))
    assert [v.tolist() for v in sums.values] == [[9.0] * 3, [13.0] * 3, [11.0] * 3]  # 2*sum + (2+2+1)
    np.testing.assert_allclose(mean, np.full(3, 9.0 / 5.0, np.float32))  # (2*1 + 2*2 + 1*3) / 5 rows
    traced = step.get_concrete_function(gd.PerReplica(parts)).graph("traced")
    assert sorted(traced.meta.replica_variants.values()) == [[0, 1], [2]]
    assert len(traced.inputs) == 2  # one input per distinct shape, not per replica


def test_reduce_inside_the_replica_function_is_refused() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    def replica_fn(v):
        return strategy.reduce("SUM", v, axis=None)

    with pytest.raises(gd.InvalidArgumentError, match="inside strategy.run.*all_reduce"):
        strategy.run(replica_fn, args=(gd.PerReplica((np.ones(2, np.float32),) * 2),))


def test_structural_diff_names_the_first_difference() -> None:
    a = gd.trace(lambda x: np.tanh(x) * 2.0, np.ones(3, np.float32))
    b = gd.trace(lambda x: np.tanh(x) * 3.0, np.ones(3, np.float32))
    assert structural_diff(a, a.copy()) is None
    assert "constant" in structural_diff(a, b)
    c = gd.trace(lambda x: np.exp(x) * 2.0, np.ones(3, np.float32))
    assert "Tanh vs Exp" in structural_diff(a, c)
    with pytest.raises(gd.GraphError, match="differs"):
        assert_structural_equal(a, c)
