"""Diffs between graphs and per-pass diffs of a strategy's pipeline."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.diff import diff_graphs, pipeline_diffs, strategy_pass_diffs
from graphdist.models.mlp import make_step
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass


@pytest.fixture(scope="module")
def mirrored() -> gd.ConcreteFunction:
    step, args = make_step(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    return step.get_concrete_function(*args)


def small() -> gd.Graph:
    return gd.trace(lambda x: np.tanh(x @ x.T) + 1, np.ones((3, 3), np.float32))


def test_identical_graphs_have_an_empty_diff() -> None:
    graph = small()
    diff = diff_graphs(graph, graph.copy())
    assert diff.empty and not diff.added and not diff.removed and not diff.changed
    assert diff.brief() == "no change"
    assert "(no change)" in diff.format()


def test_added_removed_and_changed_nodes() -> None:
    before = small()
    after = before.copy()
    tanh = after.find_nodes("Tanh")[0]
    sigmoid = after.add_node("Sigmoid", [tanh.inputs[0]])
    after.replace_all_uses_with(tanh.outputs[0], sigmoid.outputs[0])
    after.remove_node(tanh)
    after.topological_sort()
    matmul = after.find_nodes("MatMul")[0]
    matmul.device, matmul.attrs["note"] = "cpu:1", 1
    diff = diff_graphs(before, after)
    assert diff.added == [(sigmoid.name, "Sigmoid")]
    assert diff.removed == [(tanh.name, "Tanh")]
    changed = {c.name: c for c in diff.changed}
    assert set(changed) == {matmul.name, after.find_nodes("Add")[0].name}
    assert changed[matmul.name].aspects == ["device None -> cpu:1", "attrs +note"]
    assert changed[after.find_nodes("Add")[0].name].aspects[0].startswith(f"inputs {tanh.outputs[0].name} -> ")
    assert diff.by_op() == {"Add": {"added": 0, "removed": 0, "changed": 1},
                            "MatMul": {"added": 0, "removed": 0, "changed": 1},
                            "Sigmoid": {"added": 1, "removed": 0, "changed": 0},
                            "Tanh": {"added": 0, "removed": 1, "changed": 0}}
    assert diff.aspects() == {"device": 1, "attrs": 1, "inputs": 1}
    text = str(diff)
    assert text.splitlines()[0] == ("diff 'lambda' (traced) -> 'lambda' (traced): nodes 4 -> 4 "
                                    "(+1 added, -1 removed, ~2 changed)")
    assert f"added: {sigmoid.name}" in text and f"removed: {tanh.name}" in text
    assert "+Sigmoid x1" in diff.brief() and "-Tanh x1" in diff.brief()


def test_op_change_under_one_name_counts_as_replacement() -> None:
    before = small()
    after = before.copy()
    after.find_nodes("Tanh")[0].op_type = "Sigmoid"
    diff = diff_graphs(before, after)
    assert [op for _, op in diff.added] == ["Sigmoid"] and [op for _, op in diff.removed] == ["Tanh"]


def test_traced_vs_rewritten(mirrored: gd.ConcreteFunction) -> None:
    diff = diff_graphs(mirrored.graph("traced"), mirrored.graph("rewritten"))
    ops = diff.by_op()
    # Traced once, as one replica: one Gradient node, one replica's assigns and cross-replica ops.
    assert ops["graphdist.Gradient"]["removed"] == 1
    assert ops["graphdist.AssignVariable"]["removed"] == 5  # 4 weights and the step counter became outputs
    assert ops["graphdist.ReplicaAllReduce"]["removed"] == 4  # the 4 gradients' aggregation
    assert ops["graphdist.CrossReplicaReduce"]["removed"] == 1  # strategy.reduce of the loss
    # Each gradient's sum (and the loss's) is read by one replica: summed there, no all-reduce left.
    assert "graphdist.AllReduce" not in ops and ops["Sum"] == {"added": 5, "removed": 0, "changed": 0}
    assert len(diff.outputs_added) == 5  # the variable updates
    assert diff.nodes_before == len(mirrored.graph("traced").nodes)
    assert diff.nodes_after == len(mirrored.graph("rewritten").nodes)


def test_strategy_pass_diffs(mirrored: gd.ConcreteFunction) -> None:
    report = strategy_pass_diffs(mirrored)
    names = [p.name for p in report.passes]
    assert names[0] == "AutodiffPass" and names[-3:] == ["AssignDevicesPass", "LowerIndexChecksPass", "PartitionPass"]
    by_name = {p.name: p for p in report.passes}
    assert by_name["AutodiffPass"].diff.by_op()["graphdist.Gradient"]["removed"] == 1
    traced_matmuls = len(mirrored.graph("traced").find_nodes("MatMul"))
    replicated = by_name["ReplicatePass"].diff.by_op()
    assert replicated["graphdist.AssignVariable"]["added"] == 5  # replica 1's copies
    assert replicated["MatMul"]["added"] > traced_matmuls  # replica 1's forward and backward
    assert by_name["LowerVariableUpdatesPass"].diff.by_op() == {
        "graphdist.AssignVariable": {"added": 0, "removed": 10, "changed": 0}}
    assert by_name["InsertCollectivesPass"].diff.by_op() == {
        "graphdist.AllReduce": {"added": 10, "removed": 0, "changed": 0},
        "graphdist.ReplicaAllReduce": {"added": 0, "removed": 8, "changed": 0},
        "graphdist.CrossReplicaReduce": {"added": 0, "removed": 1, "changed": 0}}
    summed = by_name["LowerSingleReaderAllReducesPass"].diff.by_op()
    assert summed["graphdist.AllReduce"] == {"added": 0, "removed": 10, "changed": 0}  # (4 + 1) x 2 replicas
    assert summed["Sum"] == {"added": 5, "removed": 0, "changed": 0}  # one per group, on its reader
    assert by_name["LowerCollectivesPass"].diff.empty  # no collective left to lower
    assert by_name["AssignDevicesPass"].diff.aspects()["device"] == by_name["AssignDevicesPass"].diff.nodes_after
    partitioned = by_name["PartitionPass"].diff
    assert partitioned.aspects().keys() == {"segment", "inputs"}  # the sums read the other replica via Transfers
    assert {op for _, op in partitioned.added} == {"graphdist.Transfer"} and not partitioned.removed
    assert {c.op for c in partitioned.changed if any(a.startswith("inputs") for a in c.aspects)} == {"Sum"}
    assert by_name["PartitionPass"].stage == "partitioned"
    # chained diffs add up; the re-run ends where compilation ended and leaves the compiled graphs alone
    for first, second in zip(report.passes, report.passes[1:]):
        assert first.diff.nodes_after == second.diff.nodes_before
    assert diff_graphs(report.final, mirrored.graph("partitioned")).empty
    assert mirrored.graph("traced").stage == "traced"
    text = report.format()
    assert text.splitlines()[0].startswith("passes of MirroredStrategy on cpu:0, cpu:1 for 'mlp_train_step'")
    lower = names.index("LowerSingleReaderAllReducesPass") + 1
    assert f"[{lower}] LowerSingleReaderAllReducesPass (stage traced)" in text
    # a pass that changed nothing gets a summary line and no detail section
    graph = gd.trace(lambda x: (x + 1, x * 2)[0], np.ones(2, np.float32))
    twice = pipeline_diffs(graph, [EliminateDeadNodesPass(), EliminateDeadNodesPass()], PassContext(dump_dir=None))
    text = twice.format()
    assert "2  EliminateDeadNodesPass" in text and "no change" in text and "[2]" not in text


def test_packed_all_reduces_stay_collectives_and_get_their_algorithm() -> None:
    step, args = make_step(gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=gd.NcclAllReduce(num_packs=2)))
    report = strategy_pass_diffs(step.get_concrete_function(*args))
    names = [p.name for p in report.passes]
    assert "LowerSingleReaderAllReducesPass" not in names  # packs asked for: the all-reduces stay
    lowered = {p.name: p for p in report.passes}["LowerCollectivesPass"].diff
    assert lowered.aspects() == {"attrs": 10} and not lowered.added and not lowered.removed
    lower = names.index("LowerCollectivesPass") + 1
    text = report.format()
    assert f"[{lower}] LowerCollectivesPass (stage traced)" in text and "attrs +algorithm" in text


def test_pass_manager_calls_on_pass_after_each_pass() -> None:
    graph = gd.trace(lambda x: (x + 1, x * 2)[0], np.ones(2, np.float32))
    seen = []
    PassManager([EliminateDeadNodesPass(), EliminateDeadNodesPass()]).run(
        graph, PassContext(dump_dir=None), on_pass=lambda p, r: seen.append((p.name, r.modified, len(r.graph.nodes))))
    assert seen == [("EliminateDeadNodesPass", True, 1), ("EliminateDeadNodesPass", False, 1)]


def test_pipeline_diffs_leaves_its_input_alone() -> None:
    graph = gd.trace(lambda x: (x + 1, x * 2)[0], np.ones(2, np.float32))
    report = pipeline_diffs(graph, [EliminateDeadNodesPass()])
    assert len(graph.nodes) == 2 and len(report.final.nodes) == 1
    assert report.passes[0].diff.removed == [(graph.nodes[1].name, "Mul")]
    assert report.overall.removed == report.passes[0].diff.removed
