"""Which ops compute each example's rows from that example's rows alone, and where the examples lie after them.

``ChunkBatchReductionsPass`` keeps such *row-wise* ops on a replica's whole
batch and cuts only what mixes examples. A value's *row layout* is the axis
along which the examples lie, in order and contiguous (each example
occupies ``size / batch`` consecutive entries of that axis), so that the
rows of examples ``[i, j)`` are one ``Slice`` of that axis. An op is
row-wise here when, given the layouts of its inputs, every output has a
layout and its entries of example ``e`` are computed from the entries of
example ``e`` only, by the same arithmetic whatever the number of examples:

* elementwise ops (with broadcasting from inputs that do not depend on the
  batch): the examples stay on the broadcast axis;
* ``MatMul`` with the batch as rows of the left operand, or on a leading
  (batched-matrix) axis of both, ``Gemm`` with the batch as rows of ``A``;
* ``Conv``, ``ConvTranspose`` and pooling with the batch as axis 0 and weights
  that do not depend on the batch;
* ``Softmax``, ``LogSoftmax``, ``LayerNormalization`` and reductions over
  axes other than the batch's; ``Transpose``, ``Reshape`` that keeps examples
  contiguous, ``Unsqueeze`` / ``Squeeze`` of other axes, ``Gather`` of
  indices that depend on the batch from a table that does not.

Anything else (sums over the batch, ``Shape``, ops not listed) is not
row-wise: :func:`row_layouts` returns ``None`` and the caller computes it per
chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node, Value

__all__ = ["row_layouts", "ELEMENTWISE"]

#: Ops whose output entry depends only on the input entries at the same (broadcast) position.
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Not", "Xor", "Relu", "Exp", "Log", "Tanh", "Sigmoid", "Neg", "Sqrt",
    "Reciprocal", "Abs", "Erf", "Cast", "Identity", "Softplus", "LeakyRelu", "Clip", "Sign", "Floor", "Ceil",
    "Round", "Elu", "Selu", "HardSigmoid", "Mod", "IsNaN", "IsInf", "Sin", "Cos",
})
_POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool"})
_ROW_NORMS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization"})
_REDUCES = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
                      "ReduceSumSquare", "ReduceLogSumExp"})
#: graphdist ops that pass their input through unchanged, checking it.
_CHECKS = frozenset({"CheckIndices", "AssertInRange"})


def row_layouts(node: Node, layout: dict[int, int], batch: int) -> list[int] | None:
    """The row layout (batch axis) of each output of ``node``, or ``None`` when it is not row-wise.

    Args:
        node: The node, reading at least one value with a row layout.
        layout: ``id(value) -> axis`` for the values whose examples lie along ``axis``; a value not in it does
            not depend on the batch.
        batch: Examples in the batch.
    """
    axes = [layout.get(id(v)) if v is not None else None for v in node.inputs]
    if node.domain == GRAPHDIST_DOMAIN:
        return [axes[0]] if node.op_type in _CHECKS and axes[0] is not None and len(node.outputs) == 1 else None
    if node.domain != "" or any(out.shape is None for out in node.outputs):
        return None
    rule = _RULES.get(node.op_type)
    if rule is None and node.op_type in ELEMENTWISE:
        rule = _elementwise
    if rule is None:
        return None
    try:
        axis = rule(node, axes, batch)
    except (TypeError, ValueError, IndexError):
        return None
    if axis is None or not _examples_fit(node.outputs[0], axis, batch):
        return None
    return [axis] * len(node.outputs)


def _examples_fit(value: Value, axis: int, batch: int) -> bool:
    return value.shape is not None and 0 <= axis < len(value.shape) and int(value.shape[axis]) % batch == 0 \
        and int(value.shape[axis]) > 0


def _elementwise(node: Node, axes: list[int | None], batch: int) -> int | None:
    rank = len(node.outputs[0].shape)
    out_axis = None
    out = node.outputs[0].shape
    for value, axis in zip(node.inputs, axes):
        if value is None:
            continue
        shift = rank - len(value.shape)
        if axis is not None:
            if out_axis not in (None, axis + shift) or int(value.shape[axis]) != int(out[axis + shift]):
                return None  # two batch operands on different axes, or one broadcast along the batch
            out_axis = axis + shift
    for value, axis in zip(node.inputs, axes):
        if value is None or axis is not None:
            continue
        shift = rank - len(value.shape)
        position = out_axis - shift
        if 0 <= position < len(value.shape) and int(value.shape[position]) != 1:
            return None  # a batch-sized operand that is not laid out by example (a batch-size constant)
    return out_axis


def _matmul(node: Node, axes: list[int | None], batch: int) -> int | None:
    (a, b), (a_axis, b_axis) = node.inputs[:2], axes[:2]
    if a is None or b is None or len(a.shape) < 2 or len(b.shape) < 2:
        return None
    rank = len(node.outputs[0].shape)
    if b_axis is None:
        # rows of A (axis -2), or a leading batched-matrix axis of A, never the contracted axis -1
        return a_axis + rank - len(a.shape) if a_axis is not None and a_axis < len(a.shape) - 1 else None
    if a_axis is None or a_axis >= len(a.shape) - 2 or b_axis >= len(b.shape) - 2:
        return None
    out_a, out_b = a_axis + rank - len(a.shape), b_axis + rank - len(b.shape)
    return out_a if out_a == out_b and int(a.shape[a_axis]) == int(b.shape[b_axis]) else None


def _gemm(node: Node, axes: list[int | None], batch: int) -> int | None:
    if axes[0] != (1 if node.attrs.get("transA", 0) else 0) or any(a is not None for a in axes[1:]):
        return None
    return 0 if not node.attrs.get("transA", 0) and _broadcast_free(node, 2) else None


def _broadcast_free(node: Node, index: int) -> bool:
    """Gemm's ``C`` broadcasts along the rows (it has one row, or none)."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return True
    shape = node.inputs[index].shape
    return len(shape) < 2 or int(shape[0]) == 1


def _per_image(node: Node, axes: list[int | None], batch: int) -> int | None:
    if axes[0] != 0 or any(a is not None for a in axes[1:]):
        return None
    return 0


def _row_norm(node: Node, axes: list[int | None], batch: int) -> int | None:
    if axes[0] is None or any(a is not None for a in axes[1:]):
        return None
    rank = len(node.inputs[0].shape)
    axis = int(node.attrs.get("axis", -1)) % rank
    # LayerNormalization (and Softmax before opset 13) normalizes over ``axis`` and every axis after it
    return axes[0] if axes[0] < axis else None


def _reduce(node: Node, axes: list[int | None], batch: int) -> int | None:
    if axes[0] is None or any(a is not None for a in axes[1:]):
        return None
    rank = len(node.inputs[0].shape)
    reduced = _constant_ints(node, "axes", 1)
    if reduced is None:
        return None  # all axes, the batch's among them
    reduced = sorted(int(a) % rank for a in reduced)
    if not reduced and node.attrs.get("noop_with_empty_axes", 0):
        return axes[0]
    if not reduced or axes[0] in reduced:
        return None
    keep = node.attrs.get("keepdims", 1)
    return axes[0] if keep else axes[0] - sum(1 for a in reduced if a < axes[0])


def _expand(node: Node, axes: list[int | None], batch: int) -> int | None:
    if axes[0] is None or axes[1] is not None:
        return None
    axis = axes[0] + len(node.outputs[0].shape) - len(node.inputs[0].shape)
    return axis if int(node.inputs[0].shape[axes[0]]) == int(node.outputs[0].shape[axis]) else None


def _concat(node: Node, axes: list[int | None], batch: int) -> int | None:
    """Along another axis than the batch's, of operands all laid out on it (or batch-sized on it)."""
    laid = {a for a in axes if a is not None}
    if len(laid) != 1:
        return None
    axis = laid.pop()
    rank = len(node.outputs[0].shape)
    size = int(node.outputs[0].shape[axis])
    if int(node.attrs.get("axis", 0)) % rank == axis:
        return None
    if any(a is None and int(v.shape[axis]) != size for v, a in zip(node.inputs, axes) if v is not None):
        return None
    return axis


def _pad(node: Node, axes: list[int | None], batch: int) -> int | None:
    """Padding of other axes than the batch's (constant pads)."""
    if axes[0] is None or any(a is not None for a in axes[1:]) or node.attrs.get("mode", "constant") != "constant":
        return None
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return None  # pads of some axes only
    pads = _constant_ints(node, "pads", 1)
    rank = len(node.inputs[0].shape)
    if pads is None or len(pads) != 2 * rank or pads[axes[0]] or pads[axes[0] + rank]:
        return None
    return axes[0]


def _slice(node: Node, axes: list[int | None], batch: int) -> int | None:
    """A Slice of other axes than the batch's."""
    if axes[0] is None or any(a is not None for a in axes[1:]):
        return None
    rank = len(node.inputs[0].shape)
    sliced = _constant_ints(node, "axes", 3)
    sliced = list(range(len(_constant_ints(node, "starts", 1) or []))) if sliced is None else sliced
    return None if axes[0] in [int(a) % rank for a in sliced] else axes[0]


def _transpose(node: Node, axes: list[int | None], batch: int) -> int | None:
    rank = len(node.inputs[0].shape)
    perm = [int(p) for p in node.attrs.get("perm", list(range(rank))[::-1])]
    return perm.index(axes[0]) if axes[0] is not None else None


def _reshape(node: Node, axes: list[int | None], batch: int) -> int | None:
    """The examples stay contiguous: the entries before the batch axis stay before the new one, and each example's
    entries fill whole entries of the new axis.
    """
    if axes[0] is None or axes[1] is not None:
        return None
    src, dst = [int(d) for d in node.inputs[0].shape], [int(d) for d in node.outputs[0].shape]
    outer = int(np.prod(src[:axes[0]], dtype=np.int64))
    per_example = int(np.prod(src[axes[0]:], dtype=np.int64)) // batch
    product = 1
    for position, dim in enumerate(dst):
        if product == outer:
            inner = int(np.prod(dst[position + 1:], dtype=np.int64))
            if dim % batch == 0 and per_example % inner == 0 and dim * inner == per_example * batch:
                return position
        product *= dim
        if product > outer:
            return None
    return None


def _unsqueeze(node: Node, axes: list[int | None], batch: int) -> int | None:
    if axes[0] is None or any(a is not None for a in axes[1:]):
        return None
    added = _constant_ints(node, "axes", 1)
    if added is None:
        return None
    rank = len(node.outputs[0].shape)
    added = sorted(int(a) % rank for a in added)
    kept = [p for p in range(rank) if p not in added]
    return kept[axes[0]]


def _squeeze(node: Node, axes: list[int | None], batch: int) -> int | None:
    if axes[0] is None or any(a is not None for a in axes[1:]):
        return None
    removed = _constant_ints(node, "axes", 1)
    rank = len(node.inputs[0].shape)
    if removed is None:
        removed = [p for p, d in enumerate(node.inputs[0].shape) if int(d) == 1]
    removed = sorted(int(a) % rank for a in removed)
    return None if axes[0] in removed else axes[0] - sum(1 for a in removed if a < axes[0])


def _gather(node: Node, axes: list[int | None], batch: int) -> int | None:
    data_axis, index_axis = axes[0], axes[1]
    if data_axis is not None or index_axis is None:
        return None
    return int(node.attrs.get("axis", 0)) % len(node.inputs[0].shape) + index_axis


def _constant_ints(node: Node, attr: str, index: int) -> list[int] | None:
    """An axes operand: the attribute, or a constant input; ``None`` when absent or not constant."""
    if attr in node.attrs:
        return [int(a) for a in np.atleast_1d(node.attrs[attr])]
    if len(node.inputs) > index and node.inputs[index] is not None:
        const: Any = node.inputs[index].const_value
        if const is not None:
            return [int(a) for a in np.atleast_1d(np.asarray(const))]
        raise ValueError("axes not constant")
    return None


_RULES = {
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _per_image, "ConvTranspose": _per_image,
    **{op: _per_image for op in _POOLS}, **{op: _row_norm for op in _ROW_NORMS}, **{op: _reduce for op in _REDUCES},
    "Transpose": _transpose, "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Gather": _gather,
    "Expand": _expand, "Concat": _concat, "Pad": _pad, "Slice": _slice,
}
