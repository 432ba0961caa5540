"""LowerLayoutsPass: per-device programs on local shapes, with the collectives the layouts need.

Reads what :class:`graphdist.passes.propagate_layouts.PropagateLayoutsPass`
wrote (``value.meta["layout"]``, ``node.meta["input_layouts"]``,
``graph.meta.mesh``).

Invariant established: every node of replica ``r`` is replaced by one copy per
device of the replica (``mesh.devices[r][i]``), computing that device's block
of each value (local shapes: a dimension split over an axis of size ``n`` is
``1/n`` as long; a ``Reshape`` or ``Expand`` gets its local target shape); no
``ShardingConstraint`` remains; no node keeps ``meta["input_layouts"]``. Where
a node reads an input in another layout than the input has, the pass reshards
it, per mesh axis (collectives among the devices that differ only along that
axis; one group per replica and per position on the other axes):

* partial over ``X`` -> a ``ReduceScatter`` when the reader wants the value
  split over ``X`` along a dimension whose leading dimensions are 1 on each
  device (the flattened chunks are then the blocks), else an ``AllReduce``;
* split over ``X`` -> not split: ``AllGather`` along that dimension;
* not split -> split over ``Y``: a local ``Slice`` by the device's coordinate
  (no communication);
* split over ``X`` along dimension ``a`` -> split over ``X`` along ``b`` (not
  split before): an ``AllToAll`` (``split_axis=b``, ``concat_axis=a``) where
  the cost model prices it below the alternative and ``b``'s local length
  divides by the axis' size, else ``AllGather`` along ``a`` then ``Slice``
  along ``b``;
* split over ``X`` -> split over ``Y`` elsewhere: ``AllGather`` then ``Slice``.

Cost model (:func:`graphdist.runtime.comm.algorithms.collective_cost`, on
the pass's ``link``, :data:`~graphdist.runtime.comm.algorithms.MESH_LINK` by
default): each collective costs its messages' latency plus the bytes each
device sends (and combines) at the link's rates; with ``S`` the value's bytes
on a device and ``n`` the group's size, a device sends ``2 (n-1)/n S`` for an
``AllReduce`` (ring), ``(n-1)/n S`` for a ``ReduceScatter``, ``(n-1) S`` for an
``AllGather``, ``(n-1)/n S`` for an ``AllToAll``, and 0 for a ``Slice``; each
collective is ``n - 1`` messages (``2 (n-1)`` for the all-reduce). Of the two
ways to reduce a partial value a split reader wants, the reduce-scatter (half
the all-reduce's bytes, no slice after) is taken whenever it applies; of the
two ways to move a split to another dimension, the cheaper by the model (the
all-to-all: the same messages, ``1/n`` the bytes of the all-gather). Each
collective's node has ``meta["bytes_per_device"]`` and
``meta["predicted_seconds"]`` by this model.

``graph.meta.layouts`` lists every value split or partial over the mesh
(type, layout, block per device); ``Graph.summary()`` shows it.

A graph output (a step result, a variable's new value) is made whole on the
replica's first device: partial sums are added up (``Sum``) and blocks joined
(``Concat``) there, reading the other devices' values (``PartitionPass``
inserts the transfers): one copy of the value moves, not one per device.
A variable split over the mesh is read by each device as its block (a
``Slice`` of the whole stored value); its new value is joined for the
write-back. Stored in parts (``PassContext.options[REPLICA_PARTS_OPTION]``,
which ``gd.function`` sets, or ``replica_parts=True``): its input is replaced
by one input per device of a replica, ``<input>/part<i>`` (the block), and its
write-back by one output per device (the new block, in the variable's
layout), each a ``variable_updates`` entry; ``graph.meta.sharded_state``
records the parts with their ``blocks`` (``(start, stop)`` per dimension)
and ``graph.meta.placement`` places the variable ``"sharded"``. No device
then holds more than its block of it.

Cases:
* a node outside the replicas (cross-replica context): one copy on the first
  replica's first device, reading whole values;
* an ``Add`` / ``Sub`` / ``Sum`` that keeps a partial sum while adding whole
  values (``meta["add_once"]``): only the first device of each group adds
  them; the others pass their summand on (negated for ``whole - partial``);
  a ``Gemm`` / ``Conv`` / ``ConvTranspose`` whose contraction is split: only the
  first device of each group adds the bias (``C``);
* a grouped ``Conv`` whose channels are split (whole groups per device): each
  copy's ``group`` is the number of groups its block holds;
* a collective between replicas (``AllReduce`` of the batch axis) of values
  whole on every device of a replica (a replicated weight's gradient, an FSDP
  weight's gather or gradient): one copy, on each replica's first device, the
  others reading its result (``PartitionPass``'s transfers: in one process a
  second name for the same array); of split or partial values: one copy per
  device, each in its own group (``group_key`` suffixed with the device
  index);
* a mesh whose replicas have one device each: only ``ShardingConstraint``
  nodes are removed (they are the identity there);
* a graph already lowered (no ``input_layouts``), or without a mesh: unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.comm_ops import is_communication
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.layouts import INPUT_LAYOUTS_KEY, RESHARDS_KEY, Layout, MeshSpec, local_slices
from graphdist.ir.placement import PlacementSpec, VariablePlacement, variable_specs
from graphdist.ir.placement_ops import SHARDING_CONSTRAINT
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.layout_rules import ADD_ONCE_KEY, layout_of
from graphdist.passes.shard_optimizer_state import REPLICA_PARTS_OPTION
from graphdist.runtime.comm.algorithms import MESH_LINK, Link, collective_cost

__all__ = ["GLOBAL_LAYOUT_KEY", "LowerLayoutsPass", "collective_bytes", "variable_bytes_per_device"]

#: ``value.meta`` key of a lowered value: the layout of the whole value it is a block of (for summaries).
GLOBAL_LAYOUT_KEY = "global_layout"
#: ``node.meta`` keys of the layout passes' bookkeeping, removed once the nodes are lowered.
_LAYOUT_META = (INPUT_LAYOUTS_KEY, RESHARDS_KEY, "add_once")
#: Ops with a target-shape input (position 1), rewritten to the local shape.
_SHAPE_INPUT_OPS = frozenset({"Reshape", "Expand"})


def collective_bytes(op_type: str, local_bytes: int, group: int) -> int:
    """Bytes each device sends for one collective of the cost model (see the module docstring)."""
    if group <= 1:
        return 0
    if op_type == "AllReduce":
        return 2 * (group - 1) * local_bytes // group
    if op_type in ("ReduceScatter", "AllToAll"):
        return (group - 1) * local_bytes // group
    if op_type == "AllGather":
        return (group - 1) * local_bytes
    return 0


def variable_bytes_per_device(graph: Graph) -> int:
    """Bytes of variables (parameters and optimizer state) one device of a replica keeps.

    A variable stored in parts (split by its layout here, or a ZeRO-1 slot) counts one part; any other
    counts whole (every device holds a copy).
    """
    sharded = graph.meta.sharded_state
    total = 0
    for _, spec in variable_specs(graph):
        layout = sharded.get(spec.uid)
        elements = int(layout["shard"]) if layout else int(np.prod(spec.shape, dtype=np.int64))
        total += elements * np.dtype(spec.dtype).itemsize
    return total


def _local_group(node: Node, local_input: Value | None) -> int:
    """A grouped ``Conv``'s ``group`` on a device that holds ``local_input``'s channels (whole groups of them)."""
    channels = int(node.inputs[0].shape[1])
    local = int(local_input.shape[1]) if local_input is not None else channels
    return int(node.attrs["group"]) * local // channels


class LowerLayoutsPass(PassBase):
    """Rewrites a graph with layouts into per-device programs (see the module docstring).

    Args:
        replica_parts: Store each split variable as one part per device of a replica (``None``: as
            ``PassContext.options[REPLICA_PARTS_OPTION]`` says, which ``gd.function`` sets; else whole).
        link: The cost model's link between the mesh's devices (chooses between reshards).
    """

    runs_after = ("PropagateLayoutsPass",)

    def __init__(self, replica_parts: bool | None = None, link: Link = MESH_LINK) -> None:
        self.replica_parts = replica_parts
        self.link = link

    def __repr__(self) -> str:
        args = [] if self.replica_parts is None else [f"replica_parts={self.replica_parts}"]
        args += [] if self.link == MESH_LINK else [f"link={self.link}"]
        return f"{self.name}({', '.join(args)})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        mesh: MeshSpec | None = graph.meta.mesh
        pending = any(INPUT_LAYOUTS_KEY in n.meta for n in graph.nodes)
        constraints = graph.find_nodes(SHARDING_CONSTRAINT, GRAPHDIST_DOMAIN)
        if mesh is None or not pending or mesh.devices_per_replica == 1:
            for node in graph.nodes:
                for key in _LAYOUT_META:
                    node.meta.pop(key, None)
            graph.replace_all_uses_with_many([(n.outputs[0], n.inputs[0]) for n in constraints])
            graph.remove_nodes(constraints)
            return PassResult(graph, modified=bool(constraints))
        parts = self.replica_parts if self.replica_parts is not None else bool(
            ctx.options.get(REPLICA_PARTS_OPTION, False))
        _Lowering(graph, mesh, parts, self.link).run()
        return PassResult(graph, modified=True)

    def ensures(self, graph: Graph, ctx: PassContext) -> None:
        from graphdist.errors import PostconditionError

        left = [n.name for n in graph.nodes if INPUT_LAYOUTS_KEY in n.meta
                or (n.domain == GRAPHDIST_DOMAIN and n.op_type == SHARDING_CONSTRAINT)]
        if left:
            raise PostconditionError(f"LowerLayoutsPass left nodes with layouts to lower: {left[:5]}")


class _Lowering:
    """One run of the pass over a graph."""

    def __init__(self, graph: Graph, mesh: MeshSpec, parts: bool = False, link: Link = MESH_LINK) -> None:
        self.graph = graph
        self.mesh = mesh
        self.link = link
        self.count = mesh.devices_per_replica

        self.local: dict[int, list[Value]] = {}  # node outputs -> a value per device of their replica
        self.sources: dict[tuple[int, int], list[Value]] = {}  # (graph input or constant, replica) -> per device
        self.resharded: dict[tuple[int, Layout, int], list[Value]] = {}
        self.created: list[Node] = []
        self.groups = 0
        self.parts: dict[str, tuple[Value, str, list[Value]]] = {}  # uid -> (whole input, name, part inputs)
        if parts:
            self._make_parts()

    # ---------------------------------------------------------------- driver
    def run(self) -> None:
        for node in list(self.graph.nodes):
            self._lower(node)
        updates = list(self.graph.meta.variable_updates)
        first_update = len(self.graph.outputs) - len(updates)  # the write-backs are the last outputs, in order
        outputs: list[Value] = []
        new_updates: list[tuple[str, str]] = []
        for position, value in enumerate(self.graph.outputs):
            uid = updates[position - first_update][1] if position >= first_update else None
            if uid in self.parts:  # each device writes back its own block
                whole_input, _, _ = self.parts[uid]
                blocks = self._reshard(value, layout_of(whole_input), self._replica_of(value))
                outputs += blocks
                new_updates += [(block.name, uid) for block in blocks]
                continue
            whole = self._whole(value)
            outputs.append(whole)
            if uid is not None:
                new_updates.append((whole.name, uid))
        self.graph.outputs = outputs
        self.graph.meta.layouts = self._layout_table()
        self.graph.set_nodes(self.created, safe=False)
        if updates:
            self.graph.meta.variable_updates = new_updates
        self._record_parts()

    def _layout_table(self) -> dict[str, list[str]]:
        """``value -> [type, layout, block]`` of the values split or partial over the mesh (for summaries)."""
        table = {}
        values = [*self.graph.inputs, *(out for node in self.graph.nodes if node not in self.created
                                        for out in node.outputs)]
        for value in values:
            layout = layout_of(value)
            if not layout.is_replicated:
                block = "x".join(str(d) for d in self.mesh.local_shape(value.shape, layout))
                table[value.name] = [value.type_str(), str(layout), f"[{block}]"]
        return table

    # ------------------------------------------------------------------ parts
    def _make_parts(self) -> None:
        """One input per device of a replica for each split variable: its block (the whole input goes)."""
        inputs = {v.name: v for v in self.graph.inputs}
        for name, spec in variable_specs(self.graph):
            value = inputs.get(name)
            if value is None or layout_of(value).is_replicated or layout_of(value).partial:
                continue
            shape = self.mesh.local_shape(value.shape, layout_of(value))
            parts = [self.graph.add_input(f"{value.name}/part{i}", value.dtype, shape) for i in range(self.count)]
            self.parts[spec.uid] = (value, name, parts)
            for replica in range(len(self.mesh.devices)):
                self.sources[(id(value), replica)] = parts

    def _record_parts(self) -> None:
        """Drops the whole inputs the parts replace; records the parts as ``sharded_state`` and their placement."""
        if not self.parts:
            return
        doomed = {id(whole) for whole, _, _ in self.parts.values()}
        self.graph.inputs = [v for v in self.graph.inputs if id(v) not in doomed]
        sharded = dict(self.graph.meta.sharded_state)
        placements = dict(getattr(self.graph.meta.placement, "variables", {}))
        for uid, (whole, _, parts) in self.parts.items():
            layout = layout_of(whole)
            blocks = [[list(block) for block in self._block(whole, layout, index)] for index in range(self.count)]
            size = int(np.prod(whole.shape, dtype=np.int64))
            sharded[uid] = {"replicas": self.count, "local": self.count, "shard": size // self._blocks_of(layout),
                            "size": size, "parts": [p.name for p in parts], "blocks": blocks,
                            "layout": layout.to_attr()}
            placements[uid] = VariablePlacement("sharded", tuple(self.mesh.devices[0]))
        self.graph.meta.sharded_state = sharded
        self.graph.meta.placement = PlacementSpec(placements)

    def _block(self, whole: Value, layout: Layout, index: int) -> list[tuple[int, int]]:
        spans = {dim: (start, stop) for dim, start, stop in local_slices(self.mesh, whole.shape, layout, index)}
        return [spans.get(dim, (0, int(size))) for dim, size in enumerate(whole.shape)]

    def _blocks_of(self, layout: Layout) -> int:
        return int(np.prod([self.mesh.size(a) for a in layout.dims if a is not None], dtype=np.int64))

    @staticmethod
    def _replica_of(value: Value) -> int:
        producer = value.producer
        return producer.replica if producer is not None and producer.replica is not None else 0

    def _add(self, op_type: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None, device: str,
             replica: int | None, name: str, domain: str = "", num_outputs: int | None = None,
             meta: dict[str, Any] | None = None) -> Node:
        node = self.graph.add_node(op_type, list(inputs), attrs, domain=domain, num_outputs=num_outputs, name=name)
        node.device, node.replica = device, replica
        node.meta.update(meta or {})
        self.created.append(node)
        return node

    def _const(self, name: str, values: Sequence[int]) -> Value:
        return self.graph.add_initializer(name, np.asarray(list(values), np.int64))

    # -------------------------------------------------------------- per node
    def _lower(self, node: Node) -> None:
        replica = node.replica if node.replica is not None else 0
        wanted = node.meta.get(INPUT_LAYOUTS_KEY) or [None] * len(node.inputs)
        columns: list[list[Value | None]] = []
        for value, want in zip(node.inputs, wanted):
            if value is None:
                columns.append([None] * self.count)
            else:
                # A node outside the replicas reads each value where its replica keeps it.
                home = self._replica_of(value) if node.replica is None else replica
                columns.append(list(self._reshard(value, want or Layout.replicated(value.rank), home)))
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == SHARDING_CONSTRAINT:
            self.local[id(node.outputs[0])] = columns[0]  # type: ignore[assignment]
            return
        meta = {k: v for k, v in node.meta.items() if k not in _LAYOUT_META}
        if node.replica is None:
            copy = self._copy(node, [c[0] for c in columns], self.mesh.devices[0][0], None, meta, None)
            for out, new in zip(node.outputs, copy.outputs):
                self.local[id(out)] = [new] * self.count
            return
        if self._once_per_replica(node, wanted):
            copy = self._copy(node, [c[0] for c in columns], self.mesh.devices[replica][0], node.replica, meta, 0)
            for out, new in zip(node.outputs, copy.outputs):
                self.local[id(out)] = [new] * self.count  # the other devices read it (a transfer)
            return
        for out in node.outputs:
            self.local[id(out)] = []
        once = node.meta.get(ADD_ONCE_KEY)
        for index in range(self.count):
            if once and not self._first_of_groups(index, layout_of(node.outputs[0]).partial):
                self.local[id(node.outputs[0])].append(self._without(node, columns, once, replica, index, meta))
                continue
            copy = self._copy(node, [c[index] for c in columns], self.mesh.devices[replica][index], node.replica,
                              meta, index)
            for out, new in zip(node.outputs, copy.outputs):
                self._check_local(out, new)
                self.local[id(out)].append(new)

    def _once_per_replica(self, node: Node, wanted: Sequence[Layout | None]) -> bool:
        """Whether a collective between replicas runs on each replica's first device only: its inputs and outputs
        are whole on every device of a replica (a replicated weight's gradient, an FSDP weight's gather), so one
        device's copy serves them all; per device it would move the same bytes once per device.
        """
        if node.domain != GRAPHDIST_DOMAIN or not is_communication(node) or "group_key" not in node.attrs:
            return False
        return (all(want is None or want.is_replicated for want in wanted)
                and all(layout_of(out).is_replicated for out in node.outputs))

    def _first_of_groups(self, index: int, axes: frozenset[str]) -> bool:
        coords = self.mesh.coordinates(index)
        return all(coords[axis] == 0 for axis in axes)

    def _without(self, node: Node, columns: list[list[Value | None]], once: list[int], replica: int, index: int,
                 meta: dict[str, Any]) -> Value:
        """Device ``index``'s summand of a partial ``Add``/``Sub``/``Sum`` whose whole operands (``once``) only
        the first device of the group adds: the partial operands' sum (negated when subtracted).
        """
        kept = [c[index] for position, c in enumerate(columns) if position not in once]
        device = self.mesh.devices[replica][index]
        if node.op_type in ("Gemm", "Conv", "ConvTranspose"):  # the optional bias input left out
            return self._add(node.op_type, kept, dict(node.attrs), device, replica, node.name,
                             meta=dict(meta)).outputs[0]
        if node.op_type == "Sub" and once == [0]:
            return self._add("Neg", kept, None, device, replica, node.name, meta=dict(meta)).outputs[0]
        if len(kept) == 1:
            return kept[0]  # type: ignore[return-value]
        return self._add("Sum", kept, None, device, replica, node.name, meta=dict(meta)).outputs[0]

    def _copy(self, node: Node, inputs: list[Value | None], device: str, replica: int | None,
              meta: dict[str, Any], index: int | None) -> Node:
        attrs = dict(node.attrs)
        if index is not None and "group_key" in attrs and self.count > 1:
            attrs["group_key"] = f"{attrs['group_key']}/d{index}"  # one group per device of the replicas
        if node.op_type in _SHAPE_INPUT_OPS and not node.domain and index is not None:
            out = node.outputs[0]
            local = self.mesh.local_shape(out.shape, layout_of(out))
            if local != tuple(out.shape):
                inputs = [inputs[0], self._const(f"{node.name}_local_shape", local), *inputs[2:]]
        if node.op_type == "Conv" and not node.domain and int(attrs.get("group", 1)) > 1:
            attrs["group"] = _local_group(node, inputs[0])
        copy = self._add(node.op_type, inputs, attrs, device, replica, node.name, node.domain, len(node.outputs),
                         dict(meta))
        for out, new in zip(node.outputs, copy.outputs):
            new.meta[GLOBAL_LAYOUT_KEY] = layout_of(out)
        return copy

    def _check_local(self, whole: Value, local: Value) -> None:
        expected = self.mesh.local_shape(whole.shape, layout_of(whole))
        if whole.is_static and tuple(local.shape) != tuple(expected):
            raise GraphError(f"LowerLayoutsPass: %{whole.name} laid out {layout_of(whole)} should be {expected} on "
                             f"each device, its copy %{local.name} is {local.type_str()}")

    # ------------------------------------------------------------ reshards
    def _values(self, value: Value, replica: int) -> list[Value]:
        if value.producer is not None:
            return self.local[id(value)]
        key = (id(value), replica)
        if key not in self.sources:
            layout = layout_of(value)
            whole = [value] * self.count
            self.sources[key] = whole if layout.is_replicated else self._split(
                whole, Layout.replicated(value.rank), layout, replica)
        return self.sources[key]

    def _reshard(self, value: Value, want: Layout, replica: int) -> list[Value]:
        """``value``'s blocks on the replica's devices as ``want`` lays it out (made once per layout)."""
        values = self._values(value, replica)
        have = layout_of(value)
        if have == want:
            return values
        key = (id(value), want, replica)
        if key not in self.resharded:
            self.resharded[key] = self._resharded(values, value, have, want, replica)
        return self.resharded[key]

    def _resharded(self, values: list[Value], value: Value, have: Layout, want: Layout,
                   replica: int) -> list[Value]:
        values, current = self._reduce(values, have, want, replica)
        if want.partial - current.partial:
            raise GraphError(f"LowerLayoutsPass: %{value.name} is {current}, a reader wants it partial ({want}); "
                             "no rule asks a whole value to become partial")
        values, current = self._exchange(values, current, want, replica)
        dims = list(current.dims)
        for dim, axis in enumerate(current.dims):
            if axis is not None and want.dims[dim] != axis:
                values = self._collective("AllGather", values, axis, replica, {"axis": dim})
                dims[dim] = None
        return self._split(values, Layout(tuple(dims), current.partial), want, replica)

    def _reduce(self, values: list[Value], have: Layout, want: Layout, replica: int) -> tuple[list[Value], Layout]:
        """Sums the partial axes ``want`` does not keep: reduce-scatter where it gives ``want``'s block, else
        all-reduce.
        """
        current = have
        for axis in sorted(have.partial - want.partial):
            dim = self._scatter_dim(values[0], current, want, axis)
            if dim is None:
                values = self._collective("AllReduce", values, axis, replica, {"reduce_op": "SUM",
                                                                               "algorithm": "ring"})
                current = Layout(current.dims, current.partial - {axis})
                continue
            scattered = self._collective("ReduceScatter", values, axis, replica, {"reduce_op": "SUM"},
                                         shard=True)
            dims = tuple(axis if d == dim else a for d, a in enumerate(current.dims))
            shape = list(values[0].shape)
            shape[dim] //= self.mesh.size(axis)
            values = [self._add("Reshape", [v, self._const("scatter_shape", shape)], None, v.producer.device,
                                v.producer.replica, f"{v.name}_block").outputs[0] for v in scattered]
            current = Layout(dims, current.partial - {axis})
        return values, current

    def _exchange(self, values: list[Value], current: Layout, want: Layout,
                  replica: int) -> tuple[list[Value], Layout]:
        """Moves each axis ``want`` splits another dimension over (one not split now) by an all-to-all, where
        the cost model prices that below gathering the value and slicing it.
        """
        for dim, axis in enumerate(current.dims):
            if axis is None or want.dims[dim] == axis or axis not in want.dims:
                continue
            target = want.dims.index(axis)
            if current.dims[target] is not None or not self._exchange_pays(values[0], target, axis):
                continue
            values = self._collective("AllToAll", values, axis, replica, {"split_axis": target, "concat_axis": dim})
            dims = list(current.dims)
            dims[dim], dims[target] = None, axis
            current = Layout(tuple(dims), current.partial)
        return values, current

    def _exchange_pays(self, local: Value, target: int, axis: str) -> bool:
        """Whether an all-to-all can split ``local``'s dimension ``target`` over ``axis`` and costs less than an
        all-gather (then a free slice).
        """
        size = self.mesh.size(axis)
        if not local.is_static or int(local.shape[target]) % size:
            return False
        nbytes = int(local.nbytes or 0)
        return collective_cost("AllToAll", nbytes, size, self.link) < collective_cost("AllGather", nbytes, size,
                                                                                      self.link)

    def _scatter_dim(self, local: Value, current: Layout, want: Layout, axis: str) -> int | None:
        if not local.is_static or axis in current.dims:
            return None
        for dim, wanted in enumerate(want.dims):
            if wanted == axis and current.dims[dim] is None:
                leading = int(np.prod(local.shape[:dim], dtype=np.int64))
                return dim if leading == 1 and local.shape[dim] % self.mesh.size(axis) == 0 else None
        return None

    def _split(self, values: list[Value], current: Layout, want: Layout, replica: int) -> list[Value]:
        """Slices the dimensions ``want`` splits and ``current`` does not, each device its block."""
        out = list(values)
        for dim, axis in enumerate(want.dims):
            if axis is None or current.dims[dim] == axis:
                continue
            parts = self.mesh.size(axis)
            for index in range(self.count):
                value = out[index]
                block = int(value.shape[dim]) // parts
                start = self.mesh.coordinates(index)[axis] * block
                bounds = [self._const(name, [at]) for name, at in
                          (("block_start", start), ("block_stop", start + block), ("block_axis", dim))]
                node = self._add("Slice", [value, *bounds], None, self.mesh.devices[replica][index], replica,
                                 f"{value.name}_block")
                out[index] = node.outputs[0]
        return out

    def _collective(self, op_type: str, values: list[Value], axis: str, replica: int, attrs: dict[str, Any],
                    shard: bool = False) -> list[Value]:
        """One collective over ``axis``: a group per position on the other axes, members in axis order."""
        self.groups += 1
        size = self.mesh.size(axis)
        out = []
        for index in range(self.count):
            value = values[index]
            key = f"layout{self.groups}.{values[0].name}/{self.mesh.group_name(index, axis)}/r{replica}"
            extra = {"shard": self.mesh.coordinates(index)[axis]} if shard else {}
            nbytes = int(value.nbytes or 0)
            seconds = collective_cost(op_type, nbytes, size, self.link, str(attrs.get("algorithm", "ring")))
            node = self._add(op_type, [value], {**attrs, **extra, "group_key": key, "group_size": size},
                             self.mesh.devices[replica][index], replica, f"{value.name}_{op_type.lower()}",
                             GRAPHDIST_DOMAIN, meta={"side_effect": True, "predicted_seconds": seconds,
                                                     "bytes_per_device": collective_bytes(op_type, nbytes, size)})
            out.append(node.outputs[0])
        return out

    # --------------------------------------------------------------- outputs
    def _whole(self, value: Value) -> Value:
        """``value`` whole on its replica's first device (partial sums added, blocks joined there)."""
        replica = self._replica_of(value)
        values = self._values(value, replica)
        current = layout_of(value)
        if current.is_replicated:
            return values[0]
        values = list(values)
        for axis in sorted(current.partial):
            values = self._to_first(values, axis, replica, lambda group: ("Sum", group, None))
        for dim, axis in enumerate(current.dims):
            if axis is not None:
                values = self._to_first(values, axis, replica, lambda group, d=dim: ("Concat", group, {"axis": d}))
        return values[0]

    def _to_first(self, values: list[Value], axis: str, replica: int, make: Any) -> list[Value]:
        """For each group over ``axis``, its members' values combined on its first member's device."""
        out = list(values)
        for index in range(self.count):
            if self.mesh.coordinates(index)[axis] != 0:
                continue
            members = [values[m] for m in self.mesh.group(index, axis)]
            op_type, inputs, attrs = make(members)
            out[index] = self._add(op_type, inputs, attrs, self.mesh.devices[replica][index], replica,
                                   f"{values[index].name}_whole").outputs[0]
        return out
