"""LowerVariableUpdatesPass: before vs hand-built expected structure, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend), the written-back values and ``graph.meta.variable_updates``."""

from __future__ import annotations

import numpy as np

from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.passes.lower_variable_updates import LowerVariableUpdatesPass
from tests.passes.pass_checks import check_pass, random_feeds, run_reference


def _op(graph: Graph, op: str, inputs: list[Value], **attrs) -> Value:
    domain = GRAPHDIST_DOMAIN if op == "AssignVariable" else ""
    return graph.add_node(op, inputs, attrs or None, domain=domain).outputs[0]


def _step(lowered: bool) -> Graph:
    """``v = w - x; y = v * 2; v = y / 2; u = x``, returning ``y`` (``lowered``: what the pass makes of it)."""
    graph = Graph("expected" if lowered else "step")
    x, w = graph.add_input("x", np.float32, (3,)), graph.add_input("w", np.float32, (3,))
    first = _op(graph, "Sub", [w, x])
    if not lowered:
        first = _op(graph, "AssignVariable", [first], variable="v")  # read by y: y reads the Sub
    y = _op(graph, "Mul", [first, graph.add_initializer("two", np.float32(2.0))])
    second = _op(graph, "Mul", [y, graph.add_initializer("half", np.float32(0.5))])
    if lowered:
        graph.outputs = [y, second, _op(graph, "Identity", [x])]  # an input written back gets its own output
    else:
        _op(graph, "AssignVariable", [second], variable="v")  # the last assign of v is the one written back
        _op(graph, "AssignVariable", [x], variable="u")
        graph.outputs = [y]
    return graph


def test_last_assign_of_each_variable_becomes_an_output() -> None:
    graph = _step(lowered=False)
    feeds = random_feeds(graph)
    graph = check_pass(LowerVariableUpdatesPass(), graph, modified=True, expected=_step(lowered=True), feeds=feeds,
                       new_outputs=2)
    y, v, u = graph.outputs
    assert graph.meta.variable_updates == [(v.name, "v"), (u.name, "u")]
    _, v_value, u_value = run_reference(graph, feeds)
    np.testing.assert_allclose(v_value, feeds["w"] - feeds["x"], rtol=1e-6)  # (w - x) * 2 / 2
    np.testing.assert_array_equal(u_value, feeds["x"])


def test_assigned_user_output_gets_an_identity() -> None:
    def build(lowered: bool) -> Graph:
        graph = Graph("expected" if lowered else "output")
        x = graph.add_input("x", np.float32, (2,))
        y = _op(graph, "Neg", [x])
        graph.outputs = [y, _op(graph, "Identity", [y])] if lowered else [y]
        if not lowered:
            _op(graph, "AssignVariable", [y], variable="v")
        return graph

    graph = check_pass(LowerVariableUpdatesPass(), build(False), modified=True, expected=build(True), new_outputs=1)
    assert graph.meta.variable_updates == [(graph.outputs[1].name, "v")]
    assert graph.outputs[0] is not graph.outputs[1]


def test_updates_recorded_earlier_are_kept() -> None:
    graph = _step(lowered=False)
    graph.meta.variable_updates = [("earlier", "t")]
    graph = check_pass(LowerVariableUpdatesPass(), graph, modified=True, new_outputs=2)
    assert [uid for _, uid in graph.meta.variable_updates] == ["t", "v", "u"]


def test_no_assigns_is_unchanged() -> None:
    graph = _step(lowered=True)
    graph.meta.variable_updates = []
    check_pass(LowerVariableUpdatesPass(), graph, modified=False, expected=_step(lowered=True))
