"""Verification, rewiring, node removal, passes and ONNX writing are linear in the graph's size.

Each scaling test times an operation on a graph and on one 8 times larger (best of 3, in this process) and
checks that the time grows by less than 3 times the size ratio: a linear step grows about 8x, a quadratic one
about 64x (what these steps did before: a use-list scan per input in verify, a node-list scan per removed node,
an outputs scan per rewired value or written value). The semantics of the batched edits are checked against
the one-at-a-time edits they replace.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from graphdist.ir import Graph, assert_structural_equal, to_onnx, verify
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Uses
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.lower_stop_gradients import LowerStopGradientsPass

SMALL, FACTOR = 2000, 8


def _best_of(make: Callable[[int], object], run: Callable[[object], object], size: int, tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        subject = make(size)
        start = time.perf_counter()
        run(subject)
        best = min(best, time.perf_counter() - start)
    return best


def _growth(make: Callable[[int], object], run: Callable[[object], object]) -> float:
    return _best_of(make, run, SMALL * FACTOR) / max(_best_of(make, run, SMALL), 1e-6)


def _fan_out(readers: int) -> Graph:
    """``x`` read by every node of a chain ``h_k = h_{k-1} + x`` (one value with ``readers`` uses)."""
    graph = Graph("fan_out")
    x = graph.add_input("x", np.float32, (4,))
    h = x
    for _ in range(readers):
        h = graph.add_node("Add", [h, x]).outputs[0]
    graph.outputs = [h]
    return graph


def _markers(count: int) -> Graph:
    """A chain of ``count`` StopGradient markers, each also a graph output through a Neg."""
    graph = Graph("markers")
    h = graph.add_input("x", np.float32, (4,))
    outputs = []
    for _ in range(count):
        h = graph.add_node("StopGradient", [h], domain=GRAPHDIST_DOMAIN).outputs[0]
        outputs.append(graph.add_node("Neg", [h]).outputs[0])
    graph.outputs = outputs
    return graph


def test_uses_behaves_as_the_list_it_replaces() -> None:
    graph = _fan_out(3)
    x = graph.inputs[0]
    first, second, third = graph.nodes  # first = x + x
    assert isinstance(x.uses, Uses) and len(x.uses) == 4 and bool(x.uses)
    assert x.uses == [(first, 0), (first, 1), (second, 1), (third, 1)]
    assert (second, 1) in x.uses and (second, 0) not in x.uses
    second.replace_input(1, first.outputs[0])
    assert x.uses == [(first, 0), (first, 1), (third, 1)]
    with pytest.raises(ValueError, match="is not a use"):
        x.uses.remove((second, 1))
    assert repr(x.uses) == repr([(first, 0), (first, 1), (third, 1)]) and x.uses != [(third, 1), (first, 0)]
    verify(graph)


def test_verify_is_linear_in_a_values_fan_out() -> None:
    assert _growth(_fan_out, verify) < 3 * FACTOR


def test_lowering_stop_gradients_is_linear_and_equals_one_marker_at_a_time() -> None:
    assert _growth(_markers, lambda g: LowerStopGradientsPass()(g)) < 3 * FACTOR
    batched, one_by_one = _markers(50), _markers(50)
    LowerStopGradientsPass()(batched)
    for node in one_by_one.find_nodes("StopGradient", GRAPHDIST_DOMAIN):
        one_by_one.replace_all_uses_with(node.outputs[0], node.inputs[0])
        one_by_one.remove_node(node)
    assert_structural_equal(batched, one_by_one)
    verify(batched)


def test_removing_dead_nodes_is_linear() -> None:
    def dead(count: int) -> Graph:
        graph = _fan_out(count)
        graph.outputs = [graph.nodes[0].outputs[0]]  # everything after the first node is dead
        return graph

    assert _growth(dead, lambda g: EliminateDeadNodesPass()(g)) < 3 * FACTOR
    graph = dead(10)
    EliminateDeadNodesPass()(graph)
    assert len(graph.nodes) == 1 and graph.inputs[0].uses == [(graph.nodes[0], 0), (graph.nodes[0], 1)]


def test_writing_onnx_is_linear_in_the_number_of_outputs() -> None:
    assert _growth(_markers, to_onnx) < 3 * FACTOR


def test_replace_all_uses_with_many_equals_the_calls_one_after_the_other() -> None:
    def chain() -> Graph:
        graph = Graph("chain")
        x = graph.add_input("x", np.float32, (2,))
        a = graph.add_node("Identity", [x]).outputs[0]
        b = graph.add_node("Identity", [a]).outputs[0]
        c = graph.add_node("Relu", [b]).outputs[0]
        graph.outputs = [a, b, c]
        return graph

    batched, sequential = chain(), chain()
    # b -> its input a, then a -> x: b's readers and the outputs a and b must end on x.
    pairs = [(g.nodes[1].outputs[0], g.nodes[1].inputs[0]) for g in (batched, sequential)]
    pairs = [(pair, (g.nodes[0].outputs[0], g.nodes[0].inputs[0])) for pair, g in zip(pairs, (batched, sequential))]
    count = batched.replace_all_uses_with_many(pairs[0])
    expected = sum(sequential.replace_all_uses_with(old, new) for old, new in pairs[1])
    assert count == expected == 6  # c twice, output b twice (b -> a -> x), node b and output a once
    x = batched.inputs[0]
    assert batched.outputs[:2] == [x, x] and batched.nodes[2].inputs[0] is x
    batched.remove_nodes(batched.nodes[:2])
    sequential.remove_node(sequential.nodes[1])
    sequential.remove_node(sequential.nodes[0])
    assert_structural_equal(batched, sequential)


def test_remove_nodes_refuses_a_node_whose_output_is_still_read() -> None:
    graph = _fan_out(3)
    with pytest.raises(Exception, match="still used"):
        graph.remove_nodes([graph.nodes[1]])
    assert len(graph.nodes) == 3
    verify(graph)
