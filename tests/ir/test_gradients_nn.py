"""Gradient rules of the neural-network ops of imported models (``graphdist.ir.gradients_nn``).

Each rule equals central finite differences of the op's numpy reference
(itself checked against onnx.reference in ``tests/ir/test_nn_ops.py``): in
float64 on the backends that run the op in float64, and in float32 (against
float64 differences) where ONNX Runtime's CPU provider has the op in float32
only (LRN, Mean, GlobalAveragePool, GlobalMaxPool, Gelu). Dropout in training
mode is checked against the mask-based formula computed from the mask the op
returns; GlobalMaxPool's ties against the first-maximum rule. The existing
Softmax, Concat, Gather and AveragePool rules are checked in the forms real
models use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx.reference import ReferenceEvaluator

import graphdist as gd
import graphdist.passes.autodiff  # noqa: F401 - registers the rules
from graphdist.errors import GraphError
from graphdist.ir.gradients import GradBuilder
from graphdist.ir.graph import Graph, Node
from graphdist.ir.nn_ops import NN_OPS
from graphdist.ir.ops import get_opdef
from tests.ir.test_nn_ops import (
    ALL,
    F32,
    F64,
    REF_ORT,
    SINCE,
    _raw_n,
    at_opset,
    batch_norm,
    batch_norm_training,
    elu,
    flatten,
    gelu,
    gemm,
    global_average_pool,
    global_max_pool,
    hard_sigmoid,
    layer_norm,
    leaky_relu,
    lrn,
    onnx_run,
    pos,
    r,
    selu,
)
from tests.trace.test_gradients import _raw, _raw_window, _softmax, _weighted, check, check_f32, numeric_grad


def _op(op_type: str, reference: Callable[..., Any], **attrs: Any) -> Callable[..., Any]:
    """``fn(*args)``: the op (traced) or ``reference`` (eager), with a weighted sum as upstream gradient."""
    return lambda *a: _weighted(_raw(op_type, lambda *v: reference(*v, **attrs), *a, **attrs))


def _op_n(op_type: str, reference: Callable[..., Any], count: int, use: tuple[int, ...], **attrs: Any
          ) -> Callable[..., Any]:
    """Like :func:`_op` for a multi-output op: the weighted sum of the outputs in ``use`` (as float64)."""
    def fn(*a: Any) -> Any:
        outs = _raw_n(op_type, lambda *v: reference(*v, **attrs), count, *a, **attrs)
        return sum(np.sum(_weighted(outs[i].astype(F64))) for i in use)

    return fn


# ------------------------------------------------------------ gradient cases
#: name -> (fn, args, float64 backends, float32 backends). ONNX Runtime's CPU provider has LRN,
#: Mean, GlobalAveragePool and GlobalMaxPool in float32 only: those run float32 there.
Case = tuple[Callable[..., Any], tuple[np.ndarray, ...], tuple[str, ...], tuple[str, ...]]
F32_ON_ORT = (("reference", "tvm"), ("ort",))

CASES: dict[str, Case] = {
    # Gemm
    "gemm": (_op("Gemm", gemm), (r(3, 4), r(4, 5)), ALL, ()),
    "gemm_transA_bias_row_alpha_beta": (_op("Gemm", gemm, transA=1, alpha=0.5, beta=2.0),
                                        (r(4, 3), r(4, 5), r(5)), ALL, ()),
    "gemm_transB_bias_column": (_op("Gemm", gemm, transB=1), (r(3, 4), r(5, 4), r(3, 1)), ALL, ()),
    "gemm_both_transposed_scalar_c": (_op("Gemm", gemm, transA=1, transB=1, alpha=1.5),
                                      (r(4, 3), r(5, 4), r(1)), ALL, ()),
    "gemm_full_c": (_op("Gemm", gemm, beta=0.5), (r(3, 4), r(4, 2), r(3, 2)), ALL, ()),
    # BatchNormalization
    "batch_norm_inference_nchw": (_op("BatchNormalization", batch_norm, epsilon=1e-3),
                                  (r(2, 3, 4, 5), r(3), r(3), r(3), pos(3)), ALL, ()),
    "batch_norm_inference_nc": (_op("BatchNormalization", batch_norm), (r(6, 3), r(3), r(3), r(3), pos(3)), ALL, ()),
    "batch_norm_training_all_outputs": (_op_n("BatchNormalization", batch_norm_training, 3, (0, 1, 2),
                                              training_mode=1, momentum=0.7, epsilon=1e-3),
                                        (r(3, 2, 4, 3), r(2), r(2), r(2), pos(2)), ALL, ()),
    "batch_norm_training_y_only_ncl": (_op_n("BatchNormalization", batch_norm_training, 3, (0,), training_mode=1),
                                       (r(4, 3, 5), r(3), r(3), r(3), pos(3)), ALL, ()),
    "batch_norm_training_running_stats_only": (_op_n("BatchNormalization", batch_norm_training, 3, (1, 2),
                                                     training_mode=1), (r(4, 3, 2), r(3), r(3), r(3), pos(3)),
                                               ALL, ()),
    # LRN (N != C: onnx.reference's forward LRN is wrong then; the gradient graph has no LRN)
    "lrn_size3": (_op("LRN", lrn, size=3), (r(2, 5, 3, 2),), *F32_ON_ORT),
    "lrn_size4_attrs": (_op("LRN", lrn, size=4, alpha=0.5, beta=0.6, bias=1.5), (r(2, 6, 2, 3),), *F32_ON_ORT),
    # Sum, Mean
    "sum_broadcast": (lambda *a: _weighted(_raw("Sum", lambda *v: sum(v), *a)), (r(2, 3), r(3), r(2, 1)), ALL, ()),
    "sum_single": (lambda a: _weighted(_raw("Sum", lambda v: v, a)), (r(2, 3),), ALL, ()),
    "mean_broadcast": (lambda *a: _weighted(_raw("Mean", lambda *v: sum(v) / len(v), *a)),
                       (r(2, 3), r(3), r(2, 1)), *F32_ON_ORT),
    # Flatten
    "flatten_default": (_op("Flatten", flatten), (r(2, 3, 4),), ALL, ()),
    "flatten_axis0": (_op("Flatten", flatten, axis=0), (r(2, 3, 4),), ALL, ()),
    "flatten_axis_negative": (_op("Flatten", flatten, axis=-1), (r(2, 3, 4),), ALL, ()),
    "flatten_axis_rank": (_op("Flatten", flatten, axis=3), (r(2, 3, 4),), ALL, ()),
    # Dropout in inference mode (training mode: test_dropout_training_* below)
    "dropout_no_training_input": (lambda a: _weighted(_raw("Dropout", lambda v, _: v, a, np.array(0.4))),
                                  (r(3, 4),), ALL, ()),
    "dropout_training_false": (lambda a: _weighted(_raw("Dropout", lambda v, *_: v, a, np.array(0.4),
                                                        np.array(False))), (r(3, 4),), ALL, ()),
    # global pools
    "global_average_pool_2d": (_op("GlobalAveragePool", global_average_pool), (r(2, 3, 4, 5),), *F32_ON_ORT),
    "global_average_pool_1d": (_op("GlobalAveragePool", global_average_pool), (r(2, 3, 5),), *F32_ON_ORT),
    "global_max_pool_2d": (_op("GlobalMaxPool", global_max_pool), (r(2, 3, 4, 5),), *F32_ON_ORT),
    "global_max_pool_3d": (_op("GlobalMaxPool", global_max_pool), (r(1, 2, 2, 3, 2),), *F32_ON_ORT),
    # LayerNormalization (float64: the float32 Mean/InvStdDev outputs are recomputed in float64)
    "layer_norm_last_axis_bias_all_outputs": (_op_n("LayerNormalization", layer_norm, 3, (0, 1, 2), epsilon=1e-3),
                                              (r(2, 3, 4), r(4), r(4)), ALL, ()),
    "layer_norm_axis1_no_bias": (_op_n("LayerNormalization", layer_norm, 1, (0,), axis=1), (r(2, 3, 4), r(3, 4)),
                                 ALL, ()),
    "layer_norm_axis_negative2_broadcast_scale": (_op_n("LayerNormalization", layer_norm, 1, (0,), axis=-2),
                                                  (r(2, 3, 4), r(4), r(1, 4)), ALL, ()),
    "layer_norm_axis0_stats_only": (_op_n("LayerNormalization", layer_norm, 3, (1, 2), axis=0), (r(2, 3), r(2, 3)),
                                    ALL, ()),
    # activations (Gelu: opset 20, float32 on ONNX Runtime, which has no float64 Erf)
    "gelu": (at_opset(20, _op("Gelu", gelu)), (r(3, 5) * 3,), ("reference", "tvm"), ("ort",)),
    "gelu_tanh": (at_opset(20, _op("Gelu", gelu, approximate="tanh")), (r(3, 5) * 3,), ("reference", "tvm"),
                  ("ort",)),
    "hard_sigmoid": (_op("HardSigmoid", hard_sigmoid, alpha=0.4, beta=0.45), (r(3, 4) * 2.25 + 0.0078125,), ALL, ()),
    "leaky_relu": (_op("LeakyRelu", leaky_relu, alpha=0.1), (r(3, 4) + 0.0078125,), ALL, ()),
    # TVM 0.27's ONNX frontend cannot convert float64 Elu and Selu (it mixes in a float32 constant)
    "elu": (_op("Elu", elu, alpha=0.7), (r(3, 4) + 0.0078125,), REF_ORT, ("tvm",)),
    "selu": (_op("Selu", selu), (r(3, 4) + 0.0078125,), REF_ORT, ("tvm",)),
    "selu_attrs": (_op("Selu", selu, alpha=1.2, gamma=0.8), (r(3, 4) + 0.0078125,), REF_ORT, ("tvm",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name: str) -> None:
    fn, args, backends64, backends32 = CASES[name]
    if backends64:
        check(fn, *args, backends=backends64)
    if backends32:
        check_f32(fn, *args, backends=backends32)


# ------------------------------------------- existing rules, in the forms real models use
def _take(axis: int) -> Callable[..., Any]:
    return lambda w, i: np.take(w, i, axis=axis)


NEG_IDS = np.array([[-1, 0], [2, -3]], np.int64)
EXISTING_CASES: dict[str, Case] = {
    "softmax_2d_last_axis": (_op("Softmax", lambda x, axis: _softmax(x, axis), axis=-1), (r(3, 5),), ALL, ()),
    "softmax_2d_axis1": (_op("Softmax", lambda x, axis: _softmax(x, axis), axis=1), (r(4, 3),), ALL, ()),
    "softmax_3d_axis1": (_op("Softmax", lambda x, axis: _softmax(x, axis), axis=1), (r(2, 3, 4),), ALL, ()),
    "log_softmax_2d_axis1": (_op("LogSoftmax", lambda x, axis: np.log(_softmax(x, axis)), axis=1), (r(2, 5),),
                             ALL, ()),
    "concat_nchw_channels": (_op("Concat", lambda *v, axis: np.concatenate(v, axis=axis), axis=1),
                             (r(2, 2, 3, 3), r(2, 3, 3, 3), r(2, 1, 3, 3)), ALL, ()),
    "concat_nchw_channels_repeated_input": (lambda a, b: _weighted(_raw("Concat", lambda *v: np.concatenate(v, 1),
                                                                        a, b, a, axis=1)),
                                            (r(1, 2, 2, 3), r(1, 1, 2, 3)), ALL, ()),
    "gather_2d_negative_indices_axis0": (lambda w: _weighted(_raw("Gather", _take(0), w, NEG_IDS, axis=0)),
                                         (r(3, 4),), ALL, ()),
    "gather_2d_negative_indices_axis_minus1": (lambda w: _weighted(_raw("Gather", _take(-1), w, NEG_IDS, axis=-1)),
                                               (r(2, 3, 3),), ALL, ()),
    "gather_scalar_index": (lambda w: _weighted(_raw("Gather", _take(1), w, np.array(-2), axis=1)), (r(2, 3),),
                            ALL, ()),
    # ResNet/Inception style 3x3 stride-1 average pools with symmetric pads (both divisor rules).
    "average_pool_pads_count_include_pad": (_raw_window("AveragePool", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                        count_include_pad=1), (r(1, 2, 4, 5),), ("reference",),
                                            ("reference", "ort")),
    "average_pool_pads_exclude_pad": (_raw_window("AveragePool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                                      (r(2, 2, 5, 4),), ("reference",), ("reference", "ort")),
    "average_pool_stride2_pads_count_include_pad": (_raw_window("AveragePool", kernel_shape=[3, 3], strides=[2, 2],
                                                                pads=[1, 1, 1, 1], count_include_pad=1),
                                                    (r(1, 3, 5, 6),), ("reference",), ("reference", "ort")),
}


@pytest.mark.parametrize("name", sorted(EXISTING_CASES))
def test_existing_rule_in_model_forms(name: str) -> None:
    fn, args, backends64, backends32 = EXISTING_CASES[name]
    if backends64:
        check(fn, *args, backends=backends64)
    if backends32:
        check_f32(fn, *args, backends=backends32)


def test_existing_rule_eager_references_match_onnx_reference() -> None:
    """The numpy side of the Softmax, Concat and Gather cases agrees with onnx.reference."""
    x = r(3, 2, 3)
    for axis in (-1, 1):
        np.testing.assert_allclose(_softmax(x, axis), onnx_run("Softmax", [x], {"axis": axis})[0], rtol=1e-12)
        np.testing.assert_allclose(np.log(_softmax(x, axis)), onnx_run("LogSoftmax", [x], {"axis": axis})[0],
                                   rtol=1e-12)
    for axis in (0, -1):
        np.testing.assert_array_equal(_take(axis)(x, NEG_IDS), onnx_run("Gather", [x, NEG_IDS], {"axis": axis})[0])
    parts = [r(2, 2, 3, 3), r(2, 1, 3, 3)]
    np.testing.assert_array_equal(np.concatenate(parts, 1), onnx_run("Concat", parts, {"axis": 1})[0])


# ------------------------------------------------------------- Dropout, training mode
def _dropout_step(ratio: float, backend: str, traced_flags: bool = False) -> Callable[..., Any]:
    """A step returning Dropout's output, its mask and the gradient of a weighted sum of the output."""
    def step(x: Any, *flags: Any) -> Any:
        rate, training = flags if traced_flags else (np.array(ratio), np.array(True))
        with gd.GradientTape() as tape:
            out, mask = _raw_n("Dropout", None, 2, x, rate, training, seed=3)
            loss = np.sum(_weighted(out))
        return out, mask, tape.gradient(loss, x)

    return gd.function(step, backend=backend)


def _upstream(shape: tuple[int, ...]) -> np.ndarray:
    """The gradient ``_weighted`` passes back."""
    return np.cos(np.arange(int(np.prod(shape))) * 0.7).reshape(shape)


# TVM 0.27 runs training Dropout as the identity: the tvm backend sends it to ONNX Runtime (tvm_fallback).
DROPOUT_BACKENDS = [*REF_ORT, "tvm"]


@pytest.mark.parametrize("backend", DROPOUT_BACKENDS)
def test_dropout_training_gradient_is_the_masked_scaled_upstream(backend: str) -> None:
    x, ratio = r(16, 12), 0.3
    out, mask, grad = _dropout_step(ratio, backend)(x)
    assert mask.dtype == np.bool_ and 0 < mask.mean() < 1  # 192 draws: some kept, some dropped
    # The mask is the one applied (ONNX Runtime scales by a float32 1 / (1 - ratio)).
    np.testing.assert_allclose(out, x * mask / (1 - ratio), rtol=1e-7)
    np.testing.assert_allclose(grad, _upstream(x.shape) * mask / (1 - ratio), rtol=1e-12)


@pytest.mark.parametrize("backend", REF_ORT)
def test_dropout_runtime_ratio_and_training_flag(backend: str) -> None:
    x = r(16, 12)
    step = _dropout_step(0.0, backend, traced_flags=True)
    out, mask, grad = step(x, np.array(0.25), np.array(True))
    assert 0 < mask.mean() < 1
    np.testing.assert_allclose(grad, _upstream(x.shape) * mask / 0.75, rtol=1e-12)
    out, mask, grad = step(x, np.array(0.25), np.array(False))  # inference mode: identity
    assert mask.all()
    np.testing.assert_array_equal(out, x)
    np.testing.assert_allclose(grad, _upstream(x.shape), rtol=1e-12)


def test_dropout_training_without_mask_output_raises() -> None:
    def fn(a: Any) -> Any:
        return np.sum(_raw("Dropout", None, a, np.array(0.5), np.array(True)))

    with pytest.raises(GraphError, match=r"Dropout .*training mode without its mask output.*second output"):
        gd.function(lambda x: gd.grad(fn)(x), backend="reference")(r(3, 4))


# ------------------------------------------------------------- GlobalMaxPool ties
@pytest.mark.parametrize("backend", ALL)
def test_global_max_pool_gives_ties_to_the_first_maximum(backend: str) -> None:
    """As the MaxPool rule: the first maximum in row-major order gets a window's gradient."""
    x = np.array([[[[1, 3], [3, 0]], [[2, 2], [2, 2]], [[-1, -4], [-3, -1]]]], F32)  # (1, 3, 2, 2)
    upstream = np.array([2.0, 3.0, 5.0], F32).reshape(1, 3, 1, 1)
    expected = np.zeros_like(x)
    expected[0, 0, 0, 1], expected[0, 1, 0, 0], expected[0, 2, 0, 0] = 2.0, 3.0, 5.0
    fn = lambda a: _raw("GlobalMaxPool", global_max_pool, a) * upstream  # noqa: E731
    got = gd.function(lambda a: gd.grad(fn)(a), backend=backend)(x)
    np.testing.assert_array_equal(got, expected)


# ------------------------------------------------------------------ Gelu (opset 20)
def _gelu_rule_gradient(x: np.ndarray, approximate: str, runtime: str) -> np.ndarray:
    """Gelu's gradient rule run directly (no tracing, no passes) on a graph lowered at opset 20."""
    graph = Graph("gelu_grad")
    value = graph.add_input("x", x.dtype, x.shape)
    attrs = {"approximate": approximate}
    opdef = get_opdef("Gelu")
    node = graph.add_node("Gelu", [value], attrs, output_types=opdef.infer(Node("Gelu", [value], attrs), None))
    b = GradBuilder(graph)
    (grad,) = opdef.gradient(b, node, [b.const(_upstream(x.shape), x.dtype)])
    graph.outputs = [grad]
    model = gd.ir.to_onnx(graph, opset=20)
    if runtime == "reference":
        return ReferenceEvaluator(model).run(None, {"x": x})[0]
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradient_rule_at_opset_20(approximate: str) -> None:
    """float64 on onnx.reference, float32 on ONNX Runtime (no float64 Erf there)."""
    x = r(3, 5) * 3
    expected = numeric_grad(lambda v: gelu(v, approximate) * _upstream(x.shape), [x], 0)
    np.testing.assert_allclose(_gelu_rule_gradient(x, approximate, "reference"), expected, rtol=1e-6, atol=1e-7)
    got = _gelu_rule_gradient(x.astype(F32), approximate, "ort")
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


# ------------------------------------------------------------------ coverage
def traced_cases() -> list[tuple[Callable[..., Any], tuple[np.ndarray, ...]]]:
    """Every finite-difference case of this module."""
    return [(fn, args) for fn, args, *_ in [*CASES.values(), *EXISTING_CASES.values()]]


def test_every_nn_op_has_a_rule_exercised_by_a_case() -> None:
    assert set(NN_OPS) == set(SINCE)
    seen: set[str] = set()
    for fn, args in traced_cases():
        argnums = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
        graph = gd.trace(lambda *a, fn=fn, argnums=argnums: gd.grad(fn, argnums=argnums)(*a), *args)
        seen.update(n.op_type for n in graph.nodes)
    for op_type in NN_OPS:
        assert get_opdef(op_type).gradient is not None, op_type
    assert not set(NN_OPS) - seen
