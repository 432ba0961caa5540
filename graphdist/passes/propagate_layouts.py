"""PropagateLayoutsPass: a layout over the device mesh for every value, GSPMD style, by a rule per op family.

Invariant established: every value read or made by a node has
``value.meta["layout"]`` (a :class:`graphdist.ir.layouts.Layout`: per dimension
a mesh axis or ``None``, plus the axes it is a pending partial sum over), and
every node has ``node.meta["input_layouts"]``: the layout it reads each input
in. Where that differs from the input's own layout, the node's
``meta["reshards"]`` lists the input position (``LowerLayoutsPass`` makes
the collective or slice). ``graph.meta["mesh"]`` is the mesh. Only the
mesh's non-batch axes of size above one appear in layouts: the batch axis
makes the replicas (``ReplicatePass``), so inside a replica it splits
nothing.

Seeds: the variables' layouts (by uid, as the strategy resolved its ``LayoutMap``
against its variables, an optimizer slot taking its variable's; a variable
it did not list, as in a re-planned step, by the first pattern its name
matches), ``ShardingConstraint`` nodes
(``with_sharding_constraint``); every other graph input and constant is
replicated. Propagation runs forward in graph order, through the gradients
too (after ``AutodiffPass`` they are ordinary nodes), and again while some
reader of a partial value sums it: then every reader reads it summed (one
reduction, shared, instead of a reduction per reader downstream), and the sum
moves up through the reshapes and copies that made the value. Rules:

* elementwise ops (with broadcasting): an output dimension takes the axis of
  an input split along it (first input first; an axis used once); ``Add`` /
  ``Sub`` / ``Sum`` of inputs partial over the same axes, or of such partial
  inputs (not broadcast) and whole ones (float; the whole ones are added by
  the first device of each group only, ``meta["add_once"]``: a residual
  connection's gradient then waits for one sum), ``Neg`` /
  ``Identity`` of one, ``Mul`` with one partial input and ``Div`` with a
  partial numerator stay partial (they are linear there); any other partial
  input is reduced first;
* ``MatMul`` (ranks >= 2): rows from the left operand, columns from the
  right; a contracting dimension split on either side is split on both (the
  replicated side is sliced) and the result is partial over that axis; one
  partial operand times an unsplit-sum operand stays partial; ``Gemm`` the
  same (``transA`` / ``transB``), its ``C`` added by one device per group when
  the contraction is split;
* ``Conv`` / ``ConvTranspose`` (``group`` 1): batch and output channels keep
  their axes, split input channels make a partial sum (the bias added once),
  spatial dimensions are read whole;
* reductions (``ReduceSum``, ``ReduceMean``, ``ReduceMax``, ...): kept
  dimensions keep their axes; a reduced split dimension makes ``ReduceSum``
  partial, the others read it gathered; ``ReduceSum`` of a partial value
  stays partial;
* ``Transpose``: axes permuted; ``Reshape`` / ``Squeeze`` / ``Unsqueeze`` /
  ``Flatten``: a split dimension keeps its axis where it is the outermost of a
  run of dimensions merged or cut into others (``(N, T, D) -> (N, T, H, D/H)``
  with ``D`` split splits ``H``) and the axis divides the new outermost one;
  other split dimensions are read whole; ``Expand``: axes follow the input's
  dimensions, broadcast ones unsplit;
* ``Softmax`` / ``LogSoftmax`` / ``LayerNormalization``: the normalised
  dimensions are read whole (gathered), the others keep their axes;
* ``Gather``: the gathered dimension of the data is read whole, the others
  and the indices' keep their axes; ``Concat`` / ``Split``: the joined or cut
  dimension is read whole;
* ``ShardingConstraint``: reads its input in its layout, which its output has;
* ``graphdist.AllReduce`` / ``AllGather`` between replicas: per device, as the
  input is laid out (``AllGather``'s axis whole);
* any other op, and a node outside the replicas (cross-replica context):
  reads every input replicated and makes replicated outputs (always correct,
  only slower).

Cases:
* a mesh whose non-batch axes all have size one: every layout replicated;
* a variable split over the batch axis: ``NotImplementedError`` (FSDP is not
  built here); an axis that does not divide its dimension: ``GraphError``;
* a second run: recomputes the same layouts, ``modified`` is ``False``.

Backward: after forward propagation, a value computed whole whose readers
all read it split the same way (a ``ShardingConstraint``'s pin, a split
operand of a ``MatMul``...) is computed split instead, where its producer
(an elementwise op, ``Transpose`` or ``MatMul``) can make it from slices of
its whole inputs (slices move no data, and each device computes only its
block); this goes on backwards through the producers, and forward
propagation runs again.

Not built: backward pulls through reshapes, reductions and other ops,
grouped convolutions, and ``AllToAll`` (a change of split axis is an all-gather and a slice).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.layouts import INPUT_LAYOUTS_KEY, LAYOUT_KEY, MESH_KEY, RESHARDS_KEY, Layout, MeshSpec
from graphdist.ir.placement import VariableSpec, variable_specs
from graphdist.ir.placement_ops import SHARDING_CONSTRAINT
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.shard_logical_devices import ELEMENTWISE_OPS

__all__ = ["ADD_ONCE_KEY", "PropagateLayoutsPass", "layout_of"]

#: ``node.meta`` key of an ``Add`` / ``Sub`` / ``Sum`` of a partial sum and whole values that stays partial:
#: the input positions of the whole values, which only the first device of each group adds.
ADD_ONCE_KEY = "add_once"

Rule = tuple[list[Layout | None], list[Layout]]

_REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSumExp", "ReduceSumSquare"})
_RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
_NORMALISING = frozenset({"Softmax", "LogSoftmax"})


def layout_of(value: Value) -> Layout:
    """The value's layout (replicated when it has none)."""
    layout = value.meta.get(LAYOUT_KEY)
    return layout if layout is not None else Layout.replicated(value.rank)


class PropagateLayoutsPass(PassBase):
    """Gives every value a layout over the mesh (see the module docstring).

    Args:
        mesh: The mesh (axes, sizes, the batch axis, each replica's devices).
        variables: Variable uid -> a mesh axis or ``None`` per dimension (absent: replicated).
    """

    runs_after = ("AutodiffPass", "ReplicatePass", "InsertCollectivesPass", "LowerCollectivesPass")

    def __init__(self, mesh: MeshSpec, variables: Mapping[str, Sequence[str | None]] | None = None,
                 patterns: Sequence[tuple[str, Sequence[str | None]]] = ()) -> None:
        self.mesh = mesh
        self.variables = {uid: tuple(layout) for uid, layout in (variables or {}).items()}
        self.patterns = [(str(pattern), tuple(layout)) for pattern, layout in patterns]

    def _layout_of_variable(self, spec: VariableSpec) -> tuple[str | None, ...] | None:
        """The variable's layout: by uid, else the pattern its name matches (exactly, else ``re.search``)."""
        if spec.uid in self.variables:
            return self.variables[spec.uid]
        exact = [layout for pattern, layout in self.patterns if pattern == spec.name]
        found = exact or [layout for pattern, layout in self.patterns if re.search(pattern, spec.name)]
        if len(found) > 1:
            raise GraphError(f"PropagateLayoutsPass: variable {spec.name!r} matches several layout patterns "
                             f"({', '.join(p for p, _ in self.patterns if re.search(p, spec.name))}); make them "
                             "exclusive")
        if not found or len(found[0]) != len(spec.shape):
            return None  # matched for another rank (a slot of another shape): replicated
        return found[0]

    def _seed(self, spec: VariableSpec, layout: tuple[str | None, ...]) -> Layout:
        for dim, (size, axis) in enumerate(zip(spec.shape, layout)):
            if axis is None:
                continue
            if axis == self.mesh.batch_axis and self.mesh.size(axis) > 1:
                raise NotImplementedError(f"variable {spec.name!r} is split over the batch axis {axis!r}: weights "
                                          "sharded over the batch axis are FSDP (ZeRO-3), not built by the layout "
                                          "passes")
            if int(size) % self.mesh.size(axis):
                raise GraphError(f"variable {spec.name!r}: dimension {dim} (size {size}) is not divisible by mesh "
                                 f"axis {axis!r} (size {self.mesh.size(axis)}); pad it or leave it unsplit")
        return self.mesh.normalised(Layout(layout))

    def __repr__(self) -> str:
        split = {uid: layout for uid, layout in self.variables.items() if any(layout)}
        return f"{self.name}(mesh={dict(zip(self.mesh.axis_names, self.mesh.shape))}, variables={split})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        before = _snapshot(graph)
        graph.meta[MESH_KEY] = self.mesh
        seeds = {}
        for name, spec in variable_specs(graph):
            layout = self._layout_of_variable(spec)
            if layout is not None:
                seeds[name] = self._seed(spec, layout)
        for value in graph.inputs:
            _set(value, seeds.get(value.name, Layout.replicated(value.rank)))
        for value in graph.initializers.values():
            _set(value, Layout.replicated(value.rank))
        summed: set[int] = set()  # partial values some reader sums: every reader reads them summed
        preferred: dict[int, Layout] = {}  # whole values every reader reads split alike: computed split
        for _ in range(_BACKWARD_ROUNDS):
            self._forward(graph, summed, preferred)
            wishes = _preferences(graph, preferred)
            if wishes == preferred:
                break
            preferred = wishes
        return PassResult(graph, modified=_snapshot(graph) != before)

    def _forward(self, graph: Graph, summed: set[int], preferred: dict[int, Layout]) -> None:
        """Forward propagation, again while some reader sums a partial value (see the module docstring)."""
        while True:
            for node in graph.nodes:
                self._propagate(node, summed, preferred)
            more = {id(_sum_at(v)) for node in graph.nodes for v, w in zip(node.inputs, node.meta[INPUT_LAYOUTS_KEY])
                    if v is not None and w is not None and layout_of(v).partial - w.partial} - summed
            if not more:
                return
            summed |= more

    def _propagate(self, node: Node, summed: set[int], preferred: dict[int, Layout] | None = None) -> None:
        wanted, outputs = self._rule(node, summed)
        wish = (preferred or {}).get(id(node.outputs[0])) if len(node.outputs) == 1 else None
        if wish is not None and outputs[0].is_replicated and all(
                v is None or layout_of(v).is_replicated for v in node.inputs):
            pulled = _pull(node, wish)
            if pulled is not None:  # computed split from slices of its whole inputs (slicing moves nothing)
                node.meta.pop(ADD_ONCE_KEY, None)
                wanted, outputs = pulled, [wish]
        node.meta[INPUT_LAYOUTS_KEY] = wanted
        node.meta[RESHARDS_KEY] = [i for i, (v, w) in enumerate(zip(node.inputs, wanted))
                                   if v is not None and w is not None and layout_of(v) != w]
        for out, layout in zip(node.outputs, outputs):
            _set(out, layout)

    # ---------------------------------------------------------------- rules
    def _rule(self, node: Node, summed: set[int]) -> Rule:
        node.meta.pop(ADD_ONCE_KEY, None)
        layouts = [None if v is None else layout_of(v).without_partial() if id(v) in summed else layout_of(v)
                   for v in node.inputs]
        if node.replica is None:  # cross-replica context: runs once, on whole values
            return _replicated(node)
        rule = self._rule_for(node)
        result = rule(node, layouts) if rule is not None else None
        return result if result is not None else _replicated(node)

    def _rule_for(self, node: Node) -> Any:
        if node.domain == GRAPHDIST_DOMAIN:
            return {SHARDING_CONSTRAINT: self._constraint, "AllReduce": _per_device,
                    "AllGather": _per_device_gathered}.get(node.op_type)
        if node.domain:
            return None
        if node.op_type in ELEMENTWISE_OPS or node.op_type == "Sum":
            return _elementwise
        if node.op_type in _REDUCTIONS:
            return _reduction
        return {"MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "ConvTranspose": _conv, "Transpose": _transpose,
                "Expand": _expand, "Softmax": _normalising, "LogSoftmax": _normalising,
                "LayerNormalization": _layer_norm, "Gather": _gather, "Concat": _concat, "Split": _split,
                **dict.fromkeys(_RESHAPES, functools.partial(_reshape, mesh=self.mesh))}.get(node.op_type)

    def _constraint(self, node: Node, layouts: list[Layout | None]) -> Rule:
        pinned = self.mesh.normalised(Layout.from_attr(node.attrs.get("layout", [])))
        if len(pinned.dims) != node.inputs[0].rank:
            pinned = Layout.replicated(node.inputs[0].rank)
        return [pinned], [pinned]


# ------------------------------------------------------------------ backward
#: Rounds of forward propagation and backward preferences (a chain of pulled values settles in one or two).
_BACKWARD_ROUNDS = 4


def _pull(node: Node, layout: Layout) -> list[Layout | None] | None:
    """The layouts ``node`` would read its (whole) inputs in to compute its output laid out as ``layout``
    (``None``: it cannot): elementwise ops, ``Transpose`` and ``MatMul``.
    """
    if node.domain or len(node.outputs) != 1 or layout.partial:
        return None
    out = node.outputs[0]
    if node.op_type in ELEMENTWISE_OPS:
        return [None if v is None else Layout(_aligned(v, out, layout.dims)) for v in node.inputs]
    if node.op_type == "Transpose":
        perm = node.attrs.get("perm") or list(reversed(range(out.rank)))
        dims: list[str | None] = [None] * out.rank
        for position, source in enumerate(perm):
            dims[source] = layout.dims[position]
        return [Layout(tuple(dims))]
    if node.op_type == "MatMul" and all(v is not None and v.rank >= 2 for v in node.inputs):
        a, b = node.inputs
        batch = layout.dims[:-2]
        return [Layout((*_aligned_batch(a, out, batch), layout.dims[-2], None)),
                Layout((*_aligned_batch(b, out, batch), None, layout.dims[-1]))]
    return None


def _preferences(graph: Graph, before: dict[int, Layout]) -> dict[int, Layout]:
    """Backward, from the last node: a whole value whose readers all read it split the same way (a pulled
    reader by what it would read) and whose producer can compute it split from its whole inputs, preferred
    split so; not a graph output. ``before``: the last round's preferences (values already split by them
    count as whole, so the preferences settle instead of alternating).
    """
    def whole(value: Value | None) -> bool:
        return value is None or layout_of(value).is_replicated or before.get(id(value)) == layout_of(value)

    outputs = {id(v) for v in graph.outputs}
    preferred: dict[int, Layout] = {}
    pulled: dict[int, list[Layout | None]] = {}  # node id -> the input layouts it reads when pulled
    for node in reversed(graph.nodes):
        if node.replica is None or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if id(out) in outputs or not out.uses or not whole(out) or not all(whole(v) for v in node.inputs):
            continue
        wanted = {(pulled[id(reader)] if id(reader) in pulled else reader.meta.get(INPUT_LAYOUTS_KEY, []))[index]
                  for reader, index in out.uses}
        if len(wanted) != 1:
            continue
        wish = next(iter(wanted))
        if wish is None or wish.is_replicated or wish.partial:
            continue
        inputs = _pull(node, wish)
        if inputs is not None:
            preferred[id(out)] = wish
            pulled[id(node)] = inputs
    return preferred


# -------------------------------------------------------------------- helpers
#: Ops that move or copy a partial sum's elements without reducing them: summing their input costs no more
#: than summing their output, and serves the input's other readers too.
_SUM_BEFORE = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand"})


def _sum_at(value: Value) -> Value:
    """Where to sum a partial ``value`` a reader needs summed: before the reshapes and copies that made it."""
    while True:
        producer = value.producer
        if producer is None or producer.domain or producer.op_type not in _SUM_BEFORE:
            return value
        source = producer.inputs[0]
        if source is None or layout_of(source).partial != layout_of(value).partial:
            return value
        value = source

def _set(value: Value, layout: Layout) -> None:
    value.meta[LAYOUT_KEY] = layout


def _snapshot(graph: Graph) -> list[Any]:
    values = [*graph.inputs, *graph.initializers.values(), *(o for n in graph.nodes for o in n.outputs)]
    return [v.meta.get(LAYOUT_KEY) for v in values] + [n.meta.get(INPUT_LAYOUTS_KEY) for n in graph.nodes]


def _replicated(node: Node) -> Rule:
    return ([None if v is None else Layout.replicated(v.rank) for v in node.inputs],
            [Layout.replicated(out.rank) for out in node.outputs])


def _aligned(value: Value, out: Value, dims: Sequence[str | None]) -> tuple[str | None, ...]:
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
    wanted = [None if v is None else Layout(_aligned(v, out, dims), partial if i in keepers else frozenset())
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
    wanted_a = Layout((*_aligned_batch(a, out, batch), rows, contract), la.partial if keep_a else frozenset())
    wanted_b = Layout((*_aligned_batch(b, out, batch), contract, cols), lb.partial if keep_b else frozenset())
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
        wanted.append(Layout(_aligned(bias, out, (rows, cols))))
        if contract is not None:
            node.meta[ADD_ONCE_KEY] = [2]
    return wanted, [Layout((rows, cols), frozenset({contract} if contract else ()))]


def _conv(node: Node, layouts: list[Layout | None]) -> Rule | None:
    """``Conv`` / ``ConvTranspose`` (``group`` 1): batch from the input, output channels from the weights,
    the contracted channels split on both sides make a partial sum (its bias added once); spatial dimensions
    are read whole.
    """
    x, w = layouts[0], layouts[1]
    if x is None or w is None or int(node.attrs.get("group", 1)) != 1:
        return None
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


def _aligned_batch(value: Value, out: Value, batch: Sequence[str | None]) -> tuple[str | None, ...]:
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
