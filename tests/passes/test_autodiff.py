"""AutodiffPass: before vs expected structure built by hand from the gradient rules, honest ``modified``, a
second run changes nothing, and the gradients equal numpy's analytic ones (reference backend). A graph with
a ``Gradient`` node cannot run before the pass, so "numerics unchanged" is "numerics equal the calculus"."""

from __future__ import annotations

import numpy as np

import graphdist as gd
from graphdist.ir import GRAPHDIST_DOMAIN, Graph
from graphdist.passes.autodiff import AutodiffPass
from graphdist.passes.base import PassContext
from tests.passes.pass_checks import check_pass, run_reference

RNG = np.random.default_rng(5)


def _product(expanded: bool) -> Graph:
    """``t = x * w`` and ``Gradient(t, w, z)`` with ``z`` unconnected (``expanded``: the backward ops)."""
    graph = Graph("expected" if expanded else "product")
    x, w, z = (graph.add_input(name, np.float32, (3,)) for name in ("x", "w", "z"))
    target = graph.add_node("Mul", [x, w]).outputs[0]
    if expanded:
        seed = graph.add_initializer("ones", np.ones(3, np.float32))  # d sum(t) / d t
        graph.add_node("Mul", [seed, w])  # the Mul rule's gradient for x (not a source: dead here)
        grad_w = graph.add_node("Mul", [seed, x]).outputs[0]
        grad_z = graph.add_initializer("zeros", np.zeros(3, np.float32))  # not connected: zeros
    else:
        grad_w, grad_z = graph.add_node("Gradient", [target, w, z], domain=GRAPHDIST_DOMAIN, num_outputs=2).outputs
    graph.outputs = [target, grad_w, grad_z]
    return graph


def test_product_expands_by_the_mul_rule() -> None:
    feeds = {name: RNG.standard_normal(3).astype(np.float32) for name in ("x", "w", "z")}
    graph = check_pass(AutodiffPass(), _product(False), modified=True, expected=_product(True), numerics=False)
    assert not graph.find_nodes("Gradient", GRAPHDIST_DOMAIN)
    target, grad_w, grad_z = run_reference(graph, feeds)
    np.testing.assert_array_equal(target, feeds["x"] * feeds["w"])
    np.testing.assert_array_equal(grad_w, feeds["x"])
    np.testing.assert_array_equal(grad_z, np.zeros(3, np.float32))


def _least_squares(x, y, w):
    with gd.GradientTape() as tape:
        tape.watch(w)
        residual = x @ w - y
        loss = (residual * residual).sum() + (w * w).sum()  # w is used twice: its gradients add up
    return loss, tape.gradient(loss, w)


def test_traced_least_squares_gradient_equals_numpy() -> None:
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    y = RNG.standard_normal(4).astype(np.float32)
    w = RNG.standard_normal(3).astype(np.float32)
    traced = gd.trace(_least_squares, x, y, w)
    graph = check_pass(AutodiffPass(), traced, modified=True, numerics=False)
    loss, grad = run_reference(graph, dict(zip([v.name for v in graph.inputs], (x, y, w), strict=True)))
    residual = x.astype(np.float64) @ w - y
    np.testing.assert_allclose(loss, residual @ residual + w.astype(np.float64) @ w, rtol=1e-5)
    np.testing.assert_allclose(grad, 2 * x.T.astype(np.float64) @ residual + 2 * w, rtol=1e-4, atol=1e-5)


def test_two_gradient_nodes_are_each_expanded() -> None:
    def step(x):
        with gd.GradientTape() as first:
            first.watch(x)
            square = (x * x).sum()
        with gd.GradientTape() as second:
            second.watch(x)
            cube = (x * x * x).sum()
        return first.gradient(square, x), second.gradient(cube, x)

    x = np.array([1.0, -2.0, 0.5], np.float32)
    traced = gd.trace(step, x)
    assert len(traced.find_nodes("Gradient", GRAPHDIST_DOMAIN)) == 2
    graph = check_pass(AutodiffPass(), traced, modified=True, numerics=False)
    square_grad, cube_grad = run_reference(graph, {graph.inputs[0].name: x})
    np.testing.assert_allclose(square_grad, 2 * x)
    np.testing.assert_allclose(cube_grad, 3 * x * x)


def test_no_gradient_nodes_is_unchanged() -> None:
    graph = _product(True)
    check_pass(AutodiffPass(), graph, modified=False, expected=_product(True), ctx=PassContext())
