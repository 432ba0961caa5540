"""InsertCollectivesPass: replicated before vs hand-built expected structure, honest
``modified``, a second run changes nothing, and the collectives compute the reduction over
the replicas (executed as a two-replica plan with the local communicator)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import default_cache, get_backend
from graphdist.compile.plan import Plan
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal, to_onnx, verify
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.insert_collectives import InsertCollectivesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.partition import PartitionPass
from graphdist.passes.replicate import ReplicatePass
from graphdist.runtime.devices import parse_device

CTX = PassContext(devices=("cpu:0", "cpu:1"))
RNG = np.random.default_rng(5)
META = ("replica", "side_effect")


def _execute(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Places, partitions and runs a copy of the graph as a plan (collectives included)."""
    placed = PassManager([LowerCollectivesPass(), AssignDevicesPass(), PartitionPass()]).run(graph.copy(), CTX).graph
    plan = Plan.from_graph(placed).compile(get_backend("reference"))
    return plan.run({v.name: feeds[v.name] for v in placed.inputs})


def _reference(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The whole graph on the reference backend (cross-replica ops reduce their inputs themselves)."""
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run({v.name: feeds[v.name] for v in graph.inputs})


def _op(graph: Graph, op_type: str, inputs: list[Value], attrs: dict | None = None, *, replica: int | None = None,
        domain: str = "", **meta) -> Value:
    node = graph.add_node(op_type, inputs, attrs, domain=domain)
    node.meta.update(meta)
    if replica is not None:
        node.replica = replica
        node.meta.update(context="replica")
    return node.outputs[0]


def _insert(graph: Graph, num_workers: int = 1) -> Graph:
    """Runs the pass: it must say it changed the graph, verify, and change nothing the second time."""
    result = InsertCollectivesPass(num_workers)(graph, CTX)
    assert result.modified
    verify(result.graph)
    snapshot = result.graph.copy()
    again = InsertCollectivesPass(num_workers)(result.graph, CTX)
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, placement=True, meta_keys=META)
    return result.graph


def _feeds(graph: Graph) -> dict[str, np.ndarray]:
    return {v.name: RNG.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs}


@pytest.mark.parametrize("num_workers", [1, 3])
def test_replica_collectives_sharing_a_key_become_one_group(num_workers: int) -> None:
    in_sync = 2 * num_workers
    graph = Graph("replicated")  # as ReplicatePass leaves it: one copy per replica, keys shared
    xs = [graph.add_input(f"x{r}", np.float32, (2, 3)) for r in range(2)]
    two = graph.add_initializer("two", np.float32(2.0))
    muls = [_op(graph, "Mul", [xs[r], two], replica=r) for r in range(2)]
    sums = [_op(graph, "ReplicaAllReduce", [muls[r]], {"reduce_op": "MAX", "group_key": "all_reduce0.0"},
                replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    gathers = [_op(graph, "ReplicaAllGather", [xs[r]], {"axis": 1, "num_replicas": in_sync,
                                                         "group_key": "all_gather1.0"},
                   replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    graph.outputs = [*sums, *gathers]
    graph = _insert(graph, num_workers)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, (2, 3)) for r in range(2)]
    two = expected.add_initializer("two", np.float32(2.0))
    muls = [_op(expected, "Mul", [xs[r], two], replica=r) for r in range(2)]
    sums = [_op(expected, "AllReduce", [muls[r]], {"reduce_op": "MAX", "group_key": "a", "group_size": in_sync},
                replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    gathers = [_op(expected, "AllGather", [xs[r]], {"axis": 1, "group_key": "b", "group_size": in_sync},
                   replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    expected.outputs = [*sums, *gathers]
    assert_structural_equal(graph, expected, placement=True, meta_keys=META)
    assert graph.outputs[2].shape == (2, 3 * in_sync)


def test_two_groups_stay_two_groups() -> None:
    graph = Graph("two_groups")
    xs = [graph.add_input(f"x{r}", np.float32, (3,)) for r in range(2)]
    graph.outputs = [_op(graph, "ReplicaAllReduce", [xs[r]], {"reduce_op": "SUM", "group_key": key},
                         replica=r, domain=GRAPHDIST_DOMAIN) for key in ("k0", "k1") for r in range(2)]
    graph = _insert(graph)
    assert [n.attrs["group_key"] for n in graph.nodes] == ["k0", "k0", "k1", "k1"]
    assert [n.attrs["group_size"] for n in graph.nodes] == [2, 2, 2, 2]
    feeds = _feeds(graph)
    for got, want in zip(_execute(graph, feeds), [feeds["x0"] + feeds["x1"]] * 4, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_copy_alone_is_a_group_of_one() -> None:
    def step(x):
        return gd.get_replica_context().all_reduce("sum", x * 2.0)

    traced = gd.trace(step, np.ones((2, 3), np.float32))
    graph = ReplicatePass(1)(traced.copy(), PassContext()).graph
    before = _reference(graph, {"arg0": np.arange(6, dtype=np.float32).reshape(2, 3)})
    graph = _insert(graph)

    expected = Graph("expected")
    x, two = expected.add_input("x", np.float32, (2, 3)), expected.add_initializer("two", np.float32(2.0))
    doubled = _op(expected, "Mul", [x, two])
    expected.outputs = [_op(expected, "AllReduce", [doubled], {"reduce_op": "SUM", "group_key": "k", "group_size": 1},
                            domain=GRAPHDIST_DOMAIN, side_effect=True)]
    assert_structural_equal(graph, expected, placement=True, meta_keys=META)
    after = _reference(graph, {"arg0": np.arange(6, dtype=np.float32).reshape(2, 3)})
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[0], np.arange(6).reshape(2, 3) * 2.0)


def _cross_graph(op_type: str, attrs: dict, shapes=((2, 3), (2, 3))) -> Graph:
    """Cross-replica code reading both replicas' ``x_r * 2`` (``Neg`` reads the result)."""
    graph = Graph("cross")
    xs = [graph.add_input(f"x{r}", np.float32, shape) for r, shape in enumerate(shapes)]
    two = graph.add_initializer("two", np.float32(2.0))
    muls = [_op(graph, "Mul", [xs[r], two], replica=r) for r in range(2)]
    result = _op(graph, op_type, muls, attrs, domain=GRAPHDIST_DOMAIN, context="cross", side_effect=True)
    graph.outputs = [_op(graph, "Neg", [result])]
    return graph


@pytest.mark.parametrize(("op_type", "attrs", "collective", "combine"), [
    ("CrossReplicaReduce", {"reduce_op": "SUM", "group_key": "reduce0"}, "AllReduce", lambda a, b: a + b),
    ("CrossReplicaReduce", {"reduce_op": "MEAN", "group_key": "reduce0"}, "AllReduce", lambda a, b: (a + b) / 2),
    ("CrossReplicaGather", {"axis": 1, "num_replicas": 2, "group_key": "gather0"}, "AllGather",
     lambda a, b: np.concatenate([a, b], axis=1)),
])
def test_cross_replica_op_becomes_one_member_per_replica(op_type, attrs, collective, combine) -> None:
    graph = _cross_graph(op_type, attrs)
    feeds = _feeds(graph)
    before = _reference(graph, feeds)
    graph = _insert(graph)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, (2, 3)) for r in range(2)]
    two = expected.add_initializer("two", np.float32(2.0))
    muls = [_op(expected, "Mul", [xs[r], two], replica=r) for r in range(2)]
    member_attrs = {k: v for k, v in attrs.items() if k != "num_replicas"} | {"group_size": 2}
    members = [_op(expected, collective, [muls[r]], member_attrs, replica=r, domain=GRAPHDIST_DOMAIN,
                   side_effect=True) for r in range(2)]
    expected.outputs = [_op(expected, "Neg", [members[0]])]  # readers read replica 0's member
    assert_structural_equal(graph, expected, placement=True, meta_keys=META)
    assert [n.meta["context"] for n in graph.nodes[2:4]] == ["replica", "replica"]

    (after,) = _execute(graph, feeds)
    np.testing.assert_allclose(after, before[0], rtol=1e-6)
    np.testing.assert_allclose(after, -combine(2 * feeds["x0"], 2 * feeds["x1"]), rtol=1e-6)


def test_traced_step_reduces_and_gathers_over_replicas() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    def replica_fn(v):
        context = gd.get_replica_context()
        return context.all_reduce("SUM", v * 2.0), context.all_gather(v, axis=0), v * 2.0

    @gd.function
    def step(x):
        total, gathered, doubled = strategy.run(replica_fn, args=(x,))
        return total, gathered, strategy.reduce("MEAN", doubled, axis=None), strategy.gather(doubled, axis=0)

    x = gd.PerReplica((np.zeros((2, 3), np.float32),) * 2)
    graph = ReplicatePass(2)(step.get_concrete_function(x).graph("traced").copy(), CTX).graph
    graph = _insert(graph)
    assert not any(n.op_type.startswith(("Replica", "Cross")) for n in graph.nodes)
    assert sorted({(n.op_type, n.attrs["group_size"]) for n in graph.nodes if n.domain}) == [("AllGather", 2),
                                                                                              ("AllReduce", 2)]
    x0, x1 = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 5.0, np.float32)
    total0, total1, gathered0, gathered1, mean, gathered = _execute(graph, {"arg0_r0": x0, "arg0_r1": x1})
    for total in (total0, total1):
        np.testing.assert_array_equal(total, [[10, 12, 14], [16, 18, 20]])  # 2 * (x0 + x1)
    for all_gathered in (gathered0, gathered1):
        np.testing.assert_array_equal(all_gathered, np.concatenate([x0, x1]))
    np.testing.assert_array_equal(mean, [[5, 6, 7], [8, 9, 10]])  # (2 x0 + 2 x1) / 2
    np.testing.assert_array_equal(gathered, np.concatenate([2 * x0, 2 * x1]))


def test_uneven_replica_all_gather_is_an_error() -> None:
    graph = Graph("uneven")
    xs = [graph.add_input(f"x{r}", np.float32, shape) for r, shape in enumerate([(2, 3), (1, 3)])]
    graph.outputs = [_op(graph, "ReplicaAllGather", [xs[r]], {"axis": 0, "num_replicas": 2, "group_key": "ag7"},
                         replica=r, domain=GRAPHDIST_DOMAIN) for r in range(2)]
    with pytest.raises(gd.GraphError, match=r"all-gather ag7 .*different shapes \(replica 0: float32\[2,3\], "
                                            r"replica 1: float32\[1,3\]\)"):
        InsertCollectivesPass()(graph, CTX)


def test_uneven_cross_replica_gather_is_an_error() -> None:
    graph = _cross_graph("CrossReplicaGather", {"axis": 0, "num_replicas": 2, "group_key": "g3"},
                         shapes=((2, 3), (2, 4)))
    with pytest.raises(gd.GraphError, match=r"all-gather g3 .*different shapes.*float32\[2,4\]"):
        InsertCollectivesPass()(graph, CTX)


def test_no_cross_replica_ops_is_unchanged() -> None:
    graph = Graph("plain")
    x = graph.add_input("x", np.float32, (3,))
    y = _op(graph, "Neg", [x], replica=0)
    graph.outputs = [_op(graph, "AllReduce", [y], {"reduce_op": "SUM", "group_size": 1, "group_key": "k"},
                         domain=GRAPHDIST_DOMAIN, replica=0)]
    before = graph.copy()
    result = InsertCollectivesPass()(graph, CTX)
    assert not result.modified
    assert_structural_equal(result.graph, before, placement=True, meta_keys=META)
