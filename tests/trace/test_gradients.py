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
import graphdist.passes.autodiff  # noqa: F401 - registers the rules
from graphdist.ir import to_onnx
from graphdist.ir.gradients import _zero_gradient
from graphdist.ir.graph import ONNX_DOMAIN, Graph
from graphdist.ir.ops import get_opdef, registered_ops
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import current_trace

BACKENDS = ("reference", "ort", "tvm")
#: Sliding-window gradients are large unrolled graphs: TVM compiles each in 1-12 s, so it checks a
#: representative set (every op and padding style once) and the other backends check them all.
WINDOW_BACKENDS = ("reference", "ort")
TVM_WINDOW_CASES = {"avg_pool_nchw_3x3_stride1_same", "conv_nhwc_groups2_same_bias",
                    "conv_nchw_dilation2_valid_stride2", "max_pool_nchw_3x3_stride1_same",
                    "max_pool_nchw_2x3_strides_1x2", "conv_explicit_asymmetric_pads"}
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
          rtol: float = 1e-5, atol: float = 1e-6, backends: tuple[str, ...] = BACKENDS) -> None:
    """Asserts autodiff gradients of ``fn`` equal finite differences on ``backends`` (default: every backend)."""
    args = list(args)
    if argnums is None:
        argnums = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
    expected = [numeric_grad(fn, args, i) for i in argnums]
    for backend in backends:
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
    from tests.ir.test_gradients_nn import traced_cases  # the ops of imported models (graphdist.ir.nn_ops)

    seen: set[str] = set()
    float32_cases = {name: (fn, tuple(np.asarray(a, np.float32) for a in args))
                     for name, (fn, args) in {**WINDOW_CASES, **RAW_WINDOW_CASES}.items()}
    for fn, args in [*CASES.values(), *float32_cases.values(), *traced_cases()]:
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


# ------------------------------------------------ convolution and pooling
# Conv, ConvTranspose and AveragePool run in float32 only in ONNX Runtime's CPU provider (gd.nn
# uses an im2col composite for float64), so these cases run the autodiff graph in float32 on both
# backends and compare with float64 finite differences of the eager (float64, im2col) function.
F32_RTOL = 2e-5


def _f32_exact(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Random float64 values that float32 represents exactly (same inputs in both precisions)."""
    return r(*shape, low=low, high=high).astype(np.float32).astype(np.float64)


def _weighted(y: Any) -> Any:
    """``y`` times fixed weights of its shape: a non-uniform upstream gradient."""
    size = int(np.prod(y.shape))
    return y * np.cos(np.arange(size) * 0.7).reshape(y.shape).astype(y.dtype)


def check_f32(fn: Callable[..., Any], *args: np.ndarray, rtol: float = F32_RTOL,
              backends: tuple[str, ...] = BACKENDS) -> None:
    """float32 autodiff gradients on ``backends`` against float64 finite differences.

    The tolerance is relative to the largest expected gradient entry of each argument.
    """
    args64 = [np.asarray(a, np.float64) for a in args]
    argnums = tuple(range(len(args64)))
    expected = [numeric_grad(fn, args64, i) for i in argnums]
    args32 = [a.astype(np.float32) for a in args64]
    for backend in backends:
        step = gd.function(lambda *a: gd.grad(fn, argnums=argnums)(*a), backend=backend)
        got = step(*args32)
        for i, g, e in zip(argnums, got, expected):
            g = np.asarray(g)
            assert g.dtype == np.float32 and g.shape == e.shape, (backend, i, g.dtype, g.shape)
            np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * np.abs(e).max(),
                                       err_msg=f"{backend}: argument {i}")


def _conv(**kw: Any) -> Callable[..., Any]:
    return lambda x, w, *bias: _weighted(gd.nn.conv2d(x, w, *bias, **kw))


def _pool(kind: str, *args: Any, **kw: Any) -> Callable[..., Any]:
    pool = gd.nn.max_pool2d if kind == "max" else gd.nn.avg_pool2d
    return lambda x: _weighted(pool(x, *args, **kw))


def _nhwc(n: int, h: int, w: int, c: int) -> np.ndarray:
    return _f32_exact(n, h, w, c)


# conv2d filters: (KH, KW, C_in/groups, C_out) for NHWC, (C_out, C_in/groups, KH, KW) for NCHW.
WINDOW_CASES: dict[str, tuple[Callable[..., Any], tuple[np.ndarray, ...]]] = {
    "conv_nhwc_valid_stride1_bias": (_conv(), (_nhwc(2, 5, 6, 3), _f32_exact(3, 3, 3, 4), _f32_exact(4))),
    "conv_nhwc_same_stride2": (_conv(stride=2, padding="SAME"), (_nhwc(2, 7, 6, 3), _f32_exact(3, 3, 3, 4))),
    "conv_nchw_same_stride1_bias": (_conv(padding="SAME", data_format="NCHW"),
                                    (_f32_exact(2, 3, 5, 6), _f32_exact(4, 3, 3, 3), _f32_exact(4))),
    "conv_nchw_valid_stride2": (_conv(stride=2, data_format="NCHW"), (_f32_exact(2, 3, 7, 8), _f32_exact(4, 3, 3, 2))),
    "conv_nhwc_dilation2_same": (_conv(dilation=2, padding="SAME"), (_nhwc(2, 7, 7, 2), _f32_exact(3, 3, 2, 3))),
    "conv_nchw_dilation2_valid_stride2": (_conv(dilation=2, stride=2, data_format="NCHW"),
                                          (_f32_exact(1, 2, 9, 8), _f32_exact(3, 2, 3, 3))),
    "conv_nhwc_groups2_same_bias": (_conv(groups=2, padding="SAME"),
                                    (_nhwc(2, 5, 5, 4), _f32_exact(3, 3, 2, 6), _f32_exact(6))),
    "conv_nchw_groups2_stride2": (_conv(groups=2, stride=2, padding="SAME", data_format="NCHW"),
                                  (_f32_exact(2, 4, 6, 5), _f32_exact(4, 2, 3, 3))),
    "conv_nhwc_depthwise": (_conv(groups=3, padding="SAME"), (_nhwc(2, 5, 5, 3), _f32_exact(3, 3, 1, 6))),
    "conv_explicit_asymmetric_pads": (_conv(stride=(2, 1), padding=((1, 0), (2, 1))),
                                      (_nhwc(1, 6, 5, 2), _f32_exact(3, 2, 2, 3))),
    "conv_1x1": (_conv(), (_nhwc(2, 3, 4, 3), _f32_exact(1, 1, 3, 2))),
    "max_pool_nhwc_2x2_valid": (_pool("max", 2), (_nhwc(2, 6, 5, 3),)),
    "max_pool_nhwc_3x3_stride2_same": (_pool("max", 3, 2, padding="SAME"), (_nhwc(2, 7, 6, 2),)),
    "max_pool_nchw_3x3_stride1_same": (_pool("max", 3, 1, padding="SAME", data_format="NCHW"),
                                       (_f32_exact(2, 2, 5, 4),)),
    "max_pool_nchw_2x3_strides_1x2": (_pool("max", (2, 3), (1, 2), data_format="NCHW"), (_f32_exact(1, 2, 5, 7),)),
    "max_pool_nhwc_2x2_stride1_same": (_pool("max", 2, 1, padding="SAME"), (_nhwc(1, 4, 5, 2),)),
    "avg_pool_nhwc_2x2_valid": (_pool("avg", 2), (_nhwc(2, 6, 5, 3),)),
    "avg_pool_nhwc_3x3_stride2_same": (_pool("avg", 3, 2, padding="SAME"), (_nhwc(2, 7, 6, 2),)),
    "avg_pool_nchw_3x3_stride1_same": (_pool("avg", 3, 1, padding="SAME", data_format="NCHW"),
                                       (_f32_exact(2, 2, 5, 4),)),
    "avg_pool_nchw_2x3_strides_1x2": (_pool("avg", (2, 3), (1, 2), data_format="NCHW"), (_f32_exact(1, 2, 5, 7),)),
    "avg_pool_nhwc_2x2_stride1_same": (_pool("avg", 2, 1, padding="SAME"), (_nhwc(1, 4, 5, 2),)),
    "convnet_like": (lambda x, w: np.sum(_weighted(gd.nn.avg_pool2d(gd.nn.max_pool2d(
        gd.nn.relu(gd.nn.conv2d(x, w, stride=2, padding="SAME")), 2, padding="SAME"), 2, 1, padding="SAME")) ** 2),
                     (_nhwc(2, 6, 6, 3), _f32_exact(3, 3, 3, 4))),
}


# onnx 1.23's reference MaxPool reads asymmetric pads in the wrong order (a 2x2 stride-1 SAME
# pool of a 4x5 image gives 3x6), so these cases run on ONNX Runtime only.
ORT_ONLY = {"max_pool_nhwc_2x2_stride1_same"}


@pytest.mark.parametrize("name", sorted(WINDOW_CASES))
def test_window_op_gradient_float32(name: str) -> None:
    fn, args = WINDOW_CASES[name]
    backends = ("ort",) if name in ORT_ONLY else WINDOW_BACKENDS
    check_f32(fn, *args, backends=backends + (("tvm",) if name in TVM_WINDOW_CASES else ()))


_ONNX_EVALUATORS: dict[Any, Any] = {}


def _onnx_eval(op_type: str, attrs: dict[str, Any], *arrays: np.ndarray) -> np.ndarray:
    """Runs one ONNX op with ``onnx.reference`` (the eager side of a raw-op case)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    key = (op_type, repr(sorted(attrs.items())), tuple((a.dtype.str, a.shape) for a in arrays))
    if key not in _ONNX_EVALUATORS:
        elem = helper.np_dtype_to_tensor_dtype(arrays[0].dtype)
        names = [f"in{i}" for i in range(len(arrays))]
        graph = helper.make_graph(
            [helper.make_node(op_type, names, ["out"], **attrs)], "op",
            [helper.make_tensor_value_info(n, elem, a.shape) for n, a in zip(names, arrays)],
            [helper.make_tensor_value_info("out", elem, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        _ONNX_EVALUATORS[key] = (ReferenceEvaluator(model), names)
    evaluator, names = _ONNX_EVALUATORS[key]
    return evaluator.run(None, dict(zip(names, arrays)))[0]


def _grouped_conv_transpose(attrs: dict[str, Any], x: np.ndarray, w: np.ndarray, *bias: np.ndarray) -> np.ndarray:
    """ConvTranspose with ``group`` > 1, one group at a time: onnx 1.23's reference implementation
    of grouped ConvTranspose slices the weights by output channel (wrong results)."""
    group = attrs["group"]
    single = {k: v for k, v in attrs.items() if k != "group"}
    xs, ws = np.split(x, group, axis=1), np.split(w, group, axis=0)
    out = np.concatenate([_onnx_eval("ConvTranspose", single, a, b) for a, b in zip(xs, ws)], axis=1)
    return out + bias[0].reshape(1, -1, 1, 1) if bias else out


def _raw_window(op_type: str, **attrs: Any) -> Callable[..., Any]:
    def eager(*v: np.ndarray) -> np.ndarray:
        if op_type == "ConvTranspose" and attrs.get("group", 1) > 1:
            return _grouped_conv_transpose(attrs, *v)
        return _onnx_eval(op_type, attrs, *v)

    return lambda *a: _weighted(_raw(op_type, eager, *a, **attrs))


# ONNX ops with attributes gd.nn does not use, emitted directly (NCHW).
RAW_WINDOW_CASES: dict[str, tuple[Callable[..., Any], tuple[np.ndarray, ...]]] = {
    "avg_pool_count_include_pad": (_raw_window("AveragePool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1],
                                               count_include_pad=1), (_f32_exact(1, 2, 6, 5),)),
    "avg_pool_same_lower_exclude_pad": (_raw_window("AveragePool", kernel_shape=[2, 3], auto_pad="SAME_LOWER"),
                                        (_f32_exact(1, 2, 4, 5),)),
    "avg_pool_ceil_mode": (_raw_window("AveragePool", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
                           (_f32_exact(1, 2, 5, 5),)),
    "avg_pool_ceil_mode_count_include_pad": (_raw_window("AveragePool", kernel_shape=[2, 3], strides=[2, 2],
                                                         pads=[0, 1, 1, 1], ceil_mode=1, count_include_pad=1),
                                             (_f32_exact(1, 2, 6, 7),)),
    "max_pool_ceil_mode_dilations": (_raw_window("MaxPool", kernel_shape=[2, 2], strides=[2, 1], dilations=[2, 1],
                                                 ceil_mode=1), (_f32_exact(1, 2, 6, 5),)),
    "max_pool_same_upper": (_raw_window("MaxPool", kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
                            (_f32_exact(1, 2, 5, 4),)),
    "conv_1d_same_lower_stride2": (_raw_window("Conv", auto_pad="SAME_LOWER", strides=[2]),
                                   (_f32_exact(2, 3, 7), _f32_exact(4, 3, 4), _f32_exact(4))),
    "conv_transpose_stride2_groups2_bias": (_raw_window("ConvTranspose", strides=[2, 2], pads=[1, 0, 0, 1],
                                                        output_padding=[1, 0], group=2),
                                            (_f32_exact(1, 4, 3, 4), _f32_exact(4, 2, 3, 2), _f32_exact(4))),
    "conv_transpose_dilation": (_raw_window("ConvTranspose", dilations=[2, 2], pads=[1, 1, 0, 2]),
                                (_f32_exact(2, 2, 3, 3), _f32_exact(2, 3, 2, 3))),
}


@pytest.mark.parametrize("name", sorted(RAW_WINDOW_CASES))
def test_raw_window_op_gradient_float32(name: str) -> None:
    fn, args = RAW_WINDOW_CASES[name]
    # The eager side (onnx.reference) agrees with ONNX Runtime on the forward values.
    forward = gd.function(fn, backend="ort")(*(a.astype(np.float32) for a in args))
    np.testing.assert_allclose(forward, fn(*args), rtol=1e-5, atol=1e-5)
    # (The gradient graph of the grouped ConvTranspose has no grouped ConvTranspose left, so
    # onnx.reference runs it.)
    check_f32(fn, *args, backends=WINDOW_BACKENDS)


@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [2, 3], "pads": [1, 0, 2, 1], "output_padding": [1, 2]},
    {"dilations": [2, 1], "group": 2, "pads": [0, 1, 1, 0]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 1], "auto_pad": "VALID", "output_padding": [1, 0]},
])
def test_conv_transpose_shape_rule_matches_onnxruntime(attrs: dict[str, Any]) -> None:
    import onnxruntime
    from onnx import TensorProto, helper

    x = _f32_exact(2, 4, 3, 5).astype(np.float32)
    w = _f32_exact(4, 3, 3, 2).astype(np.float32)
    graph = Graph("g")
    node = graph.add_node("ConvTranspose", [graph.add_input("x", np.float32, ("n", 4, 3, 5)),
                                            graph.add_input("w", np.float32, w.shape)], attrs)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, w.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x, "w": w})
    assert node.outputs[0].shape == ("n", *y.shape[1:])


def test_max_pool_float64_gradient() -> None:
    """MaxPool runs in float64 in ONNX Runtime too: full-precision check on both backends."""
    check(_pool("max", 3, 2, padding="SAME"), _f32_exact(2, 5, 6, 2))
    check(_pool("max", 2, data_format="NCHW"), _f32_exact(1, 2, 4, 6))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_ties_go_to_the_first_maximum(dtype: Any) -> None:
    """Each window's gradient goes to its first maximum in row-major order (as TensorFlow and
    ONNX Runtime's Indices pick); padding never takes it."""
    x = np.array([[1, 1, 0, 2], [1, 1, 2, 2], [3, 0, 3, 3], [0, 3, 3, 3]], dtype)[None, :, :, None]
    upstream = np.arange(1, 17, dtype=dtype).reshape(1, 4, 4, 1)

    def expected(pool: int, stride: int, pads: tuple[int, int]) -> np.ndarray:
        padded = np.pad(x[0, :, :, 0], (pads, pads), constant_values=-np.inf)
        size = (padded.shape[0] - pool) // stride + 1
        out = np.zeros_like(padded)
        for i in range(size):
            for j in range(size):
                window = padded[i * stride:i * stride + pool, j * stride:j * stride + pool]
                k = int(np.argmax(window))  # the first maximum
                out[i * stride + k // pool, j * stride + k % pool] += upstream[0, i, j, 0]
        return out[pads[0]:pads[0] + 4, pads[0]:pads[0] + 4][None, :, :, None]

    for backend in BACKENDS:
        for pool, stride, padding, pads in ((2, 2, "VALID", (0, 0)), (3, 1, "SAME", (1, 1))):
            size = 4 // stride

            def fn(v: Any, pool: int = pool, stride: int = stride, padding: str = padding, size: int = size) -> Any:
                return gd.nn.max_pool2d(v, pool, stride, padding=padding) * upstream[:, :size, :size]

            got = gd.function(lambda v, fn=fn: gd.grad(fn)(v), backend=backend)(x)
            np.testing.assert_array_equal(got, expected(pool, stride, pads), err_msg=f"{backend} {pool} {padding}")


def test_convnet_sgd_steps_decrease_the_loss() -> None:
    """conv2d -> relu -> max_pool2d -> flatten -> dense -> sparse softmax cross entropy, float32,
    trained with SGD through OneDeviceStrategy.run and GradientTape."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 8, 8, 1)).astype(np.float32)
    labels = (x[:, :4].mean(axis=(1, 2, 3)) > x[:, 4:].mean(axis=(1, 2, 3))).astype(np.int64)
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        kernel = gd.Variable(rng.standard_normal((3, 3, 1, 8)).astype(np.float32) * 0.5, name="conv/kernel")
        bias = gd.Variable(np.zeros(8, np.float32), name="conv/bias")
        dense = gd.Variable(rng.standard_normal((128, 2)).astype(np.float32) * 0.1, name="dense/kernel")
        dense_bias = gd.Variable(np.zeros(2, np.float32), name="dense/bias")
        optimizer = gd.optimizers.SGD(0.01)
    variables = [kernel, bias, dense, dense_bias]

    def step(images: Any, classes: Any) -> Any:
        with gd.GradientTape() as tape:
            h = gd.nn.relu(gd.nn.conv2d(images, kernel, bias, padding="SAME"))
            h = gd.nn.max_pool2d(h, 2)
            logits = h.reshape(h.shape[0], -1) @ dense + dense_bias
            loss = np.mean(gd.nn.sparse_softmax_cross_entropy(classes, logits))
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    losses = [float(strategy.run(step, args=(x, labels))) for _ in range(6)]
    assert all(np.isfinite(losses)), losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.6 * losses[0], losses


# -------------------------------------------------------- registry coverage
# Ops with a float input that have no gradient rule, and why (printed by the test).
NON_DIFFERENTIABLE: dict[str, str] = {}
NOT_YET: dict[str, str] = {}
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
def test_no_rule_raises_tracing_error_naming_the_op(monkeypatch) -> None:
    monkeypatch.setattr(get_opdef("Sin"), "gradient", None)
    step = gd.function(lambda x: gd.grad(lambda a: np.sin(a).sum())(x), backend="reference")
    with pytest.raises(gd.TracingError, match="cannot differentiate through Sin .*no gradient rule at opset 18"):
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


def test_stop_gradient_blocks_the_gradient_and_round_trips_through_onnx() -> None:
    from graphdist.ir import from_onnx

    x = np.array([1.0, 2.0, 3.0])

    @gd.function
    def g(x):
        return gd.grad(lambda a: (gd.stop_gradient(a) * a).sum())(x)

    np.testing.assert_allclose(g(x), x)  # d/da of c * a with c = a held constant: a, not 2a
    assert gd.stop_gradient(x) is x  # eager: the value itself
    traced = gd.trace(lambda a: gd.stop_gradient(a) * 2.0, x)
    model = to_onnx(traced)
    assert [n.op_type for n in model.graph.node][0] == "Identity"  # runnable by any ONNX runtime
    assert from_onnx(model).nodes[0].qualified_op == "graphdist.StopGradient"


def test_tvm_window_cases_exist() -> None:
    assert TVM_WINDOW_CASES <= set(WINDOW_CASES)
