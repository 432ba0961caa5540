"""ShardOptimizerStatePass: ZeRO-1, each replica updates and keeps its 1/N slice of every optimizer slot.

After :class:`graphdist.passes.insert_collectives.InsertCollectivesPass` a variable's
gradient is an ``AllReduce`` (SUM) group with one member per replica, and
its update (the optimizer's elementwise arithmetic on the summed gradient,
the variable and its slots) is computed on one replica, the one whose
values ``LowerVariableUpdatesPass`` writes back; the other replicas' copies
of the update are dead. This pass rewrites that into the ZeRO-1 form
(PyTorch's ``ZeroRedundancyOptimizer``): the flattened gradient, padded to
a multiple of the replica count N, is reduce-scattered; replica ``r``
updates elements ``[r * k, (r + 1) * k)`` of the variable and of every slot
(``k = ceil(size / N)``); the updated weights are all-gathered.

Invariant established: every gradient group this pass can shard is a
``ReduceScatter`` group followed by N copies of the update on ``k``-element
slices and an ``AllGather`` of the new weights; ``graph.meta.sharded_state``
maps each sharded slot's variable uid to ``{"replicas", "shard", "size"}``
and ``graph.meta.placement`` places those slots ``"sharded"``.

How a sharded slot is stored, read and written back:

* *in parts* (across workers always; in one process when the caller stores
  variables in parts, ``PassContext.options[REPLICA_PARTS_OPTION]``, which
  ``gd.function`` sets): the slot's graph input is replaced by one input per
  local replica, ``<input>/part<r>`` (``k`` elements: the shard replica
  ``r`` updates), and its write-back by one output per local replica (its
  updated shard), each in ``graph.meta.variable_updates`` under the
  slot's uid, in local replica order; ``sharded_state`` lists the part
  inputs (``"parts"``). Each replica's update reads and writes only its own
  part: no slice of the slot, no concatenation, no copy between devices.
  The caller stores the variable as those parts
  (:class:`graphdist.trace.variables.WorkerShard`);
* *whole* (in one process otherwise, e.g. a re-planned or exported plan, whose
  variables are one array each): each replica slices its shard of the
  slot's input, and the slices are concatenated on replica ``L`` for the
  write-back (a copy between devices).

Across workers (``num_workers`` W > 1 with L local replicas each,
``MultiWorkerMirroredStrategy(shard_optimizer_state=True)``): N = W * L shards, and local replica
``r`` of worker ``w`` updates shard ``r * W + w``. The flattened, padded gradient is
reduce-scattered over the local replicas (replica ``r`` gets part ``r`` of the local sum, ``W * k``
elements; skipped when L is 1), then each part through a ``CrossWorkerReduceScatter`` (MPI, one call
per local replica): shard ``r * W + w``. The new weight shards go the other way
(``CrossWorkerAllGather`` per local replica, then a local ``AllGather``). Each sharded slot is
stored in parts (above): this worker's L shards, so the process stores only those
(``sharded_state`` records ``workers``, ``worker`` and ``local``; the compiled function converts
the variable's storage, see :meth:`graphdist.trace.variables.Variable.store_in_parts`).

:class:`graphdist.passes.shard_parameters.ShardParametersPass` (FSDP / ZeRO-3, which runs first) reuses
this analysis and rewrite for the weights it shards: ``_Update.params`` hands it each such weight's
per-replica shards, which the update reads and writes back instead of all-gathering the new weight.

Cases:

* a group whose update is elementwise (``_ELEMENTWISE``) over the summed
  gradient, values of the variable's shape and scalars, and whose results
  are only variable updates: sharded (SGD, momentum, Adam, AdamW, RMSprop,
  Adagrad updates are);
* a variable with fewer elements than replicas, or a size that does not
  divide: padded with zeros to ``k * N`` (the padding is updated like any
  element and sliced off, so it never reaches the variable);
* a trainable variable's new value: all-gathered; replica ``L`` (the one
  written back) slices and reshapes it;
* a non-trainable variable updated there (an optimizer slot): never
  all-gathered; stored in parts (each replica writes back its own shard), or
  whole (its slices concatenated on replica ``L`` for the write-back);
* in one process, a slot whose value is read outside its update (the step
  returns it, or another computation reads it), or a caller that does not
  store parts: the update's slots are stored whole;
* a group that is not a gradient update (a loss reduction), whose summed
  value is read by more than one replica or by a non-elementwise op,
  reduced with another op than SUM, spans other workers
  (``group_size`` above the local members) when ``num_workers`` is 1, has a
  scalar, symbolic or non-float value, or a single member: left unchanged
  (logged at DEBUG);
* across workers: a slot whose value is read outside its update (it could
  not be stored as a chunk): left unchanged (logged at DEBUG);
* nothing to shard (also a second run): unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, ONNX_DOMAIN, Graph, Node, Value
from graphdist.ir.liveness import live_nodes
from graphdist.ir.placement import PlacementSpec, VariablePlacement, variable_specs
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["REPLICA_PARTS_OPTION", "ShardOptimizerStatePass", "state_bytes_per_replica"]

logger = logging.getLogger(__name__)

#: ``PassContext.options`` key: the caller stores a sharded slot in per-replica parts (see the module docstring).
REPLICA_PARTS_OPTION = "zero_replica_parts"

#: ONNX ops whose output element i depends only on element i of each (same-shape or scalar) input.
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Sqrt", "Pow", "Abs", "Exp", "Log", "Reciprocal",
                          "Max", "Min", "Cast", "Identity", "Where", "Sign", "Clip", "Relu", "Tanh", "Sigmoid",
                          "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or"})


@dataclass
class _Update:
    """One gradient group's update, as found on the replica written back."""

    members: list[Node]  # the AllReduce members, by replica
    owner: Node  # the member whose result the update reads
    nodes: list[Node]  # the update's nodes, in graph order
    results: list[tuple[Value, str, bool]]  # (updated value, variable uid, trainable)
    dead: list[Node] = field(default_factory=list)  # other replicas' unused copies of the update
    parts: bool = False  # its slots are stored in per-replica parts (else whole)
    # FSDP (ShardParametersPass): uid -> per-local-replica shards of a trainable variable that keeps them
    # (never all-gathered), as values made by the caller; written back in parts when params_in_parts, else joined.
    params: dict[str, list[Value]] = field(default_factory=dict)
    params_in_parts: bool = False


class ShardOptimizerStatePass(PassBase):
    """Rewrites all-reduce + update into reduce-scatter -> sliced update -> all-gather (ZeRO-1).

    Args:
        num_workers: Worker processes in sync (``1``: shard over this process's replicas).
        worker: This worker's index (its shard across workers).
        comm_group: The communicator of the cross-worker collectives
            (see :func:`graphdist.runtime.comm.mpi.register_group`).
        replica_parts: In one process, store the sharded slots in per-replica parts (``None``: as
            ``PassContext.options[REPLICA_PARTS_OPTION]`` says, else whole). Across workers they always are.
    """

    runs_after = ("InsertCollectivesPass", "ShardParametersPass")

    def __init__(self, num_workers: int = 1, worker: int = 0, comm_group: str = "",
                 replica_parts: bool | None = None) -> None:
        self.workers = _Workers(int(num_workers), int(worker), str(comm_group))
        self.replica_parts = replica_parts

    def __repr__(self) -> str:
        parts = "" if self.replica_parts is None else f"replica_parts={self.replica_parts}"
        if self.workers.count == 1:
            return f"{self.name}({parts})"
        return (f"{self.name}(num_workers={self.workers.count}, worker={self.workers.index}, "
                f"comm_group={self.workers.group!r}{', ' + parts if parts else ''})")

    def _wants_parts(self, ctx: PassContext) -> bool:
        if self.workers.count > 1:
            return True
        if self.replica_parts is not None:
            return bool(self.replica_parts)
        return bool(ctx.options.get(REPLICA_PARTS_OPTION, False))

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        live = live_nodes(graph)
        specs = {spec.uid: (name, spec) for name, spec in variable_specs(graph)}
        updated = {name: uid for name, uid in graph.meta.variable_updates}
        parts = self._wants_parts(ctx)
        updates = [u for u in (self._analyse(graph, members, live, updated, specs, parts)
                               for members in _gradient_groups(graph).values()) if u is not None]
        if not updates:
            return PassResult(graph, modified=False)
        sharded: dict[str, dict[str, int]] = dict(graph.meta.sharded_state)
        for update in updates:
            sharded.update(_Rewrite(graph, update, self.workers, specs).apply())
        graph.topological_sort()  # the new nodes sit before the group's first member; some read later values
        graph.meta.sharded_state = sharded
        _place_sharded(graph, sharded, ctx)
        return PassResult(graph, modified=True)

    def _analyse(self, graph: Graph, members: list[Node], live: set[int], updated: dict[str, str],
                 specs: dict[str, Any], parts: bool = False, why: list[str] | None = None) -> _Update | None:
        """The group's update when it can be sharded, else ``None`` (the reason logged, and appended to ``why``)."""
        first = members[0]
        key = first.attrs.get("group_key")
        reason = _group_problem(members, self.workers.count)
        if reason is None:
            readers = [m for m in members if any(id(n) in live for n, _ in m.outputs[0].uses)]
            reason = None if len(readers) == 1 else f"{len(readers)} replicas read the sum"
        if reason is not None:
            logger.debug("ShardOptimizerStatePass: group %s left unsharded: %s", key, reason)
            if why is not None:
                why.append(reason)
            return None
        owner = readers[0]
        shape = owner.outputs[0].shape
        nodes, reason = _closure(owner.outputs[0], live, shape)
        results: list[tuple[Value, str, bool]] = []
        if reason is None:
            inside = {id(n) for n in nodes}
            for node in nodes:
                for out in node.outputs:
                    outside = [n for n, _ in out.uses if id(n) not in inside]
                    if not outside and out not in graph.outputs:
                        continue
                    uid = updated.get(out.name)
                    if outside or uid is None or uid not in specs:
                        reason = f"%{out.name} is read outside the update"
                        break
                    results.append((out, uid, bool(specs[uid][1].trainable)))
        if reason is None and not results:
            reason = "its sum updates no variable"
        dead = _downstream(members, live) if reason is None else []
        if reason is None and parts:
            slots = _slot_inputs(graph, results, specs)
            outside = _slot_read_outside(graph, slots, nodes, live)
            if outside is not None and self.workers.count > 1:
                reason = outside  # across workers a slot is only ever stored as this worker's parts
            elif outside is not None:
                logger.debug("ShardOptimizerStatePass: group %s sharded, its slots stored whole: %s", key, outside)
                parts = False
            else:
                # Other replicas' dead copies of slot arithmetic (b1 * m) read the slot whole: removed with the update.
                known = {id(n) for n in dead}
                dead += [n for n in _dead_readers(slots, live) if id(n) not in known]
        if reason is not None:
            logger.debug("ShardOptimizerStatePass: group %s left unsharded: %s", key, reason)
            if why is not None:
                why.append(reason)
            return None
        return _Update(members, owner, nodes, results, dead, parts)


def _gradient_groups(graph: Graph) -> dict[str, list[Node]]:
    groups: dict[str, list[Node]] = {}
    for node in graph.nodes:
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "AllReduce":
            groups.setdefault(str(node.attrs.get("group_key") or node.name), []).append(node)
    for members in groups.values():
        members.sort(key=lambda m: m.replica or 0)
    return groups


@dataclass(frozen=True)
class _Workers:
    """The worker processes the shards are spread over (``count`` 1: this process's replicas)."""

    count: int = 1
    index: int = 0
    group: str = ""


def _group_problem(members: list[Node], num_workers: int = 1) -> str | None:
    """Why the group cannot be reduce-scattered here, or ``None``."""
    first = members[0]
    value = first.inputs[0]
    replicas = [m.replica for m in members]
    size = int(first.attrs.get("group_size", len(members)))
    if num_workers > 1:
        if size != num_workers * len(members):
            return f"group_size {size} is not {num_workers} workers x {len(members)} local replicas"
        if replicas != list(range(len(members))):
            return f"its members are replicas {replicas}, not 0..{len(members) - 1}"
    elif len(members) < 2:
        return "a single participant"
    elif size != len(members):
        return "it spans other workers"
    elif replicas != list(range(len(members))):
        return f"its members are replicas {replicas}, not 0..{len(members) - 1}"
    if str(first.attrs.get("reduce_op", "SUM")).upper() != "SUM":
        return f"reduce_op {first.attrs.get('reduce_op')}"
    if not value.shape or not value.is_static or np.dtype(value.dtype).kind != "f":
        return f"a {value.type_str()} value (scalars, symbolic shapes and non-floats stay whole)"
    return None


def _slot_inputs(graph: Graph, results: list[tuple[Value, str, bool]], specs: dict[str, Any]) -> list[Value]:
    """The graph inputs of the slots (non-trainable variables) an update writes."""
    inputs = {v.name: v for v in graph.inputs}
    return [inputs[specs[uid][0]] for _, uid, trainable in results if not trainable and specs[uid][0] in inputs]


def _slot_read_outside(graph: Graph, slots: list[Value], nodes: list[Node], live: set[int]) -> str | None:
    """Why a slot cannot be stored in per-replica parts (a live node outside the update reads it whole, or
    the step returns it), or ``None``.
    """
    inside = {id(n) for n in nodes}
    for value in slots:
        if value in graph.outputs or any(id(n) not in inside and id(n) in live for n, _ in value.uses):
            return f"slot %{value.name} is read outside its update"
    return None


def _dead_readers(values: list[Value], live: set[int]) -> list[Node]:
    """Dead nodes reading ``values``, and the dead nodes they feed."""
    seen: dict[int, Node] = {}
    stack = [n for v in values for n, _ in v.uses if id(n) not in live]
    while stack:
        node = stack.pop()
        if id(node) not in seen and id(node) not in live:
            seen[id(node)] = node
            stack.extend(n for out in node.outputs for n, _ in out.uses)
    return list(seen.values())


def _closure(start: Value, live: set[int], shape: tuple) -> tuple[list[Node], str | None]:
    """Live nodes reachable from ``start``, if all are elementwise on ``shape`` (else the reason)."""
    seen: dict[int, Node] = {}
    stack = [n for n, _ in start.uses if id(n) in live]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        if node.domain != ONNX_DOMAIN or node.op_type not in _ELEMENTWISE:
            return [], f"the update uses {node.qualified_op} ({node.name}), which is not elementwise"
        for out in node.outputs:
            if tuple(out.shape) != tuple(shape):
                return [], f"{node.name} makes a {out.type_str()} value"
        for value in node.inputs:
            if value is not None and tuple(value.shape) not in (tuple(shape), (), (1,)):
                return [], f"{node.name} reads %{value.name}: {value.type_str()}"
        seen[id(node)] = node
        stack.extend(n for out in node.outputs for n, _ in out.uses if id(n) in live)
    _add_feeders(seen, shape)
    graph = start.producer.graph if start.producer is not None else None
    order = {id(n): i for i, n in enumerate(graph.nodes)} if graph is not None else {}
    return sorted(seen.values(), key=lambda n: order.get(id(n), 0)), None


def _add_feeders(nodes: dict[int, Node], shape: tuple) -> None:
    """Adds to ``nodes`` the elementwise producers of its full-shape inputs that only it reads.

    ``b1 * m`` of Adam does not depend on the gradient, but it is slot arithmetic: sliced with the
    update, each replica computes its slice of it instead of reading the whole product from one replica.
    """
    grown = True
    while grown:
        grown = False
        for node in list(nodes.values()):
            for value in node.inputs:
                producer = value.producer if value is not None else None
                if (producer is None or id(producer) in nodes or tuple(value.shape) != tuple(shape)
                        or producer.domain != ONNX_DOMAIN or producer.op_type not in _ELEMENTWISE
                        or producer.meta.get("side_effect")):
                    continue
                outputs_ok = all(tuple(out.shape) == tuple(shape) and out.uses
                                 and all(id(n) in nodes for n, _ in out.uses) for out in producer.outputs)
                inputs_ok = all(v is None or tuple(v.shape) in (tuple(shape), (), (1,)) for v in producer.inputs)
                graph_outputs = producer.graph.outputs if producer.graph is not None else []
                if outputs_ok and inputs_ok and not any(out in graph_outputs for out in producer.outputs):
                    nodes[id(producer)] = producer
                    grown = True


def _downstream(members: list[Node], live: set[int]) -> list[Node]:
    """Dead nodes fed (transitively) by the members' results: the other replicas' unused updates."""
    return _dead_readers([m.outputs[0] for m in members], live)


class _Rewrite:
    """Builds the sharded form of one :class:`_Update` and removes the old one."""

    def __init__(self, graph: Graph, update: _Update, workers: _Workers = _Workers(),
                 specs: dict[str, Any] | None = None) -> None:
        self.graph, self.update, self.workers = graph, update, workers
        self.across = workers.count > 1
        self.local = len(update.members)
        self.count = workers.count * self.local if self.across else self.local
        self.shape = tuple(update.owner.outputs[0].shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.shard = -(-self.size // self.count)
        self.key = str(update.members[0].attrs.get("group_key"))
        self.last = update.owner.replica or 0
        self._slices: dict[tuple[int, int], Value] = {}
        self.specs = specs or {}
        # Stored in parts: each slot input becomes one input per local replica, its shard (padded).
        slots = _slot_inputs(graph, update.results, self.specs) if update.parts else []
        self._slot_inputs = slots
        self._parts = {id(value): [graph.add_input(f"{value.name}/part{r}", value.dtype, (self.shard,))
                                   for r in range(self.local)] for value in slots}
        inputs = {v.name: v for v in graph.inputs}
        for uid, parts in update.params.items():  # an FSDP weight: its shards as the caller made them
            self._parts[id(inputs[self.specs[uid][0]])] = parts

    def _shard_of(self, replica: int) -> int:
        """The shard local replica ``replica`` updates: across workers ``replica * workers + worker``, so that a
        local reduce-scatter followed by one across the workers hands it exactly that shard.
        """
        return replica * self.workers.count + self.workers.index if self.across else replica

    def _cross_attrs(self, kind: str) -> dict[str, Any]:
        # per_participant: every local participant's buffer is its own (one MPI call each, in replica order).
        return {"num_workers": self.workers.count, "group_key": f"{self.key}.{kind}/workers", "per_participant": 1,
                **({"comm_group": self.workers.group} if self.workers.group else {})}

    def apply(self) -> dict[str, dict[str, int]]:
        """Rewrites the graph; returns ``uid -> layout`` of the sharded slots."""
        anchor = self.update.members[0]
        with self.graph.inserting_before(anchor):  # the new nodes go before the first member, in order
            new_nodes: list[Node] = []
            outputs: dict[int, list[Value]] = {id(v): [] for v, _, _ in self.update.results}
            for replica, member in enumerate(self.update.members):
                with _Collect(self.graph, new_nodes, replica, anchor):
                    gradient = self._scatter(member, replica)
                    mapping = {id(self.update.owner.outputs[0]): gradient}
                    for node in self.update.nodes:
                        self._clone(node, mapping, replica)
                    for value, _, _ in self.update.results:
                        outputs[id(value)].append(mapping[id(value)])
            sharded: dict[str, dict[str, Any]] = {}
            inputs = {id(v): v for v in self._slot_inputs}
            input_of = {v.name: v for v in self._slot_inputs}
            with _Collect(self.graph, new_nodes, self.last, anchor):
                finals: dict[int, Value | list[Value]] = {}
                for value, uid, trainable in self.update.results:
                    parts = outputs[id(value)]
                    kept = uid in self.update.params  # an FSDP weight keeps its shards: no all-gather
                    in_parts = self.update.params_in_parts if kept else self.update.parts
                    if trainable and not kept:
                        finals[id(value)] = self._gather(parts, value)
                    elif in_parts:  # each replica writes back its own shard
                        finals[id(value)] = parts
                    else:
                        finals[id(value)] = self._concat(parts, value)
                    if not trainable or kept:
                        sharded[uid] = {"replicas": self.count, "shard": self.shard, "size": self.size}
                        if self.across:
                            sharded[uid].update(workers=self.workers.count, worker=self.workers.index, local=self.local)
                        if kept and in_parts:
                            sharded[uid]["parts"] = [v.name for v in self.update.params[uid]]
                        elif in_parts:
                            slot = input_of.get(self.specs[uid][0]) if uid in self.specs else None
                            sharded[uid]["parts"] = [v.name for v in self._parts[id(slot)]] if slot is not None else []
        self._rewire(finals)
        self._remove_old()
        unread = {i for i, value in inputs.items() if not value.uses}  # the parts replace them
        self.graph.inputs = [v for v in self.graph.inputs if id(v) not in unread]
        return sharded

    # ------------------------------------------------------------ building
    def _flat(self, value: Value, name: str) -> Value:
        """``value`` flattened and zero-padded to ``shard * count`` elements."""
        flat = self.graph.add_node("Reshape", [value, self._const("flat", [-1])], name=f"{name}_flat").outputs[0]
        pad = self.shard * self.count - self.size
        if pad:
            zeros = self._const("zeros", np.zeros(pad, np.dtype(value.dtype)))
            flat = self.graph.add_node("Concat", [flat, zeros], {"axis": 0}, name=f"{name}_pad").outputs[0]
        return flat

    def _scatter(self, member: Node, replica: int) -> Value:
        if self.across and self.local == 1:
            flat = self._flat(member.inputs[0], "zero_grad")
            return self._cross(flat, "CrossWorkerReduceScatter", "scatter", {"reduce_op": "SUM"}, replica)
        # The local ReduceScatter reads its input flat: only a padded gradient is flattened in the graph (a
        # flattened segment output would be a copy of the whole gradient).
        padded = self.shard * self.count != self.size
        flat = self._flat(member.inputs[0], "zero_grad") if padded else member.inputs[0]
        attrs = {k: v for k, v in member.attrs.items() if k not in ("algorithm", "root")}
        attrs.update(group_key=f"{self.key}.scatter", group_size=self.local, shard=replica)
        node = self.graph.add_node("ReduceScatter", [flat], attrs, domain=GRAPHDIST_DOMAIN, name="reduce_scatter")
        node.meta["side_effect"] = True
        if self.across:  # the local sum's part `replica` (workers * shard elements), then across the workers
            return self._cross(node.outputs[0], "CrossWorkerReduceScatter", "scatter", {"reduce_op": "SUM"}, replica)
        return node.outputs[0]

    def _cross(self, value: Value, op_type: str, kind: str, extra: dict[str, Any], replica: int) -> Value:
        node = self.graph.add_node(op_type, [value], {**extra, **self._cross_attrs(kind)}, domain=GRAPHDIST_DOMAIN,
                                   name=kind.replace("scatter", "reduce_scatter").replace("gather", "all_gather"))
        node.replica = replica
        node.meta["side_effect"] = True
        return node.outputs[0]

    def _slice(self, value: Value, replica: int) -> Value:
        """Local replica ``replica``'s shard of ``value`` flattened and padded (of a slot stored in parts: its part)."""
        if id(value) in self._parts:
            return self._parts[id(value)][replica]
        key = (id(value), replica)
        if key not in self._slices:
            flat, index = self._flat(value, "zero_slice"), self._shard_of(replica)
            start, stop = index * self.shard, (index + 1) * self.shard
            self._slices[key] = self.graph.add_node(
                "Slice", [flat, self._const("starts", [start]), self._const("ends", [stop]),
                          self._const("axes", [0])], name="zero_slice").outputs[0]
        return self._slices[key]

    def _clone(self, node: Node, mapping: dict[int, Value], replica: int) -> None:
        inputs = []
        for value in node.inputs:
            if value is None or id(value) in mapping:
                inputs.append(None if value is None else mapping[id(value)])
            elif tuple(value.shape) == self.shape:
                inputs.append(self._slice(value, replica))
            else:
                inputs.append(value)  # a scalar (learning rate, betas): the same on every slice
        twin = self.graph.add_node(node.op_type, inputs, dict(node.attrs), domain=node.domain,
                                   name=f"{node.name}_shard")
        for out, new in zip(node.outputs, twin.outputs):
            mapping[id(out)] = new

    def _gather(self, parts: list[Value], value: Value) -> Value:
        """All-gathers the new weight slices; replica ``last``'s copy, un-padded, is the new value.

        Across workers each local replica first gathers its shard from the workers (the contiguous
        elements ``[r * workers * shard, (r + 1) * workers * shard)``), then the local replicas gather those.
        """
        if self.across:
            parts = [self._cross(part, "CrossWorkerAllGather", "gather", {"axis": 0}, replica)
                     for replica, part in enumerate(parts)]
            if self.local == 1:
                return self._unflatten(parts[0], value)
        gathered = None
        for replica, part in enumerate(parts):
            node = self.graph.add_node("AllGather", [part], {"axis": 0, "group_key": f"{self.key}.gather",
                                                             "group_size": self.local},
                                       domain=GRAPHDIST_DOMAIN, name="all_gather")
            node.replica = replica
            node.meta["side_effect"] = True
            if replica == self.last:
                gathered = node.outputs[0]
        return self._unflatten(gathered, value)

    def _concat(self, parts: list[Value], value: Value) -> Value:
        joined = self.graph.add_node("Concat", parts, {"axis": 0}, name="zero_state").outputs[0]
        return self._unflatten(joined, value)

    def _unflatten(self, flat: Value, like: Value) -> Value:
        if self.shard * self.count != self.size:
            flat = self.graph.add_node("Slice", [flat, self._const("starts", [0]), self._const("ends", [self.size]),
                                                 self._const("axes", [0])], name="zero_unpad").outputs[0]
        return self.graph.add_node("Reshape", [flat, self._const("shape", list(self.shape))],
                                   name="zero_update").outputs[0]

    def _const(self, name: str, array: Any) -> Value:
        array = np.asarray(array)
        return self.graph.add_initializer(f"zero_{name}", array if array.dtype != np.int32 else array.astype(np.int64))

    # ------------------------------------------------------------ removing
    def _rewire(self, finals: dict[int, Value | list[Value]]) -> None:
        """Makes the new values the write-backs; a slot stored in parts gets one output (and one
        ``variable_updates`` entry) per local replica, in replica order, where its whole value was.
        """
        names: dict[str, list[str]] = {}
        for value, _, _ in self.update.results:
            final = finals[id(value)]
            if isinstance(final, Value):
                self.graph.replace_all_uses_with(value, final)
                names[value.name] = [final.name]
                continue
            outputs: list[Value] = []  # only the graph output reads a slot's update (see _slot_read_outside)
            for out in self.graph.outputs:
                outputs.extend(final if out is value else [out])
            self.graph.outputs = outputs
            names[value.name] = [part.name for part in final]
        self.graph.meta.variable_updates = [(new, uid) for out, uid in self.graph.meta.variable_updates
                                               for new in names.get(out, [out])]

    def _remove_old(self) -> None:
        doomed = {id(n): n for n in [*self.update.dead, *self.update.nodes, *self.update.members]}
        for node in reversed([n for n in self.graph.nodes if id(n) in doomed]):
            for out in node.outputs:
                for user, index in list(out.uses):
                    if id(user) not in doomed:  # a dead reader outside the update: it reads nothing now
                        user.replace_input(index, None)
            self.graph.remove_node(node)


class _Collect:
    """Tags the nodes ``graph.add_node`` inserts inside the block (before ``anchor``, the graph's cursor) with
    ``replica``, and lists them in ``sink``.
    """

    def __init__(self, graph: Graph, sink: list[Node], replica: int, anchor: Node) -> None:
        self.graph, self.sink, self.replica, self.anchor = graph, sink, replica, anchor

    def __enter__(self) -> _Collect:
        self.start = len(self.graph.nodes)
        return self

    def __exit__(self, *exc: Any) -> None:
        count = len(self.graph.nodes) - self.start
        if count <= 0:
            return
        end = next(i for i, node in enumerate(self.graph.nodes) if node is self.anchor)
        added = self.graph.nodes[end - count:end]
        for node in added:
            if node.replica is None:
                node.replica = self.replica
            node.meta.setdefault("context", "replica")
        self.sink.extend(added)


def _place_sharded(graph: Graph, sharded: dict[str, dict[str, int]], ctx: PassContext) -> None:
    """Records the sharded slots in a new ``graph.meta.placement`` (the old spec may be shared)."""
    old: PlacementSpec | None = graph.meta.placement
    placements = dict(old.variables) if old is not None else {}
    for uid, layout in sharded.items():
        placements[uid] = VariablePlacement("sharded", tuple(ctx.devices[:layout["replicas"]]))
    graph.meta.placement = PlacementSpec(placements)


def state_bytes_per_replica(graph: Graph) -> int:
    """Bytes of non-trainable variable state (optimizer slots, counters) one replica keeps and updates.

    A slot sharded by :class:`ShardOptimizerStatePass` counts its slice (``shard`` elements), any other
    non-trainable variable counts whole (every replica of a mirrored strategy holds a copy).
    """
    sharded = graph.meta.sharded_state
    total = 0
    for _, spec in variable_specs(graph):
        if spec.trainable:
            continue
        itemsize = np.dtype(spec.dtype).itemsize
        layout = sharded.get(spec.uid)
        total += itemsize * (layout["shard"] if layout else int(np.prod(spec.shape, dtype=np.int64)))
    return total
