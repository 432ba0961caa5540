"""Graph's view methods (API.md: summary, to_onnx, to_dot, render, to_networkx) are the IR's free functions."""

from __future__ import annotations

import numpy as np
import onnx

import graphdist as gd
from graphdist.ir import graph_summary, graph_to_dot, graph_to_networkx, to_onnx


def _graph() -> gd.ir.Graph:
    return gd.trace(lambda x: np.maximum(x * 2.0, 0.0).sum(axis=-1), gd.TensorSpec((None, 3), np.float32))


def test_methods_give_what_the_free_functions_give() -> None:
    graph = _graph()
    assert graph.summary() == graph_summary(graph) == str(graph)
    assert graph.to_dot(title="t") == graph_to_dot(graph, title="t")
    assert graph.to_onnx() == to_onnx(graph)
    onnx.checker.check_model(graph.to_onnx())
    assert sorted(graph.to_networkx().nodes) == sorted(graph_to_networkx(graph).nodes)


def test_render_writes_the_dot_text(tmp_path) -> None:
    graph = _graph()
    written = graph.render(tmp_path / "g.dot")
    assert written.read_text().strip() == graph_to_dot(graph).strip()
