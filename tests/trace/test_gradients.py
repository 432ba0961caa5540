"""Gradient rules checked against central finite differences.

Every case runs ``gd.grad`` inside ``gd.function`` on float64 inputs, on the
``reference`` and ``ort`` backends, and compares with finite differences of
the same numpy function run eagerly. A registry test keeps the list of ops
without a rule explicit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import graphdist as gd
import passes.autodiff  # noqa: F401 - registers the rules
from graphdist.ir.gradients import _zero_gradient
from graphdist.ir.graph import ONNX_DOMAIN
from graphdist.ir.ops import get_opdef, registered_ops
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import current_trace

BACKENDS = ("reference", "ort")
EPS = 1e-6


# ------------------------------------------------------------- helpers
def _raw(op_type: str, reference: Callable[..., np.ndarray], *args: Any, **attrs: Any) -> Any:
    """Emits ``op_type`` when traced, runs ``reference`` eagerly (for ops numpy calls do not emit)."""
    if any(isinstance(a, Tensor) for a in args):
        ctx = current_trace()
        values = [a.value if isinstance(a, Tensor) else None if a is None else ctx.constant(a) for a in args]
        return ctx.emit1(op_type, values, attrs)
    return reference(*args)


def numeric_grad(fn: Callable[..., Any], args: list[np.ndarray], index: int) -> np.ndarray:
    """Central finite differences of ``sum(fn(*args))`` with respect to ``args[index]``."""
    x = np.array(args[index], dtype=np.float64)
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        original = flat[i]
        values = []
        for delta in (EPS, -EPS):
            flat[i] = original + delta
            call = list(args)
            call[index] = x.copy()
            values.append(float(np.sum(fn(*call))))
        flat[i] = original
        gflat[i] = (values[0] - values[1]) / (2 * EPS)
    return grad


def check(fn: Callable[..., Any], *args: Any, argnums: tuple[int, ...] | None = None,
          rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Asserts autodiff gradients of ``fn`` equal finite differences on every backend."""
    args = list(args)
    if argnums is None:
        argnums = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
    expected = [numeric_grad(fn, args, i) for i in argnums]
    for backend in BACKENDS:
        step = gd.function(lambda *a: gd.grad(fn, argnums=argnums)(*a), backend=backend)
        got = step(*args)
        assert len(got) == len(argnums)
        for i, g, e in zip(argnums, got, expected):
            g = np.asarray(g)
            assert g.shape == np.shape(args[i]), (backend, i, g.shape)
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{backend}: argument {i}")


_rng = np.random.default_rng(0)


def r(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return _rng.uniform(low, high, size=shape)


def pos(*shape: int) -> np.ndarray:
    return r(*shape, low=0.5, high=2.0)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf)(x)


IDS = np.array([[0, 2, 2], [4, 0, 2]])
W = r(5, 3) * 3  # weight for the weighted sums (a non-uniform upstream gradient)

CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    # elementwise binary, with broadcasting
    "add_broadcast": (lambda a, b: (a + b) * W[:3, :], (r(3, 3), r(3))),
    "sub_broadcast": (lambda a, b: (a - b) * W[:2, :], (r(2, 1), r(2, 3))),
    "mul_broadcast": (lambda a, b: a * b, (r(2, 3, 4), r(3, 1))),
    "div_broadcast": (lambda a, b: a / b, (r(3, 4), pos(4))),
    "pow_tensor_exponent": (lambda a, b: a ** b, (pos(3, 4), r(4))),
    "pow_const_exponent": (lambda a: (a ** 3) * W[:2, :], (r(2, 3),)),
    "maximum": (lambda a, b: np.maximum(a, b) * W[:3, :], (r(3, 3), r(3) + 0.05)),
    "minimum": (lambda a, b: np.minimum(a, b) * W[:3, :], (r(3, 3), r(3, 1) + 0.05)),
    "where": (lambda a, b: np.where(a > 0, a * b, b * 2.0), (r(3, 4), r(4))),
    "where_mask_from_compare": (lambda a: np.where(np.abs(a) < 0.5, a, np.zeros_like(a)) * a, (r(4, 4),)),
    # elementwise unary
    "neg_identity": (lambda a: (-(+a)) * W[:2, :], (r(2, 3),)),
    "exp": (lambda a: np.exp(a) * W[:2, :], (r(2, 3),)),
    "log": (lambda a: np.log(a) * W[:2, :], (pos(2, 3),)),
    "log1p_expm1": (lambda a: np.log1p(a) + np.expm1(a), (pos(2, 3),)),
    "sqrt": (lambda a: np.sqrt(a) * W[:2, :], (pos(2, 3),)),
    "tanh": (lambda a: np.tanh(a) * W[:2, :], (r(2, 3),)),
    "sigmoid_like": (lambda a: 1.0 / (1.0 + np.exp(-a)) * W[:2, :], (r(2, 3),)),
    "abs": (lambda a: np.abs(a) * W[:2, :], (r(2, 3),)),
    "sin_cos": (lambda a, b: np.sin(a) * np.cos(b), (r(2, 3), r(2, 3))),
    "reciprocal": (lambda a: np.reciprocal(a) * W[:2, :], (pos(2, 3),)),
    "square": (lambda a: np.square(a) * W[:2, :], (r(2, 3),)),
    "clip_scalar": (lambda a: np.clip(a, -0.5, 0.4) * W[:3, :], (r(3, 3),)),
    "clip_min_only": (lambda a: np.clip(a, -0.3, None) * W[:3, :], (r(3, 3),)),
    "clip_array_bounds": (lambda a: np.clip(a, -0.5 * np.ones(3), 0.4) * W[:3, :], (r(3, 3),)),
    "relu_like": (lambda a: np.maximum(a, 0.0) * W[:2, :], (r(2, 3),)),
    "sign_floor_masks": (lambda a: a * np.sign(a) + np.floor(a * 3) * a + np.round(a) + np.ceil(a),
                         (r(2, 3) * 0.9 + 0.013,)),
    "clip_traced_bound": (lambda a, lo: np.clip(a, lo, 0.4) * W[:3, :], (r(3, 3), np.array(-0.2))),
    # reductions
    "sum_all": (lambda a: np.sum(a * W[:2, :]), (r(2, 3),)),
    "sum_axis_keepdims": (lambda a: np.sum(a, axis=1, keepdims=True) * a, (r(2, 3),)),
    "sum_negative_axis": (lambda a: np.sum(a, axis=-1) * np.arange(1, 3), (r(2, 3),)),
    "sum_multi_axes": (lambda a: a.sum(axis=(0, 2)) * np.arange(1, 4), (r(2, 3, 4),)),
    "mean": (lambda a: np.mean(a, axis=0) * np.arange(1, 4), (r(2, 3),)),
    "mean_all": (lambda a: np.mean(a * W[:2, :]), (r(2, 3),)),
    "max_axis": (lambda a: np.max(a, axis=-1, keepdims=True) * np.arange(1, 3)[:, None], (r(2, 5),)),
    "min_all": (lambda a: np.min(a) * 3.0, (r(2, 5),)),
    "prod_axis": (lambda a: np.prod(a, axis=1) * np.arange(1, 3), (r(2, 4),)),
    "prod_all": (lambda a: np.prod(a), (pos(2, 3),)),
    "var": (lambda a: np.var(a, axis=1) * np.arange(1, 3), (r(2, 4),)),
    "std": (lambda a: np.std(a, axis=0, ddof=1) * np.arange(1, 5), (r(3, 4),)),
    "var_all": (lambda a: np.var(a), (r(3, 4),)),
    # matmul
    "matmul_2d": (lambda a, b: (a @ b) * W[:2, :], (r(2, 4), r(4, 3))),
    "matmul_1d_2d": (lambda a, b: (a @ b) * W[0], (r(4), r(4, 3))),
    "matmul_2d_1d": (lambda a, b: (a @ b) * W[:2, 0], (r(2, 4), r(4))),
    "matmul_1d_1d": (lambda a, b: a @ b, (r(4), r(4))),
    "matmul_batched_broadcast": (lambda a, b: (a @ b) * W[:2, :], (r(3, 2, 4), r(4, 3))),
    "matmul_batched_both": (lambda a, b: a @ b, (r(2, 1, 2, 4), r(3, 4, 2))),
    "matmul_1d_batched": (lambda a, b: (a @ b) * W[:2, :], (r(4), r(2, 4, 3))),
    "dot": (lambda a, b: np.dot(a, b) * W[:2, :], (r(2, 4), r(4, 3))),
    # shapes
    "reshape": (lambda a: a.reshape(3, 2) * W[:3, :2], (r(2, 3),)),
    "transpose": (lambda a: np.transpose(a, (2, 0, 1)) * np.arange(4.0)[:, None, None], (r(2, 3, 4),)),
    "dot_T": (lambda a: a.T * W[:3, :2], (r(2, 3),)),
    "expand_dims_squeeze": (lambda a: np.squeeze(np.expand_dims(a, -1) * 2.0, axis=-1) * W[:2, :], (r(2, 3),)),
    "broadcast_to": (lambda a: np.broadcast_to(a, (4, 3)) * W[:4, :], (r(3),)),
    "swapaxes_moveaxis": (lambda a: np.moveaxis(np.swapaxes(a, 0, 1), 0, -1) * np.arange(3.0), (r(2, 3, 2),)),
    "concatenate": (lambda a, b: np.concatenate([a, b, a], axis=-1) * np.arange(7.0), (r(2, 3), r(2, 1))),
    "stack": (lambda a, b: np.stack([a, b], axis=1) * np.arange(3.0), (r(2, 3), r(2, 3))),
    "split": (lambda a: np.split(a, [1, 3], axis=1)[0] * 2 + np.split(a, [1, 3], axis=1)[2] * 3, (r(2, 5),)),
    "split_unused_part": (lambda a: np.split(a, 2)[1] * W[:2, :], (r(4, 3),)),
    # indexing
    "slice_basic": (lambda a: a[1:3, :2] * W[:2, :2], (r(4, 3),)),
    "slice_steps": (lambda a: a[::2, 1::3] * W[:2, :2], (r(4, 6),)),
    "slice_negative_steps": (lambda a: a[::-1, -1:0:-2] * W[:3, :2], (r(3, 5),)),
    "slice_int_and_ellipsis": (lambda a: (a[..., 1] * np.arange(1.0, 4.0)).sum() + (a[0, :, 2:] * 2.0).sum(),
                               (r(2, 3, 3),)),
    "slice_newaxis": (lambda a: a[None, 1:, ::-1] * 2.0, (r(3, 2),)),
    "index_array_repeated": (lambda w: w[IDS] * np.arange(1.0, 4.0), (r(5, 3),)),
    "index_array_axis1": (lambda w: w[:, [2, 0, 2, 2]] * np.arange(1.0, 5.0), (r(3, 4),)),
    "index_negative": (lambda w: w[[-1, 0, -1]] * W[:3, :2], (r(3, 2),)),
    "take_axis_last": (lambda w: np.take(w, np.array([1, 1, 0]), axis=-1) * 2.0, (r(2, 3, 2),)),
    # ops numpy calls do not emit, traced directly
    "softmax": (lambda a: _raw("Softmax", lambda x: _softmax(x, 1), a, axis=1) * W[:3, :], (r(3, 3),)),
    "softmax_axis0": (lambda a: _raw("Softmax", lambda x: _softmax(x, 0), a, axis=0) * W[:3, :], (r(3, 3),)),
    "log_softmax": (lambda a: _raw("LogSoftmax", lambda x: np.log(_softmax(x, -1)), a, axis=-1) * W[:2, :],
                    (r(2, 3),)),
    "softplus": (lambda a: _raw("Softplus", lambda x: np.log1p(np.exp(x)), a) * W[:2, :], (r(2, 3),)),
    "erf": (lambda a: _raw("Erf", _erf, a) * W[:2, :], (r(2, 3),)),
    "fmod_float": (lambda a, b: _raw("Mod", np.fmod, a, b, fmod=1) * W[:2, :], (r(2, 3) * 3, pos(3))),
    "pad_constant": (lambda a: _raw("Pad", lambda x, _: np.pad(x, ((1, 0), (0, 2))), a, np.array([1, 0, 0, 2]))
                     * np.arange(5.0), (r(2, 3),)),
    "pad_crop": (lambda a: _raw("Pad", lambda x, _: np.pad(x, ((1, 0), (0, 2)))[:, 1:], a,
                                np.array([1, -1, 0, 2])) * np.arange(4.0), (r(2, 3),)),
    "pad_axes": (lambda a: _raw("Pad", lambda x, *_: np.pad(x, ((0, 0), (2, 1))), a, np.array([2, 1]), None,
                                np.array([-1])) * np.arange(6.0), (r(2, 3),)),
    "relu": (lambda a: _raw("Relu", lambda x: np.maximum(x, 0.0), a) * W[:2, :], (r(2, 3),)),
    "sigmoid": (lambda a: _raw("Sigmoid", lambda x: 1 / (1 + np.exp(-x)), a) * W[:2, :], (r(2, 3),)),
    # composites
    "mlp_like": (lambda x, w1, w2: np.tanh(x @ w1) @ w2, (r(4, 3), r(3, 5), r(5, 2))),
    "used_twice": (lambda a: a * a + np.exp(a) * a, (r(2, 3),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name: str) -> None:
    fn, args = CASES[name]
    check(fn, *args)


def test_cast_gradient() -> None:
    x = r(2, 3)
    fn = lambda a: (a.astype(np.float32) * np.float32(3)).astype(np.float64)  # noqa: E731
    for backend in BACKENDS:
        got = gd.function(lambda v: gd.grad(fn)(v), backend=backend)(x)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, np.full((2, 3), 3.0))


def test_every_rule_is_exercised_by_a_case() -> None:
    """Each op with a (non-zero) gradient rule appears on a differentiated path of some case."""
    seen: set[str] = set()
    for fn, args in CASES.values():
        argnums = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
        graph = gd.trace(lambda *a, fn=fn, argnums=argnums: gd.grad(fn, argnums=argnums)(*a), *args)
        seen.update(n.op_type for n in graph.nodes if n.domain == ONNX_DOMAIN)
    seen.add("Cast")  # test_cast_gradient
    ruled = {op for domain, op in registered_ops() if domain == ONNX_DOMAIN
             and get_opdef(op, domain).gradient not in (None, _zero_gradient)}
    assert not ruled - seen, f"gradient rules without a finite-difference case: {sorted(ruled - seen)}"


def test_traced_int_tensor_indexing_accumulates_duplicates() -> None:
    weights = r(5, 3)
    ids = np.array([1, 3, 1, 1, 0])
    scale = np.arange(1.0, 6.0)[:, None]
    fn = lambda w, i: w[i] * scale  # noqa: E731
    expected = numeric_grad(lambda w: w[ids] * scale, [weights], 0)
    for backend in BACKENDS:
        got = gd.function(lambda w, i: gd.grad(fn)(w, i), backend=backend)(weights, ids)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # Traced int32 ids on axis 1.
    fn1 = lambda w, i: np.take(w, i, axis=1) * 2.0  # noqa: E731
    ids1 = np.array([[2, 2], [0, 2]], np.int32)
    expected1 = numeric_grad(lambda w: np.take(w, ids1, axis=1) * 2.0, [weights], 0)
    for backend in BACKENDS:
        got = gd.function(lambda w, i: gd.grad(fn1)(w, i), backend=backend)(weights, ids1)
        np.testing.assert_allclose(got, expected1, rtol=1e-5, atol=1e-6)


def test_reduce_prod_with_zeros() -> None:
    a = np.array([[0.0, 2.0, 3.0], [1.5, 2.0, -1.0], [0.0, 0.0, 4.0]])
    expected = np.array([[6.0, 0.0, 0.0], [-2.0, -1.5, 3.0], [0.0, 0.0, 0.0]])
    for backend in BACKENDS:
        got = gd.function(lambda x: gd.grad(lambda y: np.prod(y, axis=-1))(x), backend=backend)(a)
        np.testing.assert_allclose(got, expected)


# -------------------------------------------------------- registry coverage
# Ops with a float input that have no gradient rule, and why (printed by the test).
NON_DIFFERENTIABLE: dict[str, str] = {}
NOT_YET: dict[str, str] = {
    "Conv": "being added concurrently; needs a ConvTranspose-style rule",
    "MaxPool": "being added concurrently; needs the argmax indices output",
    "AveragePool": "being added concurrently",
}
BOOL_ONLY = {"And", "Or", "Xor", "Not"}  # no float inputs


def test_every_float_op_has_a_rule_or_is_listed(capsys) -> None:
    missing = []
    for domain, op_type in registered_ops():
        if domain != ONNX_DOMAIN or op_type in BOOL_ONLY:
            continue
        if get_opdef(op_type, domain).gradient is None and op_type not in NON_DIFFERENTIABLE | NOT_YET:
            missing.append(op_type)
    with capsys.disabled():
        listed = {**NON_DIFFERENTIABLE, **NOT_YET}
        print("\nops without gradient rules: " + "; ".join(f"{k} ({v})" for k, v in sorted(listed.items())))
    assert not missing, f"ops with float inputs but no gradient rule and not listed: {missing}"


# ------------------------------------------------------------ behaviour
def test_no_rule_raises_graph_error_naming_the_op(monkeypatch) -> None:
    monkeypatch.setattr(get_opdef("Sin"), "gradient", None)
    step = gd.function(lambda x: gd.grad(lambda a: np.sin(a).sum())(x), backend="reference")
    with pytest.raises(gd.GraphError, match="Sin"):
        step(r(3))


def test_unconnected_source_gets_zeros() -> None:
    for backend in BACKENDS:
        gx, gy = gd.function(lambda x, y: gd.grad(lambda a, b: (a * 2.0).sum() + 0.0 * 0, argnums=(0, 1))(x, y),
                             backend=backend)(r(2, 3), r(4))
        np.testing.assert_allclose(gx, np.full((2, 3), 2.0))
        np.testing.assert_array_equal(gy, np.zeros(4))


def test_value_used_twice_accumulates() -> None:
    x = r(3)
    for backend in BACKENDS:
        got = gd.function(lambda v: gd.grad(lambda a: a * a + a * 3.0)(v), backend=backend)(x)
        np.testing.assert_allclose(got, 2 * x + 3.0)


def test_value_and_grad_and_tape() -> None:
    x = r(3)

    def step(v):
        with gd.GradientTape() as tape:
            loss = (v * v).sum()
        value, g = gd.value_and_grad(lambda a: (a * a).sum())(v)
        return value, g, tape.gradient(loss, v)

    value, g, tape_g = gd.function(step, backend="reference")(x)
    np.testing.assert_allclose(value, (x * x).sum())
    np.testing.assert_allclose(g, 2 * x)
    np.testing.assert_allclose(tape_g, 2 * x)


def test_gradient_tape_outside_traced_code_raises() -> None:
    with pytest.raises(gd.TracingError, match="strategy.run"):
        with gd.GradientTape():
            pass
    with pytest.raises(gd.TracingError, match="strategy.run"):
        gd.grad(lambda a: a.sum())(np.ones(3))


def test_integer_source_raises() -> None:
    step = gd.function(lambda x: gd.grad(lambda a: (a * 2.0).sum())(x), backend="reference")
    with pytest.raises(gd.TracingError, match="int64"):
        step(np.arange(3))
