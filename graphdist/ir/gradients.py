"""Reverse-mode gradient rules, attached to the OpDef registry.

A rule has the signature ``rule(b: GradBuilder, node, grads) -> input_grads``:
``grads`` holds the gradient of each output of ``node`` (``None`` where no
gradient flows), and the rule returns one gradient per input (``None`` for
inputs that are not differentiable, such as integer indices or shapes). Rules
emit ops through the :class:`GradBuilder`, which appends them to the graph;
:class:`passes.autodiff.AutodiffPass` drives the rules and places the new
nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, ONNX_DOMAIN, Graph, Node, Value
from graphdist.ir.ops import get_opdef, onnx_dtype

__all__ = ["GradBuilder", "register_gradient", "GradRule"]

GradRule = Callable[["GradBuilder", Node, list["Value | None"]], list["Value | None"]]


def register_gradient(op_type: str, domain: str = ONNX_DOMAIN) -> Callable[[GradRule], GradRule]:
    """Decorator attaching a gradient rule to ``domain.op_type``'s OpDef."""

    def attach(rule: GradRule) -> GradRule:
        get_opdef(op_type, domain).gradient = rule
        return rule

    return attach


class GradBuilder:
    """Emits backward ops into ``graph`` (appended; the autodiff pass moves them).

    Attributes:
        graph: Graph being differentiated.
        created: Nodes emitted so far, in order.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.created: list[Node] = []

    # ------------------------------------------------------------ basics
    def op(self, op_type: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None,
           domain: str = ONNX_DOMAIN, num_outputs: int | None = None) -> list[Value]:
        """Emits one node and returns its outputs."""
        node = self.graph.add_node(op_type, inputs, attrs, domain=domain, num_outputs=num_outputs,
                                   name=f"grad_{op_type.lower()}")
        node.meta["backward"] = True
        self.created.append(node)
        return node.outputs

    def op1(self, op_type: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None) -> Value:
        """Emits a single-output node."""
        return self.op(op_type, inputs, attrs)[0]

    def const(self, value: Any, dtype: Any) -> Value:
        """A constant initializer."""
        return self.graph.add_initializer("grad_const", np.asarray(value, dtype=dtype))

    def int64s(self, values: Sequence[int]) -> Value:
        """An int64 1-D constant."""
        return self.graph.add_initializer("grad_axes", np.asarray(list(values), dtype=np.int64).reshape(-1))

    def zeros_like(self, value: Value) -> Value:
        """A constant of zeros with ``value``'s shape and dtype."""
        return self.const(np.zeros(value.shape, value.dtype), value.dtype)

    # ----------------------------------------------------------- helpers
    def add(self, a: Value, b: Value) -> Value:
        """``a + b``."""
        return self.op1("Add", [a, b])

    def mul(self, a: Value, b: Value) -> Value:
        """``a * b``."""
        return self.op1("Mul", [a, b])

    def neg(self, a: Value) -> Value:
        """``-a``."""
        return self.op1("Neg", [a])

    def cast(self, a: Value, dtype: Any) -> Value:
        """``a.astype(dtype)`` (no node when equal)."""
        return a if a.dtype == np.dtype(dtype) else self.op1("Cast", [a], {"to": onnx_dtype(dtype)})

    def reshape(self, a: Value, shape: Sequence[int]) -> Value:
        """Reshape to a static shape (no node when equal)."""
        if tuple(a.shape) == tuple(shape):
            return a
        return self.op1("Reshape", [a, self.int64s(shape)])

    def reduce_sum(self, a: Value, axes: Sequence[int], keepdims: bool) -> Value:
        """Sum over ``axes``."""
        if not axes:
            return a
        return self.op1("ReduceSum", [a, self.int64s(sorted(axes))], {"keepdims": int(keepdims)})

    def unbroadcast(self, grad: Value, shape: Sequence[Any]) -> Value:
        """Sums ``grad`` over the axes that broadcasting added or expanded to reach ``shape``."""
        shape = tuple(shape)
        if tuple(grad.shape) == shape:
            return grad
        lead = grad.rank - len(shape)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and grad.shape[lead + i] != 1]
        summed = self.reduce_sum(grad, axes, keepdims=True)
        return self.reshape(summed, shape)

    def expand_to(self, grad: Value, shape: Sequence[int]) -> Value:
        """Broadcasts ``grad`` to ``shape``."""
        if tuple(grad.shape) == tuple(shape):
            return grad
        return self.op1("Expand", [grad, self.int64s(shape)])


# ----------------------------------------------------------------- rules
def _ub(b: GradBuilder, grad: Value | None, like: Value) -> Value | None:
    return None if grad is None else b.unbroadcast(grad, like.shape)


def _float(value: Value | None) -> bool:
    return value is not None and value.dtype.kind == "f"


@register_gradient("Identity")
def _identity(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [g[0]]


@register_gradient("AssignVariable", GRAPHDIST_DOMAIN)
def _assign(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [g[0]]


@register_gradient("Add")
def _add(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x, y = node.inputs
    return [_ub(b, g[0], x), _ub(b, g[0], y)]


@register_gradient("Sub")
def _sub(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x, y = node.inputs
    return [_ub(b, g[0], x), _ub(b, b.neg(g[0]), y)]


@register_gradient("Mul")
def _mul(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x, y = node.inputs
    return [_ub(b, b.mul(g[0], y), x), _ub(b, b.mul(g[0], x), y)]


@register_gradient("Div")
def _div(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x, y = node.inputs
    gx = b.op1("Div", [g[0], y])
    gy = b.neg(b.op1("Div", [b.mul(gx, x), y]))
    return [_ub(b, gx, x), _ub(b, gy, y)]


@register_gradient("Neg")
def _neg(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [b.neg(g[0])]


@register_gradient("Cast")
def _cast(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x = node.inputs[0]
    if not (_float(x) and _float(node.outputs[0])):
        return [None]
    return [b.cast(g[0], x.dtype)]


@register_gradient("Exp")
def _exp(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [b.mul(g[0], node.outputs[0])]


@register_gradient("Log")
def _log(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [b.op1("Div", [g[0], node.inputs[0]])]


@register_gradient("Tanh")
def _tanh(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    y = node.outputs[0]
    one = b.const(1, y.dtype)
    return [b.mul(g[0], b.op1("Sub", [one, b.mul(y, y)]))]


@register_gradient("Sigmoid")
def _sigmoid(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    y = node.outputs[0]
    one = b.const(1, y.dtype)
    return [b.mul(g[0], b.mul(y, b.op1("Sub", [one, y])))]


@register_gradient("Sqrt")
def _sqrt(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    y = node.outputs[0]
    return [b.op1("Div", [g[0], b.mul(b.const(2, y.dtype), y)])]


@register_gradient("Relu")
def _relu(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x = node.inputs[0]
    mask = b.cast(b.op1("Greater", [x, b.const(0, x.dtype)]), x.dtype)
    return [b.mul(g[0], mask)]


def _select_grad(b: GradBuilder, node: Node, g: Value, greater: str) -> list[Value | None]:
    x, y = node.inputs
    take_x = b.cast(b.op1(greater, [x, y]), g.dtype)
    take_y = b.op1("Sub", [b.const(1, g.dtype), take_x])
    return [_ub(b, b.mul(g, take_x), x), _ub(b, b.mul(g, take_y), y)]


@register_gradient("Max")
def _max(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return _select_grad(b, node, g[0], "GreaterOrEqual")


@register_gradient("Min")
def _min(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return _select_grad(b, node, g[0], "LessOrEqual")


@register_gradient("Where")
def _where(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    cond, x, y = node.inputs
    zeros = b.const(0, g[0].dtype)
    return [None, _ub(b, b.op1("Where", [cond, g[0], zeros]), x), _ub(b, b.op1("Where", [cond, zeros, g[0]]), y)]


def _swap_last(b: GradBuilder, value: Value) -> Value:
    perm = list(range(value.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return b.op1("Transpose", [value], {"perm": perm})


@register_gradient("MatMul")
def _matmul(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x, y = node.inputs
    grad = g[0]
    x2 = b.reshape(x, (1, *x.shape)) if x.rank == 1 else x
    y2 = b.reshape(y, (*y.shape, 1)) if y.rank == 1 else y
    out_shape = list(grad.shape)
    if x.rank == 1:
        out_shape.insert(len(out_shape) - (0 if y.rank == 1 else 1), 1)
    if y.rank == 1:
        out_shape.append(1)
    g2 = b.reshape(grad, out_shape)
    gx = b.op1("MatMul", [g2, _swap_last(b, y2)])
    gy = b.op1("MatMul", [_swap_last(b, x2), g2])
    gx = b.unbroadcast(gx, x2.shape)
    gy = b.unbroadcast(gy, y2.shape)
    return [b.reshape(gx, x.shape), b.reshape(gy, y.shape)]


def _reduce_axes(node: Node) -> list[int]:
    x = node.inputs[0]
    axes_value = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_value is None or axes_value.const_value is None or axes_value.const_value.size == 0:
        return [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(x.rank))
    return sorted(int(a) % x.rank for a in axes_value.const_value.reshape(-1))


def _grad_to_input_shape(b: GradBuilder, node: Node, grad: Value) -> Value:
    """Reshapes a reduction's output gradient to keepdims form and broadcasts it back."""
    x = node.inputs[0]
    axes = _reduce_axes(node)
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return b.expand_to(b.reshape(grad, kept), x.shape)


@register_gradient("ReduceSum")
def _reduce_sum(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [_grad_to_input_shape(b, node, g[0]), None]


@register_gradient("ReduceMean")
def _reduce_mean(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x = node.inputs[0]
    count = int(np.prod([x.shape[i] for i in _reduce_axes(node)], dtype=np.int64))
    scaled = b.op1("Div", [g[0], b.const(count, g[0].dtype)])
    return [_grad_to_input_shape(b, node, scaled), None]


def _reduce_extreme(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # The gradient goes to the extreme elements, split evenly between ties.
    x = node.inputs[0]
    y = _grad_to_input_shape(b, node, node.outputs[0])
    mask = b.cast(b.op1("Equal", [x, y]), x.dtype)
    axes = _reduce_axes(node)
    ties = b.expand_to(b.reduce_sum(mask, axes, keepdims=True), x.shape)
    share = b.op1("Div", [mask, ties])
    return [b.mul(_grad_to_input_shape(b, node, g[0]), share), None]


register_gradient("ReduceMax")(_reduce_extreme)
register_gradient("ReduceMin")(_reduce_extreme)


@register_gradient("Reshape")
def _reshape(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [b.reshape(g[0], node.inputs[0].shape), None]


register_gradient("Squeeze")(lambda b, node, g: [b.reshape(g[0], node.inputs[0].shape), None])
register_gradient("Unsqueeze")(lambda b, node, g: [b.reshape(g[0], node.inputs[0].shape), None])
register_gradient("Expand")(lambda b, node, g: [b.unbroadcast(g[0], node.inputs[0].shape), None])


@register_gradient("Transpose")
def _transpose(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    perm = node.attrs.get("perm", list(range(node.inputs[0].rank))[::-1])
    inverse = list(np.argsort(perm))
    return [b.op1("Transpose", [g[0]], {"perm": [int(p) for p in inverse]})]


@register_gradient("Pow")
def _pow(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x, exponent = node.inputs
    y = node.outputs[0]
    power = b.cast(exponent, x.dtype)
    minus_one = b.op1("Sub", [power, b.const(1, x.dtype)])
    gx = b.mul(g[0], b.mul(power, b.op1("Pow", [x, minus_one])))
    gexp = None
    if _float(exponent):
        gexp = _ub(b, b.mul(g[0], b.mul(y, b.op1("Log", [x]))), exponent)
    return [_ub(b, gx, x), gexp]


# ------------------------------------------------- elementwise unary rules
def _unary_rule(derivative: Callable[[GradBuilder, Node], Value]) -> GradRule:
    """A rule ``g * derivative(x)`` for a one-input, one-output elementwise op."""

    def rule(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
        return [b.mul(g[0], derivative(b, node))]

    return rule


register_gradient("Abs")(_unary_rule(lambda b, n: b.op1("Sign", [n.inputs[0]])))
register_gradient("Sin")(_unary_rule(lambda b, n: b.op1("Cos", [n.inputs[0]])))
register_gradient("Cos")(_unary_rule(lambda b, n: b.neg(b.op1("Sin", [n.inputs[0]]))))
register_gradient("Softplus")(_unary_rule(lambda b, n: b.op1("Sigmoid", [n.inputs[0]])))
# d(1/x) = -1/x^2 = -y^2
register_gradient("Reciprocal")(_unary_rule(lambda b, n: b.neg(b.mul(n.outputs[0], n.outputs[0]))))


@register_gradient("Erf")
def _erf(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x = node.inputs[0]
    gauss = b.op1("Exp", [b.neg(b.mul(x, x))])
    return [b.mul(g[0], b.mul(gauss, b.const(2.0 / np.sqrt(np.pi), x.dtype)))]


def _zero_gradient(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    """Piecewise-constant ops (and ops whose output does not depend on input values)."""
    return [None] * len(node.inputs)


for _name in ("Sign", "Floor", "Ceil", "Round", "ArgMax", "ArgMin", "IsNaN", "IsInf", "Equal", "Less",
              "Greater", "LessOrEqual", "GreaterOrEqual", "RandomUniformLike"):
    register_gradient(_name)(_zero_gradient)


@register_gradient("Mod")
def _mod(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # Float remainder: a - q * b with q = floor(a / b) (fmod=0) or trunc(a / b) (fmod=1).
    x, y = node.inputs
    if not _float(x):
        return [None, None]
    ratio = b.op1("Div", [x, y])
    if node.attrs.get("fmod", 0):
        quotient = b.mul(b.op1("Sign", [ratio]), b.op1("Floor", [b.op1("Abs", [ratio])]))
    else:
        quotient = b.op1("Floor", [ratio])
    return [_ub(b, g[0], x), _ub(b, b.neg(b.mul(g[0], quotient)), y)]


@register_gradient("Clip")
def _clip(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # The gradient flows where min <= x <= max; a bound gets the gradient where it clipped x.
    x = node.inputs[0]
    lower = node.inputs[1] if len(node.inputs) > 1 else None
    upper = node.inputs[2] if len(node.inputs) > 2 else None
    one = b.const(1, x.dtype)
    keep = None
    grads: list[Value | None] = [None, None, None][: len(node.inputs)]
    for index, bound, outside in ((1, lower, "Less"), (2, upper, "Greater")):
        if bound is None:
            continue
        clipped = b.cast(b.op1(outside, [x, bound]), x.dtype)
        inside = b.op1("Sub", [one, clipped])
        keep = inside if keep is None else b.mul(keep, inside)
        if _float(bound):
            grads[index] = _ub(b, b.mul(g[0], clipped), bound)
    grads[0] = g[0] if keep is None else b.mul(g[0], keep)
    return grads


# ----------------------------------------------------------- reductions
@register_gradient("ReduceProd")
def _reduce_prod(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # d(prod)/dx_i = product of the other elements, computed without dividing by zero:
    # no zero in the group: prod / x_i; one zero: the product of the non-zeros at the zero,
    # 0 elsewhere; several zeros: 0.
    x = node.inputs[0]
    axes = _reduce_axes(node)
    zero = b.const(0, x.dtype)
    one = b.const(1, x.dtype)
    is_zero = b.op1("Equal", [x, zero])
    safe = b.op1("Where", [is_zero, one, x])
    if axes:
        nonzero_prod = b.op1("ReduceProd", [safe, b.int64s(axes)], {"keepdims": 1})
        zeros = b.reduce_sum(b.cast(is_zero, x.dtype), axes, keepdims=True)
    else:
        nonzero_prod, zeros = safe, b.cast(is_zero, x.dtype)
    no_zero = b.op1("Equal", [zeros, zero])
    one_zero = b.op1("Equal", [zeros, one])
    others = b.op1("Where", [no_zero, b.op1("Div", [nonzero_prod, safe]),
                             b.op1("Where", [b.op1("And", [one_zero, is_zero]), nonzero_prod, zero])])
    return [b.mul(_grad_to_input_shape(b, node, g[0]), others), None]


# ---------------------------------------------------------------- softmax
def _softmax_axis(node: Node) -> int:
    x = node.inputs[0]
    return int(node.attrs.get("axis", -1)) % x.rank


@register_gradient("Softmax")
def _softmax(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    y = node.outputs[0]
    dot = b.reduce_sum(b.mul(g[0], y), [_softmax_axis(node)], keepdims=True)
    return [b.mul(y, b.op1("Sub", [g[0], dot]))]


@register_gradient("LogSoftmax")
def _log_softmax(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    y = node.outputs[0]
    total = b.reduce_sum(g[0], [_softmax_axis(node)], keepdims=True)
    return [b.op1("Sub", [g[0], b.mul(b.op1("Exp", [y]), total)])]


# ------------------------------------------------------ shape movements
@register_gradient("Concat")
def _concat(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    axis = int(node.attrs["axis"]) % node.inputs[0].rank
    sizes = [int(v.shape[axis]) for v in node.inputs]
    if len(sizes) == 1:
        return [g[0]]
    return list(b.op("Split", [g[0], b.int64s(sizes)], {"axis": axis}, num_outputs=len(sizes)))


@register_gradient("Split")
def _split(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    x = node.inputs[0]
    axis = int(node.attrs.get("axis", 0)) % x.rank
    parts = [grad if grad is not None else b.zeros_like(out) for out, grad in zip(node.outputs, g)]
    joined = parts[0] if len(parts) == 1 else b.op1("Concat", parts, {"axis": axis})
    return [joined] + [None] * (len(node.inputs) - 1)


def _ints(value: Value | None) -> list[int] | None:
    return None if value is None else [int(v) for v in np.asarray(value.const_value).reshape(-1)]


def _axis_shape(rank: int, axis: int, size: int) -> list[int]:
    return [size if i == axis else 1 for i in range(rank)]


@register_gradient("Slice")
def _slice(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # Slice is separable by axis: per sliced axis, gather each input position's element from the
    # gradient (any index where the position was not taken) and zero the positions not taken.
    x = node.inputs[0]
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = _ints(inputs[1]), _ints(inputs[2])
    axes = _ints(inputs[3]) or list(range(len(starts)))
    steps = _ints(inputs[4]) or [1] * len(starts)
    grad = g[0]
    if any(d == 0 for d in grad.shape):
        return [b.zeros_like(x), None, None, None, None][: len(node.inputs)]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= x.rank
        dim = int(x.shape[axis])
        taken = list(range(*slice(start, end, step).indices(dim)))
        if taken == list(range(dim)):
            continue
        source = np.zeros(dim, np.int64)
        mask = np.zeros(dim, x.dtype)
        for position, index in enumerate(taken):
            source[index] = position
            mask[index] = 1
        grad = b.op1("Gather", [grad, b.int64s(source)], {"axis": axis})
        grad = b.mul(grad, b.const(mask.reshape(_axis_shape(x.rank, axis, dim)), x.dtype))
    return [grad] + [None] * (len(node.inputs) - 1)


@register_gradient("Gather")
def _gather(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # One-hot of the indices (N x dim), contracted with the gradient: duplicates accumulate.
    x, indices = node.inputs
    axis = int(node.attrs.get("axis", 0)) % x.rank
    dim = int(x.shape[axis])
    pre = int(np.prod(x.shape[:axis], dtype=np.int64))
    post = int(np.prod(x.shape[axis + 1 :], dtype=np.int64))
    count = int(np.prod(indices.shape, dtype=np.int64))
    flat = b.reshape(b.cast(indices, np.int64), (count, 1))
    wrapped = b.op1("Where", [b.op1("Less", [flat, b.const(0, np.int64)]),
                              b.add(flat, b.const(dim, np.int64)), flat])
    one_hot = b.cast(b.op1("Equal", [wrapped, b.int64s(range(dim))]), x.dtype)  # (count, dim)
    grad = b.reshape(g[0], (pre, count, post))
    scattered = b.op1("MatMul", [b.op1("Transpose", [one_hot], {"perm": [1, 0]}), grad])  # (pre, dim, post)
    return [b.reshape(scattered, x.shape), None]


@register_gradient("Pad")
def _pad(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    # Constant mode: the gradient of the kept region, cropped back (or zero-filled where Pad cropped).
    x = node.inputs[0]
    mode = node.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
        raise GraphError(f"cannot differentiate through Pad ({node.name}) in mode {mode!r}: only mode "
                         "'constant' has a gradient rule")
    pads = _ints(node.inputs[1])
    axes = _ints(node.inputs[3]) if len(node.inputs) > 3 else None
    axes = [a % x.rank for a in axes] if axes else list(range(x.rank))
    grad = g[0]
    # Drop what Pad added (positive pads), then zero-fill what it cropped (negative pads).
    begins, ends = pads[: len(axes)], pads[len(axes):]
    if any(p > 0 for p in pads):
        starts = [max(begin, 0) for begin in begins]
        stops = [int(grad.shape[axis]) - max(end, 0) for end, axis in zip(ends, axes)]
        grad = b.op1("Slice", [grad, b.int64s(starts), b.int64s(stops), b.int64s(axes)])
    if any(p < 0 for p in pads):
        refill = [max(-begin, 0) for begin in begins] + [max(-end, 0) for end in ends]
        grad = b.op1("Pad", [grad, b.int64s(refill), b.const(0, grad.dtype), b.int64s(axes)])
    return [grad] + [None] * (len(node.inputs) - 1)

