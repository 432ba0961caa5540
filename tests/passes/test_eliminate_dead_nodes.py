"""EliminateDeadNodesPass: before vs hand-built expected structure, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend)."""

from __future__ import annotations

import numpy as np

from graphdist.ir import GRAPHDIST_DOMAIN, Graph
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from tests.passes.pass_checks import check_pass


def _live(graph: Graph) -> Graph:
    """``y = x + 1``: the part of every graph below that an output needs."""
    x = graph.add_input("x", np.float32, (2, 3))
    graph.outputs = list(graph.add_node("Add", [x, graph.add_initializer("one", np.float32(1.0))]).outputs)
    return graph


def test_dead_chain_and_its_constant_go_in_one_run() -> None:
    graph = _live(Graph("dead"))
    x = graph.inputs[0]
    exp = graph.add_node("Exp", [x]).outputs[0]
    graph.add_node("Mul", [exp, graph.add_initializer("three", np.float32(3.0))])  # read by nothing
    graph = check_pass(EliminateDeadNodesPass(), graph, modified=True, expected=_live(Graph("expected")))
    assert sorted(graph.initializers) == ["one"]


def test_unused_initializer_alone_is_dropped() -> None:
    graph = _live(Graph("constant"))
    graph.add_initializer("unused", np.zeros(4, np.float32))
    graph = check_pass(EliminateDeadNodesPass(), graph, modified=True, expected=_live(Graph("expected")))
    assert "unused" not in graph.initializers


def test_side_effect_node_is_kept() -> None:
    def build(name: str) -> Graph:
        graph = _live(Graph(name))
        check = graph.add_node("Neg", [graph.inputs[0]])
        check.meta["side_effect"] = True
        return graph

    graph = build("side_effect")
    check_pass(EliminateDeadNodesPass(), graph, modified=False, expected=build("expected"))


def test_node_feeding_an_output_only_through_a_graphdist_op_is_kept() -> None:
    """A node counts as live through any reader, graphdist-domain ones included."""
    def build(name: str) -> Graph:
        graph = Graph(name)
        x = graph.add_input("x", np.float32, (3,))
        doubled = graph.add_node("Mul", [x, graph.add_initializer("two", np.float32(2.0))]).outputs[0]
        graph.outputs = graph.add_node("StopGradient", [doubled], domain=GRAPHDIST_DOMAIN).outputs
        return graph

    check_pass(EliminateDeadNodesPass(), build("live"), modified=False, expected=build("expected"))


def test_graph_output_read_by_no_node_is_live() -> None:
    def build(name: str) -> Graph:
        graph = _live(Graph(name))
        graph.outputs.append(graph.add_node("Exp", [graph.inputs[0]]).outputs[0])
        return graph

    check_pass(EliminateDeadNodesPass(), build("outputs"), modified=False, expected=build("expected"))
