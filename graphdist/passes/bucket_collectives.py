"""BucketCollectivesPass: fuse small all-reduces into packs (gradient bucketing).

Invariant established: the all-reduce groups that the packing rule below
puts together are each replaced by one packed group. A group is a *chain*
of collectives on each participant (device and replica):

* a multi-participant ``graphdist.AllReduce`` (devices of one process);
* under ``MultiWorkerMirroredStrategy`` with several local devices, that
  ``AllReduce`` followed by the ``graphdist.CrossWorkerAllReduce`` that
  ``InsertCrossWorkerCollectivesPass`` appended (local devices first, then
  the workers through MPI);
* with one local device, the ``CrossWorkerAllReduce`` alone (the local
  all-reduce of one participant was lowered to the identity).

On every participant the pack is, in ONNX ops placed on that participant's
device and replica::

    Reshape(g_i, [-1]) ... -> Concat(axis=0) -> AllReduce (group_key "bucketN")
        [-> CrossWorkerAllReduce (group_key "bucketN/workers")]
        -> Split(axis=0, sizes) -> Reshape(piece_i, shape(g_i)) ...

(with one local device only the ``CrossWorkerAllReduce``), so a pack is one
local all-reduce and one MPI all-reduce, and every reader of a member's
result reads its slice of the packed result (rewired with
``Graph.replace_all_uses_with``). Sum, mean, max and min are elementwise,
so reducing the packed buffer equals reducing each member. Every
collective of a group the pass considered carries ``meta["bucket"]`` (its
pack's key, or its own group key when it stayed alone), so a second run
changes nothing and ``PartitionPass`` can cut the backward pass at the
packs. When packs were built and the graph has collectives between
workers, they are numbered again (``attrs["sequence"]``) in the new graph
order, which is the same on every worker: every worker issues the MPI calls
in the same order, the first-ready pack first.

Which groups may share a pack (one *class*): the same chain of ops with the
same attributes apart from the names (``group_key``, and ``sequence`` and
``name`` of a cross-worker link): ``reduce_op``, ``group_size``,
``algorithm``, ``root``, ``num_workers``, ``comm_group``; same dtype,
same participants (device and replica of each member) and the same
*input phase*: the number of communication steps on the longest path to the
members' inputs, i.e. the phase PartitionPass gives them. Packing within one
phase leaves every other node's phase unchanged and cannot create a cycle:
a group whose input depends on another group's result has a strictly larger
input phase, so the two never share a pack.

Packing rule (per class): groups are ordered by when their input becomes
ready in the step, i.e. the graph position of the node producing the member
inputs (reverse-mode autodiff emits the last layer's gradients first, so
this is roughly reverse variable order), and cut into *contiguous* runs of
that order:

* ``bytes_per_pack=B``: greedily, a pack takes the next group while its
  size stays within ``B`` bytes (a group larger than ``B`` stays alone);
* ``num_packs=K``: ``K`` runs of roughly equal bytes (a group goes to run
  ``floor(K * midpoint / total)``, where midpoint is the middle of its byte
  range in the concatenation); fewer when there are fewer groups.

A pack's Concat waits for all of its members, so contiguous runs in
readiness order mean pack ``k`` waits only for the gradients up to its own
last member, never for the end of the backward pass: the first pack holds the
gradients produced first and can be reduced while earlier layers' backward
ops still run, wherever the partition and the communicator overlap them.
(Packing in variable order instead would put the first layer's gradient,
produced last, into the first pack and make every pack wait for the whole
backward pass.) With PartitionPass's ``(device, phase)`` segments a device's
backward pass of one phase is one segment, so today all packs of a phase
become ready together and the order decides which one the communication
lane reduces first; the packs appear in the graph, and hence in the plan's
communication tasks, in readiness order.

Cases:
* bucketing off (``num_packs=0`` or ``bytes_per_pack=0``): unchanged;
* local group of one participant, not lowered yet (no ``algorithm``), with a
  symbolic or empty shape, with members of different shapes, or reading a
  value placed on another device than the member: left alone (not marked);
* local group whose result is read by anything but one cross-worker group
  (members followed by different cross-worker groups, or some members
  only): left alone (not marked);
* cross-worker all-reduce groups (one local participant, or after a local
  group): packed with their chain as above; cross-worker gathers and
  reduce-scatters (ZeRO-1) are not packed but numbered with the others;
* class of one group, or a pack of one group: left alone (marked);
* groups marked by an earlier run (``meta["bucket"]``): skipped, so the pass
  is idempotent; ``modified`` is true only when a pack was built;
* members of 1-D shape: no Reshape on either side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError
from graphdist.ir.comm_ops import CROSS_WORKER_OPS, is_communication
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.insert_cross_worker_collectives import number_cross_worker_groups

__all__ = ["BucketCollectivesPass", "pack_groups"]

#: Meta key marking the AllReduce nodes the pass has decided on.
BUCKET = "bucket"

_LOCAL, _CROSS = "AllReduce", "CrossWorkerAllReduce"
#: Attributes that name a collective (or number it) rather than say what it computes.
_NAMING = frozenset({"group_key", "sequence", "name"})


def pack_groups(sizes: list[int], *, num_packs: int | None = None,
                bytes_per_pack: int | None = None) -> list[list[int]]:
    """Cuts groups, given in readiness order by byte size, into contiguous packs.

    Args:
        sizes: Bytes of each group (one participant's buffer), in order.
        num_packs: Make this many packs of roughly equal bytes (fewer when
            there are fewer groups).
        bytes_per_pack: Make packs of at most this many bytes (a larger group
            forms a pack of its own). Takes precedence over ``num_packs``.

    Returns:
        Indices into ``sizes``, one list per pack, in order; every index once.
    """
    if not sizes:
        return []
    packs: list[list[int]] = []
    if bytes_per_pack:
        total = 0
        for index, size in enumerate(sizes):
            if packs and packs[-1] and total + size <= bytes_per_pack:
                packs[-1].append(index)
                total += size
            else:
                packs.append([index])
                total = size
        return packs
    count = min(int(num_packs or 1), len(sizes))
    overall = float(sum(sizes)) or 1.0
    start = 0.0
    last = -1
    for index, size in enumerate(sizes):
        slot = min(count - 1, int(count * (start + size / 2.0) / overall))
        start += size
        if slot != last:
            packs.append([])
            last = slot
        packs[-1].append(index)
    return packs


@dataclass
class _Group:
    """One AllReduce group the pass may pack."""

    key: str
    members: list[list[Node]]  # one chain of collectives per participant, by replica; the first reads the value
    nbytes: int
    ready: int  # graph position of the latest producer of a member input (-1: graph inputs only)
    first: int  # graph position of the first member
    klass: tuple  # attributes, dtype, participants, input phase: groups of one class may share a pack


def _replica_of(node: Node) -> int | None:
    return node.replica


def _available_phases(graph: Graph) -> dict[int, int]:
    """For each node, the phase at which its outputs are available (comm nodes add one)."""
    phase: dict[int, int] = {}
    for node in graph.nodes:
        best = 0
        for value in node.inputs:
            if value is not None and value.producer is not None:
                best = max(best, phase[id(value.producer)])
        phase[id(node)] = best + (1 if is_communication(node) else 0)
    return phase


def _device_of(node: Node, devices: tuple[str, ...]) -> str | None:
    """The node's device, or the one AssignDevicesPass will give it."""
    if node.device is not None:
        return node.device
    replica = _replica_of(node)
    return devices[replica] if replica is not None and replica < len(devices) else None


def _attrs_key(node: Node) -> tuple:
    """The node's attributes apart from the names (what must agree within a group and a pack)."""
    return tuple(sorted((k, repr(v)) for k, v in node.attrs.items() if k not in _NAMING))


def _chains(op_type: str, nodes: list[Node], groups: dict[tuple[str, str], list[Node]],
            step_outputs: set[int]) -> list[list[Node]] | None:
    """Each participant's chain of collectives for the group ``nodes`` (sorted by replica), or ``None``.

    ``step_outputs``: ids of the graph's output values (a local result the step returns cannot become the
    slice of a pack's cross-worker result).
    """
    if "algorithm" not in nodes[0].attrs or int(nodes[0].attrs.get("group_size", 1)) != len(nodes):
        return None
    replicas = [_replica_of(n) for n in nodes]
    if None in replicas or len(set(replicas)) != len(nodes):
        return None
    members = sorted(nodes, key=_replica_of)
    if op_type == _CROSS:
        if any(_is_local_reduce(n.inputs[0].producer) for n in members):
            return None  # the second link of a local group's chain
        return [[n] for n in members]
    if len(nodes) < 2:
        return None
    followers = [[user for user, _ in n.outputs[0].uses] for n in members]
    crossing = [f for users in followers for f in users
                if f.domain == GRAPHDIST_DOMAIN and f.op_type in CROSS_WORKER_OPS]
    if not crossing:
        return [[n] for n in members]
    if any(len(users) != 1 for users in followers) or len(crossing) != len(members) or any(
            f.op_type != _CROSS for f in crossing) or any(id(n.outputs[0]) in step_outputs for n in members):
        return None
    keys = {str(f.attrs.get("group_key") or f.name) for f in crossing}
    if len(keys) != 1 or len(groups.get((_CROSS, keys.pop()), [])) != len(members):
        return None
    return [[n, users[0]] for n, users in zip(members, followers)]


def _is_local_reduce(node: Node | None) -> bool:
    return node is not None and node.domain == GRAPHDIST_DOMAIN and node.op_type == _LOCAL


def _candidates(graph: Graph, devices: tuple[str, ...]) -> list[_Group]:
    """Lowered all-reduce groups (local, local then cross-worker, or cross-worker) not decided on before,
    in graph order.
    """
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    phases = _available_phases(graph)
    step_outputs = {id(v) for v in graph.outputs}
    by_key: dict[tuple[str, str], list[Node]] = {}
    for node in graph.nodes:
        if node.domain == GRAPHDIST_DOMAIN and node.op_type in (_LOCAL, _CROSS):
            by_key.setdefault((node.op_type, str(node.attrs.get("group_key") or node.name)), []).append(node)
    groups = []
    for (op_type, key), nodes in by_key.items():
        chains = _chains(op_type, nodes, by_key, step_outputs)
        if chains is None or any(BUCKET in n.meta for chain in chains for n in chain):
            continue
        values = [chain[0].inputs[0] for chain in chains]
        first = values[0]
        if (not first.is_static or not first.nbytes or any(v.shape != first.shape or v.dtype != first.dtype
                                                           for v in values)):
            continue
        if any(v.producer is not None and v.producer.device is not None
               and v.producer.device != _device_of(chain[0], devices) for v, chain in zip(values, chains)):
            continue  # the Concat would need a transfer first: keep reading across devices directly
        links = tuple((n.op_type, _attrs_key(n)) for n in chains[0])
        if any(tuple((n.op_type, _attrs_key(n)) for n in chain) != links for chain in chains):
            continue
        participants = tuple((chain[0].device, _replica_of(chain[0])) for chain in chains)
        input_phase = max(phases[id(v.producer)] if v.producer is not None else 0 for v in values)
        ready = max(position[id(v.producer)] if v.producer is not None else -1 for v in values)
        groups.append(_Group(key, chains, int(first.nbytes), ready, position[id(chains[0][0])],
                             (links, first.dtype.str, participants, input_phase)))
    return groups


def _placed_like(node: Node, template: Node, key: str) -> None:
    """Puts ``node`` on the template member's device and replica."""
    node.device, node.replica = template.device, template.replica
    if "context" in template.meta:
        node.meta["context"] = template.meta["context"]
    node.meta[BUCKET] = key


class BucketCollectivesPass(PassBase):
    """Fuses compatible AllReduce groups into packs, in the order their inputs become ready.

    Args:
        num_packs: Pack each class of compatible groups into this many packs
            of roughly equal size; ``0`` turns bucketing off.
        bytes_per_pack: Pack groups into packs of at most this many bytes
            (per participant); ``0`` turns bucketing off. Give one of the two.

    Raises:
        InvalidArgumentError: A negative or non-integer setting, both set to
            positive values, or neither given.
    """

    runs_after = ("LowerCollectivesPass",)

    def __init__(self, num_packs: int | None = None, bytes_per_pack: int | None = None) -> None:
        for label, setting in (("num_packs", num_packs), ("bytes_per_pack", bytes_per_pack)):
            if setting is not None and (isinstance(setting, bool) or not isinstance(setting, (int, np.integer))
                                        or setting < 0):
                raise InvalidArgumentError(f"BucketCollectivesPass: {label} must be a non-negative int, "
                                           f"got {setting!r}")
        if num_packs is None and bytes_per_pack is None:
            raise InvalidArgumentError("BucketCollectivesPass needs num_packs or bytes_per_pack")
        if num_packs and bytes_per_pack:
            raise InvalidArgumentError(f"BucketCollectivesPass: give num_packs ({num_packs}) or bytes_per_pack "
                                       f"({bytes_per_pack}), not both")
        self.num_packs = None if num_packs is None else int(num_packs)
        self.bytes_per_pack = None if bytes_per_pack is None else int(bytes_per_pack)

    @property
    def enabled(self) -> bool:
        """False when a setting is 0 (bucketing off)."""
        return self.num_packs != 0 and self.bytes_per_pack != 0

    def __repr__(self) -> str:
        setting = f"bytes_per_pack={self.bytes_per_pack}" if self.bytes_per_pack is not None \
            else f"num_packs={self.num_packs}"
        return f"{self.name}({setting})"

    # ------------------------------------------------------------ analysis
    def _packs(self, groups: list[_Group]) -> tuple[list[list[_Group]], list[_Group]]:
        """Packs of two or more groups (in readiness order) and the groups left alone."""
        classes: dict[tuple, list[_Group]] = {}
        for group in groups:
            classes.setdefault(group.klass, []).append(group)
        packs, alone = [], []
        for members in classes.values():
            members.sort(key=lambda g: (g.ready, g.first))
            for indices in pack_groups([g.nbytes for g in members], num_packs=self.num_packs,
                                       bytes_per_pack=self.bytes_per_pack):
                chosen = [members[i] for i in indices]
                (packs if len(chosen) > 1 else alone).append(chosen)
        packs.sort(key=lambda p: (max(g.ready for g in p), p[0].first))
        return packs, [g for single in alone for g in single]

    # ------------------------------------------------------------- rewrite
    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        if not self.enabled:
            return PassResult(graph, False)
        packs, alone = self._packs(_candidates(graph, tuple(ctx.devices)))
        for group in alone:
            for chain in group.members:
                for node in chain:
                    node.meta[BUCKET] = group.key
        if not packs:
            return PassResult(graph, False)
        position = {id(n): i for i, n in enumerate(graph.nodes)}
        placement: dict[int, tuple] = {}  # new node -> sort key next to its anchor
        taken = {n.attrs.get("group_key") for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN}
        shapes: dict[tuple, Value] = {(-1,): graph.add_initializer("bucket_flat_shape", np.array([-1], np.int64))}
        counter = 0
        for pack in packs:
            while f"bucket{counter}" in taken or f"bucket{counter}/workers" in taken:
                counter += 1
            key = f"bucket{counter}"
            taken.update((key, f"{key}/workers"))  # the pack's local and cross-worker links
            sizes = graph.add_initializer(f"{key}_sizes", np.array(
                [int(np.prod(g.members[0][0].inputs[0].shape, dtype=np.int64)) for g in pack], np.int64))
            for participant in range(len(pack[0].members)):
                chains = [g.members[participant] for g in pack]
                created = self._build(graph, chains, key, [g.key for g in pack], shapes, sizes)
                inputs = [chain[0].inputs[0] for chain in chains]
                producers = [position[id(v.producer)] for v in inputs if v.producer is not None]
                anchor = (max(producers), 1) if producers else (min(position[id(c[0])] for c in chains), -1)
                for node in created:
                    placement[id(node)] = (*anchor, len(placement))
                for chain in chains:
                    for node in reversed(chain):
                        graph.remove_node(node)
        order = {id(n): (position[id(n)], 0, 0) for n in graph.nodes if id(n) in position}
        order.update(placement)
        graph.set_nodes(sorted(graph.nodes, key=lambda n: order[id(n)]))
        graph.topological_sort()  # readers of a member that preceded the pack's anchor move after it
        if any(n.domain == GRAPHDIST_DOMAIN and n.op_type in CROSS_WORKER_OPS for n in graph.nodes):
            number_cross_worker_groups(graph)  # every worker issues the MPI calls in the new graph order
        return PassResult(graph, True)

    @staticmethod
    def _build(graph: Graph, chains: list[list[Node]], key: str, member_keys: list[str], shapes: dict[tuple, Value],
               sizes: Value) -> list[Node]:
        """One participant's Reshape/Concat/collectives/Split/Reshape chain; rewires the members' readers.

        Args:
            graph: The graph to add to.
            chains: The participant's chain of collectives of each group in the pack, in pack order.
            key: The pack's key (``group_key`` of its local all-reduce; ``key + "/workers"`` of its
                cross-worker one).
            member_keys: Group keys of the packed groups (``meta["bucket_members"]``).
            shapes: Shape initializers made so far, by dims (shared by every pack).
            sizes: The pack's Split sizes.

        Returns:
            The nodes added, in order.
        """
        template = chains[0][0]
        created: list[Node] = []

        def add(op_type: str, inputs: list[Any], attrs: dict[str, Any] | None = None, **kwargs: Any) -> Node:
            node = graph.add_node(op_type, inputs, attrs, **kwargs)
            _placed_like(node, template, key)
            created.append(node)
            return node

        def shape_of(dims: tuple) -> Value:
            if dims not in shapes:
                shapes[dims] = graph.add_initializer("bucket_shape", np.array(dims, np.int64).reshape(-1))
            return shapes[dims]

        pieces = []
        for chain in chains:
            value = chain[0].inputs[0]
            pieces.append(value if value.rank == 1 else
                          add("Reshape", [value, shape_of((-1,))], name=f"{key}_flatten").outputs[0])
        packed = add("Concat", pieces, {"axis": 0}, name=f"{key}_concat").outputs[0]
        for link in chains[0]:
            attrs = {k: v for k, v in link.attrs.items() if k not in ("sequence", "name")}  # numbered after packing
            attrs["group_key"] = key if link.op_type == _LOCAL else f"{key}/workers"
            reduce = add(link.op_type, [packed], attrs, domain=GRAPHDIST_DOMAIN, name=f"{key}_{link.op_type.lower()}")
            reduce.meta["side_effect"] = True  # every participant of a collective must run
            reduce.meta["bucket_members"] = list(member_keys)
            packed = reduce.outputs[0]
        split = add("Split", [packed, sizes], {"axis": 0}, num_outputs=len(chains), name=f"{key}_split")
        for chain, piece in zip(chains, split.outputs):
            out = chain[-1].outputs[0]
            if out.rank != 1:
                piece = add("Reshape", [piece, shape_of(out.shape)], name=f"{key}_unflatten").outputs[0]
            graph.replace_all_uses_with(out, piece)
        return created
