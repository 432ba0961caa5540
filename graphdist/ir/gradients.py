"""Reverse-mode gradient rules, attached to the OpDef registry.

A rule has the signature ``rule(b: GradBuilder, node, grads) -> input_grads``:
``grads`` holds the gradient of each output of ``node`` (``None`` where no
gradient flows), and the rule returns one gradient per input (``None`` for
inputs that are not differentiable, such as integer indices or shapes). Rules
emit ops through the :class:`GradBuilder`, which appends them to the graph;
:class:`graphdist.passes.autodiff.AutodiffPass` drives the rules and places the new
nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir import state_ops  # noqa: F401 - AssignVariable must be registered before its rule
from graphdist.ir.batch import record
from graphdist.ir.graph import GRAPHDIST_DOMAIN, ONNX_DOMAIN, Graph, Node, Value
from graphdist.ir.ops import OPSET, get_opdef, has_opdef, node_opdef, onnx_dtype, registered_ops

__all__ = ["GradBuilder", "register_gradient", "GradRule", "gradient_rule", "ops_with_gradients"]

GradRule = Callable[["GradBuilder", Node, list["Value | None"]], list["Value | None"]]

#: Rules of ops without a hand-written OpDef (their generic OpDef is made from ONNX's schema, at the
#: graph's opset): ``(domain, op_type) -> (rule, since)``; the rule models the op's forms from opset
#: ``since`` on.
_SCHEMA_OP_RULES: dict[tuple[str, str], tuple[GradRule, int]] = {}


def register_gradient(op_type: str, domain: str = ONNX_DOMAIN, since: int = 1) -> Callable[[GradRule], GradRule]:
    """Decorator attaching a gradient rule to ``domain.op_type``.

    An op with a hand-written OpDef gets the rule on that OpDef. Any other
    ONNX op (one whose OpDef is generic, made from ONNX's schema) keeps it
    here, for its forms of opset ``since`` and later.
    """

    def attach(rule: GradRule) -> GradRule:
        if has_opdef(op_type, domain):
            get_opdef(op_type, domain).gradient = rule
        else:
            _SCHEMA_OP_RULES[(domain, op_type)] = (rule, since)
        return rule

    return attach


def gradient_rule(node: Node) -> GradRule | None:
    """The gradient rule of ``node`` at its graph's opset, or ``None`` when it has none."""
    rule = node_opdef(node).gradient
    if rule is not None:
        return rule
    entry = _SCHEMA_OP_RULES.get((node.domain, node.op_type))
    if entry is None:
        return None
    opset = node.graph.opset_imports.get(node.domain, OPSET) if node.graph is not None else OPSET
    return entry[0] if opset >= entry[1] else None


def ops_with_gradients() -> list[str]:
    """Every op with a gradient rule (``domain.op`` outside the ONNX domain), sorted; graphdist's own
    bookkeeping ops (``graphdist.*``) left out.
    """
    names = {f"{d + '.' if d else ''}{o}" for (d, o) in registered_ops() if get_opdef(o, d).gradient is not None}
    names |= {f"{d + '.' if d else ''}{o}" for d, o in _SCHEMA_OP_RULES}
    return sorted(n for n in names if not n.startswith(GRAPHDIST_DOMAIN + "."))


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
        """An int64 1-D constant (a shape made from the batch size remembers it, as traced constants do)."""
        values = list(values)
        made = self.graph.add_initializer("grad_axes", np.asarray(values, dtype=np.int64).reshape(-1))
        provenance = record(values)
        if provenance is not None:
            made.meta["batch"] = provenance
        return made

    def filled(self, shape: Sequence[Any], fill: float, dtype: Any) -> Value:
        """A constant of ``shape`` filled with ``fill``; a shape holding the batch size is remembered in
        ``meta["batch_fill"]`` (its elements do not depend on the batch, only its extent does).
        """
        made = self.const(np.full(tuple(int(d) for d in shape), fill, dtype), dtype)
        provenance = record(tuple(shape))
        if provenance is not None:
            made.meta["batch_fill"] = provenance
        return made

    def zeros_like(self, value: Value) -> Value:
        """A constant of zeros with ``value``'s shape and dtype."""
        return self.filled(value.shape, 0, value.dtype)

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
        if axes == [0] and grad.rank == 2 and grad.dtype.kind == "f" and isinstance(grad.shape[0], int):
            # A bias gradient: ones(1, N) @ grad runs as a GEMM, several times faster than ReduceSum(axis=0).
            ones = self.filled((1, grad.shape[0]), 1, grad.dtype)
            return self.reshape(self.op1("MatMul", [ones, grad]), shape)
        summed = self.reduce_sum(grad, axes, keepdims=True)
        return self.reshape(summed, shape)

    def expand_to(self, grad: Value, shape: Sequence[int]) -> Value:
        """Broadcasts ``grad`` to ``shape``."""
        if tuple(grad.shape) == tuple(shape):
            return grad
        if 0 in tuple(shape):
            # An empty result (a replica's empty slice of a partial batch). ONNX Runtime's constant
            # folding turns Expand(x[1], [0]) into x[1], not x[0], so emit the empty constant directly.
            return self.const(np.zeros(tuple(shape), grad.dtype), grad.dtype)
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
    # Where(mask, g, 0) is one pass over the data; Cast + Mul would be two.
    x, y = node.inputs
    take_x = b.op1(greater, [x, y])
    zero = b.const(0, g.dtype)
    return [_ub(b, b.op1("Where", [take_x, g, zero]), x), _ub(b, b.op1("Where", [take_x, zero, g]), y)]


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


# ------------------------------------------------------- sliding windows
@dataclass
class _Windows:
    """Geometry of a sliding-window op over spatial axes ``2..`` of an (N, C, spatial...) tensor.

    Window ``o`` of axis ``a`` reads input position ``o * strides[a] - begins[a] + i * dilations[a]``
    for kernel tap ``i``; ``ends`` are the end pads the op was given (attribute or auto_pad).
    """

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    begins: list[int]
    ends: list[int]
    sizes: list[int]  # input spatial sizes
    outs: list[int]  # output spatial sizes

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def reach(self, axis: int) -> int:
        """End padding the windows actually read (ceil_mode windows may read past ``ends``)."""
        extent = (self.outs[axis] - 1) * self.strides[axis] + (self.kernel[axis] - 1) * self.dilations[axis] + 1
        return max(0, extent - self.sizes[axis] - self.begins[axis])


def _str_attr(node: Node, name: str, default: str) -> str:
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _static(node: Node, what: str, dims: Sequence[Any]) -> list[int]:
    if not all(isinstance(d, int) for d in dims):
        raise GraphError(f"cannot differentiate through {node.op_type} ({node.name}): the {what} sizes "
                         f"{tuple(dims)} must be static")
    return [int(d) for d in dims]


def _windows(node: Node, x: Value, kernel: Sequence[int], out: Value) -> _Windows:
    """The geometry of ``node`` (Conv, MaxPool, AveragePool) reading ``x`` and writing ``out``."""
    rank = x.rank - 2
    sizes = _static(node, "spatial input", x.shape[2:])
    outs = _static(node, "spatial output", out.shape[2:])
    kernel = [int(k) for k in kernel]
    strides = [int(v) for v in node.attrs.get("strides") or [1] * rank]
    dilations = [int(v) for v in node.attrs.get("dilations") or [1] * rank]
    pads = [int(v) for v in node.attrs.get("pads") or [0] * 2 * rank]
    begins, ends = pads[:rank], pads[rank:]
    auto_pad = _str_attr(node, "auto_pad", "NOTSET")
    if auto_pad == "VALID":
        begins, ends = [0] * rank, [0] * rank
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for k, s, d, size, o in zip(kernel, strides, dilations, sizes, outs):
            total = max(0, (o - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else total - small)
            ends.append(total - begins[-1])
    return _Windows(kernel, strides, dilations, begins, ends, sizes, outs)


def _pad_full(b: GradBuilder, x: Value, begins: Sequence[int], ends: Sequence[int], fill: float = 0.0) -> Value:
    """``Pad`` with non-negative pads for every axis and no ``axes`` input.

    ONNX Runtime 1.31's transpose optimizer, pushing a Transpose through a Pad that has the
    ``axes`` input, permutes ``pads`` as if it covered every axis (a Gather out of bounds at
    run time), so the backward ops never use that input.
    """
    if not any(begins) and not any(ends):
        return x
    return b.op1("Pad", [x, b.int64s(list(begins) + list(ends)), b.const(fill, x.dtype)])


def _pad_spatial(b: GradBuilder, x: Value, win: _Windows, fill: float) -> Value:
    """``x`` padded with ``fill`` so that every window lies inside it."""
    return _pad_full(b, x, [0, 0, *win.begins], [0, 0, *(win.reach(a) for a in range(win.rank))], fill)


def _inside_mask(win: _Windows) -> np.ndarray:
    """(1, 1, padded spatial...) booleans: True where :func:`_pad_spatial`'s result holds input."""
    inside = np.ones((1, 1), np.bool_)
    for a in range(win.rank):
        axis = np.zeros(win.begins[a] + win.sizes[a] + win.reach(a), np.bool_)
        axis[win.begins[a]:win.begins[a] + win.sizes[a]] = True
        inside = np.logical_and.outer(inside, axis).reshape(1, 1, *inside.shape[2:], axis.size)
    return inside


def _mask_tap(mask: np.ndarray, win: _Windows, tap: Sequence[int]) -> np.ndarray:
    """The (1, 1, outs...) part of ``mask`` that kernel tap ``tap`` reads (as :func:`_window_tap`)."""
    index = [slice(None), slice(None)]
    for i, d, o, stride in zip(tap, win.dilations, win.outs, win.strides):
        index.append(slice(i * d, i * d + (o - 1) * stride + 1, stride))
    return mask[tuple(index)]


def _window_tap(b: GradBuilder, padded: Value, win: _Windows, tap: Sequence[int]) -> Value:
    """The (N, C, outs...) elements that kernel tap ``tap`` reads in each window of ``padded``."""
    starts = [i * d for i, d in zip(tap, win.dilations)]
    stops = [start + (o - 1) * s + 1 for start, o, s in zip(starts, win.outs, win.strides)]
    if all(start == 0 and stop == dim for start, stop, dim in zip(starts, stops, padded.shape[2:])) \
            and all(s == 1 for s in win.strides):
        return padded
    axes = list(range(2, 2 + win.rank))
    return b.op1("Slice", [padded, b.int64s(starts), b.int64s(stops), b.int64s(axes), b.int64s(win.strides)])


def _keep_batch(b: GradBuilder, value: Value, shape: Sequence[int]) -> Value:
    """Reshape to ``(value.shape[0], *shape)`` (the batch dimension may be symbolic)."""
    if tuple(value.shape[1:]) == tuple(shape):
        return value
    return b.op1("Reshape", [value, b.int64s([0, *shape])])


def _pad_axis(b: GradBuilder, value: Value, axis: int, begin: int, end: int) -> Value:
    """Zero-pads (or, for negative amounts, crops) one axis.

    Crops are Slices: ``onnx.reference``'s Pad rejects negative pads.
    """
    if begin < 0 or end < 0:
        stop = int(value.shape[axis]) + min(end, 0)
        value = b.op1("Slice", [value, b.int64s([max(-begin, 0)]), b.int64s([stop]), b.int64s([axis])])
        begin, end = max(begin, 0), max(end, 0)
    begins, ends = [0] * value.rank, [0] * value.rank
    begins[axis], ends[axis] = begin, end
    return _pad_full(b, value, begins, ends)


def _place(b: GradBuilder, parts: dict[int, Value], axis: int, win: _Windows) -> Value:
    """Scatters window values back to input positions along one spatial axis.

    ``parts[i]`` holds, for each window ``o`` along ``axis`` (spatial axis ``axis - 2``), the value
    of kernel tap ``i``; it lands on input position ``o * stride - begin + i * dilation`` and the
    values landing on one position add up. Positions in the padding are dropped.
    """
    a = axis - 2
    stride, dilation, size, count = win.strides[a], win.dilations[a], win.sizes[a], win.outs[a]
    shape = list(parts[next(iter(parts))].shape)
    inner = [int(d) for d in shape[1:]]

    def spread(value: Value, width: int) -> Value:
        # (.., count, width, ..) -> (.., count * stride, ..): each window's width <= stride taps,
        # then zeros up to the stride.
        if stride > width:
            value = _pad_axis(b, value, axis + 1, 0, stride - width)
        return _keep_batch(b, value, inner[: axis - 1] + [count * stride] + inner[axis:])

    def frame(value: Value, first: int, length: int) -> Value | None:
        # Input positions first .. first + length - 1, cropped or zero-filled to 0 .. size - 1
        # (None when they all lie in the padding).
        if first + length <= 0 or first >= size:
            return None
        return _pad_axis(b, value, axis, first, size - first - length)

    taps = sorted(parts)
    if len(taps) > 1 and dilation == 1 and taps == list(range(taps[0], taps[-1] + 1)) and len(taps) <= stride:
        # Windows that do not overlap: interleave the taps in one Concat.
        expanded = [_keep_batch(b, parts[i], inner[: axis - 1] + [count, 1] + inner[axis:]) for i in taps]
        joined = b.op1("Concat", expanded, {"axis": axis + 1})
        placed = frame(spread(joined, len(taps)), taps[0] - win.begins[a], count * stride)
        if placed is None:
            raise GraphError(f"window taps {taps} lie in the padding of axis {axis}")
        return placed
    total = None
    for i in taps:
        value = parts[i]
        if stride > 1 and count > 1:
            value = spread(_keep_batch(b, value, inner[: axis - 1] + [count, 1] + inner[axis:]), 1)
            length = count * stride
        else:
            length = (count - 1) * stride + 1
        placed = frame(value, i * dilation - win.begins[a], length)
        if placed is not None:
            total = placed if total is None else b.add(total, placed)
    if total is None:
        raise GraphError(f"window taps {taps} lie in the padding of axis {axis}")
    return total


def _scatter_windows(b: GradBuilder, taps: dict[tuple[int, ...], Value], win: _Windows,
                     level: int = 0) -> Value:
    """Scatters per-tap window values (N, C, outs...) back to an (N, C, sizes...) gradient.

    The scatter is separable: the taps are placed along the last spatial axis first, then
    the sums along the axis before it, and so on.
    """
    if level == win.rank:
        return taps[()]
    groups: dict[int, dict[tuple[int, ...], Value]] = {}
    for tap, value in taps.items():
        groups.setdefault(tap[0], {})[tap[1:]] = value
    # Groups holding the same values (AveragePool: every tap) are scattered once.
    done: dict[tuple[tuple[tuple[int, ...], int], ...], Value] = {}
    inner = {}
    for i, group in groups.items():
        key = tuple(sorted((tap, id(value)) for tap, value in group.items()))
        if key not in done:
            done[key] = _scatter_windows(b, group, win, level + 1)
        inner[i] = done[key]
    return _place(b, inner, 2 + level, win)


def _taps(win: _Windows) -> list[tuple[int, ...]]:
    """Kernel taps in row-major order (the order ONNX Runtime scans a window in)."""
    return list(itertools.product(*(range(k) for k in win.kernel)))


@register_gradient("MaxPool")
def _max_pool(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    """Routes each window's gradient to its maximum.

    Tie rule: the gradient of a window goes to one element, the first maximum in row-major
    window order (the element ONNX Runtime's ``Indices`` output names; TensorFlow's
    ``max_pool2d`` gradient gives the same result on tied inputs); an element that is the
    maximum of several overlapping windows gets the sum. Padding never wins: it is filled
    with -inf and a constant mask of the positions inside the input is and-ed into each tap's
    hit (a NaN fill would do it alone, but TVM's simplifier folds comparisons with a NaN
    constant wrongly once the pad is inlined into them); a window whose maximum is NaN passes
    no gradient (NaN equals nothing).

    Emits Pad, Slice, Equal, And/Or/Not, Where, Reshape, Concat and Add only, so it runs for
    every dtype MaxPool does (float32 and float64 in ONNX Runtime).
    """
    x, y = node.inputs[0], node.outputs[0]
    if not _float(x) or g[0] is None:
        return [None]
    win = _windows(node, x, [int(k) for k in node.attrs["kernel_shape"]], y)
    padded = _pad_spatial(b, x, win, float("-inf"))
    inside = _inside_mask(win)
    zero = b.const(0, g[0].dtype)
    taken: Value | None = None
    taps = _taps(win)
    parts: dict[tuple[int, ...], Value] = {}
    for index, tap in enumerate(taps):
        hit = b.op1("Equal", [_window_tap(b, padded, win, tap), y])
        tap_inside = _mask_tap(inside, win, tap)
        if not tap_inside.all():
            hit = b.op1("And", [hit, b.const(tap_inside, np.bool_)])
        first = hit if taken is None else b.op1("And", [hit, b.op1("Not", [taken])])
        if index < len(taps) - 1:
            taken = hit if taken is None else b.op1("Or", [taken, hit])
        parts[tap] = b.op1("Where", [first, g[0], zero])
    return [_scatter_windows(b, parts, win)]


@register_gradient("AveragePool")
def _average_pool(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    """Spreads each window's gradient evenly over the elements it averaged.

    The divisor of each window is computed when the rule runs, as AveragePool does: with
    ``count_include_pad=0`` the window's elements inside the input, with ``count_include_pad=1``
    also those in the pads (explicit or auto_pad), never the positions a ``ceil_mode`` window
    reaches beyond the end pad. Emits Mul, Reshape, Pad, Concat and Add (dtype-agnostic).
    """
    x, y = node.inputs[0], node.outputs[0]
    if not _float(x) or g[0] is None:
        return [None]
    win = _windows(node, x, [int(k) for k in node.attrs["kernel_shape"]], y)
    include_pad = bool(node.attrs.get("count_include_pad", 0))
    counts = np.ones((1, 1), np.float64)
    for a in range(win.rank):
        low, high = (-win.begins[a], win.sizes[a] + win.ends[a]) if include_pad else (0, win.sizes[a])
        starts = np.arange(win.outs[a]) * win.strides[a] - win.begins[a]
        positions = starts[:, None] + np.arange(win.kernel[a])[None, :] * win.dilations[a]
        per_axis = ((positions >= low) & (positions < high)).sum(axis=1)
        counts = np.multiply.outer(counts, per_axis).reshape(1, 1, *counts.shape[2:], win.outs[a])
    scaled = b.mul(g[0], b.const(1.0 / np.maximum(counts, 1), x.dtype))
    return [_scatter_windows(b, {tap: scaled for tap in _taps(win)}, win)]


def _conv_weight_grad(b: GradBuilder, x: Value, grad: Value, weight: Value, win: _Windows, group: int) -> Value:
    """d(sum(Conv(x, W) * grad))/dW by im2col, for ``x`` (N, C, sizes...) and ``grad``
    (N, O, outs...); the result has ``weight``'s shape (O, C/group, kernel...).

    With a static batch: x moved to (group, spatial..., N, C/group), padded, flattened to
    (group, positions, N * C/group) and one ``Gather`` of every window's positions gives the
    columns (group, taps, outs * N, C/group); one batched MatMul with the gradient (group, 1,
    O/group, outs * N) contracts windows and batch at once. Each gathered row is a contiguous
    block of N * C/group values. Emits Reshape, Transpose, Pad, Gather and MatMul: float32 and
    float64. The batch dimension must be static (as everywhere in autodiff: the seed gradient
    is a constant of the target's shape).

    In ONNX Runtime 1.31 on the CPU (one thread), for x (64, 16, 8, 8) and W (32, 16, 3, 3),
    SAME: 0.71-0.81 ms, about the forward Conv's time (0.68-0.78 ms), against 1.0-1.6 ms for
    the Slice + Concat im2col and 1.7-2.6 ms for a Conv treating N as the channels; at stride 2
    0.20 ms against 0.56-0.66 and 0.51-0.72 ms.
    """
    batch = x.shape[0]
    if not isinstance(batch, int):
        raise GraphError(f"cannot differentiate a convolution of {x.type_str()}: the batch dimension must be static")
    channels, out_channels = int(x.shape[1]), int(grad.shape[1])
    per_group, out_per_group = channels // group, out_channels // group
    rank = win.rank
    taps = _taps(win)
    length = int(np.prod(win.outs, dtype=np.int64))
    moved = b.reshape(x, (batch, group, per_group, *win.sizes))
    moved = b.op1("Transpose", [moved], {"perm": [1, *range(3, 3 + rank), 0, 2]})  # (G, sizes..., N, C/G)
    padded = _pad_full(b, moved, [0, *win.begins, 0, 0], [0, *(win.reach(a) for a in range(rank)), 0, 0])
    padded_sizes = [int(d) for d in padded.shape[1:1 + rank]]
    positions = int(np.prod(padded_sizes, dtype=np.int64))
    flat = b.reshape(padded, (group, positions, batch * per_group))
    # Flat position of (tap, window) in the padded image, taps major.
    index = np.zeros((len(taps), *win.outs), np.int64)
    for t, tap in enumerate(taps):
        coords = np.meshgrid(*(np.arange(o) * s + i * d for o, s, i, d
                               in zip(win.outs, win.strides, tap, win.dilations)), indexing="ij")
        index[t] = np.ravel_multi_index(coords, padded_sizes)
    columns = b.op1("Gather", [flat, b.int64s(index.reshape(-1))], {"axis": 1})  # (G, taps * L, N * C/G)
    columns = b.reshape(columns, (group, len(taps), length * batch, per_group))
    moved_grad = b.reshape(grad, (batch, group, out_per_group, length))
    moved_grad = b.op1("Transpose", [moved_grad], {"perm": [1, 2, 3, 0]})  # (G, O/G, L, N)
    moved_grad = b.reshape(moved_grad, (group, 1, out_per_group, length * batch))
    product = b.op1("MatMul", [moved_grad, columns])  # (G, taps, O/G, C/G)
    product = b.op1("Transpose", [product], {"perm": [0, 2, 3, 1]})  # (G, O/G, C/G, taps)
    return b.reshape(product, weight.shape)


def _conv_input_grad(b: GradBuilder, grad: Value, weight: Value, win: _Windows, group: int) -> Value:
    """d(sum(Conv(x, W) * grad))/dx by col2im, the adjoint of :func:`_conv_weight_grad`.

    One batched MatMul gives every window's column (N, C, taps, L); each tap's slice is
    scattered back to the input positions it read (:func:`_scatter_windows`). Emits Reshape,
    Transpose, MatMul, Split, Pad, Slice, Concat and Add: any dtype.
    """
    out_channels, per_group = int(weight.shape[0]), int(weight.shape[1])
    taps = _taps(win)
    length = int(np.prod(win.outs, dtype=np.int64))
    kernel = b.reshape(weight, (group, out_channels // group, per_group * len(taps)))
    kernel = b.op1("Transpose", [kernel], {"perm": [0, 2, 1]})  # (G, C/G * taps, O/G)
    grad = _keep_batch(b, grad, (group, out_channels // group, length))
    columns = b.op1("MatMul", [kernel, grad])  # (N, G, C/G * taps, L)
    columns = _keep_batch(b, columns, (group * per_group, len(taps), length))
    pieces = [columns] if len(taps) == 1 else b.op("Split", [columns, b.int64s([1] * len(taps))], {"axis": 2},
                                                    num_outputs=len(taps))
    parts = {tap: _keep_batch(b, piece, (group * per_group, *win.outs)) for tap, piece in zip(taps, pieces)}
    return _scatter_windows(b, parts, win)


def _bias_grad(b: GradBuilder, grad: Value) -> Value:
    return b.reduce_sum(grad, [0] + list(range(2, grad.rank)), keepdims=False)


@register_gradient("Conv")
def _conv(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    """Gradients of Conv (any number of spatial axes; strides, pads, auto_pad, dilations, group, bias).

    * input, ``group == 1``: ``ConvTranspose`` of the output gradient with the same weights,
      strides, pads and dilations, and the ``output_padding`` that gives back the input size.
      The fastest option measured in ONNX Runtime 1.31 on the CPU for x (64, 16, 8, 8) and
      W (32, 16, 3, 3), SAME: 0.81-0.84 ms (one thread) against 1.38-1.43 ms for a Conv of the
      flipped, transposed weights; col2im made the whole step 1.5x (stride 1) to 3.8x
      (stride 2) slower;
    * input, ``group > 1``: col2im (:func:`_conv_input_grad`), because ``onnx.reference``'s
      grouped ``ConvTranspose`` is wrong (onnx 1.23: it slices the weights by output channel);
    * weights: im2col (:func:`_conv_weight_grad`);
    * bias: ``ReduceSum`` over the batch and spatial axes.

    ONNX Runtime's CPU provider has ``ConvTranspose`` (like ``Conv``) only in float32, so the
    input gradient of an ungrouped Conv runs in float32 only there. That is enough: float64
    ``Conv`` nodes never reach ONNX Runtime, as :func:`graphdist.trace.nn.conv2d` emits its
    im2col composite for float64 (the ``reference`` backend runs both dtypes).
    """
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    grad, y = g[0], node.outputs[0]
    win = _windows(node, x, w.shape[2:], y)
    group = int(node.attrs.get("group", 1))
    output_padding = [size + begin + end - (o - 1) * s - (k - 1) * d - 1 for size, begin, end, o, s, k, d
                      in zip(win.sizes, win.begins, win.ends, win.outs, win.strides, win.kernel, win.dilations)]
    attrs = {"kernel_shape": win.kernel, "strides": win.strides, "dilations": win.dilations,
             "pads": win.begins + win.ends, "group": group}
    if any(output_padding):
        attrs["output_padding"] = output_padding
    if group == 1:
        gx = b.op1("ConvTranspose", [grad, w], attrs)
    else:
        gx = _conv_input_grad(b, grad, w, win, group)
    gw = _conv_weight_grad(b, x, grad, w, win, group)
    grads: list[Value | None] = [gx, gw]
    if len(node.inputs) > 2:
        grads.append(None if bias is None else _bias_grad(b, grad))
    return grads


@register_gradient("ConvTranspose")
def _conv_transpose(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    """Gradients of ConvTranspose, the adjoint of Conv with the same weights and geometry.

    Input: ``Conv`` of the output gradient (cropped when ``output_padding`` adds a window);
    weights: the Conv weight gradient with the roles of input and output swapped; bias:
    ``ReduceSum``. Only explicit ``pads`` (or VALID) without ``output_shape`` are supported.
    Float32 only in ONNX Runtime (no float64 Conv there).
    """
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    grad, y = g[0], node.outputs[0]
    if _str_attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID") or node.attrs.get("output_shape"):
        raise GraphError(f"cannot differentiate through ConvTranspose ({node.name}) with auto_pad SAME or "
                         "output_shape: give explicit pads and output_padding")
    # ConvTranspose(x) maps like the transpose of a Conv from y's sizes to x's sizes.
    rank = x.rank - 2
    pads = [0] * 2 * rank if _str_attr(node, "auto_pad", "NOTSET") == "VALID" else \
        [int(p) for p in node.attrs.get("pads") or [0] * 2 * rank]
    strides = [int(v) for v in node.attrs.get("strides") or [1] * rank]
    dilations = [int(v) for v in node.attrs.get("dilations") or [1] * rank]
    kernel = [int(k) for k in w.shape[2:]]
    sizes = _static(node, "spatial output", y.shape[2:])
    in_sizes = _static(node, "spatial input", x.shape[2:])
    # The windows of that Conv; an output_padding >= stride (allowed when dilation > stride)
    # adds windows at the end that no input element maps to.
    outs = [(size + pads[a] + pads[rank + a] - (k - 1) * d - 1) // s + 1
            for a, (size, k, d, s) in enumerate(zip(sizes, kernel, dilations, strides))]
    win = _Windows(kernel, strides, dilations, pads[:rank], pads[rank:], sizes, in_sizes)
    group = int(node.attrs.get("group", 1))
    gx = b.op1("Conv", [grad, w], {"kernel_shape": kernel, "strides": strides, "dilations": dilations,
                                   "pads": pads, "group": group})
    if outs != in_sizes:
        axes = list(range(2, 2 + rank))
        gx = b.op1("Slice", [gx, b.int64s([0] * rank), b.int64s(in_sizes), b.int64s(axes)])
    gw = _conv_weight_grad(b, grad, x, w, win, group)
    grads: list[Value | None] = [gx, gw]
    if len(node.inputs) > 2:
        grads.append(None if bias is None else _bias_grad(b, grad))
    return grads


@register_gradient("StopGradient", GRAPHDIST_DOMAIN)
def _stop_gradient(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [None]
