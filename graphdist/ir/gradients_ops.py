"""Reverse-mode gradient rules of ONNX ops that have no hand-written OpDef (their OpDef is made from
ONNX's schema, :mod:`graphdist.ir.onnx_schema_ops`): the ops real exported models train through.

Same contract as :mod:`graphdist.ir.gradients`: ``rule(b, node, grads)`` returns one gradient per
input (``None`` where none flows). Rules emit ops of the trace's opset (18 or newer) only.

Resize and the non-constant modes of Pad are linear maps that act on each axis separately: the
rule builds each axis's (output length x input length) matrix from the op's definition (coordinate
transformation, nearest rounding, linear weights, edge/reflect/wrap index) and multiplies the
gradient by its transpose along that axis. Their sizes must be static.

Conventions where the derivative is not unique: HardSwish and PRelu take the ``x <= 0`` side at
the kinks' left ends as the existing activations do (HardSwish's slope is ``(2x + 3) / 6`` inside
``(-3, 3)`` and 0 or 1 outside); ScatterND / ScatterElements without reduction give the replaced
data elements no gradient, and with duplicate indices (which ONNX leaves undefined) every duplicate
update gets the gradient of the element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from graphdist.errors import GraphError
from graphdist.ir import nn_ops  # noqa: F401 - hand-written OpDefs first: a rule goes on the OpDef when there is one
from graphdist.ir.gradients import GradBuilder, GradRule, _grad_to_input_shape, _ints, _pad_full, register_gradient
from graphdist.ir.graph import Node, Value

__all__: list[str] = []

Grads = list[Value | None]


# ----------------------------------------------------------------- helpers
def _input(node: Node, index: int) -> Value | None:
    value = node.inputs[index] if index < len(node.inputs) else None
    return None if value is None or value.name == "" else value


def _const(node: Node, index: int, what: str) -> np.ndarray | None:
    """The constant value of input ``index`` (``None`` when absent or empty-named)."""
    value = _input(node, index)
    if value is None:
        return None
    if value.const_value is None:
        raise GraphError(f"cannot differentiate through {node.op_type} ({node.name}): its {what} must be a "
                         "constant when tracing (it is computed at run time)")
    return np.asarray(value.const_value)


def _static(node: Node, value: Value) -> list[int]:
    if not all(isinstance(d, int) for d in value.shape):
        raise GraphError(f"cannot differentiate through {node.op_type} ({node.name}): the shape of "
                         f"{value.type_str()} must be static; give the graph inputs static shapes")
    return [int(d) for d in value.shape]


def _str(node: Node, name: str, default: str) -> str:
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def _scalar(b: GradBuilder, value: float, like: Value) -> Value:
    return b.const(value, like.dtype)


def _along_axis(b: GradBuilder, grad: Value, axis: int, matrix: np.ndarray) -> Value:
    """``out[..., j, ...] = sum_i grad[..., i, ...] * matrix[i, j]`` along ``axis``."""
    last = grad.rank - 1
    weights = b.const(matrix.astype(grad.dtype), grad.dtype)
    if axis == last:
        return b.op1("MatMul", [grad, weights])
    perm = list(range(grad.rank))
    perm[axis], perm[last] = last, axis
    moved = b.op1("Transpose", [grad], {"perm": perm})
    return b.op1("Transpose", [b.op1("MatMul", [moved, weights])], {"perm": perm})


def _selection(sources: np.ndarray, length: int) -> np.ndarray:
    """(len(sources), length) 0/1 matrix: row ``i`` picks input element ``sources[i]``."""
    matrix = np.zeros((len(sources), length))
    matrix[np.arange(len(sources)), sources] = 1.0
    return matrix


# ------------------------------------------------------------------ Resize
_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                     "tf_crop_and_resize")


def _original_coordinates(mode: str, size: int, out: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """Where each output position of one axis reads the input (ONNX Resize's coordinate transformation)."""
    x = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out / (scale * size)
        center = size / 2
        return center * (1 - adjustment) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":
        return x * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return x / scale
    start, end = roi  # tf_crop_and_resize
    if out > 1:
        return start * (size - 1) + x * (end - start) * (size - 1) / (out - 1)
    return np.full(out, 0.5 * (start + end) * (size - 1))


def _nearest(coordinates: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "floor":
        return np.floor(coordinates)
    if rounding == "ceil":
        return np.ceil(coordinates)
    if rounding == "round_prefer_ceil":
        return np.floor(coordinates + 0.5)
    return np.ceil(coordinates - 0.5)  # round_prefer_floor


def _resize_matrix(node: Node, size: int, out: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """(out, size): the linear map Resize applies along one axis (rows outside a crop are zero)."""
    mode = _str(node, "mode", "nearest")
    coordinate_mode = _str(node, "coordinate_transformation_mode", "half_pixel")
    if coordinate_mode not in _COORDINATE_MODES:
        raise GraphError(f"cannot differentiate through Resize ({node.name}): unknown coordinate_transformation_mode "
                         f"{coordinate_mode!r}")
    coordinates = _original_coordinates(coordinate_mode, size, out, scale, roi)
    matrix = np.zeros((out, size))
    rows = np.arange(out)
    if mode == "nearest":
        index = np.clip(_nearest(coordinates, _str(node, "nearest_mode", "round_prefer_floor")), 0, size - 1)
        matrix[rows, index.astype(np.int64)] = 1.0
    else:  # linear: the two neighbours, clamped to the edge as ONNX pads the input
        low = np.floor(coordinates)
        ratio = coordinates - low
        for offset, weight in ((0, 1.0 - ratio), (1, ratio)):
            np.add.at(matrix, (rows, np.clip(low + offset, 0, size - 1).astype(np.int64)), weight)
    if coordinate_mode == "tf_crop_and_resize":  # outside the input: the extrapolation value, a constant
        matrix[(coordinates < 0) | (coordinates > size - 1)] = 0.0
    return matrix


def _resize_scales(node: Node, shape: Sequence[int], out_shape: Sequence[int]) -> list[float]:
    rank = len(shape)
    axes = [int(a) % rank for a in node.attrs.get("axes", range(rank))]
    scales = _const(node, 2, "scales")
    full = [1.0] * rank
    if scales is not None and scales.size:
        for axis, scale in zip(axes, scales.reshape(-1)):
            full[axis] = float(scale)
        return full
    policy = _str(node, "keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        raise GraphError(f"cannot differentiate through Resize ({node.name}) with sizes and "
                         f"keep_aspect_ratio_policy={policy!r}: only 'stretch' (or scales) has a gradient rule")
    return [o / s for o, s in zip(out_shape, shape)]


def _resize_roi(node: Node, rank: int) -> list[tuple[float, float]]:
    roi = _const(node, 1, "roi") if _str(node, "coordinate_transformation_mode", "") == "tf_crop_and_resize" else None
    if roi is None or not roi.size:
        return [(0.0, 1.0)] * rank
    axes = [int(a) % rank for a in node.attrs.get("axes", range(rank))]
    flat = [float(v) for v in roi.reshape(-1)]
    full = [(0.0, 1.0)] * rank
    for i, axis in enumerate(axes):
        full[axis] = (flat[i], flat[len(axes) + i])
    return full


@register_gradient("Resize", since=11)
def _resize(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Modes ``nearest`` and ``linear`` (no ``antialias`` when shrinking); every coordinate transformation."""
    x = node.inputs[0]
    mode = _str(node, "mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise GraphError(f"cannot differentiate through Resize ({node.name}) in mode {mode!r}: only 'nearest' and "
                         "'linear' have a gradient rule")
    shape, out_shape = _static(node, x), _static(node, node.outputs[0])
    scales = _resize_scales(node, shape, out_shape)
    if mode == "linear" and int(node.attrs.get("antialias", 0)) and any(s < 1 for s in scales):
        raise GraphError(f"cannot differentiate through Resize ({node.name}): antialiased shrinking has no gradient "
                         "rule")
    roi = _resize_roi(node, x.rank)
    grad = g[0]
    for axis, (size, out) in enumerate(zip(shape, out_shape)):
        matrix = _resize_matrix(node, size, out, scales[axis], roi[axis])
        if matrix.shape != (size, size) or not np.array_equal(matrix, np.eye(size)):
            grad = _along_axis(b, grad, axis, matrix)
    return [grad] + [None] * (len(node.inputs) - 1)


# --------------------------------------------------------------------- Pad
def pad_gradient(b: GradBuilder, node: Node, grad: Value, mode: str, pads: Sequence[int],
                 axes: Sequence[int]) -> Value:
    """The gradient of Pad in mode ``edge``, ``reflect`` or ``wrap``: each output element came from one input
    element (``numpy.pad``'s modes of the same names), so it goes back there; negative pads crop.
    """
    x = node.inputs[0]
    shape = _static(node, x)
    numpy_mode = {"edge": "edge", "reflect": "reflect", "wrap": "wrap"}[mode]
    for i, axis in enumerate(axes):
        begin, end = int(pads[i]), int(pads[len(axes) + i])
        if begin == 0 and end == 0:
            continue
        size = shape[axis]
        sources = np.pad(np.arange(size), (max(begin, 0), max(end, 0)), mode=numpy_mode)
        sources = sources[max(-begin, 0): len(sources) - max(-end, 0)]
        grad = _along_axis(b, grad, axis, _selection(sources, size))
    return grad


@register_gradient("Pad")
def _pad(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # Constant mode: the gradient of the kept region, cropped back (or zero-filled where Pad cropped).
    x = node.inputs[0]
    mode = node.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise GraphError(f"cannot differentiate through Pad ({node.name}) in mode {mode!r}: only modes "
                         "'constant', 'edge', 'reflect' and 'wrap' have a gradient rule")
    pads = _ints(node.inputs[1])
    axes = _ints(node.inputs[3]) if len(node.inputs) > 3 else None
    axes = [a % x.rank for a in axes] if axes else list(range(x.rank))
    grad = g[0]
    if mode != "constant":
        return [pad_gradient(b, node, grad, mode, pads, axes)] + [None] * (len(node.inputs) - 1)
    # Drop what Pad added (positive pads), then zero-fill what it cropped (negative pads).
    begins, ends = pads[: len(axes)], pads[len(axes):]
    if any(p > 0 for p in pads):
        starts = [max(begin, 0) for begin in begins]
        stops = [int(grad.shape[axis]) - max(end, 0) for end, axis in zip(ends, axes)]
        grad = b.op1("Slice", [grad, b.int64s(starts), b.int64s(stops), b.int64s(axes)])
    if any(p < 0 for p in pads):
        refill_begins, refill_ends = [0] * x.rank, [0] * x.rank
        for begin, end, axis in zip(begins, ends, axes):
            refill_begins[axis], refill_ends[axis] = max(-begin, 0), max(-end, 0)
        grad = _pad_full(b, grad, refill_begins, refill_ends)
    return [grad] + [None] * (len(node.inputs) - 1)


# ------------------------------------------------------------- activations
@register_gradient("HardSwish", since=14)
def _hard_swish(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """``y = x * hs(x)``, ``hs = clip(x / 6 + 1/2, 0, 1)``: ``dy/dx = hs + x / 6`` inside ``(-3, 3)``."""
    x = node.inputs[0]
    gate = b.op1("HardSigmoid", [x], {"alpha": 1.0 / 6.0, "beta": 0.5})
    inside = b.op1("And", [b.op1("Greater", [x, _scalar(b, -3.0, x)]), b.op1("Less", [x, _scalar(b, 3.0, x)])])
    slope = b.op1("Where", [inside, b.mul(x, _scalar(b, 1.0 / 6.0, x)), _scalar(b, 0.0, x)])
    return [b.mul(g[0], b.add(gate, slope))]


@register_gradient("PRelu", since=9)
def _prelu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    x, slope = node.inputs
    positive = b.op1("Greater", [x, _scalar(b, 0.0, x)])
    zero = _scalar(b, 0.0, x)
    gx = b.op1("Where", [positive, g[0], b.mul(g[0], slope)])
    gslope = b.op1("Where", [positive, zero, b.mul(g[0], x)])
    return [b.unbroadcast(gx, x.shape), b.unbroadcast(gslope, slope.shape)]


@register_gradient("Softsign", since=1)
def _softsign(b: GradBuilder, node: Node, g: Grads) -> Grads:
    x = node.inputs[0]
    denominator = b.add(_scalar(b, 1.0, x), b.op1("Abs", [x]))
    return [b.op1("Div", [g[0], b.mul(denominator, denominator)])]


def _register_unary(op_type: str, since: int, derivative: Callable[[GradBuilder, Value], Value]) -> None:
    """Registers ``g * derivative(x)`` for the one-input elementwise op ``op_type``."""

    def rule(b: GradBuilder, node: Node, g: Grads) -> Grads:
        return [b.mul(g[0], derivative(b, node.inputs[0]))]

    register_gradient(op_type, since=since)(rule)


def _one(b: GradBuilder, x: Value) -> Value:
    return _scalar(b, 1.0, x)


_register_unary("Tan", 7, lambda b, x: b.add(_one(b, x), b.mul(b.op1("Tan", [x]), b.op1("Tan", [x]))))
_register_unary("Sinh", 9, lambda b, x: b.op1("Cosh", [x]))
_register_unary("Cosh", 9, lambda b, x: b.op1("Sinh", [x]))
_register_unary("Atan", 7, lambda b, x: b.op1("Reciprocal", [b.add(_one(b, x), b.mul(x, x))]))
_register_unary("Asin", 7, lambda b, x: b.op1("Reciprocal", [b.op1("Sqrt", [b.op1("Sub", [_one(b, x),
                                                                                         b.mul(x, x)])])]))
_register_unary("Acos", 7, lambda b, x: b.neg(b.op1("Reciprocal", [b.op1("Sqrt", [b.op1("Sub", [_one(b, x),
                                                                                                b.mul(x, x)])])])))
_register_unary("Asinh", 9, lambda b, x: b.op1("Reciprocal", [b.op1("Sqrt", [b.add(b.mul(x, x), _one(b, x))])]))


# ----------------------------------------------------- InstanceNormalization
@register_gradient("InstanceNormalization", since=6)
def _instance_norm(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """``y = scale * (x - mu) * inv + bias`` per (n, c) over the spatial axes:
    ``dx = inv * (Gn - mean(Gn) - Xn * mean(Gn * Xn))`` with ``Gn = G * scale``.
    """
    x, scale, bias = node.inputs
    axes = list(range(2, x.rank))
    channels = _static(node, scale)[0]
    channel = [1, channels] + [1] * (x.rank - 2)

    def mean(value: Value) -> Value:
        return b.op1("ReduceMean", [value, b.int64s(axes)], {"keepdims": 1})

    centered = b.op1("Sub", [x, mean(x)])
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    inv = b.op1("Reciprocal", [b.op1("Sqrt", [b.add(mean(b.mul(centered, centered)), _scalar(b, epsilon, x))])])
    normalized = b.mul(centered, inv)
    g_norm = b.mul(g[0], b.reshape(scale, channel))
    inner = b.op1("Sub", [b.op1("Sub", [g_norm, mean(g_norm)]), b.mul(normalized, mean(b.mul(g_norm, normalized)))])
    per_channel = [0, *axes]
    gscale = b.reshape(b.reduce_sum(b.mul(g[0], normalized), per_channel, keepdims=False), [channels])
    gbias = b.reshape(b.reduce_sum(g[0], per_channel, keepdims=False), [channels])
    return [b.mul(inv, inner), gscale, gbias]


# --------------------------------------------------------- gathers, scatters
@register_gradient("GatherElements", since=11)
def _gather_elements(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Scatter-add of the gradient back to the positions read (duplicates add up)."""
    x, indices = node.inputs
    axis = int(node.attrs.get("axis", 0))
    zeros = b.op1("ConstantOfShape", [b.op1("Shape", [x])], {"value": _zero_tensor(x)})
    return [b.op1("ScatterElements", [zeros, indices, g[0]], {"axis": axis, "reduction": "add"}), None]


def _zero_tensor(like: Value) -> onnx.TensorProto:
    """ConstantOfShape's ``value``: a one-element zero of ``like``'s dtype."""
    return numpy_helper.from_array(np.zeros(1, like.dtype))


def _scatter(b: GradBuilder, node: Node, g: Grads, gather: str, attrs: dict) -> Grads:
    data, indices, updates = node.inputs
    reduction = _str(node, "reduction", "none")
    if reduction not in ("none", "add"):
        raise GraphError(f"cannot differentiate through {node.op_type} ({node.name}) with reduction {reduction!r}: "
                         "only 'none' and 'add' have a gradient rule")
    gdata = g[0]
    if reduction == "none":  # replaced elements do not reach the output
        zeros = b.op1("ConstantOfShape", [b.op1("Shape", [updates])], {"value": _zero_tensor(updates)})
        gdata = b.op1(node.op_type, [g[0], indices, zeros], attrs)
    return [gdata, None, b.op1(gather, [g[0], indices], attrs)]


@register_gradient("ScatterND", since=11)
def _scatter_nd(b: GradBuilder, node: Node, g: Grads) -> Grads:
    return _scatter(b, node, g, "GatherND", {})


@register_gradient("ScatterElements", since=11)
def _scatter_elements(b: GradBuilder, node: Node, g: Grads) -> Grads:
    return _scatter(b, node, g, "GatherElements", {"axis": int(node.attrs.get("axis", 0))})


@register_gradient("GatherND", since=12)
def _gather_nd(b: GradBuilder, node: Node, g: Grads) -> Grads:
    x, indices = node.inputs
    if int(node.attrs.get("batch_dims", 0)):
        raise GraphError(f"cannot differentiate through GatherND ({node.name}) with batch_dims: no gradient rule")
    zeros = b.op1("ConstantOfShape", [b.op1("Shape", [x])], {"value": _zero_tensor(x)})
    return [b.op1("ScatterND", [zeros, indices, g[0]], {"reduction": "add"}), None]


# ------------------------------------------------------------ Tile, CumSum
@register_gradient("Tile", since=6)
def _tile(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Sums the copies: the gradient as (r0, d0, r1, d1, ...) reduced over the repeat axes."""
    x = node.inputs[0]
    shape = _static(node, x)
    repeats = [int(r) for r in _const(node, 1, "repeats").reshape(-1)]
    split = [n for pair in zip(repeats, shape) for n in pair]
    summed = b.reduce_sum(b.reshape(g[0], split), [2 * i for i in range(len(shape))], keepdims=False)
    return [b.reshape(summed, shape), None]


@register_gradient("CumSum", since=11)
def _cumsum(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Each input element reaches every later output (earlier with ``reverse``): the opposite running sum."""
    attrs = {"exclusive": int(node.attrs.get("exclusive", 0)), "reverse": 1 - int(node.attrs.get("reverse", 0))}
    return [b.op1("CumSum", [g[0], node.inputs[1]], attrs), None]


# ------------------------------------------------------------------ Einsum
def _einsum_terms(node: Node) -> tuple[list[str], str]:
    equation = _str(node, "equation", "").replace(" ", "")
    if "." in equation:
        raise GraphError(f"cannot differentiate through Einsum ({node.name}) with an ellipsis ({equation!r}): "
                         "write the axes out")
    inputs, _, output = equation.partition("->")
    terms = inputs.split(",")
    if "->" not in equation:  # implicit output: the letters used once, in alphabetical order
        letters = "".join(terms)
        output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if any(len(set(t)) != len(t) for t in terms):
        raise GraphError(f"cannot differentiate through Einsum ({node.name}): a repeated letter within one operand "
                         f"({equation!r}, a diagonal) has no gradient rule")
    return terms, output


@register_gradient("Einsum", since=12)
def _einsum(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """The gradient of operand ``i`` is the Einsum of the output gradient with the other operands; a letter
    only operand ``i`` has (summed away) is broadcast back.
    """
    terms, output = _einsum_terms(node)
    grads: Grads = []
    for i, (operand, term) in enumerate(zip(node.inputs, terms)):
        if operand.dtype.kind != "f":
            grads.append(None)
            continue
        others = [(v, t) for j, (v, t) in enumerate(zip(node.inputs, terms)) if j != i]
        present = set(output).union(*[set(t) for _, t in others])
        kept = "".join(c for c in term if c in present)
        equation = ",".join([output, *[t for _, t in others]]) + "->" + kept
        grad = b.op1("Einsum", [g[0], *[v for v, _ in others]], {"equation": equation})
        if kept != term:
            shape = _static(node, operand)
            grad = b.reshape(grad, [d if c in present else 1 for c, d in zip(term, shape)])
            grad = b.expand_to(grad, shape)
        grads.append(grad)
    return grads


# --------------------------------------------------------------- reductions
def _reduction(derivative: Callable[[GradBuilder, Value, Value], Value]) -> GradRule:
    """``g * derivative(x, y)`` with the reduction's output ``y`` and ``g`` broadcast back to ``x``'s shape."""
    def rule(b: GradBuilder, node: Node, g: Grads) -> Grads:
        y = _grad_to_input_shape(b, node, node.outputs[0])
        grad = _grad_to_input_shape(b, node, g[0])
        return [b.mul(grad, derivative(b, node.inputs[0], y))] + [None] * (len(node.inputs) - 1)

    return rule


def _safe_ratio(b: GradBuilder, x: Value, y: Value) -> Value:
    """``x / y``, 0 where ``y`` is 0 (the subgradient of a norm at 0)."""
    zero = _scalar(b, 0.0, y)
    is_zero = b.op1("Equal", [y, zero])
    return b.op1("Where", [is_zero, zero, b.op1("Div", [x, b.op1("Where", [is_zero, _scalar(b, 1.0, y), y])])])


register_gradient("ReduceSumSquare", since=18)(_reduction(lambda b, x, y: b.mul(x, _scalar(b, 2.0, x))))
register_gradient("ReduceL1", since=18)(_reduction(lambda b, x, y: b.op1("Sign", [x])))
register_gradient("ReduceL2", since=18)(_reduction(_safe_ratio))
register_gradient("ReduceLogSumExp", since=18)(_reduction(lambda b, x, y: b.op1("Exp", [b.op1("Sub", [x, y])])))
register_gradient("ReduceLogSum", since=18)(_reduction(lambda b, x, y: b.op1("Exp", [b.neg(y)])))


# ------------------------------------------------------- more activations
def _positive(b: GradBuilder, x: Value, threshold: float = 0.0) -> Value:
    return b.op1("Greater", [x, _scalar(b, threshold, x)])


@register_gradient("Celu", since=12)
def _celu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    x = node.inputs[0]
    alpha = float(node.attrs.get("alpha", 1.0))
    negative = b.op1("Exp", [b.mul(x, _scalar(b, 1.0 / alpha, x))])
    return [b.mul(g[0], b.op1("Where", [_positive(b, x), _scalar(b, 1.0, x), negative]))]


@register_gradient("Mish", since=18)
def _mish(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """``y = x tanh(softplus(x))``: ``tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2)``."""
    x = node.inputs[0]
    t = b.op1("Tanh", [b.op1("Softplus", [x])])
    tail = b.mul(b.mul(x, b.op1("Sigmoid", [x])), b.op1("Sub", [_scalar(b, 1.0, x), b.mul(t, t)]))
    return [b.mul(g[0], b.add(t, tail))]


@register_gradient("ThresholdedRelu", since=10)
def _thresholded_relu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    x = node.inputs[0]
    above = _positive(b, x, float(node.attrs.get("alpha", 1.0)))
    return [b.op1("Where", [above, g[0], _scalar(b, 0.0, x)])]


@register_gradient("Shrink", since=9)
def _shrink(b: GradBuilder, node: Node, g: Grads) -> Grads:
    x = node.inputs[0]
    lambd = float(node.attrs.get("lambd", 0.5))
    outside = b.op1("Or", [_positive(b, x, lambd), b.op1("Less", [x, _scalar(b, -lambd, x)])])
    return [b.op1("Where", [outside, g[0], _scalar(b, 0.0, x)])]


# ------------------------------------------------- rearrangements, selections
@register_gradient("SpaceToDepth", since=13)
def _space_to_depth(b: GradBuilder, node: Node, g: Grads) -> Grads:
    return [b.op1("DepthToSpace", [g[0]], {"blocksize": int(node.attrs["blocksize"]), "mode": "DCR"})]


@register_gradient("DepthToSpace", since=13)
def _depth_to_space(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """DCR: SpaceToDepth, its inverse. CRD: the inverse reshape and transpose."""
    block = int(node.attrs["blocksize"])
    if _str(node, "mode", "DCR") == "DCR":
        return [b.op1("SpaceToDepth", [g[0]], {"blocksize": block})]
    n, c, h, w = _static(node, node.inputs[0])
    split = b.reshape(g[0], [n, c // (block * block), h, block, w, block])
    moved = b.op1("Transpose", [split], {"perm": [0, 1, 3, 5, 2, 4]})
    return [b.reshape(moved, [n, c, h, w])]


@register_gradient("Trilu", since=14)
def _trilu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Trilu keeps a triangle and zeroes the rest: its gradient is the same Trilu of the gradient."""
    return [b.op1("Trilu", [g[0], *node.inputs[1:]], dict(node.attrs))] + [None] * (len(node.inputs) - 1)


@register_gradient("TopK", since=11)
def _top_k(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """The values' gradient goes back to the positions they were taken from."""
    x = node.inputs[0]
    if g[0] is None:
        return [None, None]
    zeros = b.op1("ConstantOfShape", [b.op1("Shape", [x])], {"value": _zero_tensor(x)})
    axis = int(node.attrs.get("axis", -1))
    return [b.op1("ScatterElements", [zeros, node.outputs[1], g[0]], {"axis": axis, "reduction": "add"}), None]
