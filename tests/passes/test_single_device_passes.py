"""Pass tests in the style of TVM/torch.fx: before vs expected structure, honest
``modified``, a second run changes nothing, numerics before == after."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import default_cache, get_backend
from graphdist.ir import Graph, to_onnx, verify
from graphdist.ir.comm_ops import is_communication
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.insert_collectives import InsertCollectivesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.partition import PartitionPass
from graphdist.passes.replicate import ReplicatePass
from graphdist.runtime.devices import parse_device

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _run(graph: Graph, x: np.ndarray = X) -> list[np.ndarray]:
    """Evaluates a graph with the reference backend (graphdist ops as one participant)."""
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run({graph.inputs[0].name: x})


def _ops(graph: Graph) -> list[str]:
    return [n.qualified_op for n in graph.nodes]


def _replica_step(x):
    ctx = gd.get_replica_context()
    total = ctx.all_reduce("sum", x * 2.0)
    gathered = ctx.all_gather(x, axis=0)
    return total + ctx.replica_id_in_sync_group.astype(np.float32), gathered


@pytest.fixture
def traced() -> Graph:
    return gd.trace(_replica_step, X)


def _check_pass(pass_, graph: Graph, expected_ops: list[str], ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    before = _run(graph)
    result = pass_(graph, ctx)
    assert result.modified, f"{pass_.name} changed the graph but said it did not"
    assert _ops(result.graph) == expected_ops
    verify(result.graph)
    for got, want in zip(_run(result.graph), before):
        np.testing.assert_array_equal(got, want)
    again = pass_(result.graph, ctx)
    assert not again.modified, f"{pass_.name} is not idempotent"
    assert _ops(again.graph) == expected_ops
    return result.graph


def test_one_replica_materializes_the_replica_id(traced: Graph) -> None:
    assert "graphdist.ReplicaId" in _ops(traced)
    graph = _check_pass(ReplicatePass(1), traced,
                        ["Mul", "graphdist.ReplicaAllReduce", "graphdist.ReplicaAllGather", "Cast", "Add"])
    constants = [v for v in graph.initializers.values() if v.name.startswith("replica_id")]
    assert [int(c.const_value) for c in constants] == [0]


def test_lower_single_replica_collectives(traced: Graph) -> None:
    graph = PassManager([ReplicatePass(1), InsertCollectivesPass()]).run(traced, PassContext()).graph
    assert _ops(graph) == ["Mul", "graphdist.AllReduce", "graphdist.AllGather", "Cast", "Add"]
    _check_pass(LowerCollectivesPass(), graph, ["Mul", "Cast", "Add"])


@pytest.mark.parametrize(("attrs", "expected"), [
    (None, {"algorithm": "ring"}),
    ({"algorithm": "hierarchical_copy"}, {"algorithm": "hierarchical_copy"}),
    ({"algorithm": "reduce_to_one", "reduce_to_device": "cpu:1"}, {"algorithm": "reduce_to_one", "root": 1}),
])
def test_lower_collectives_annotates_wide_groups(attrs, expected) -> None:
    graph = Graph("wide")
    x = graph.add_input("x", np.float32, (2,))
    graph.outputs = graph.add_node("AllReduce", [x], {"reduce_op": "SUM", "group_size": 2},
                                   domain="graphdist").outputs
    ctx = PassContext(devices=("cpu:0", "cpu:1"))
    result = LowerCollectivesPass(attrs)(graph, ctx)
    assert result.modified
    node = result.graph.nodes[0]
    assert {k: node.attrs[k] for k in expected} == expected
    assert not LowerCollectivesPass(attrs)(result.graph, ctx).modified


def test_eliminate_dead_nodes() -> None:
    def fn(x):
        unused = np.exp(x) * 3.0  # noqa: F841 - dead on purpose
        return x + 1.0

    graph = gd.trace(fn, X)
    assert _ops(graph) == ["Exp", "Mul", "Add"]
    graph = _check_pass(EliminateDeadNodesPass(), graph, ["Add"])
    assert len(graph.initializers) == 1  # the 3.0 constant went with its user


def test_assign_devices_and_partition(traced: Graph) -> None:
    ctx = PassContext(devices=("cpu:0",))
    traced = PassManager([ReplicatePass(1), InsertCollectivesPass()]).run(traced, ctx).graph
    graph = _check_pass(AssignDevicesPass(), traced, _ops(traced), ctx)
    assert graph.stage == "rewritten"
    assert {n.device for n in graph.nodes} == {"cpu:0"}
    graph = _check_pass(PartitionPass(), graph, _ops(traced), ctx)
    assert graph.stage == "partitioned"
    # collectives (not yet lowered here) cut the device's nodes into phases
    assert {n.meta["segment"] for n in graph.nodes if not is_communication(n)} == {"cpu0.p0", "cpu0.p1"}
    assert all("segment" not in n.meta for n in graph.nodes if is_communication(n))


def test_unplaced_graph_fails_rewritten_verification(traced: Graph) -> None:
    with pytest.raises(gd.GraphError, match="has no device"):
        verify(traced, "rewritten")


def test_one_device_pipeline_end_to_end(traced: Graph) -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    before = _run(traced)
    result = PassManager(strategy.pipeline()).run(traced.copy(), PassContext(devices=("cpu:0",)))
    assert result.modified
    assert not any(n.domain == "graphdist" for n in result.graph.nodes)
    for got, want in zip(_run(result.graph), before):
        np.testing.assert_array_equal(got, want)
    assert not PassManager(strategy.pipeline()).run(result.graph, PassContext(devices=("cpu:0",))).modified


def test_dump_writes_every_stage(tmp_path, traced: Graph) -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    PassManager(strategy.pipeline()).run(traced, PassContext(dump_dir=str(tmp_path)))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith("00.traced.txt") for n in names)
    assert any("ReplicatePass.onnx" in n for n in names)
    assert len([n for n in names if n.endswith(".txt")]) == 1 + len(strategy.pipeline())
