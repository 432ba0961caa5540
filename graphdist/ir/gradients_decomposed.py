"""Gradients by decomposition: the recurrent ops LSTM, GRU and RNN, and GroupNormalization and
MeanVarianceNormalization.

A rule here re-computes the node's outputs with primitive ops (a recurrence unrolled over the
static sequence length, with MatMul, Slice, Sigmoid, Tanh, Mul, Add, Concat), then back-propagates
the output gradients through those ops with their own rules (:func:`backprop_through`): so the
gradient is exactly the composition of rules each checked on its own, with no hand-written BPTT.
The re-computation costs one extra forward pass of the node.

Recurrent forms with a rule: ``layout=0``; default activations; no ``clip``; LSTM without ``input_forget``;
no ``sequence_lens`` (every sequence full length); any direction, biases, initial states and LSTM
peepholes. Another form raises :class:`~graphdist.errors.GraphError` naming what is missing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir import nn_ops  # noqa: F401 - hand-written OpDefs first: a rule goes on the OpDef when there is one
from graphdist.ir.gradients import GradBuilder, GradRule, gradient_rule, register_gradient
from graphdist.ir.graph import Node, Value

__all__ = ["backprop_through"]

Grads = list[Value | None]

_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def backprop_through(b: GradBuilder, nodes: list[Node], outputs: list[Value | None], grads: Grads,
                     sources: list[Value | None]) -> Grads:
    """Reverse-mode gradients of ``sources`` through ``nodes`` (emitted by ``b``, in order), given the
    gradients ``grads`` of ``outputs``; ``None`` where no gradient reaches a source.
    """
    accumulated: dict[int, Value] = {}
    for value, grad in zip(outputs, grads):
        if value is not None and grad is not None:
            accumulated[id(value)] = grad
    for node in reversed(nodes):
        output_grads = [accumulated.get(id(v)) for v in node.outputs]
        if all(g is None for g in output_grads):
            continue
        rule = gradient_rule(node)
        if rule is None:
            raise GraphError(f"internal: the decomposition emitted {node.op_type}, which has no gradient rule")
        for value, grad in zip(node.inputs, rule(b, node, output_grads)):
            if value is None or grad is None or value.dtype.kind != "f":
                continue
            previous = accumulated.get(id(value))
            accumulated[id(value)] = grad if previous is None else b.add(previous, grad)
    return [None if s is None else accumulated.get(id(s)) for s in sources]


# ----------------------------------------------------------------- helpers
def _present(node: Node, index: int) -> Value | None:
    value = node.inputs[index] if index < len(node.inputs) else None
    return None if value is None or value.name == "" else value


def _check_form(node: Node) -> None:
    """Raises for the forms without a rule (see the module docstring)."""
    what = f"cannot differentiate through {node.op_type} ({node.name})"
    activations = node.attrs.get("activations")
    if activations is not None:
        names = [a.decode() if isinstance(a, bytes) else str(a) for a in activations]
        default = _DEFAULT_ACTIVATIONS[node.op_type]
        if [n.lower() for n in names] not in ([d.lower() for d in default], [d.lower() for d in default * 2]):
            raise GraphError(f"{what} with activations {names}: only the defaults {default} have a gradient rule")
    for name in ("clip", "input_forget", "layout"):
        if node.attrs.get(name):
            raise GraphError(f"{what} with {name}={node.attrs[name]}: no gradient rule for that form")
    if _present(node, 4) is not None and node.inputs[4].const_value is None:
        raise GraphError(f"{what} with sequence_lens: no gradient rule (every sequence must be full length)")
    if not all(isinstance(d, int) for d in node.inputs[0].shape):
        raise GraphError(f"{what}: the input's shape {node.inputs[0].shape} must be static (the recurrence is "
                         "unrolled over its sequence length)")
    if _present(node, 4) is not None and np.any(np.asarray(node.inputs[4].const_value) != node.inputs[0].shape[0]):
        raise GraphError(f"{what} with sequence_lens shorter than the sequence: no gradient rule")


class _Unroller:
    """Emits one direction of a recurrence, keeping the ops it emits."""

    def __init__(self, b: GradBuilder, node: Node) -> None:
        self.b, self.node = b, node
        self.start = len(b.created)
        self.x = node.inputs[0]
        self.seq, self.batch = int(self.x.shape[0]), int(self.x.shape[1])
        self.hidden = int(node.attrs["hidden_size"])

    def op(self, op_type: str, inputs: list[Value], attrs: dict | None = None) -> Value:
        return self.b.op1(op_type, inputs, attrs)

    def take(self, value: Value, axis: int, start: int, stop: int) -> Value:
        """``value[start:stop]`` along ``axis``."""
        b = self.b
        return self.op("Slice", [value, b.int64s([start]), b.int64s([stop]), b.int64s([axis])])

    def direction(self, value: Value | None, d: int) -> Value | None:
        """``value[d]`` of a per-direction input (dropping the direction axis)."""
        if value is None:
            return None
        part = self.take(value, 0, d, d + 1)
        return self.b.reshape(part, [int(s) for s in value.shape[1:]])

    def gate(self, value: Value, index: int) -> Value:
        """The ``index``-th block of ``hidden`` on the last axis."""
        return self.take(value, value.rank - 1, index * self.hidden, (index + 1) * self.hidden)

    def state(self, initial: Value | None, d: int) -> Value:
        if initial is None:
            return self.b.const(np.zeros((self.batch, self.hidden), self.x.dtype), self.x.dtype)
        return self.direction(initial, d)

    def transposed(self, matrix: Value) -> Value:
        return self.op("Transpose", [matrix], {"perm": [1, 0]})

    def projections(self, w: Value, bias: Value | None, count: int) -> tuple[Value, Value | None]:
        """``X @ W^T (+ Wb)`` for every step at once (seq, batch, count * hidden), and the ``Rb`` half of ``bias``."""
        projected = self.op("MatMul", [self.x, self.transposed(w)])
        if bias is None:
            return projected, None
        projected = self.b.add(projected, self.take(bias, 0, 0, count * self.hidden))
        return projected, self.take(bias, 0, count * self.hidden, 2 * count * self.hidden)

    def step_input(self, projected: Value, t: int) -> Value:
        width = int(projected.shape[-1])
        return self.b.reshape(self.take(projected, 0, t, t + 1), [self.batch, width])

    def order(self, d: int) -> list[int]:
        direction = self.node.attrs.get("direction", "forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        backward = direction == "reverse" or (direction == "bidirectional" and d == 1)
        return list(range(self.seq))[::-1] if backward else list(range(self.seq))

    def stacked(self, states: dict[int, Value]) -> Value:
        """(seq, 1, batch, hidden): the per-step states in time order."""
        pieces = [self.b.reshape(states[t], [1, 1, self.batch, self.hidden]) for t in range(self.seq)]
        return pieces[0] if len(pieces) == 1 else self.op("Concat", pieces, {"axis": 0})


def _lstm_direction(u: _Unroller, d: int) -> tuple[Value, Value, Value]:
    b, node = u.b, u.node
    w, r = u.direction(node.inputs[1], d), u.direction(node.inputs[2], d)
    projected, recurrent_bias = u.projections(w, u.direction(_present(node, 3), d), 4)
    peephole = u.direction(_present(node, 7), d)
    h, c = u.state(_present(node, 5), d), u.state(_present(node, 6), d)
    r_t = u.transposed(r)
    states = {}
    for t in u.order(d):
        gates = b.add(u.step_input(projected, t), u.op("MatMul", [h, r_t]))
        if recurrent_bias is not None:
            gates = b.add(gates, recurrent_bias)
        i, o, f, cell = (u.gate(gates, k) for k in range(4))  # ONNX's order: input, output, forget, cell
        if peephole is not None:
            i = b.add(i, b.mul(u.gate(peephole, 0), c))
            f = b.add(f, b.mul(u.gate(peephole, 2), c))
        c = b.add(b.mul(u.op("Sigmoid", [f]), c), b.mul(u.op("Sigmoid", [i]), u.op("Tanh", [cell])))
        if peephole is not None:
            o = b.add(o, b.mul(u.gate(peephole, 1), c))
        h = b.mul(u.op("Sigmoid", [o]), u.op("Tanh", [c]))
        states[t] = h
    return u.stacked(states), h, c


def _gru_direction(u: _Unroller, d: int) -> tuple[Value, Value]:
    b, node = u.b, u.node
    w, r = u.direction(node.inputs[1], d), u.direction(node.inputs[2], d)
    projected, recurrent_bias = u.projections(w, u.direction(_present(node, 3), d), 3)
    h = u.state(_present(node, 5), d)
    r_z, r_r, r_h = (u.transposed(u.take(r, 0, k * u.hidden, (k + 1) * u.hidden)) for k in range(3))
    before_reset = bool(node.attrs.get("linear_before_reset", 0))
    one = b.const(1.0, u.x.dtype)
    rb = [None if recurrent_bias is None else u.gate(recurrent_bias, k) for k in range(3)]

    def recurrent(matrix: Value, state: Value, k: int) -> Value:
        product = u.op("MatMul", [state, matrix])
        return product if rb[k] is None else b.add(product, rb[k])

    states = {}
    for t in u.order(d):
        step = u.step_input(projected, t)
        z = u.op("Sigmoid", [b.add(u.gate(step, 0), recurrent(r_z, h, 0))])
        reset = u.op("Sigmoid", [b.add(u.gate(step, 1), recurrent(r_r, h, 1))])
        if before_reset:
            candidate = b.add(u.gate(step, 2), b.mul(reset, recurrent(r_h, h, 2)))
        else:
            candidate = b.add(u.gate(step, 2), recurrent(r_h, b.mul(reset, h), 2))
        candidate = u.op("Tanh", [candidate])
        h = b.add(b.mul(u.op("Sub", [one, z]), candidate), b.mul(z, h))
        states[t] = h
    return u.stacked(states), h


def _rnn_direction(u: _Unroller, d: int) -> tuple[Value, Value]:
    b, node = u.b, u.node
    w, r = u.direction(node.inputs[1], d), u.direction(node.inputs[2], d)
    projected, recurrent_bias = u.projections(w, u.direction(_present(node, 3), d), 1)
    h = u.state(_present(node, 5), d)
    r_t = u.transposed(r)
    states = {}
    for t in u.order(d):
        total = b.add(u.step_input(projected, t), u.op("MatMul", [h, r_t]))
        h = u.op("Tanh", [total if recurrent_bias is None else b.add(total, recurrent_bias)])
        states[t] = h
    return u.stacked(states), h


_DIRECTIONS = {"LSTM": _lstm_direction, "GRU": _gru_direction, "RNN": _rnn_direction}


def _directions(node: Node) -> int:
    direction = node.attrs.get("direction", "forward")
    return 2 if (direction.decode() if isinstance(direction, bytes) else direction) == "bidirectional" else 1


def _rnn_rule(b: GradBuilder, node: Node, g: Grads) -> Grads:
    _check_form(node)
    u = _Unroller(b, node)
    per_direction = [_DIRECTIONS[node.op_type](u, d) for d in range(_directions(node))]
    recomputed = []
    for position, axis in enumerate((1, 0, 0)[: len(per_direction[0])]):
        parts = [outputs[position] for outputs in per_direction]
        if position > 0:  # Y_h, Y_c: (directions, batch, hidden)
            parts = [b.reshape(p, [1, u.batch, u.hidden]) for p in parts]
        recomputed.append(parts[0] if len(parts) == 1 else b.op1("Concat", parts, {"axis": axis}))
    emitted = b.created[u.start:]
    return backprop_through(b, emitted, recomputed, list(g[: len(recomputed)]), list(node.inputs))


register_gradient("LSTM", since=7)(_rnn_rule)
register_gradient("GRU", since=7)(_rnn_rule)
register_gradient("RNN", since=7)(_rnn_rule)


# ------------------------------------------------- normalisations, by decomposition
def _normalized(b: GradBuilder, x: Value, axes: list[int], epsilon: float) -> Value:
    """``(x - mean) / sqrt(var + epsilon)`` over ``axes`` (population variance)."""
    def mean(value: Value) -> Value:
        return b.op1("ReduceMean", [value, b.int64s(axes)], {"keepdims": 1})

    centered = b.op1("Sub", [x, mean(x)])
    variance = mean(b.mul(centered, centered))
    return b.op1("Div", [centered, b.op1("Sqrt", [b.add(variance, b.const(epsilon, x.dtype))])])


def _decomposed(build: Callable[[GradBuilder, Node], list[Value]]) -> GradRule:
    """A rule that re-computes the node's outputs with ``build`` and back-propagates through that."""
    def rule(b: GradBuilder, node: Node, g: Grads) -> Grads:
        start = len(b.created)
        outputs = build(b, node)
        return backprop_through(b, b.created[start:], outputs, list(g[: len(outputs)]), list(node.inputs))

    return rule


def _mean_variance_normalization(b: GradBuilder, node: Node) -> list[Value]:
    x = node.inputs[0]
    axes = [int(a) % x.rank for a in node.attrs.get("axes", [0, 2, 3])]
    return [_normalized(b, x, axes, 1e-9)]  # ONNX's function body adds 1e-9 to the variance


def _group_normalization(b: GradBuilder, node: Node) -> list[Value]:
    """Opset 18 (``scale``/``bias`` per group) and 21 (per channel): the channels in ``num_groups`` groups."""
    x, scale, bias = node.inputs
    if not all(isinstance(d, int) for d in x.shape):
        raise GraphError(f"cannot differentiate through GroupNormalization ({node.name}): the input's shape "
                         f"{x.shape} must be static")
    shape = [int(d) for d in x.shape]
    groups = int(node.attrs["num_groups"])
    grouped = b.reshape(x, [shape[0], groups, int(np.prod(shape[1:])) // groups])
    normalized = _normalized(b, grouped, [2], float(node.attrs.get("epsilon", 1e-5)))
    if int(scale.shape[0]) == groups and groups != shape[1]:  # the opset-18 form: one scale per group
        layout = [1, groups, 1]
    else:
        normalized = b.reshape(normalized, shape)
        layout = [1, shape[1]] + [1] * (len(shape) - 2)
    y = b.add(b.mul(normalized, b.reshape(scale, layout)), b.reshape(bias, layout))
    return [b.reshape(y, shape)]


register_gradient("MeanVarianceNormalization", since=13)(_decomposed(_mean_variance_normalization))
register_gradient("GroupNormalization", since=18)(_decomposed(_group_normalization))
