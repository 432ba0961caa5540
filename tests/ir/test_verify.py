"""``verify(graph, stage)``: each per-stage invariant, caught when broken."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.errors import GraphError
from graphdist.ir import Graph, Node, Value, verify


def small() -> Graph:
    """x -> relu -> (+ w) -> tanh, traced-style."""
    graph = Graph("small")
    x = graph.add_input("x", np.float32, (2, 3))
    w = graph.add_initializer("w", np.ones((2, 3), np.float32))
    relu = graph.add_node("Relu", [x])
    add = graph.add_node("Add", [relu.outputs[0], w])
    tanh = graph.add_node("Tanh", [add.outputs[0]])
    graph.outputs = [tanh.outputs[0]]
    return graph


def place(graph: Graph, device: str = "cpu:0") -> Graph:
    for node in graph.nodes:
        node.device = device
    return graph


def fails(graph: Graph, pattern: str, stage: str | None = None) -> str:
    with pytest.raises(GraphError, match=pattern) as info:
        verify(graph, stage)
    return str(info.value)


def test_valid_graphs_pass_every_stage() -> None:
    verify(small())
    verify(gd.trace(lambda x: (np.tanh(x @ x.T).sum(0), x[::-1, None]), np.ones((3, 3), np.float32)))
    placed = place(small())
    for stage in ("traced", "rewritten", "partitioned"):
        verify(placed, stage)


def test_use_before_definition() -> None:
    graph = small()
    graph.nodes[0], graph.nodes[1] = graph.nodes[1], graph.nodes[0]
    message = fails(graph, "reads %relu before it is defined")
    assert "'small'" in message and "'traced'" in message


def test_wrong_output_type() -> None:
    graph = small()
    graph.nodes[1].outputs[0].dtype = np.dtype(np.float64)
    fails(graph, r"output %add is float64\[2,3\] but its shape rule gives float32\[2, 3\]")
    graph = small()
    graph.nodes[2].outputs[0].shape = (3, 2)
    fails(graph, r"output %tanh is float32\[3,2\]")


def test_symbolic_names_may_differ() -> None:
    graph = Graph()
    x = graph.add_input("x", np.float32, ("batch", 3))
    relu = graph.add_node("Relu", [x])
    relu.outputs[0].shape = ("N", 3)
    graph.outputs = relu.outputs
    verify(graph)


def test_unplaced_node_at_rewritten() -> None:
    graph = place(small())
    verify(graph, "rewritten")
    graph.nodes[1].device = None
    fails(graph, r"node add \(Add\) has no device", "rewritten")
    verify(graph, "traced")


def test_graph_stage_is_the_default() -> None:
    graph = small()
    graph.stage = "rewritten"
    fails(graph, "has no device")
    verify(graph, "traced")


def test_cross_device_edge_at_partitioned() -> None:
    graph = place(small())
    graph.nodes[2].device = "cpu:1"
    verify(graph, "rewritten")
    fails(graph, r"edge %add crosses from cpu:0 \(add\) to cpu:1 \(tanh\) without a transfer or collective",
          "partitioned")


def test_collective_may_cross_devices() -> None:
    graph = Graph(stage="partitioned")
    x = graph.add_input("x", np.float32, (4,))
    left = graph.add_node("Neg", [x])
    right = graph.add_node("Abs", [x])
    reduce = graph.add_node("AllReduce", [left.outputs[0], right.outputs[0]], {"reduce_op": "SUM", "group_size": 2},
                            domain="graphdist", output_types=[(np.float32, (4,))])
    left.device, right.device, reduce.device = "cpu:0", "cpu:1", "cpu:0"
    graph.outputs = reduce.outputs
    verify(graph)
    # An ONNX op reading across devices is still refused.
    relu = graph.add_node("Relu", [right.outputs[0]])
    relu.device = "cpu:0"
    fails(graph, "crosses from cpu:1")


def test_unknown_stage() -> None:
    fails(small(), r"unknown stage 'optimized'; use one of traced, rewritten, partitioned", "optimized")


def test_unregistered_op() -> None:
    graph = small()
    node = Node("Frobnicate", [graph.inputs[0]], name="frob")
    node.outputs.append(Value("frob_out", np.float32, (2, 3), producer=node))
    graph.append(node)
    fails(graph, "op Frobnicate is not an op graphdist knows")


def test_duplicate_names() -> None:
    graph = small()
    graph.nodes[2].outputs[0].name = "relu"
    fails(graph, "value name 'relu' is used more than once")
    graph = small()
    graph.nodes[1].name = "relu"
    fails(graph, "node name 'relu' is used more than once")


def test_inconsistent_use_lists() -> None:
    graph = small()
    graph.nodes[1].inputs[0] = graph.inputs[0]  # bypasses replace_input
    message = fails(graph, "use list of %x misses node add input 0")
    assert "use list of %relu names input 0 of add, which reads another value" in message
    graph = small()
    stray = Node("Neg", [graph.inputs[0]], name="stray")  # never added to the graph
    assert stray.inputs
    fails(graph, "use list of %x names node stray, which is not in the graph")


def test_producer_mismatch_and_undefined_output() -> None:
    graph = small()
    graph.nodes[0].outputs[0]._producer = graph.nodes[1]  # corrupted on purpose
    fails(graph, "output %relu of relu names another producer")
    graph = small()
    graph.outputs = [Value("ghost", np.float32, (2, 3))]
    fails(graph, "graph output %ghost is not defined")


def test_output_count_mismatch() -> None:
    graph = Graph()
    x = graph.add_input("x", np.float32, (4,))
    split = graph.add_node("Split", [x], {"axis": 0, "num_outputs": 2})
    split.outputs.append(Value("extra", np.float32, (2,), producer=split, index=2))
    graph.outputs = list(split.outputs)
    fails(graph, "has 3 outputs but its shape rule gives 2")


def test_cycle_is_reported() -> None:
    graph = small()
    graph.nodes[0].replace_input(0, graph.nodes[2].outputs[0])
    fails(graph, "reads %tanh before it is defined")


def test_every_problem_is_listed() -> None:
    graph = small()
    graph.nodes[0].device = None
    graph.nodes[1].outputs[0].dtype = np.dtype(np.int64)
    graph.outputs.append(Value("ghost", np.float32, ()))
    message = fails(graph, "fails verification", "rewritten")
    assert "has no device" in message and "int64" in message and "ghost" in message
