"""The ONNX neural-network ops of imported models (``graphdist.ir.nn_ops``): shape rules, ``since``,
forward values.

* Shape rules agree with ONNX's own shape inference (strict mode) and reject
  bad nodes with a ``GraphError`` naming the op, the argument and the fix.
* ``OpDef.since`` is the first opset of the form each rule models.
* The numpy references (the eager side of the finite-difference cases in
  ``tests/ir/test_gradients_nn.py``) agree with ``onnx.reference`` on
  one-node models, or with ONNX Runtime where onnx 1.23's reference
  implementation is wrong (LRN when N != C, GlobalMaxPool unless 4-D); and
  graphdist's lowering of each op computes the same on every backend (the
  tvm backend rewrites or sends to ONNX Runtime the forms TVM 0.27 gets wrong:
  training BatchNormalization statistics, Dropout's mask, LayerNormalization's
  Mean/InvStdDev).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import graphdist as gd
from graphdist.errors import GraphError
from graphdist.ir.graph import ONNX_DOMAIN, Graph
from graphdist.ir.ops import get_opdef
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import current_trace
from tests.ir.test_ops import build, onnx_types, types

F64 = np.float64
F32 = np.float32
ALL = ("reference", "ort", "tvm")
REF_ORT = ("reference", "ort")
_rng = np.random.default_rng(7)


def r(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """float64 values that float32 holds exactly (the same inputs in both precisions)."""
    return _rng.uniform(low, high, size=shape).astype(F32).astype(F64)


def pos(*shape: int) -> np.ndarray:
    return r(*shape, low=0.5, high=2.0)


# ------------------------------------------------------------ numpy references
# ONNX stores float attributes as float32: the references round them the same way.
def _f(value: float) -> float:
    return float(np.float32(value))


def gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX attribute names
    y = _f(alpha) * ((a.T if transA else a) @ (b.T if transB else b))
    return y if c is None else y + _f(beta) * c


def _channels(v: np.ndarray, rank: int) -> np.ndarray:
    return v.reshape(-1, *[1] * (rank - 2))


def batch_norm(x, scale, bias, mean, var, epsilon=1e-5):
    return (_channels(scale, x.ndim) * (x - _channels(mean, x.ndim)) / np.sqrt(_channels(var, x.ndim) + _f(epsilon))
            + _channels(bias, x.ndim))


def batch_norm_training(x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, training_mode=1):
    axes = (0, *range(2, x.ndim))
    batch_mean, batch_var = x.mean(axis=axes), x.var(axis=axes)
    y = batch_norm(x, scale, bias, batch_mean, batch_var, epsilon)
    momentum = _f(momentum)
    return y, mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)


def lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    low, high = (size - 1) // 2, math.ceil((size - 1) / 2)
    squares = np.zeros_like(x)
    for c in range(x.shape[1]):
        squares[:, c] = (x[:, max(0, c - low):c + high + 1] ** 2).sum(axis=1)
    return x / (_f(bias) + _f(alpha) / size * squares) ** _f(beta)


def flatten(x, axis=1):
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


def global_average_pool(x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)


def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


def layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + _f(epsilon))
    y = (x - mean) * inv * scale
    return (y if bias is None else y + bias), mean, inv


def gelu(x, approximate="none"):
    """ONNX's function body of Gelu-20: float32 constants, cast to the input type."""
    if approximate == "tanh":
        k, c = np.sqrt(_f(2 / np.pi)), _f(0.044715)
        return 0.5 * x * (1 + np.tanh(k * (x + c * x ** 3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def hard_sigmoid(x, alpha=0.2, beta=0.5):
    return np.clip(_f(alpha) * x + _f(beta), 0, 1)


def leaky_relu(x, alpha=0.01):
    return np.where(x >= 0, x, _f(alpha) * x)


def elu(x, alpha=1.0):
    return np.where(x > 0, x, _f(alpha) * (np.exp(x) - 1))


SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def selu(x, alpha=SELU_ALPHA, gamma=SELU_GAMMA):
    return _f(gamma) * np.where(x > 0, x, _f(alpha) * (np.exp(x) - 1))


# ------------------------------------------------------------------ helpers
def _raw_n(op_type: str, reference: Callable[..., Any], count: int, *args: Any, **attrs: Any) -> Any:
    """Like ``_raw`` for an op with ``count`` outputs (a tuple of them)."""
    if any(isinstance(a, Tensor) for a in args):
        ctx = current_trace()
        values = [a.value if isinstance(a, Tensor) else None if a is None else ctx.constant(a) for a in args]
        return tuple(ctx.emit(op_type, values, attrs, num_outputs=count))
    return reference(*args)


def at_opset(opset: int, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, traced in a graph of default-domain opset >= ``opset`` (as ``inline_graph`` raises a
    trace's opset for a newer model): graphdist traces at opset 18, Gelu exists from 20 on."""
    def traced(*args: Any) -> Any:
        ctx = current_trace()
        if ctx is not None:
            ctx.graph.opset_imports[ONNX_DOMAIN] = max(ctx.graph.opset, opset)
        return fn(*args)

    return traced


def onnx_run(op_type: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], outputs: int = 1,
             opset: int = 18, runtime: str = "reference") -> list[np.ndarray]:
    """Runs one ONNX node with ``onnx.reference`` or ONNX Runtime; ``None`` inputs are omitted."""
    names = ["" if a is None else f"in{i}" for i, a in enumerate(inputs)]
    given = [(n, a) for n, a in zip(names, inputs) if a is not None]
    outs = [f"out{i}" for i in range(outputs)]
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op_type, names, outs, **attrs)], "one",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in given],
        [helper.make_tensor_value_info(o, 0, None) for o in outs]), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    feeds = dict(given)
    if runtime == "reference":
        return ReferenceEvaluator(model).run(None, feeds)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# ------------------------------------------------------------- forward values
class Forward(NamedTuple):
    """One op on fixed inputs, the numpy reference of the gradient cases, and the oracle for both."""

    op_type: str
    inputs: list[np.ndarray]
    attrs: dict[str, Any]
    outputs: int
    reference: Callable[..., Any]
    opset: int = 18
    #: "reference" (onnx.reference, float64) or "ort" (ONNX Runtime, float32) where onnx 1.23's
    #: reference implementation is wrong: LRN when N != C (it loops over the batch axis where it
    #: means the channels), GlobalMaxPool unless the input is 4-D (it reduces axes rank-2, rank-1).
    oracle: str = "reference"


FORWARD: dict[str, Forward] = {
    "gemm_transA_row_c": Forward("Gemm", [r(4, 3), r(4, 5), r(5)], {"transA": 1, "alpha": 0.5, "beta": 2.0}, 1, gemm),
    "gemm_transB_column_c": Forward("Gemm", [r(3, 4), r(5, 4), r(3, 1)], {"transB": 1}, 1, gemm),
    "gemm_no_c": Forward("Gemm", [r(3, 4), r(4, 2)], {"alpha": 3.0}, 1, gemm),
    "batch_norm": Forward("BatchNormalization", [r(2, 3, 4, 5), r(3), r(3), r(3), pos(3)], {"epsilon": 1e-3}, 1,
                          batch_norm),
    "batch_norm_training": Forward("BatchNormalization", [r(3, 2, 4), r(2), r(2), r(2), pos(2)],
                                   {"training_mode": 1, "momentum": 0.7}, 3, batch_norm_training),
    "lrn_n_equals_c": Forward("LRN", [r(3, 3, 2, 2)], {"size": 3, "alpha": 0.5, "beta": 0.6, "bias": 1.5}, 1, lrn),
    "lrn_n_differs_from_c": Forward("LRN", [r(2, 5, 3, 2)], {"size": 5, "alpha": 0.5, "bias": 2.0}, 1, lrn,
                                    oracle="ort"),
    "lrn_even_size": Forward("LRN", [r(4, 4, 2, 3)], {"size": 4, "alpha": 0.3}, 1, lrn),
    "sum": Forward("Sum", [r(2, 3), r(3), r(2, 1)], {}, 1, lambda *v: sum(v)),
    "mean": Forward("Mean", [r(2, 3), r(3), r(2, 1)], {}, 1, lambda *v: sum(v) / len(v)),
    "flatten_axis2": Forward("Flatten", [r(2, 3, 4)], {"axis": 2}, 1, flatten),
    "flatten_axis_negative": Forward("Flatten", [r(2, 3, 4)], {"axis": -1}, 1, flatten),
    "dropout_inference": Forward("Dropout", [r(3, 4), np.array(0.4)], {}, 2,
                                 lambda x, _: (x, np.ones(x.shape, np.bool_))),
    "global_average_pool": Forward("GlobalAveragePool", [r(2, 3, 4, 5)], {}, 1, global_average_pool),
    "global_average_pool_3d": Forward("GlobalAveragePool", [r(2, 3, 5)], {}, 1, global_average_pool),
    "global_max_pool": Forward("GlobalMaxPool", [r(2, 3, 4, 5)], {}, 1, global_max_pool),
    "global_max_pool_3d": Forward("GlobalMaxPool", [r(2, 3, 5)], {}, 1, global_max_pool, oracle="ort"),
    "global_max_pool_5d": Forward("GlobalMaxPool", [r(1, 2, 3, 2, 2)], {}, 1, global_max_pool, oracle="ort"),
    "layer_norm_axis1_bias": Forward("LayerNormalization", [r(2, 3, 4), r(3, 4), r(3, 4)], {"axis": 1}, 3,
                                     layer_norm),
    "layer_norm_last_axis": Forward("LayerNormalization", [r(2, 3, 4), r(4)], {"epsilon": 1e-3}, 3,
                                    lambda x, s, epsilon: layer_norm(x, s, epsilon=epsilon)),
    "layer_norm_y_only": Forward("LayerNormalization", [r(2, 3, 4), r(4), r(4)], {"axis": -1}, 1, layer_norm),
    "gelu": Forward("Gelu", [r(3, 4) * 3], {}, 1, gelu, opset=20),
    "gelu_tanh": Forward("Gelu", [r(3, 4) * 3], {"approximate": "tanh"}, 1, gelu, opset=20),
    "hard_sigmoid": Forward("HardSigmoid", [r(3, 4) * 3], {"alpha": 0.3}, 1, hard_sigmoid),
    "leaky_relu": Forward("LeakyRelu", [r(3, 4)], {"alpha": 0.2}, 1, leaky_relu),
    "elu": Forward("Elu", [r(3, 4)], {"alpha": 0.5}, 1, elu),
    "selu": Forward("Selu", [r(3, 4)], {}, 1, selu),
}

#: (case, backend) -> why the backend cannot run the case at all.
CANNOT_RUN: dict[tuple[str, str], str] = {
    ("lrn_even_size", "ort"): "ONNX Runtime's LRN kernel requires an odd size",
    ("lrn_even_size", "tvm"): "TVM 0.27's ONNX frontend cannot convert an LRN of even size",
}


def _as_tuple(value: Any) -> tuple[np.ndarray, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _oracle(case: Forward, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return onnx_run(case.op_type, inputs, case.attrs, case.outputs, case.opset, runtime=case.oracle)


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_numpy_reference_matches_the_oracle(name: str) -> None:
    """The eager side of the gradient cases is checked against ``onnx.reference`` in float64, or
    ONNX Runtime in float32 where onnx.reference is wrong.

    float64 tolerance 1e-6 (absolute 1e-7): onnx.reference rounds some intermediates to float32
    (its Erf runs in float32; LRN's alpha / size is a float32); a wrong formula is off by far more.
    """
    case = FORWARD[name]
    inputs = case.inputs if case.oracle == "reference" else [a.astype(F32) for a in case.inputs]
    expected = _oracle(case, inputs)
    got = _as_tuple(case.reference(*[a.astype(F64) for a in inputs], **case.attrs))[:case.outputs]
    assert len(got) == len(expected) == case.outputs
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-6 if case.oracle == "reference" else 2e-6, atol=1e-7)


def _forward_params() -> list[Any]:
    params = []
    for name in sorted(FORWARD):
        for backend in ALL:
            if (name, backend) in CANNOT_RUN:
                continue
            params.append(pytest.param(name, backend, id=f"{name}-{backend}"))
    return params


@pytest.mark.parametrize(("name", "backend"), _forward_params())
def test_lowered_op_matches_the_oracle(name: str, backend: str) -> None:
    """graphdist lowers each op (attributes included) so that the backend computes what the oracle
    computes for the one-node model (float32)."""
    case = FORWARD[name]
    inputs = [a.astype(F32) if a.dtype == F64 else a for a in case.inputs]
    expected = _oracle(case, inputs)
    fn = gd.function(at_opset(case.opset, lambda *a: _raw_n(case.op_type, None, case.outputs, *a, **case.attrs)),
                     backend=backend)
    got = _as_tuple(fn(*inputs))
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_cannot_run_cases_fail_loudly() -> None:
    """The backends that cannot run a case say so (no silently wrong values)."""
    case = FORWARD["lrn_even_size"]
    inputs = [a.astype(F32) for a in case.inputs]
    for backend, pattern in (("ort", "size_ % 2 == 1"), ("tvm", "cannot convert .* op 'LRN'")):
        fn = gd.function(lambda *a: _raw_n(case.op_type, None, 1, *a, **case.attrs), backend=backend)
        with pytest.raises(gd.BackendError, match=pattern):
            fn(*inputs)


# ------------------------------------------------------------------ shape rules
B = np.bool_
I64 = np.int64
V3 = (F32, (3,))
SHAPE_RULES = [
    ("Gemm", [(F32, (3, 4)), (F32, (4, 5))], None, {}, [("float32", (3, 5))]),
    ("Gemm", [(F64, (4, 3)), (F64, (5, 4)), (F64, (5,))], {"transA": 1, "transB": 1}, {}, [("float64", (3, 5))]),
    ("Gemm", [(F32, (3, 4)), (F32, (4, 5)), (F32, (3, 1))], {"alpha": 2.0}, {}, [("float32", (3, 5))]),
    ("Gemm", [(F32, (3, 4)), (F32, (4, 5)), (F32, ())], None, {}, [("float32", (3, 5))]),
    ("BatchNormalization", [(F32, (2, 3, 4, 5)), V3, V3, V3, V3], None, {}, [("float32", (2, 3, 4, 5))]),
    ("BatchNormalization", [(F64, (6, 3)), (F64, (3,)), (F64, (3,)), (F64, (3,)), (F64, (3,))], {"epsilon": 1e-3},
     {}, [("float64", (6, 3))]),
    ("BatchNormalization", [(F32, (2, 3, 5)), V3, V3, V3, V3], {"training_mode": 1}, {"num_outputs": 3},
     [("float32", (2, 3, 5)), ("float32", (3,)), ("float32", (3,))]),
    ("LRN", [(F32, (2, 3, 4, 5))], {"size": 3}, {}, [("float32", (2, 3, 4, 5))]),
    ("Sum", [(F32, (2, 3)), V3, (F32, (2, 1))], None, {}, [("float32", (2, 3))]),
    ("Sum", [(F64, (2, 3))], None, {}, [("float64", (2, 3))]),
    ("Mean", [(F32, (2, 1, 4)), (F32, (3, 1))], None, {}, [("float32", (2, 3, 4))]),
    ("Flatten", [(F32, (2, 3, 4))], None, {}, [("float32", (2, 12))]),
    ("Flatten", [(F32, (2, 3, 4))], {"axis": 0}, {}, [("float32", (1, 24))]),
    ("Flatten", [(F32, (2, 3, 4))], {"axis": 3}, {}, [("float32", (24, 1))]),
    ("Flatten", [(F32, (2, 3, 4))], {"axis": -1}, {}, [("float32", (6, 4))]),
    ("Flatten", [(I64, (2, 3, 4))], {"axis": -3}, {}, [("int64", (1, 24))]),
    ("Dropout", [(F32, (3, 4))], None, {}, [("float32", (3, 4))]),
    ("Dropout", [(F32, (3, 4)), np.array(0.1, F32), np.array(True)], {"seed": 1}, {"num_outputs": 2},
     [("float32", (3, 4)), ("bool", (3, 4))]),
    ("Dropout", [(F64, (3, 4)), (F32, ()), (B, ())], None, {"num_outputs": 2}, [("float64", (3, 4)), ("bool", (3, 4))]),
    ("GlobalAveragePool", [(F32, (2, 3, 4, 5))], None, {}, [("float32", (2, 3, 1, 1))]),
    ("GlobalAveragePool", [(F64, (2, 3, 5))], None, {}, [("float64", (2, 3, 1))]),
    ("GlobalMaxPool", [(F32, (1, 2, 3, 4, 5))], None, {}, [("float32", (1, 2, 1, 1, 1))]),
    ("LayerNormalization", [(F32, (2, 3, 4)), (F32, (4,))], None, {"num_outputs": 3},
     [("float32", (2, 3, 4)), ("float32", (2, 3, 1)), ("float32", (2, 3, 1))]),
    ("LayerNormalization", [(F64, (2, 3, 4)), (F64, (3, 4)), (F64, (3, 4))], {"axis": 1}, {"num_outputs": 3},
     [("float64", (2, 3, 4)), ("float32", (2, 1, 1)), ("float32", (2, 1, 1))]),
    ("LayerNormalization", [(F32, (2, 3, 4)), (F32, (1, 4))], {"axis": -2}, {}, [("float32", (2, 3, 4))]),
    ("HardSigmoid", [(F64, (2, 3))], {"alpha": 0.3}, {}, [("float64", (2, 3))]),
    ("LeakyRelu", [(F32, (2, 3))], None, {}, [("float32", (2, 3))]),
    ("Elu", [(F32, (2, 3))], None, {}, [("float32", (2, 3))]),
    ("Selu", [(F64, ())], None, {}, [("float64", ())]),
]


@pytest.mark.parametrize(("op_type", "inputs", "attrs", "kwargs", "expected"), SHAPE_RULES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(SHAPE_RULES)])
def test_shape_rule_matches_onnx_inference(op_type, inputs, attrs, kwargs, expected) -> None:
    graph, node = build(op_type, inputs, attrs, **kwargs)
    assert types(node) == expected
    assert onnx_types(graph) == expected


@pytest.mark.parametrize(
    ("op_type", "inputs", "attrs", "kwargs", "pattern"),
    [
        ("Gemm", [(F32, (3, 4)), (F32, (5, 2))], None, {},
         r"Gemm \(gemm\): inner dimensions differ.*K=4.*K=5; check transA/transB"),
        ("Gemm", [(F32, (2, 3, 4)), (F32, (4, 5))], None, {}, r"Gemm \(gemm\): A .* must be matrices.*use MatMul"),
        ("Gemm", [(F32, (3, 4)), (F32, (4, 5)), (F32, (4, 5))], None, {},
         r"C float32\[4,5\] must broadcast to the output shape \(3, 5\).*reshape C"),
        ("Gemm", [(F32, (3, 4)), (F64, (4, 5))], None, {}, r"Gemm \(gemm\) needs inputs of one dtype.*Cast"),
        ("BatchNormalization", [(F32, (2, 3, 4)), (F32, (4,)), V3, V3, V3], None, {},
         r"BatchNormalization \(batchnormalization\): scale float32\[4\] must have shape \(3,\), one value per"),
        ("BatchNormalization", [V3, V3, V3, V3, V3], None, {},
         r"X float32\[3\] needs layout \(N, C, \.\.\.\).*Unsqueeze"),
        ("BatchNormalization", [(F32, (2, 3)), V3, V3, V3, V3], None, {"num_outputs": 3},
         r"has 1 output\(s\) here \(Y only when training_mode=0\), got 3"),
        ("BatchNormalization", [(F32, (2, 3)), V3, V3, V3, V3], {"training_mode": 1}, {"num_outputs": 1},
         r"has 3 output\(s\) here \(Y, running_mean, running_var in training mode\), got 1"),
        ("BatchNormalization", [(I64, (2, 3)), V3, V3, V3, V3], None, {}, r"X must be a floating point.*Cast"),
        ("LRN", [(F32, (2, 3, 4, 5))], None, {}, r"LRN \(lrn\) needs the size attribute"),
        ("LRN", [(F32, (2, 3, 4))], {"size": 3}, {}, r"X float32\[2,3,4\] must be 4-D \(N, C, H, W\).*reshape"),
        ("Sum", [(F32, (2, 3)), (F32, (4,))], None, {}, r"shapes \(2, 3\) and \(4,\) cannot be broadcast"),
        ("Sum", [], None, {}, r"Sum \(sum\) needs at least one input"),
        ("Mean", [(I64, (2,))], None, {}, r"Mean \(mean\): input 0 must be a floating point tensor.*Cast"),
        ("Flatten", [(F32, (2, 3))], {"axis": 3}, {}, r"Flatten \(flatten\): axis 3 is out of range.*-2\.\.2"),
        ("Dropout", [V3, np.array(1.0, F32)], None, {}, r"Dropout \(dropout\): ratio 1\.0 must be in \[0, 1\)"),
        ("Dropout", [V3, np.array([0.5], F32)], None, {}, r"ratio float32\[1\] must be a float scalar"),
        ("Dropout", [V3, np.array(0.5, F32), np.array(1, I64)], None, {},
         r"training_mode int64\[\] must be a bool scalar"),
        ("Dropout", [V3], None, {"num_outputs": 3}, r"has 1 or 2 output\(s\) here.*got 3"),
        ("GlobalMaxPool", [V3], None, {}, r"GlobalMaxPool \(globalmaxpool\): X float32\[3\] needs layout"),
        ("LayerNormalization", [(F32, (2, 3, 4)), V3], None, {},
         r"Scale float32\[3\] must broadcast to the normalized shape \(4,\).*reshape it"),
        ("LayerNormalization", [(F32, (2, 3, 4)), (F32, (4,)), (F32, (2, 4))], None, {},
         r"B float32\[2,4\] must broadcast to the normalized shape \(4,\)"),
        ("LayerNormalization", [(F32, (2, 3, 4)), (F32, (4,))], {"axis": 3}, {}, r"axis 3 is out of range"),
        ("LayerNormalization", [(F32, (2, 3)), V3], {"stash_type": 7}, {}, r"stash_type 7 must be a float type"),
        ("Elu", [(I64, (2,))], None, {},
         r"Elu \(elu\): X must be a floating point tensor, got int64\[2\]; insert a Cast"),
    ],
    ids=lambda v: v if isinstance(v, str) and v[:1].isupper() else None,
)
def test_shape_rule_errors(op_type, inputs, attrs, kwargs, pattern) -> None:
    with pytest.raises(GraphError, match=pattern):
        build(op_type, inputs, attrs, **kwargs)


def test_shape_rules_keep_symbolic_dimensions() -> None:
    _, node = build("Gemm", [(F32, ("n", 4)), (F32, (4, 5)), (F32, (5,))])
    assert node.outputs[0].shape == ("n", 5)
    _, node = build("Flatten", [(F32, ("n", 3, 4))])
    assert node.outputs[0].shape == ("n", 12)
    _, node = build("Flatten", [(F32, ("n", 3, 4))], {"axis": 2})
    assert node.outputs[0].shape == ("n*3", 4)
    _, node = build("LayerNormalization", [(F32, ("n", 3, 4)), (F32, (4,))], num_outputs=2)
    assert [v.shape for v in node.outputs] == [("n", 3, 4), ("n", 3, 1)]
    _, node = build("BatchNormalization", [(F32, ("n", 3, 4)), V3, V3, V3, V3])
    assert node.outputs[0].shape == ("n", 3, 4)


def test_gelu_shape_rule() -> None:
    """Gelu exists from opset 20 on: in a graph at opset 20 its rule agrees with ONNX's inference; a
    graph at opset 18 refuses it."""
    graph = Graph("gelu", opset_imports={ONNX_DOMAIN: 20})
    node = graph.add_node("Gelu", [graph.add_input("x", F64, (2, "n"))], {"approximate": "tanh"})
    graph.outputs = list(node.outputs)
    assert types(node) == [("float64", (2, "n"))] == onnx_types(graph)
    with pytest.raises(GraphError, match=r"Gelu \(gelu_\d\): approximate='erf' is not supported; use 'none' or 'tanh'"):
        graph.add_node("Gelu", [graph.inputs[0]], {"approximate": "erf"})
    with pytest.raises(GraphError, match=r"Gelu \(gelu_\d\): X must be a floating point tensor.*Cast"):
        graph.add_node("Gelu", [graph.add_input("i", I64, (2,))])
    with pytest.raises(GraphError, match="Gelu does not exist at opset 18"):
        build("Gelu", [(F32, (2,))])


# ------------------------------------------------------------------ since
#: The oldest opset whose form of each op the OpDef models (inputs, attributes, semantics).
SINCE = {"Gemm": 11, "BatchNormalization": 15, "LRN": 1, "Sum": 8, "Mean": 8, "Flatten": 11, "Dropout": 12,
         "GlobalAveragePool": 1, "GlobalMaxPool": 1, "LayerNormalization": 17, "Gelu": 20, "HardSigmoid": 6,
         "LeakyRelu": 6, "Elu": 6, "Selu": 6}
#: Changes at ``since`` that the schema's structure does not show (checked in the schema's doc).
SEMANTIC_CHANGES = {"Sum": "broadcasting", "Mean": "broadcasting", "Flatten": "[-r, r]"}


def _form(schema: onnx.defs.OpSchema) -> tuple[Any, ...]:
    return ([(p.name, int(p.option)) for p in schema.inputs], [(p.name, int(p.option)) for p in schema.outputs],
            sorted(schema.attributes), [c.type_param_str for c in schema.type_constraints])


def _text(schema: onnx.defs.OpSchema) -> str:
    return schema.doc + " ".join(a.description for a in schema.attributes.values())


@pytest.mark.parametrize("op_type", sorted(SINCE))
def test_since_is_the_first_opset_of_the_modelled_form(op_type: str) -> None:
    """``since`` is a version of the op's schema; the form is the same from there to ONNX's newest
    opset (later versions only add types); the version before it has another form."""
    assert get_opdef(op_type).since == SINCE[op_type]
    first = onnx.defs.get_schema(op_type, SINCE[op_type])
    assert first.since_version == SINCE[op_type]
    for opset in range(SINCE[op_type], onnx.defs.onnx_opset_version() + 1):
        assert _form(onnx.defs.get_schema(op_type, opset)) == _form(first), opset
    if SINCE[op_type] > 1 and op_type not in ("LayerNormalization", "Gelu"):
        before = onnx.defs.get_schema(op_type, SINCE[op_type] - 1)
        if op_type in SEMANTIC_CHANGES:
            assert _form(before) == _form(first)
            assert SEMANTIC_CHANGES[op_type] in _text(first) and SEMANTIC_CHANGES[op_type] not in _text(before)
        else:
            assert _form(before) != _form(first)
