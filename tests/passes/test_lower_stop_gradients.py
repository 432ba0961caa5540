"""LowerStopGradientsPass: before vs hand-built expected structure, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend), gradients of a traced step unchanged by the lowering."""

from __future__ import annotations

import numpy as np

import graphdist as gd
from graphdist.ir import GRAPHDIST_DOMAIN, Graph
from graphdist.passes.autodiff import AutodiffPass
from graphdist.passes.base import PassContext
from graphdist.passes.lower_stop_gradients import LowerStopGradientsPass
from tests.passes.pass_checks import check_pass, run_reference


def _graph(name: str, markers: bool) -> Graph:
    """``(stop(x) * x, stop(x))``: a marker read by a node and one that is a graph output."""
    graph = Graph(name)
    x = graph.add_input("x", np.float32, (3,))
    stopped = graph.add_node("StopGradient", [x], domain=GRAPHDIST_DOMAIN).outputs[0] if markers else x
    held = graph.add_node("StopGradient", [x], domain=GRAPHDIST_DOMAIN).outputs[0] if markers else x
    graph.outputs = [graph.add_node("Mul", [stopped, x]).outputs[0], held]
    return graph


def test_markers_are_replaced_by_their_inputs() -> None:
    graph = check_pass(LowerStopGradientsPass(), _graph("markers", True), modified=True,
                       expected=_graph("expected", False))
    assert not graph.find_nodes("StopGradient", GRAPHDIST_DOMAIN)


def test_no_markers_is_unchanged() -> None:
    check_pass(LowerStopGradientsPass(), _graph("plain", False), modified=False, expected=_graph("expected", False))


def test_gradient_through_a_stopped_value_after_autodiff() -> None:
    """d/dx (stop(x) * x) = stop(x) = x: the lowered graph computes it with no marker left."""
    def step(x):
        with gd.GradientTape() as tape:
            tape.watch(x)
            y = (gd.stop_gradient(x) * x).sum()
        return tape.gradient(y, x)

    x = np.array([1.0, -2.0, 3.0], np.float32)
    traced = gd.trace(step, x)
    differentiated = AutodiffPass()(traced, PassContext()).graph
    assert differentiated.find_nodes("StopGradient", GRAPHDIST_DOMAIN)
    feeds = {differentiated.inputs[0].name: x}
    graph = check_pass(LowerStopGradientsPass(), differentiated, modified=True, feeds=feeds)
    assert not graph.find_nodes("StopGradient", GRAPHDIST_DOMAIN)
    (gradient,) = run_reference(graph, feeds)
    np.testing.assert_array_equal(gradient, x)
