"""SplitBatchChunksPass: hand-built before vs hand-built expected (the chunks, their sums in a pairwise tree),
honest ``modified``, a second run changes nothing, the numerics are the tree's bit for bit (reference
backend), the tree of one replica's chunks is a subtree of the one-device tree, and the cases it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import GraphError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal
from graphdist.ir.batch import BatchDim
from graphdist.passes.base import PassContext
from graphdist.passes.split_batch_chunks import SplitBatchChunksPass, chunks_per_replica
from tests.passes.pass_checks import check_pass, run_reference

RNG = np.random.default_rng(11)
META = ("micro", "context")


def _op(graph: Graph, op_type: str, inputs: list[Value], attrs: dict | None = None, *, domain: str = "",
        micro: int | None = None) -> Value:
    node = graph.add_node(op_type, inputs, attrs, domain=domain)
    node.meta.update({k: v for k, v in {"context": "replica", "micro": micro}.items() if v is not None})
    return node.outputs[0]


def _before(rows: int = 4) -> Graph:
    """One replica's step on ``rows`` rows: ``y = x * w``, ``loss = sum(y) / (replicas * rows)``, all-reduced."""
    graph = Graph("step")
    x = graph.add_input("x", np.float32, (BatchDim(rows), 3))
    w = graph.add_input("w", np.float32, (3,))
    batch = graph.add_initializer("batch", np.float32(rows))
    batch.meta["batch"] = [(1, 0)]
    replicas = _op(graph, "Cast", [_op(graph, "NumReplicas", [], domain=GRAPHDIST_DOMAIN)], {"to": 1})
    y = _op(graph, "Mul", [x, w])
    loss = _op(graph, "Div", [_op(graph, "ReduceSum", [y], {"keepdims": 0}), _op(graph, "Mul", [replicas, batch])])
    reduced = _op(graph, "ReplicaAllReduce", [loss], {"reduce_op": "SUM", "group_key": "g"}, domain=GRAPHDIST_DOMAIN)
    graph.outputs = [reduced, y]
    graph.meta.per_replica_inputs = {"x": None}
    graph.meta.per_replica_outputs = {1: None}
    graph.meta.batch = rows
    return graph


def _expected() -> Graph:
    """``_before`` for 8 chunks over 2 replicas: 4 chunks of one row, their losses summed ((0+1)+(2+3)) as the
    chunks come (a binary counter), the replica count times 4, ``y`` put back together."""
    graph = Graph("expected")
    x = graph.add_input("x", np.float32, (4, 3))
    w = graph.add_input("w", np.float32, (3,))
    count = _op(graph, "NumReplicas", [], domain=GRAPHDIST_DOMAIN)
    replicas = _op(graph, "Cast", [_op(graph, "Mul", [count, graph.add_initializer("k", np.int32(4))])], {"to": 1})
    axis = graph.add_initializer("axis", np.array([0], np.int64))
    chunk_rows = graph.add_initializer("chunk_rows", np.float32(1))
    ys, losses = [], []
    for m in range(4):
        rows = _op(graph, "Slice", [x, graph.add_initializer("start", np.array([m], np.int64)),
                                    graph.add_initializer("stop", np.array([m + 1], np.int64)), axis])
        ys.append(_op(graph, "Mul", [rows, w], micro=m))
        total = _op(graph, "ReduceSum", [ys[m]], {"keepdims": 0}, micro=m)
        losses.append(_op(graph, "Div", [total, _op(graph, "Mul", [replicas, chunk_rows], micro=m)], micro=m))
        if m == 1:
            first = _op(graph, "Add", [losses[0], losses[1]])
        if m == 3:
            second = _op(graph, "Add", [losses[2], losses[3]])
            tree = _op(graph, "Add", [first, second])
    reduced = _op(graph, "ReplicaAllReduce", [tree], {"reduce_op": "SUM", "group_key": "g"}, domain=GRAPHDIST_DOMAIN)
    graph.outputs = [reduced, _op(graph, "Concat", ys, {"axis": 0})]
    return graph


def _split(graph: Graph, chunks: int = 8, replicas: int = 2) -> Graph:
    # the chunks' tree sums in another order than the batch did: the bits are checked by the tests themselves
    return check_pass(SplitBatchChunksPass(chunks, replicas), graph, modified=True, numerics=False, meta_keys=META)


def test_chunks_replace_the_batch_and_their_sums_form_a_pairwise_tree() -> None:
    graph = _split(_before())
    assert_structural_equal(graph, _expected(), meta_keys=META)
    assert graph.meta.deterministic_chunks == 8 and graph.meta.accumulate_steps == 4
    assert [v.name for v in graph.inputs] == ["x", "w"]


def test_the_loss_is_the_trees_bits() -> None:
    feeds = {"x": RNG.standard_normal((4, 3)).astype(np.float32), "w": RNG.standard_normal(3).astype(np.float32)}
    loss, y = run_reference(_split(_before()), feeds)
    # NumReplicas is 1 on the reference backend (one replica), times the 4 chunks: each chunk divides by 4.
    parts = [np.float32(np.sum(feeds["x"][m:m + 1] * feeds["w"], dtype=np.float32)) / np.float32(4)
             for m in range(4)]
    assert loss.tobytes() == ((parts[0] + parts[1]) + (parts[2] + parts[3])).tobytes()
    np.testing.assert_array_equal(y, feeds["x"] * feeds["w"])


def test_one_replicas_tree_is_a_subtree_of_the_one_device_tree() -> None:
    # One device holds all 8 chunks; its tree's left half is replica 0's tree of 4 when two replicas share them.
    one_device = _split(_before(8), replicas=1)
    adds = [n for n in one_device.nodes if n.op_type == "Add"]
    assert len(adds) == 7  # 8 leaves
    root = next(n for n in one_device.nodes if n.op_type == "ReplicaAllReduce").inputs[0].producer
    left, right = (v.producer for v in root.inputs)
    assert all(v.producer.op_type == "Add" for v in [*left.inputs, *right.inputs])  # ((..+..)+(..+..)) each


def test_one_chunk_per_replica_only_records_the_chunks() -> None:
    graph = _before(4)
    snapshot = graph.copy()
    result = SplitBatchChunksPass(8, 8)(graph, PassContext())
    assert result.modified and result.graph.meta.deterministic_chunks == 8
    assert result.graph.meta.accumulate_steps is None
    assert_structural_equal(result.graph, snapshot)
    assert not SplitBatchChunksPass(8, 8)(result.graph, PassContext()).modified


def test_a_graph_without_batch_inputs_is_unchanged() -> None:
    graph = _before()
    graph.meta.batch = None
    assert not SplitBatchChunksPass(8, 2)(graph, PassContext()).modified


def test_the_rule_and_the_batch_are_checked() -> None:
    assert chunks_per_replica(8, 4) == 2
    with pytest.raises(GraphError, match="chunks must be a power of two"):
        chunks_per_replica(6, 2)
    with pytest.raises(GraphError, match="3 replicas in sync"):
        chunks_per_replica(8, 3)
    with pytest.raises(GraphError, match="global batch of 6 rows does not cut into 8 equal chunks"):
        SplitBatchChunksPass(8, 2)(_before(3), PassContext())
    graph = _before()
    graph.meta.replica_variants = {"v1": [0], "v2": [1]}
    with pytest.raises(GraphError, match="drop_remainder=True"):
        SplitBatchChunksPass(8, 2)(graph, PassContext())
