"""Gradient rules of the ops that have generic (ONNX schema) OpDefs (``graphdist.ir.gradients_ops``).

Each rule equals central finite differences of the op run by ``onnx.reference`` in float64
(the numbers come from ONNX's own implementation of the op, not from graphdist), on the
``reference`` and ``ort`` backends; in float32 on ONNX Runtime where its CPU provider has no
float64 kernel for the op. LSTM, GRU and RNN (whose rules differentiate an unrolled
re-computation) are checked in each direction, with and without biases, initial states and
peepholes. Resize is checked in each mode and coordinate transformation, as its
rule builds the interpolation weights itself (``align_corners`` at scales whose output length is
exact: with a fractional one, onnx.reference divides by the unrounded length and ONNX Runtime, as
the rule, by the output's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import graphdist as gd
import graphdist.passes.autodiff  # noqa: F401 - registers the rules
from graphdist.errors import GraphError
from tests.ir.test_nn_ops import REF_ORT, at_opset, onnx_run, r
from tests.trace.test_gradients import _raw, _weighted, check, check_f32

I64 = np.int64


def _node(op_type: str, constants: dict[int, np.ndarray | None], count: int, **attrs: Any) -> Callable[..., Any]:
    """``fn(*floats)``: ``op_type`` with the float arguments at the positions ``constants`` leaves free
    (traced, or run by ``onnx.reference`` eagerly), times a non-uniform upstream gradient.
    """
    def fn(*floats: Any) -> Any:
        free = iter(floats)
        inputs = [constants[i] if i in constants else next(free) for i in range(count)]
        return _weighted(_raw(op_type, lambda *v: onnx_run(op_type, list(v), attrs)[0], *inputs, **attrs))

    return fn


def _resize(scales: list[float] | None = None, sizes: list[int] | None = None, roi: list[float] | None = None,
            **attrs: Any) -> Callable[..., Any]:
    constants = {1: None if roi is None else np.array(roi, np.float64),
                 2: None if scales is None else np.array(scales, np.float32),
                 3: None if sizes is None else np.array(sizes, I64)}
    return _node("Resize", constants, 4, **attrs)



#: name -> (fn, float64 args, float64 backends, float32 backends)
Case = tuple[Callable[..., Any], tuple[np.ndarray, ...], tuple[str, ...], tuple[str, ...]]
ORT32 = (("reference",), ("ort",))

CASES: dict[str, Case] = {
    # Resize: nearest (each rounding), linear (each coordinate transformation), up and down, sizes, axes
    "resize_nearest_asymmetric_floor_x2": (_resize([1, 1, 2, 2], mode="nearest", nearest_mode="floor",
                                                   coordinate_transformation_mode="asymmetric"),
                                           (r(1, 2, 3, 4),), *ORT32),
    "resize_nearest_half_pixel_round_prefer_floor_x1_5": (_resize([1, 1, 1.5, 2.5], mode="nearest"),
                                                          (r(2, 1, 4, 3),), *ORT32),
    "resize_nearest_round_prefer_ceil_down": (_resize([1, 1, 0.6, 0.5], mode="nearest",
                                                      nearest_mode="round_prefer_ceil"), (r(1, 2, 5, 6),), *ORT32),
    "resize_nearest_ceil_align_corners_sizes": (_resize(sizes=[1, 1, 5, 7], mode="nearest", nearest_mode="ceil",
                                                        coordinate_transformation_mode="align_corners"),
                                                (r(1, 1, 3, 4),), *ORT32),
    "resize_linear_half_pixel_x2": (_resize([1, 1, 2, 2], mode="linear"), (r(1, 2, 3, 4),), *ORT32),
    "resize_linear_align_corners_x1_5": (_resize([1, 1, 1.5, 1.75], mode="linear",
                                                 coordinate_transformation_mode="align_corners"),
                                         (r(1, 1, 4, 4),), *ORT32),
    "resize_linear_pytorch_half_pixel_down": (_resize([1, 1, 0.5, 0.75], mode="linear",
                                                      coordinate_transformation_mode="pytorch_half_pixel"),
                                              (r(1, 2, 6, 4),), *ORT32),
    "resize_linear_asymmetric_sizes": (_resize(sizes=[2, 1, 7, 3], mode="linear",
                                               coordinate_transformation_mode="asymmetric"), (r(2, 1, 4, 5),), *ORT32),
    "resize_linear_tf_crop_and_resize": (_resize([1, 1, 1.5, 2], roi=[0, 0, 0.1, -0.2, 1, 1, 0.8, 1.3],
                                                 mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                                                 extrapolation_value=0.5), (r(1, 1, 4, 3),), *ORT32),
    "resize_linear_axes_attribute": (lambda x: _weighted(_raw(
        "Resize", lambda v, *_: onnx_run("Resize", [v, None, np.array([1, 1, 2], np.float32)], {"mode": "linear"})[0],
        x, None, np.array([2], np.float32), mode="linear", axes=[-1])), (r(2, 3, 4),), *ORT32),
    # Pad in the modes whose every output element is an input element
    "pad_edge": (_node("Pad", {1: np.array([0, 2, 1, 0, 1, 3], I64)}, 2, mode="edge"), (r(2, 3, 4),),
                 REF_ORT, ()),
    "pad_reflect": (_node("Pad", {1: np.array([0, 2, 1, 0, 1, 2], I64)}, 2, mode="reflect"),
                             (r(2, 4, 4),), REF_ORT, ()),
    "pad_wrap_axes": (_node("Pad", {1: np.array([3, 1], I64), 2: None, 3: np.array([1], I64)}, 4, mode="wrap"),
                      (r(2, 3, 2),), REF_ORT, ()),
    # activations
    "hard_swish": (_node("HardSwish", {}, 1), (r(3, 5) * 5 + 0.0078125,), ("reference",), ("ort",)),
    "prelu_channel_slope": (_node("PRelu", {}, 2), (r(2, 3, 4) + 0.0078125, r(3, 1)), REF_ORT, ()),
    "softsign": (_node("Softsign", {}, 1), (r(3, 4) * 3,), ("reference",), ("ort",)),
    "tan": (_node("Tan", {}, 1), (r(3, 4),), ("reference",), ("ort",)),
    "sinh_cosh": (lambda x: _node("Sinh", {}, 1)(x) + _node("Cosh", {}, 1)(x), (r(3, 4),), ("reference",), ("ort",)),
    "atan_asin_acos_asinh": (lambda x: sum(_node(op, {}, 1)(x * 0.9) for op in ("Atan", "Asin", "Acos", "Asinh")),
                             (r(3, 4),), ("reference",), ("ort",)),
    # InstanceNormalization
    "instance_norm_nchw": (_node("InstanceNormalization", {}, 3, epsilon=1e-3), (r(2, 3, 4, 5), r(3), r(3)),
                           REF_ORT, ()),
    "instance_norm_ncl": (_node("InstanceNormalization", {}, 3), (r(3, 2, 6), r(2), r(2)), REF_ORT, ()),
    # gathers and scatters (duplicate and negative indices)
    "gather_elements_axis1": (_node("GatherElements", {1: np.array([[0, 2, 2], [1, -1, 0]], I64)}, 2, axis=1),
                              (r(2, 3),), REF_ORT, ()),
    "gather_nd": (_node("GatherND", {1: np.array([[0, 1], [1, 2], [0, 1]], I64)}, 2), (r(2, 3, 4),),
                  REF_ORT, ()),
    "scatter_nd": (_node("ScatterND", {1: np.array([[1], [3]], I64)}, 3), (r(4, 3), r(2, 3)), REF_ORT, ()),
    "scatter_nd_add": (_node("ScatterND", {1: np.array([[1, 0], [1, 0], [2, 2]], I64)}, 3, reduction="add"),
                       (r(3, 4), r(3)), REF_ORT, ()),
    "scatter_elements": (_node("ScatterElements", {1: np.array([[2, 0], [1, 1]], I64)}, 3, axis=0),
                         (r(3, 2), r(2, 2)), REF_ORT, ()),
    # Tile, CumSum
    "tile": (_node("Tile", {1: np.array([2, 1, 3], I64)}, 2), (r(2, 3, 2),), REF_ORT, ()),
    "cumsum_exclusive": (_node("CumSum", {1: np.array(1, I64)}, 2, exclusive=1), (r(2, 4),), REF_ORT, ()),
    "cumsum_reverse": (_node("CumSum", {1: np.array(-1, I64)}, 2, reverse=1), (r(3, 4),), REF_ORT, ()),
    # reductions (axes as an input, keepdims both ways)
    "reduce_sum_square": (_node("ReduceSumSquare", {1: np.array([1], I64)}, 2), (r(2, 3, 4),), REF_ORT, ()),
    "reduce_l1_keepdims0": (_node("ReduceL1", {1: np.array([0, 2], I64)}, 2, keepdims=0), (r(2, 3, 4) + 0.0078125,),
                            REF_ORT, ()),
    "reduce_l2_all": (_node("ReduceL2", {}, 1), (r(3, 4),), REF_ORT, ()),
    "reduce_log_sum_exp": (_node("ReduceLogSumExp", {1: np.array([-1], I64)}, 2), (r(2, 5) * 3,), REF_ORT, ()),
    "reduce_log_sum": (_node("ReduceLogSum", {1: np.array([1], I64)}, 2, keepdims=0), (r(3, 4) + 2,), REF_ORT, ()),
    # more activations (kinks avoided: inputs off the thresholds)
    "celu_float32_only": (_node("Celu", {}, 1, alpha=0.7), (r(3, 4) * 2 + 0.0078125,), (), REF_ORT),
    "mish": (_node("Mish", {}, 1), (r(3, 4) * 3,), ("reference",), ("ort",)),
    "thresholded_relu": (_node("ThresholdedRelu", {}, 1, alpha=0.3), (r(3, 4) + 0.0078125,), ("reference",),
                         ("ort",)),
    "shrink": (_node("Shrink", {}, 1, lambd=0.4, bias=0.1), (r(3, 4) + 0.0078125,), ("reference",), ("ort",)),
    # rearrangements and selections
    "space_to_depth": (_node("SpaceToDepth", {}, 1, blocksize=2), (r(1, 2, 4, 6),), REF_ORT, ()),
    "depth_to_space_dcr": (_node("DepthToSpace", {}, 1, blocksize=2), (r(2, 8, 2, 3),), REF_ORT, ()),
    "depth_to_space_crd": (_node("DepthToSpace", {}, 1, blocksize=2, mode="CRD"), (r(2, 8, 2, 3),), REF_ORT, ()),
    "trilu_upper_k": (_node("Trilu", {1: np.array(1, I64)}, 2), (r(2, 4, 5),), REF_ORT, ()),
    "trilu_lower": (_node("Trilu", {}, 1, upper=0), (r(4, 4),), REF_ORT, ()),
    "top_k_values": (lambda x: _weighted(_raw("TopK", lambda v, k: onnx_run("TopK", [v, k], {"axis": 1}, 2)[0], x,
                                             np.array([2], I64), axis=1)), (r(3, 5),), ("reference",), ("ort",)),
    # Einsum (ONNX Runtime has no float64 Einsum)
    "einsum_matmul": (_node("Einsum", {}, 2, equation="ij,jk->ik"), (r(3, 4), r(4, 2)), ("reference",), ("ort",)),
    "einsum_batched_attention": (_node("Einsum", {}, 2, equation="bhqd,bhkd->bhqk"), (r(2, 2, 3, 4), r(2, 2, 5, 4)),
                                 ("reference",), ("ort",)),
    "einsum_outer_and_summed_letter": (_node("Einsum", {}, 3, equation="ia,j,k->ij"), (r(3, 2), r(4), r(2)),
                                       ("reference",), ("ort",)),
    "einsum_implicit_output": (_node("Einsum", {}, 2, equation="ij,jk"), (r(2, 3), r(3, 4)), ("reference",),
                               ("ort",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name: str) -> None:
    fn, args, backends64, backends32 = CASES[name]
    if backends64:
        check(fn, *args, backends=backends64)
    if backends32:
        check_f32(fn, *args, backends=backends32)


@pytest.mark.parametrize(("fn", "message"), [
    (_resize([1, 1, 2, 2], mode="cubic"), r"Resize \(.*\) in mode 'cubic': only 'nearest' and 'linear'"),
    (_resize([1, 1, 0.5, 0.5], mode="linear", antialias=1), "antialiased shrinking has no gradient rule"),
    (_node("Einsum", {}, 1, equation="...ij->...ji"), "Einsum .* with an ellipsis"),
    (_node("Einsum", {}, 1, equation="iijk->ijk"), "a repeated letter within one operand"),
    (_node("ScatterND", {1: np.array([[1]], I64), 2: np.ones((1, 4))}, 3, reduction="mul"),
     "ScatterND .* with reduction 'mul'"),
])
def test_forms_without_a_rule_raise_naming_the_form(fn: Callable[..., Any], message: str) -> None:
    step = gd.function(lambda x: gd.grad(fn)(x), backend="reference")
    with pytest.raises(GraphError, match=message):
        step(r(1, 1, 4, 4))


# ------------------------------------------------------------- LSTM, GRU, RNN
def _rnn(op_type: str, count: int, outputs: tuple[int, ...], constants: dict[int, np.ndarray | None] | None = None,
         **attrs: Any) -> Callable[..., Any]:
    """The weighted sum of the recurrent op's ``outputs`` (traced, or run by ``onnx.reference``)."""
    constants = constants or {}

    def fn(*floats: Any) -> Any:
        free = iter(floats)
        inputs = [constants[i] if i in constants else next(free) for i in range(count)]
        number = {"LSTM": 3, "GRU": 2, "RNN": 2}[op_type]

        def reference(*v: Any) -> list[np.ndarray]:
            return onnx_run(op_type, list(v), attrs, outputs=number)

        if any(isinstance(a, gd.Tensor) for a in inputs):
            from graphdist.trace.tracer import current_trace

            ctx = current_trace()
            values = [a.value if isinstance(a, gd.Tensor) else None if a is None else ctx.constant(a) for a in inputs]
            outs = ctx.emit(op_type, values, attrs, num_outputs=number)
        else:
            outs = reference(*inputs)
        return sum(_weighted(outs[i]).sum() for i in outputs)

    return fn


H, B_, I_, T = 3, 2, 4, 3  # hidden, batch, input, time
RNN_CASES: dict[str, Case] = {
    "lstm_forward_all_inputs": (_rnn("LSTM", 8, (0, 1, 2), {4: None}, hidden_size=H),
                                (r(T, B_, I_), r(1, 4 * H, I_), r(1, 4 * H, H), r(1, 8 * H), r(1, B_, H), r(1, B_, H),
                                 r(1, 3 * H)), ("reference",), ("ort",)),
    "lstm_bidirectional_no_bias": (_rnn("LSTM", 3, (0, 1), hidden_size=H, direction="bidirectional"),
                                   (r(T, B_, I_), r(2, 4 * H, I_), r(2, 4 * H, H)), ("reference",), ("ort",)),
    "gru_reverse_bias_initial": (_rnn("GRU", 6, (0, 1), {4: None}, hidden_size=H, direction="reverse"),
                                 (r(T, B_, I_), r(1, 3 * H, I_), r(1, 3 * H, H), r(1, 6 * H), r(1, B_, H)),
                                 ("reference",), ("ort",)),
    "gru_linear_before_reset_y_h_only": (_rnn("GRU", 4, (1,), hidden_size=H, linear_before_reset=1),
                                         (r(T, B_, I_), r(1, 3 * H, I_), r(1, 3 * H, H), r(1, 6 * H)),
                                         ("reference",), ("ort",)),
    "rnn_bidirectional_bias_initial": (_rnn("RNN", 6, (0, 1), {4: None}, hidden_size=H, direction="bidirectional"),
                                       (r(T, B_, I_), r(2, H, I_), r(2, H, H), r(2, 2 * H), r(2, B_, H)),
                                       ("reference",), ("ort",)),
}


@pytest.mark.parametrize("name", sorted(RNN_CASES))
def test_recurrent_gradient_matches_finite_differences(name: str) -> None:
    fn, args, backends64, backends32 = RNN_CASES[name]
    check(fn, *args, backends=backends64)
    check_f32(fn, *args, backends=backends32)


@pytest.mark.parametrize(("attrs", "message"), [
    ({"clip": 1.0}, r"LSTM \(.*\) with clip=1.0: no gradient rule"),
    ({"layout": 1}, "with layout=1"),
    ({"activations": ["Relu", "Tanh", "Tanh"]}, r"activations \['Relu', 'Tanh', 'Tanh'\]: only the defaults"),
])
def test_recurrent_forms_without_a_rule_raise(attrs: dict[str, Any], message: str) -> None:
    fn = _rnn("LSTM", 3, (0,), hidden_size=H, **attrs)
    step = gd.function(lambda *a: gd.grad(fn, argnums=(1,))(*a), backend="reference")
    with pytest.raises(GraphError, match=message):
        step(r(T, B_, I_), r(1, 4 * H, I_), r(1, 4 * H, H))


def _mvn(axes: list[int]) -> Callable[..., Any]:
    def numpy_mvn(x: np.ndarray) -> np.ndarray:
        centered = x - x.mean(axis=tuple(axes), keepdims=True)
        return centered / np.sqrt((centered ** 2).mean(axis=tuple(axes), keepdims=True) + 1e-9)

    return lambda x: _weighted(_raw("MeanVarianceNormalization", numpy_mvn, x, axes=axes))


NORM_CASES: dict[str, Case] = {
    # opset 21 (ONNX deprecates the opset-18 form); statistics in float64 (stash_type) to compare in float64
    "group_norm_opset21_per_channel": (at_opset(21, lambda *a: _weighted(_raw(
        "GroupNormalization", lambda *v: onnx_run("GroupNormalization", list(v), {"num_groups": 2, "stash_type": 11},
                                                  opset=21)[0],
        *a, num_groups=2, stash_type=11))), (r(2, 4, 5), r(4), r(4)), ("reference",), ()),
    # float32 only (ONNX's function body of MeanVarianceNormalization is float32): against numpy's formula
    "mean_variance_normalization": (_mvn(axes=[0, 2, 3]), (r(2, 3, 4, 2),), (), REF_ORT),
    "mean_variance_normalization_axes": (_mvn(axes=[1]), (r(2, 5, 3),), (), REF_ORT),
}


@pytest.mark.parametrize("name", sorted(NORM_CASES))
def test_decomposed_normalization_gradient_matches_finite_differences(name: str) -> None:
    fn, args, backends64, backends32 = NORM_CASES[name]
    if backends64:
        check(fn, *args, backends=backends64)
    if backends32:
        check_f32(fn, *args, backends=backends32)
