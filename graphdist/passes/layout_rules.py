"""The layout rules of :class:`graphdist.passes.propagate_layouts.PropagateLayoutsPass`, one per op family.

A rule takes a node and its inputs' layouts and returns the layout it reads
each input in and the layouts of its outputs (a :data:`Rule`), or ``None``
when it does not apply (the node then reads its inputs whole:
:func:`replicated_rule`). The pass's docstring lists what each rule does;
:func:`rule_for` picks one. Among them:

* a grouped ``Conv`` (:func:`_grouped_conv`) keeps a channel split whose
  axis size divides ``group`` (whole groups per device; ``LowerLayoutsPass``
  gives each copy its local ``group``), and reads its inputs whole otherwise;
* ``Slice`` / ``Pad`` with constant bounds or amounts keep the split of every
  dimension they take whole or leave unpadded and read a cut or padded split
  dimension whole; a partial sum passes through where the op is linear.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node, Value
from graphdist.ir.layouts import LAYOUT_KEY, Layout, MeshSpec
from graphdist.ir.placement_ops import SHARDING_CONSTRAINT
from graphdist.passes.shard_logical_devices import ELEMENTWISE_OPS

__all__ = ["ADD_ONCE_KEY", "Rule", "aligned_batch", "aligned_dims", "layout_of", "replicated_rule", "rule_for"]

#: ``node.meta`` key of an ``Add`` / ``Sub`` / ``Sum`` (or ``Gemm`` / ``Conv``) that keeps a partial sum while
#: adding whole values: the input positions of the whole values, which only the first device of each group adds.
ADD_ONCE_KEY = "add_once"

#: ``(layout each input is read in, layout of each output)``.
Rule = tuple[list[Layout | None], list[Layout]]

_REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSumExp", "ReduceSumSquare"})
_RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
_NORMALISING = frozenset({"Softmax", "LogSoftmax"})


def layout_of(value: Value) -> Layout:
    """The value's layout (replicated when it has none)."""
    layout = value.meta.get(LAYOUT_KEY)
    return layout if layout is not None else Layout.replicated(value.rank)


def rule_for(node: Node, mesh: MeshSpec) -> Any:
    """The rule of ``node``'s op family (``None``: none; the caller reads its inputs replicated)."""
    if node.domain == GRAPHDIST_DOMAIN:
        return {SHARDING_CONSTRAINT: functools.partial(_constraint, mesh=mesh), "AllReduce": _per_device,
                "AllGather": _per_device_gathered}.get(node.op_type)
    if node.domain:
        return None
    if node.op_type in ELEMENTWISE_OPS or node.op_type == "Sum":
        return _elementwise
    if node.op_type in _REDUCTIONS:
        return _reduction
    return {"MatMul": _matmul, "Gemm": _gemm, "Conv": functools.partial(_conv, mesh=mesh),
            "ConvTranspose": functools.partial(_conv, mesh=mesh), "Transpose": _transpose,
            "Expand": _expand, "Softmax": _normalising, "LogSoftmax": _normalising,
            "LayerNormalization": _layer_norm, "Gather": _gather, "Concat": _concat, "Split": _split,
            "Slice": _slice, "Pad": _pad,
            **dict.fromkeys(_RESHAPES, functools.partial(_reshape, mesh=mesh))}.get(node.op_type)


def _constraint(node: Node, layouts: list[Layout | None], mesh: MeshSpec) -> Rule:
    pinned = mesh.normalised(Layout.from_attr(node.attrs.get("layout", [])))
    if len(pinned.dims) != node.inputs[0].rank:
        pinned = Layout.replicated(node.inputs[0].rank)
    return [pinned], [pinned]


def replicated_rule(node: Node) -> Rule:
    """Every input read whole, every output whole (always correct, only slower)."""
    return ([None if v is None else Layout.replicated(v.rank) for v in node.inputs],
            [Layout.replicated(out.rank) for out in node.outputs])


def aligned_dims(value: Value, out: Value, dims: Sequence[str | None]) -> tuple[str | None, ...]:
    """``dims`` (the output's) as the input ``value`` reads them: trailing alignment, broadcast dims unsplit."""
    offset = out.rank - value.rank
    return tuple(dims[i + offset] if value.shape[i] == out.shape[i + offset] else None for i in range(value.rank))


def _partial_kept(node: Node, layouts: list[Layout | None]) -> tuple[frozenset[str], set[int]]:
    """The partial axes the output keeps (the op is linear in those inputs) and which inputs keep them."""
    present = [(i, lay) for i, lay in enumerate(layouts) if lay is not None]
    partial = [(i, lay.partial) for i, lay in present if lay.partial]
    if not partial:
        return frozenset(), set()
    op = node.op_type
    same = len({p for _, p in partial}) == 1
    if op in ("Add", "Sub", "Sum") and len(partial) == len(present) and same:
        return partial[0][1], {i for i, _ in partial}
    if op in ("Add", "Sub", "Sum") and same and len(present) == len(node.inputs) \
            and all(tuple(node.inputs[i].shape) == tuple(node.outputs[0].shape) for i, _ in partial) \
            and node.outputs[0].dtype.kind == "f":
        # partial + whole: the whole operands are added on the first device of each group only.
        node.meta[ADD_ONCE_KEY] = [i for i, _ in present if not layouts[i].partial]
        return partial[0][1], {i for i, _ in partial}
    if op in ("Neg", "Identity") and len(present) == 1:
        return partial[0][1], {0}
    if op == "Mul" and len(partial) == 1:
        return partial[0][1], {partial[0][0]}
    if op == "Div" and len(partial) == 1 and partial[0][0] == 0:
        return partial[0][1], {0}
    return frozenset(), set()


def _elementwise(node: Node, layouts: list[Layout | None]) -> Rule | None:
    if len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    dims: list[str | None] = [None] * out.rank
    used: set[str] = set()
    for value, layout in zip(node.inputs, layouts):
        if value is None or layout is None:
            continue
        offset = out.rank - value.rank
        for i, axis in enumerate(layout.dims):
            if axis is None or axis in used or value.shape[i] != out.shape[i + offset] or dims[i + offset]:
                continue
            dims[i + offset] = axis
            used.add(axis)
    partial, keepers = _partial_kept(node, layouts)
    dims = [None if d in partial else d for d in dims]
    wanted = [None if v is None else Layout(aligned_dims(v, out, dims), partial if i in keepers else frozenset())
              for i, v in enumerate(node.inputs)]
    return wanted, [Layout(tuple(dims), partial)]


def _per_device(node: Node, layouts: list[Layout | None]) -> Rule:
    layout = (layouts[0] or Layout.replicated(node.inputs[0].rank)).without_partial()
    return [layout], [layout]


def _per_device_gathered(node: Node, layouts: list[Layout | None]) -> Rule:
    layout = (layouts[0] or Layout.replicated(node.inputs[0].rank)).without_partial()
    axis = int(node.attrs.get("axis", 0)) % max(node.inputs[0].rank, 1)
    dims = tuple(None if d == axis else a for d, a in enumerate(layout.dims))
    return [Layout(dims)], [Layout(dims)]


def _matmul(node: Node, layouts: list[Layout | None]) -> Rule | None:
    a, b = node.inputs[0], node.inputs[1]
    la, lb = layouts[0], layouts[1]
    out = node.outputs[0]
    if a.rank < 2 or b.rank < 2 or la is None or lb is None:
        return None
    batch = [None] * (out.rank - 2)
    for value, layout in ((a, la), (b, lb)):
        offset = out.rank - value.rank
        for i in range(value.rank - 2):
            if layout.dims[i] and value.shape[i] == out.shape[i + offset] and batch[i + offset] is None \
                    and layout.dims[i] not in batch:
                batch[i + offset] = layout.dims[i]
    rows, cols = la.dims[-2], lb.dims[-1]
    rows = None if rows in batch else rows
    cols = None if cols in batch or cols == rows else cols
    taken = {*batch, rows, cols} - {None}
    contract = next((k for k in (la.dims[-1], lb.dims[-2]) if k is not None and k not in taken), None)
    keep_a = bool(la.partial) and not lb.partial and not (la.partial & (taken | {contract}))
    keep_b = bool(lb.partial) and not la.partial and not (lb.partial & (taken | {contract}))
    carried = la.partial if keep_a else lb.partial if keep_b else frozenset()
    out_dims = (*batch, rows, cols)
    wanted_a = Layout((*aligned_batch(a, out, batch), rows, contract), la.partial if keep_a else frozenset())
    wanted_b = Layout((*aligned_batch(b, out, batch), contract, cols), lb.partial if keep_b else frozenset())
    partial = carried | ({contract} if contract else set())
    return [wanted_a, wanted_b], [Layout(out_dims, frozenset(partial))]


def _contraction(rows: str | None, cols: str | None, k_left: str | None, k_right: str | None
                 ) -> tuple[str | None, str | None, str | None]:
    """``rows, cols, contract`` axes of a product: an axis splits one of them; the contraction is split where
    either operand splits it (the other is sliced to match).
    """
    cols = None if cols == rows else cols
    contract = next((k for k in (k_left, k_right) if k is not None and k not in (rows, cols)), None)
    return rows, cols, contract


def _gemm(node: Node, layouts: list[Layout | None]) -> Rule | None:
    """``alpha * A' @ B' + beta * C``: as ``MatMul``; with a split contraction, ``C`` is added once."""
    a, b = layouts[0], layouts[1]
    if a is None or b is None:
        return None
    trans_a, trans_b = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    rows, k_a = (a.dims[1], a.dims[0]) if trans_a else (a.dims[0], a.dims[1])
    cols, k_b = (b.dims[0], b.dims[1]) if trans_b else (b.dims[1], b.dims[0])
    rows, cols, contract = _contraction(rows, cols, k_a, k_b)
    out = node.outputs[0]
    wanted_a = Layout((contract, rows) if trans_a else (rows, contract))
    wanted_b = Layout((cols, contract) if trans_b else (contract, cols))
    wanted: list[Layout | None] = [wanted_a, wanted_b]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None:
        wanted.append(Layout(aligned_dims(bias, out, (rows, cols))))
        if contract is not None:
            node.meta[ADD_ONCE_KEY] = [2]
    return wanted, [Layout((rows, cols), frozenset({contract} if contract else ()))]


def _conv(node: Node, layouts: list[Layout | None], mesh: MeshSpec) -> Rule | None:
    """``Conv`` / ``ConvTranspose`` (``group`` 1): batch from the input, output channels from the weights,
    the contracted channels split on both sides make a partial sum (its bias added once); spatial dimensions
    are read whole. A grouped ``Conv``: :func:`_grouped_conv`.
    """
    x, w = layouts[0], layouts[1]
    if x is None or w is None:
        return None
    if int(node.attrs.get("group", 1)) != 1:
        return _grouped_conv(node, x, w, mesh) if node.op_type == "Conv" else None
    spatial = (None,) * (node.inputs[0].rank - 2)
    k_w, c_w = (w.dims[1], w.dims[0]) if node.op_type == "Conv" else (w.dims[0], w.dims[1])
    batch, channels, contract = _contraction(x.dims[0], c_w, x.dims[1], k_w)
    wanted: list[Layout | None] = [Layout((batch, contract, *spatial))]
    weight_spatial = (None,) * (node.inputs[1].rank - 2)
    wanted.append(Layout((channels, contract, *weight_spatial) if node.op_type == "Conv"
                         else (contract, channels, *weight_spatial)))
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        wanted.append(Layout((channels,)))
        if contract is not None:
            node.meta[ADD_ONCE_KEY] = [2]
    return wanted, [Layout((batch, channels, *spatial), frozenset({contract} if contract else ()))]


def _grouped_conv(node: Node, x: Layout, w: Layout, mesh: MeshSpec) -> Rule | None:
    """``Conv`` with ``group`` > 1: the channels split over an axis whose size divides ``group`` (the input's
    channels, else the kernel's output channels) stay split: each device convolves whole groups (``group / n``
    of them, ``LowerLayoutsPass`` sets its local ``group``), its input channels and the kernel's output
    channels sliced alike; no sum. Any other split: ``None`` (read whole).
    """
    group = int(node.attrs.get("group", 1))
    axis = next((a for a in (x.dims[1], w.dims[0]) if a is not None and group % mesh.size(a) == 0), None)
    if axis is None:
        return None
    batch = x.dims[0] if x.dims[0] != axis else None
    spatial = (None,) * (node.inputs[0].rank - 2)
    wanted: list[Layout | None] = [Layout((batch, axis, *spatial)),
                                   Layout((axis, *(None,) * (node.inputs[1].rank - 1)))]
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        wanted.append(Layout((axis,)))
    return wanted, [Layout((batch, axis, *spatial))]


def aligned_batch(value: Value, out: Value, batch: Sequence[str | None]) -> tuple[str | None, ...]:
    """The output's batch dimensions' axes as a matmul operand ``value`` reads them (broadcast ones unsplit)."""
    offset = out.rank - value.rank
    return tuple(batch[i + offset] if value.shape[i] == out.shape[i + offset] else None
                 for i in range(value.rank - 2))


def _axes_of(node: Node) -> list[int] | None:
    """A reduction's axes (normalised), ``None`` when they are not known statically; ``[]``: all."""
    rank = node.inputs[0].rank
    axes: Any = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        if node.inputs[1].const_value is None:
            return None
        axes = node.inputs[1].const_value.reshape(-1).tolist()
    if not axes:
        return [] if int(node.attrs.get("noop_with_empty_axes", 0)) == 0 else None
    return sorted({int(a) % rank for a in axes})


def _reduction(node: Node, layouts: list[Layout | None]) -> Rule | None:
    axes = _axes_of(node)
    layout = layouts[0]
    if axes is None or layout is None:
        return None
    value = node.inputs[0]
    reduced = set(axes) if axes else set(range(value.rank))
    summed = node.op_type == "ReduceSum"
    partial = set(layout.partial) if summed else set()
    wanted_dims = []
    for d, axis in enumerate(layout.dims):
        if d in reduced and axis is not None and summed and axis not in partial:
            partial.add(axis)
            wanted_dims.append(axis)
        elif d in reduced:
            wanted_dims.append(None)
        else:
            wanted_dims.append(axis if axis not in partial else None)
    keepdims = int(node.attrs.get("keepdims", 1))
    out_dims = [None if d in reduced else a for d, a in enumerate(wanted_dims)]
    if not keepdims:
        out_dims = [a for d, a in enumerate(out_dims) if d not in reduced]
    wanted = [Layout(tuple(wanted_dims), layout.partial if summed else frozenset())]
    wanted += [None if v is None else Layout.replicated(v.rank) for v in node.inputs[1:]]
    return wanted, [Layout(tuple(out_dims), frozenset(partial))]


def _transpose(node: Node, layouts: list[Layout | None]) -> Rule | None:
    layout = layouts[0]
    if layout is None:
        return None
    perm = node.attrs.get("perm") or list(reversed(range(node.inputs[0].rank)))
    return [layout], [Layout(tuple(layout.dims[p] for p in perm), layout.partial)]


def _reshape_groups(source: Sequence[int], target: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """The smallest runs of dimensions of ``source`` and ``target`` with equal products, in order."""
    groups = []
    i = j = 0
    while i < len(source) or j < len(target):
        ins: list[int] = []
        outs: list[int] = []
        size_in = size_out = 1
        if i < len(source):
            ins.append(i)
            size_in *= int(source[i])
            i += 1
        if j < len(target):
            outs.append(j)
            size_out *= int(target[j])
            j += 1
        while size_in != size_out:
            if size_in < size_out and i < len(source):
                ins.append(i)
                size_in *= int(source[i])
                i += 1
            elif size_out < size_in and j < len(target):
                outs.append(j)
                size_out *= int(target[j])
                j += 1
            else:
                return None
        groups.append((ins, outs))
    return groups


def _first_not_one(shape: Sequence[int], dims: list[int]) -> int | None:
    return next((d for d in dims if int(shape[d]) != 1), None)


def _reshape(node: Node, layouts: list[Layout | None], mesh: MeshSpec) -> Rule | None:
    """A reshape keeps a split where it splits the outermost dimension of a run of merged or cut dimensions
    (each device's block is then a contiguous run of the run's elements) into a dimension the axis divides;
    any other split dimension is read whole.
    """
    value, out, layout = node.inputs[0], node.outputs[0], layouts[0]
    if layout is None or not value.is_static or not out.is_static:
        return None
    groups = _reshape_groups(value.shape, out.shape)
    rest = [None if v is None else Layout.replicated(v.rank) for v in node.inputs[1:]]
    if groups is None:
        return [Layout((None,) * value.rank, layout.partial), *rest], [Layout((None,) * out.rank, layout.partial)]
    wanted = list(layout.dims)
    dims: list[str | None] = [None] * out.rank
    for ins, outs in groups:
        split = [i for i in ins if layout.dims[i] is not None]
        if not split:
            continue
        axis = layout.dims[split[0]]
        first_in, first_out = _first_not_one(value.shape, ins), _first_not_one(out.shape, outs)
        if split == [first_in] and first_out is not None and int(out.shape[first_out]) % mesh.size(axis) == 0:
            dims[first_out] = axis
        else:
            for i in split:
                wanted[i] = None
    return [Layout(tuple(wanted), layout.partial), *rest], [Layout(tuple(dims), layout.partial)]


def _expand(node: Node, layouts: list[Layout | None]) -> Rule | None:
    value, out, layout = node.inputs[0], node.outputs[0], layouts[0]
    if layout is None or not out.is_static or not value.is_static:
        return None
    offset = out.rank - value.rank
    dims: list[str | None] = [None] * out.rank
    wanted = []
    for i, axis in enumerate(layout.dims):
        keep = axis if value.shape[i] == out.shape[i + offset] else None
        wanted.append(keep)
        dims[i + offset] = keep
    return [Layout(tuple(wanted), layout.partial), Layout.replicated(node.inputs[1].rank)], \
        [Layout(tuple(dims), layout.partial)]


def _whole(layout: Layout, dims: set[int]) -> tuple[str | None, ...]:
    return tuple(None if d in dims else a for d, a in enumerate(layout.dims))


def _normalising(node: Node, layouts: list[Layout | None]) -> Rule | None:
    layout = layouts[0]
    if layout is None:
        return None
    axis = int(node.attrs.get("axis", -1)) % node.inputs[0].rank
    dims = _whole(layout, {axis})
    return [Layout(dims)], [Layout(dims)]


def _layer_norm(node: Node, layouts: list[Layout | None]) -> Rule | None:
    layout = layouts[0]
    if layout is None:
        return None
    rank = node.inputs[0].rank
    axis = int(node.attrs.get("axis", -1)) % rank
    dims = _whole(layout, set(range(axis, rank)))
    wanted = [Layout(dims)] + [None if v is None else Layout.replicated(v.rank) for v in node.inputs[1:]]
    outputs = [Layout(dims)] + [Layout(dims[:axis] + (None,) * (out.rank - axis)) for out in node.outputs[1:]]
    return wanted, outputs


def _gather(node: Node, layouts: list[Layout | None]) -> Rule | None:
    data, indices = layouts[0], layouts[1]
    if data is None or indices is None:
        return None
    axis = int(node.attrs.get("axis", 0)) % node.inputs[0].rank
    data_dims = _whole(data, {axis})
    index_dims = tuple(None if a in data_dims else a for a in indices.dims)
    out = data_dims[:axis] + index_dims + data_dims[axis + 1:]
    return [Layout(data_dims), Layout(index_dims)], [Layout(out)]


def _concat(node: Node, layouts: list[Layout | None]) -> Rule | None:
    present = [lay for lay in layouts if lay is not None]
    if not present:
        return None
    rank = node.outputs[0].rank
    axis = int(node.attrs.get("axis", 0)) % rank
    dims: list[str | None] = [None] * rank
    for layout in present:
        for d, a in enumerate(layout.dims):
            if d != axis and dims[d] is None and a is not None and a not in dims:
                dims[d] = a
    same = {lay.partial for lay in present}
    partial = present[0].partial if len(same) == 1 else frozenset()
    wanted = [None if v is None else Layout(tuple(dims), partial) for v in node.inputs]
    return wanted, [Layout(tuple(dims), partial)]


def _split(node: Node, layouts: list[Layout | None]) -> Rule | None:
    layout = layouts[0]
    if layout is None:
        return None
    axis = int(node.attrs.get("axis", 0)) % node.inputs[0].rank
    dims = _whole(layout, {axis})
    wanted = [Layout(dims, layout.partial)] + [None if v is None else Layout.replicated(v.rank)
                                               for v in node.inputs[1:]]
    return wanted, [Layout(dims, layout.partial) for _ in node.outputs]


def _constant_ints(node: Node, position: int, attr: str) -> list[int] | None:
    """Input ``position`` (or, before it was an input, attribute ``attr``) as ints; ``[]``: absent; ``None``:
    not known statically.
    """
    if len(node.inputs) > position and node.inputs[position] is not None:
        value = node.inputs[position].const_value
        return None if value is None else [int(v) for v in value.reshape(-1)]
    return [int(v) for v in node.attrs.get(attr) or []]


def _sliced_dims(node: Node) -> set[int] | None:
    """The dimensions a ``Slice`` cuts (all but those it takes whole, in order); ``None``: not known statically."""
    value = node.inputs[0]
    starts, ends = _constant_ints(node, 1, "starts"), _constant_ints(node, 2, "ends")
    axes, steps = _constant_ints(node, 3, "axes"), _constant_ints(node, 4, "steps")
    if starts is None or ends is None or axes is None or steps is None:
        return None
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    cut = set()
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= value.rank
        size = value.shape[axis]
        if not isinstance(size, int) or step != 1 or range(*slice(start, end, step).indices(size)) != range(size):
            cut.add(axis)
    return cut


def _slice(node: Node, layouts: list[Layout | None]) -> Rule | None:
    """``Slice`` (constant bounds): a dimension it takes whole keeps its axis (each device slices its block the
    same way), a cut one is read whole; a partial sum stays partial (slicing is linear).
    """
    layout, cut = layouts[0], _sliced_dims(node)
    if layout is None or cut is None:
        return None
    dims = _whole(layout, cut)
    rest = [None if v is None else Layout.replicated(v.rank) for v in node.inputs[1:]]
    return [Layout(dims, layout.partial), *rest], [Layout(dims, layout.partial)]


def _padded_dims(node: Node) -> set[int] | None:
    """The dimensions a ``Pad`` pads or crops (non-zero amounts); ``None``: not known statically."""
    rank = node.inputs[0].rank
    pads, axes = _constant_ints(node, 1, "pads"), _constant_ints(node, 3, "axes")
    if pads is None or axes is None:
        return None
    axes = [a % rank for a in axes] if axes else list(range(rank))
    if len(pads) != 2 * len(axes):
        return None
    return {axis for i, axis in enumerate(axes) if pads[i] or pads[i + len(axes)]}


def _pad_is_linear(node: Node) -> bool:
    """Whether ``Pad`` maps a sum to the sum of its results: copies (``edge`` / ``reflect`` / ``wrap``) or zeros."""
    mode = node.attrs.get("mode", "constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return True
    fill = node.inputs[2] if len(node.inputs) > 2 else None
    if fill is None:
        return float(node.attrs.get("value", 0.0)) == 0.0
    return fill.const_value is not None and not fill.const_value.any()


def _pad(node: Node, layouts: list[Layout | None]) -> Rule | None:
    """``Pad`` (constant amounts): a dimension not padded keeps its axis, a padded one is read whole; a partial
    sum stays partial where padding is linear (zeros, or copies of elements), else it is summed first.
    """
    layout, padded = layouts[0], _padded_dims(node)
    if layout is None or padded is None:
        return None
    partial = layout.partial if _pad_is_linear(node) else frozenset()
    dims = _whole(layout, padded)
    rest = [None if v is None else Layout.replicated(v.rank) for v in node.inputs[1:]]
    return [Layout(dims, partial), *rest], [Layout(dims, partial)]
