"""``graph_summary(graph)``: a readable listing with ops, shapes, dtypes, attributes
and, once placed, devices and replicas.
"""

from __future__ import annotations

import numpy as np

import graphdist as gd
from graphdist.ir import Graph, graph_summary
from graphdist.ir.printer import format_table


def traced() -> Graph:
    return gd.trace(lambda x, i: (np.tanh(x @ x.T).sum(0, keepdims=True), x[i]), np.ones((3, 3), np.float32),
                    np.array([0, 2]))


def test_summary_lists_ops_shapes_and_dtypes() -> None:
    graph = traced()
    text = graph_summary(graph)
    assert str(graph) == graph.summary() == text  # the view methods are the free function
    lines = text.splitlines()
    assert lines[0] == "Graph 'lambda'  stage=traced  inputs=2  initializers=1  nodes=5"
    assert lines[1] == "ops: Transpose x1, MatMul x1, Tanh x1, ReduceSum x1, Gather x1"
    for fragment in ("%arg0: float32[3,3]", "%arg1: int64[2]", "%axes: int64[1]", "%reducesum: float32[1,3]",
                     "%gather: float32[2,3]", "perm=[1, 0]", "keepdims=1", "axis=0", "%tanh, [0]"):
        assert fragment in text, fragment
    assert "device" not in text
    node_rows = [line for line in lines if line.lstrip()[:1].isdigit()]
    assert [row.split()[1] for row in node_rows] == [n.op_type for n in graph.nodes]
    assert text.split("outputs:")[-1].split() == ["%reducesum:", "float32[1,3]", "%gather:", "float32[2,3]"]


def test_summary_shows_placement_once_placed() -> None:
    graph = traced()
    for node in graph.nodes:
        node.device = "cpu:1"
    graph.nodes[0].replica = 3
    text = graph_summary(graph)
    header = next(line for line in text.splitlines() if line.strip().startswith("#"))
    assert header.split()[-2:] == ["device", "replica"]
    first_row = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    assert first_row.split()[-2:] == ["cpu:1", "3"]


def test_summary_of_graphdist_ops_and_symbolic_shapes() -> None:
    graph = Graph("collective")
    x = graph.add_input("x", np.float32, ("batch", 8))
    node = graph.add_node("AllReduce", [x], {"reduce_op": "MEAN", "group_size": 4, "group_key": "g" * 60},
                          domain="graphdist")
    graph.outputs = node.outputs
    text = graph_summary(graph)
    assert "graphdist.AllReduce" in text and "float32[batch,8]" in text
    assert "group_key='ggg" in text and "g" * 30 not in text and "..." in text  # long values are elided
    assert "group_size=4" in text and "reduce_op='MEAN'" in text  # ...but every key stays visible


def test_empty_graph() -> None:
    text = graph_summary(Graph("empty"))
    assert "ops: (none)" in text and text.count("(none)") == 4
    assert repr(Graph("empty")) == "<Graph 'empty' stage=traced nodes=0 inputs=0>"


def test_format_table_aligns_columns() -> None:
    table = format_table(["a", "long header"], [["value", "x"], ["v", "yy"]])
    lines = table.splitlines()
    assert lines[0] == "  a      long header"
    assert lines[1] == "  -----  -----------"
    assert lines[2] == "  value  x" and lines[3] == "  v      yy"
    assert format_table(["only"], []).splitlines() == ["  only", "  ----"]
