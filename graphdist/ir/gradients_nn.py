"""Reverse-mode gradient rules of the neural-network ops in :mod:`graphdist.ir.nn_ops`.

Same contract as :mod:`graphdist.ir.gradients`: ``rule(b, node, grads)``
returns one gradient per input of ``node`` (``None`` where none flows), built
with the :class:`~graphdist.ir.gradients.GradBuilder`. Every rule here emits
ops of opset 18 only (no op of this module's own set), so the backward graph
runs wherever the forward graph does. Rules that reshape need static shapes,
as everywhere in autodiff (the seed gradient is a constant of the target's
shape); a symbolic dimension raises :class:`~graphdist.errors.GraphError`.

Conventions where the derivative is not unique: the max of GlobalMaxPool
routes the gradient to the first maximum in row-major order (as the MaxPool
rule does); LeakyRelu, Elu and Selu take the ``x <= 0`` branch at ``x == 0``;
HardSigmoid passes no gradient where it clips (``y`` is 0 or 1). Dropout in
training mode multiplies by the node's own ``mask`` output and ``1 / (1 -
ratio)``; the mask output must exist (the rule cannot draw the same random
numbers again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir import nn_ops  # noqa: F401 - the OpDefs must be registered before their rules
from graphdist.ir.gradients import GradBuilder, register_gradient
from graphdist.ir.graph import Node, Value
from graphdist.ir.ops import numpy_dtype

__all__: list[str] = []

Grads = list[Value | None]


# ----------------------------------------------------------------- helpers
def _float(value: Value | None) -> bool:
    return value is not None and value.dtype.kind == "f"


def _input(node: Node, index: int) -> Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _static(node: Node, value: Value) -> list[int]:
    """``value``'s shape, which must be static."""
    if not all(isinstance(d, int) for d in value.shape):
        raise GraphError(f"cannot differentiate through {node.op_type} ({node.name}): the shape of "
                         f"{value.type_str()} must be static; give the graph inputs static shapes")
    return [int(d) for d in value.shape]


def _scalar(b: GradBuilder, value: float, like: Value) -> Value:
    return b.const(value, like.dtype)


def _scale(b: GradBuilder, value: Value, factor: float) -> Value:
    """``value * factor`` (no node when ``factor`` is 1)."""
    return value if factor == 1.0 else b.mul(value, _scalar(b, factor, value))


def _sub(b: GradBuilder, x: Value, y: Value) -> Value:
    return b.op1("Sub", [x, y])


def _div(b: GradBuilder, x: Value, y: Value) -> Value:
    return b.op1("Div", [x, y])


def _mean(b: GradBuilder, value: Value, axes: Sequence[int]) -> Value:
    """``ReduceMean`` over ``axes``, keeping them."""
    return b.op1("ReduceMean", [value, b.int64s(axes)], {"keepdims": 1})


def _inv_std(b: GradBuilder, var: Value, epsilon: float) -> Value:
    """``1 / sqrt(var + epsilon)``."""
    return b.op1("Reciprocal", [b.op1("Sqrt", [b.add(var, _scalar(b, epsilon, var))])])


def _add_opt(b: GradBuilder, total: Value | None, term: Value) -> Value:
    return term if total is None else b.add(total, term)


# -------------------------------------------------------------------- Gemm
def _gemm(b: GradBuilder, x: Value, y: Value, trans_x: int, trans_y: int, alpha: float) -> Value:
    attrs: dict[str, Any] = {"transA": trans_x, "transB": trans_y}
    if alpha != 1.0:
        attrs["alpha"] = alpha
    return b.op1("Gemm", [x, y], attrs)


@register_gradient("Gemm")
def _gemm_rule(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """``Y = alpha * A' @ B' + beta * C`` with ``A' = A.T if transA``, ``B' = B.T if transB``.

    ``dA' = alpha * G @ B'.T`` and ``dB' = alpha * A'.T @ G``, each one Gemm with the
    transposes folded into its attributes; ``dC = beta * G`` summed to C's shape.
    """
    a, w, c = node.inputs[0], node.inputs[1], _input(node, 2)
    grad = g[0]
    grads: Grads = [None] * len(node.inputs)
    if grad is None or not _float(a):
        return grads
    ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    grads[0] = _gemm(b, w, grad, tb, 1, alpha) if ta else _gemm(b, grad, w, 0, 1 - tb, alpha)
    grads[1] = _gemm(b, grad, a, 1, ta, alpha) if tb else _gemm(b, a, grad, 1 - ta, 0, alpha)
    if c is not None and beta != 0.0:
        grads[2] = b.unbroadcast(_scale(b, grad, beta), c.shape)
    return grads


# ------------------------------------------------------ BatchNormalization
def _channel_shape(x: Value) -> list[int]:
    """(1, C, 1, ...): a per-channel vector laid out to broadcast against ``x`` (N, C, ...)."""
    return [1, int(x.shape[1])] + [1] * (x.rank - 2)


def _non_channel_axes(x: Value) -> list[int]:
    return [0] + list(range(2, x.rank))


def _channels(b: GradBuilder, value: Value, x: Value) -> Value:
    """A (C,) input cast to ``x``'s dtype and laid out as (1, C, 1, ...)."""
    return b.reshape(b.cast(value, x.dtype), _channel_shape(x))


def _per_channel_sum(b: GradBuilder, value: Value, x: Value) -> Value:
    """Sum over every axis but the channels, as a (C,) vector."""
    return b.reshape(b.reduce_sum(value, _non_channel_axes(x), keepdims=True), [int(x.shape[1])])


def _batch_norm_inference(b: GradBuilder, node: Node, grad: Value) -> Grads:
    """``Y = scale * (X - mean) / sqrt(var + eps) + B`` with ``mean`` and ``var`` inputs."""
    x, scale, _, mean, var = node.inputs
    inv = _inv_std(b, _channels(b, var, x), float(node.attrs.get("epsilon", 1e-5)))
    scale_c = _channels(b, scale, x)
    centered = _sub(b, x, _channels(b, mean, x))
    gx = b.mul(grad, b.mul(scale_c, inv))
    g_bias = _per_channel_sum(b, grad, x)
    g_centered = _per_channel_sum(b, b.mul(grad, centered), x)  # sum(g * (x - mean))
    inv_v = b.reshape(inv, [int(x.shape[1])])
    scale_v = b.cast(scale, x.dtype)
    g_scale = b.mul(g_centered, inv_v)
    g_mean = b.neg(b.mul(g_bias, b.mul(scale_v, inv_v)))
    cube = b.mul(inv_v, b.mul(inv_v, inv_v))
    g_var = b.mul(g_centered, b.mul(scale_v, _scale(b, cube, -0.5)))
    return [gx, g_scale, g_bias, g_mean, g_var]


def _batch_norm_training(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Batch statistics: ``mu``, ``var`` (population) over N and the spatial axes.

    ``Y = scale * (X - mu) / sqrt(var + eps) + B``; ``running_mean = input_mean * momentum +
    mu * (1 - momentum)``, ``running_var = input_var * momentum + var * (1 - momentum)``.
    """
    x, scale = node.inputs[0], node.inputs[1]
    shape = _static(node, x)
    count = int(np.prod([shape[0], *shape[2:]], dtype=np.int64))
    momentum = float(node.attrs.get("momentum", 0.9))
    axes = _non_channel_axes(x)
    centered = _sub(b, x, _mean(b, x, axes))
    inv = _inv_std(b, _mean(b, b.mul(centered, centered), axes), float(node.attrs.get("epsilon", 1e-5)))
    gx: Value | None = None
    grads: Grads = [None] * 5
    if g[0] is not None:
        normalized = b.mul(centered, inv)
        sum_g = b.reduce_sum(g[0], axes, keepdims=True)
        sum_gn = b.reduce_sum(b.mul(g[0], normalized), axes, keepdims=True)
        inner = _sub(b, _sub(b, g[0], _scale(b, sum_g, 1.0 / count)), b.mul(normalized, _scale(b, sum_gn, 1.0 / count)))
        gx = b.mul(b.mul(_channels(b, scale, x), inv), inner)
        grads[1] = b.reshape(sum_gn, [shape[1]])
        grads[2] = b.reshape(sum_g, [shape[1]])
    if len(g) > 1 and g[1] is not None:  # running_mean
        grads[3] = _scale(b, g[1], momentum)
        gx = _add_opt(b, gx, b.expand_to(_scale(b, _channels(b, g[1], x), (1 - momentum) / count), shape))
    if len(g) > 2 and g[2] is not None:  # running_var: d var / dx = 2 (x - mu) / count
        grads[4] = _scale(b, g[2], momentum)
        gx = _add_opt(b, gx, b.mul(centered, _scale(b, _channels(b, g[2], x), 2 * (1 - momentum) / count)))
    grads[0] = gx
    return grads


@register_gradient("BatchNormalization")
def _batch_norm(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Both forms of opset 15: inference (given statistics) and ``training_mode=1`` (batch statistics)."""
    if not _float(node.inputs[0]):
        return [None] * len(node.inputs)
    if node.attrs.get("training_mode", 0):
        return _batch_norm_training(b, node, g)
    return [None] * 5 if g[0] is None else _batch_norm_inference(b, node, g[0])


# --------------------------------------------------------------------- LRN
def _channel_mix(b: GradBuilder, value: Value, matrix: np.ndarray, shape: list[int]) -> Value:
    """``out[:, c] = sum_i matrix[c, i] * value[:, i]`` for ``value`` of static ``shape`` (N, C, ...)."""
    flat = b.reshape(value, [shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))])
    mixed = b.op1("MatMul", [b.const(matrix, value.dtype), flat])
    return b.reshape(mixed, shape)


def _lrn_window(channels: int, size: int) -> np.ndarray:
    """(C, C) 0/1 matrix: row ``c`` selects the channels LRN sums for channel ``c``."""
    low, high = (size - 1) // 2, -(-(size - 1) // 2)
    c = np.arange(channels)
    return ((c[None, :] >= c[:, None] - low) & (c[None, :] <= c[:, None] + high)).astype(np.float64)


@register_gradient("LRN")
def _lrn(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """``Y = X * S ** -beta`` with ``S = bias + alpha / size * window_sum(X ** 2)``.

    ``dX = G * S ** -beta - 2 * alpha * beta / size * X * window_sum'(G * X * S ** (-beta - 1))``,
    where ``window_sum'`` sums over the channels whose window contains the channel (the
    transposed window). The window sums are one MatMul with a (C, C) 0/1 matrix.
    """
    x = node.inputs[0]
    shape = _static(node, x)
    size = int(node.attrs["size"])
    alpha, beta = float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("beta", 0.75))
    window = _lrn_window(shape[1], size)
    squares = _channel_mix(b, b.mul(x, x), window, shape)
    s = b.add(_scalar(b, float(node.attrs.get("bias", 1.0)), x), _scale(b, squares, alpha / size))
    power = b.op1("Pow", [s, _scalar(b, -beta, x)])
    direct = b.mul(g[0], power)
    through = _div(b, b.mul(b.mul(g[0], x), power), s)
    spread = _channel_mix(b, through, window.T.copy(), shape)
    return [_sub(b, direct, b.mul(x, _scale(b, spread, 2 * alpha * beta / size)))]


# ---------------------------------------------------------------- Sum, Mean
@register_gradient("Sum")
def _sum(b: GradBuilder, node: Node, g: Grads) -> Grads:
    return [b.unbroadcast(g[0], v.shape) for v in node.inputs]


@register_gradient("Mean")
def _mean_rule(b: GradBuilder, node: Node, g: Grads) -> Grads:
    share = _scale(b, g[0], 1.0 / len(node.inputs))
    return [b.unbroadcast(share, v.shape) for v in node.inputs]


@register_gradient("Flatten")
def _flatten(b: GradBuilder, node: Node, g: Grads) -> Grads:
    return [b.reshape(g[0], _static(node, node.inputs[0]))]


# ----------------------------------------------------------------- Dropout
def _constant(value: Value | None) -> Any:
    return None if value is None or value.const_value is None else np.asarray(value.const_value).item()


@register_gradient("Dropout")
def _dropout(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Inference mode: identity. Training mode: ``G * mask / (1 - ratio)`` with the node's mask.

    With a ``training_mode`` computed at run time, the scale is ``Where(training_mode,
    1 / (1 - ratio), 1)`` (the mask is all true in inference mode).
    """
    x, ratio, training = node.inputs[0], _input(node, 1), _input(node, 2)
    grads: Grads = [None] * len(node.inputs)
    if g[0] is None:
        return grads
    grads[0] = g[0]
    if training is None or _constant(training) is False or _constant(ratio) == 0.0:
        return grads
    if len(node.outputs) < 2:
        raise GraphError(f"cannot differentiate through Dropout ({node.name}) in training mode without its mask "
                         "output: the gradient needs the elements it kept; give the node its second output "
                         "(mask), or set training_mode to false")
    if ratio is None:
        scale = _scalar(b, 2.0, x)  # the default ratio 0.5
    elif ratio.const_value is not None:
        scale = _scalar(b, 1.0 / (1.0 - float(_constant(ratio))), x)
    else:
        scale = b.op1("Reciprocal", [_sub(b, _scalar(b, 1.0, x), b.cast(ratio, x.dtype))])
    if _constant(training) is not True:
        scale = b.op1("Where", [training, scale, _scalar(b, 1.0, x)])
    grads[0] = b.mul(b.mul(g[0], b.cast(node.outputs[1], x.dtype)), scale)
    return grads


# --------------------------------------------------------------- global pools
@register_gradient("GlobalAveragePool")
def _global_average_pool(b: GradBuilder, node: Node, g: Grads) -> Grads:
    shape = _static(node, node.inputs[0])
    count = int(np.prod(shape[2:], dtype=np.int64))
    return [b.expand_to(_scale(b, g[0], 1.0 / count), shape)]


@register_gradient("GlobalMaxPool")
def _global_max_pool(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """The gradient of each (n, c) goes to its first maximum in row-major order (ArgMax's choice)."""
    x = node.inputs[0]
    shape = _static(node, x)
    positions = int(np.prod(shape[2:], dtype=np.int64))
    flat = b.reshape(x, [shape[0], shape[1], positions])
    first = b.op1("ArgMax", [flat], {"axis": 2, "keepdims": 1})
    hit = b.op1("Equal", [first, b.int64s(range(positions))])
    spread = b.op1("Where", [hit, b.reshape(g[0], [shape[0], shape[1], 1]), _scalar(b, 0.0, x)])
    return [b.reshape(spread, shape)]


# ------------------------------------------------------- LayerNormalization
def _layer_norm_stats(b: GradBuilder, node: Node, axes: list[int]) -> tuple[Value, Value]:
    """Mean and 1/std over ``axes``, in X's dtype.

    Recomputed from X, not read from the node's Mean and InvStdDev outputs: those are in
    ``stash_type`` (float32 for a float64 X by default) and TVM 0.27's ONNX frontend returns
    placeholder scalars for them. They are computed in the wider of X's dtype and
    ``stash_type``, as the forward op does.
    """
    x = node.inputs[0]
    stash = numpy_dtype(int(node.attrs.get("stash_type", 1)))
    wide = b.cast(x, stash) if stash.itemsize > x.dtype.itemsize else x
    mean = _mean(b, wide, axes)
    centered = _sub(b, wide, mean)
    inv = _inv_std(b, _mean(b, b.mul(centered, centered), axes), float(node.attrs.get("epsilon", 1e-5)))
    return b.cast(mean, x.dtype), b.cast(inv, x.dtype)


@register_gradient("LayerNormalization")
def _layer_norm(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """``Y = (X - mu) * inv * Scale + B`` over axes ``axis..``; optional outputs ``mu``, ``inv``.

    ``dX = inv * (Gn - mean(Gn) - Xn * mean(Gn * Xn))`` with ``Xn = (X - mu) * inv`` and
    ``Gn = G * Scale``; plus ``G_mu / M`` and ``-G_inv * inv ** 2 * Xn / M`` from the
    statistics outputs (``M`` elements per normalized group).
    """
    x, scale, bias = node.inputs[0], node.inputs[1], _input(node, 2)
    shape = _static(node, x)
    axis = int(node.attrs.get("axis", -1)) % x.rank
    axes = list(range(axis, x.rank))
    count = int(np.prod(shape[axis:], dtype=np.int64))
    mean, inv = _layer_norm_stats(b, node, axes)
    normalized = b.mul(_sub(b, x, mean), inv)
    grads: Grads = [None] * len(node.inputs)
    gx: Value | None = None
    if g[0] is not None:
        grads[1] = b.unbroadcast(b.mul(g[0], normalized), scale.shape)
        if bias is not None:
            grads[2] = b.unbroadcast(g[0], bias.shape)
        g_norm = b.mul(g[0], scale)
        inner = _sub(b, _sub(b, g_norm, _mean(b, g_norm, axes)), b.mul(normalized, _mean(b, b.mul(g_norm, normalized),
                                                                                          axes)))
        gx = b.mul(inv, inner)
    if len(g) > 1 and g[1] is not None:
        gx = _add_opt(b, gx, b.expand_to(_scale(b, b.cast(g[1], x.dtype), 1.0 / count), shape))
    if len(g) > 2 and g[2] is not None:
        factor = b.mul(b.cast(g[2], x.dtype), _scale(b, b.mul(inv, inv), -1.0 / count))
        gx = _add_opt(b, gx, b.mul(normalized, factor))
    grads[0] = gx
    return grads


# ------------------------------------------------------------- activations
def _positive(b: GradBuilder, x: Value) -> Value:
    return b.op1("Greater", [x, _scalar(b, 0.0, x)])


@register_gradient("Gelu")
def _gelu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    """Exact: ``Phi(x) + x * phi(x)``. Tanh: ``0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2)`` with
    ``t = tanh(k (x + c x^3))``, ``k = sqrt(2 / pi)``, ``c = 0.044715``.
    """
    x = node.inputs[0]
    approximate = node.attrs.get("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    half, one = _scalar(b, 0.5, x), _scalar(b, 1.0, x)
    square = b.mul(x, x)
    if approximate == "tanh":
        # The constants of ONNX's function body of Gelu: float32 2/pi and 0.044715, cast to X's type.
        k, c = float(np.sqrt(np.float64(np.float32(2.0 / np.pi)))), float(np.float32(0.044715))
        inner = b.mul(x, b.add(one, _scale(b, square, c)))
        t = b.op1("Tanh", [_scale(b, inner, k)])
        slope = _scale(b, b.add(one, _scale(b, square, 3 * c)), k)
        tail = b.mul(b.mul(b.mul(half, x), _sub(b, one, b.mul(t, t))), slope)
        derivative = b.add(b.mul(half, b.add(one, t)), tail)
    else:
        cdf = b.mul(half, b.add(one, b.op1("Erf", [_scale(b, x, float(1 / np.sqrt(2.0)))])))
        pdf = _scale(b, b.op1("Exp", [_scale(b, square, -0.5)]), float(1 / np.sqrt(2 * np.pi)))
        derivative = b.add(cdf, b.mul(x, pdf))
    return [b.mul(g[0], derivative)]


@register_gradient("HardSigmoid")
def _hard_sigmoid(b: GradBuilder, node: Node, g: Grads) -> Grads:
    y = node.outputs[0]
    inside = b.op1("And", [_positive(b, y), b.op1("Less", [y, _scalar(b, 1.0, y)])])
    slope = _scale(b, g[0], float(node.attrs.get("alpha", 0.2)))
    return [b.op1("Where", [inside, slope, _scalar(b, 0.0, y)])]


@register_gradient("LeakyRelu")
def _leaky_relu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    x = node.inputs[0]
    return [b.op1("Where", [_positive(b, x), g[0], _scale(b, g[0], float(node.attrs.get("alpha", 0.01)))])]


def _exponential_unit(b: GradBuilder, node: Node, g: Value, gamma: float, alpha: float) -> Value:
    """``gamma * (x if x > 0 else alpha * (exp(x) - 1))``: slope gamma, else ``y + gamma * alpha``."""
    x, y = node.inputs[0], node.outputs[0]
    negative = b.mul(g, b.add(y, _scalar(b, gamma * alpha, y)))
    return b.op1("Where", [_positive(b, x), _scale(b, g, gamma), negative])


@register_gradient("Elu")
def _elu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    return [_exponential_unit(b, node, g[0], 1.0, float(node.attrs.get("alpha", 1.0)))]


@register_gradient("Selu")
def _selu(b: GradBuilder, node: Node, g: Grads) -> Grads:
    alpha = float(node.attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(node.attrs.get("gamma", 1.05070102214813232421875))
    return [_exponential_unit(b, node, g[0], gamma, alpha)]
