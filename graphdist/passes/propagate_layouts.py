"""PropagateLayoutsPass: a layout over the device mesh for every value, GSPMD style, by a rule per op family.

Invariant established: every value read or made by a node has
``value.meta["layout"]`` (a :class:`graphdist.ir.layouts.Layout`: per dimension
a mesh axis or ``None``, plus the axes it is a pending partial sum over), and
every node has ``node.meta["input_layouts"]``: the layout it reads each input
in. Where that differs from the input's own layout, the node's
``meta["reshards"]`` lists the input position (``LowerLayoutsPass`` makes
the collective or slice). ``graph.meta.mesh`` is the mesh. Only the
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
moves up through the reshapes and copies that made the value. Rules
(:mod:`graphdist.passes.layout_rules`):

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
  spatial dimensions are read whole; a grouped ``Conv`` (``group`` > 1,
  depthwise included) whose channels are split over an axis whose size
  divides ``group`` (the input's channels, else the kernel's output channels)
  keeps them split: each device convolves whole groups (its input channels,
  kernel and bias sliced alike, its local ``group`` ``group / n``), no sum;
  split otherwise, it reads its inputs whole;
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
* ``Slice`` (constant bounds) / ``Pad`` (constant amounts): a dimension the
  slice takes whole (step 1, all of it) or the pad leaves alone (zero amounts)
  keeps its axis, each device slicing or padding its block as the whole value
  would be; a cut or padded dimension is read whole. A partial sum stays
  partial (slicing is linear, and so is padding with zeros or copies of
  elements; a non-zero fill sums it first);
* ``ShardingConstraint``: reads its input in its layout, which its output has;
* ``graphdist.AllReduce`` / ``AllGather`` between replicas: per device, as the
  input is laid out (``AllGather``'s axis whole);
* any other op, and a node outside the replicas (cross-replica context):
  reads every input replicated and makes replicated outputs (always correct,
  only slower).

Cases:
* a mesh whose non-batch axes all have size one: every layout replicated;
* a variable split over the batch axis: ``NotImplementedError`` (FSDP is
  ``ShardParametersPass``'s, which ``ModelParallelStrategy`` configures); an
  axis that does not divide its dimension: ``GraphError``;
* a second run: recomputes the same layouts, ``modified`` is ``False``.

Backward: after forward propagation, a value computed whole whose readers
all read it split the same way (a ``ShardingConstraint``'s pin, a split
operand of a ``MatMul``...) is computed split instead, where its producer
(an elementwise op, ``Transpose`` or ``MatMul``) can make it from slices of
its whole inputs (slices move no data, and each device computes only its
block); this goes on backwards through the producers, and forward
propagation runs again.

Not built: backward pulls through reshapes, reductions and other ops; a
grouped ``ConvTranspose`` (it reads its inputs whole); a ``Slice`` that cuts a
split dimension along the blocks (it is gathered first).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from graphdist.errors import GraphError
from graphdist.ir.graph import Graph, Node, Value
from graphdist.ir.layouts import INPUT_LAYOUTS_KEY, LAYOUT_KEY, RESHARDS_KEY, Layout, MeshSpec
from graphdist.ir.placement import VariableSpec, variable_specs
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.layout_rules import (
    ADD_ONCE_KEY,
    Rule,
    aligned_batch,
    aligned_dims,
    layout_of,
    replicated_rule,
    rule_for,
)
from graphdist.passes.shard_logical_devices import ELEMENTWISE_OPS

__all__ = ["PropagateLayoutsPass"]






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
                                          "sharded over the batch axis are FSDP (ZeRO-3), which ShardParametersPass "
                                          "builds (PipelineConfig.shard_parameters); give the layout passes them "
                                          "whole")
            if int(size) % self.mesh.size(axis):
                raise GraphError(f"variable {spec.name!r}: dimension {dim} (size {size}) is not divisible by mesh "
                                 f"axis {axis!r} (size {self.mesh.size(axis)}); pad it or leave it unsplit")
        return self.mesh.normalised(Layout(layout))

    def __repr__(self) -> str:
        split = {uid: layout for uid, layout in self.variables.items() if any(layout)}
        return f"{self.name}(mesh={dict(zip(self.mesh.axis_names, self.mesh.shape))}, variables={split})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        before = _snapshot(graph)
        graph.meta.mesh = self.mesh
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
            return replicated_rule(node)
        rule = rule_for(node, self.mesh)
        result = rule(node, layouts) if rule is not None else None
        return result if result is not None else replicated_rule(node)


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
        return [None if v is None else Layout(aligned_dims(v, out, layout.dims)) for v in node.inputs]
    if node.op_type == "Transpose":
        perm = node.attrs.get("perm") or list(reversed(range(out.rank)))
        dims: list[str | None] = [None] * out.rank
        for position, source in enumerate(perm):
            dims[source] = layout.dims[position]
        return [Layout(tuple(dims))]
    if node.op_type == "MatMul" and all(v is not None and v.rank >= 2 for v in node.inputs):
        a, b = node.inputs
        batch = layout.dims[:-2]
        return [Layout((*aligned_batch(a, out, batch), layout.dims[-2], None)),
                Layout((*aligned_batch(b, out, batch), None, layout.dims[-1]))]
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
