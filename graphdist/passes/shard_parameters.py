"""ShardParametersPass: FSDP / ZeRO-3, chosen weights stored in shards and gathered before use.

ZeRO-1 (:class:`~graphdist.passes.shard_optimizer_state.ShardOptimizerStatePass`) shards the optimizer
slots but keeps every weight whole on every replica. This pass goes to ZeRO-3 (DeepSpeed's stage 3,
PyTorch's ``FullyShardedDataParallel`` / FSDP2 ``fully_shard``) for the variables it is given: each
replica stores only its ``1/N`` shard of the weight itself, and the whole weight exists only for the
duration of a step, gathered where it is used.

For a selected variable ``w`` (``size`` elements; N = workers x L local replicas, shards of
``k = ceil(size / N)`` elements of the flattened value, zero-padded to ``k * N``; local replica ``r``
of worker ``w`` owns shard ``r * workers + w``, as ZeRO-1's slots):

* **storage**: ``w``'s graph input becomes one input per local replica, ``<input>/part<r>`` (``k``
  elements), recorded in ``graph.meta.sharded_state[uid]`` (``"parts"``, with ``"parameter": True``)
  like a ZeRO-1 slot, so the compiled function stores the variable as those parts
  (:class:`graphdist.trace.variables.WorkerShard`): a replica never holds the whole weight between steps;
* **reads**: every reader of ``w`` on replica ``r`` reads ``w`` all-gathered from the parts on that replica
  (``AllGather`` over the local replicas, after a ``CrossWorkerAllGather`` across workers), un-padded and
  reshaped; the gather is inserted right before the first reader. With ``reshard_after_forward`` (the
  default, FSDP2's name) the forward readers and the backward readers (``meta["backward"]``) each have a
  gather of their own, so the forward copy is not needed by the backward pass (one layer's weight per
  gather; whether a copy is freed early is the runtime's business, see "Memory" below);
* **gradient and update**: the weight's gradient ``AllReduce`` group becomes ZeRO-1's reduce-scatter and
  sliced update (``ShardOptimizerStatePass``'s rewrite, reused), the update reading the replica's own part
  of ``w`` and of each slot; the new shard is written back as the replica's part (one
  ``graph.meta.variable_updates`` entry per local replica): no all-gather of the new weights at the end
  of the step (unlike ZeRO-1). Its optimizer slots are sharded like ZeRO-1's (stored in parts too).

Invariant established: no selected variable is read whole from a graph input (stored in parts: the
input is gone; stored whole: only the slices making its parts read it); each is read through per-replica
``AllGather`` groups of its parts, and, when the step updates it, written back as its shards
(``sharded_state[uid]`` records ``replicas``, ``shard``, ``size``, ``parameter`` and, stored in parts,
``parts``); ``graph.meta.placement`` places it ``"sharded"``.

Variables are chosen by **name**: the variable's name as the traced graph records it
(``VariableSpec.name``: ``gd.Variable.name`` without ``":0"``, e.g. ``"mlp/dense_0/kernel"``), the
name a ``LayoutMap``'s patterns match; a trailing ``":0"`` is accepted and ignored. Names survive a
plan's export and re-planning, where uids do not identify anything.

Cases:

* stored in parts (``PassContext.options[REPLICA_PARTS_OPTION]``, which ``gd.function`` sets; always
  across workers): as above;
* stored whole (a plan directory or re-planned plan, whose variables are one array each): each replica
  slices its shard out of the whole input (ZeRO-1's slice), the gathers and the sharded update are the
  same, and the new shards are concatenated on the last local replica for the write-back;
* a selected variable the step reads but does not update (an evaluation step, a frozen weight): stored
  and gathered the same way, no write-back;
* a selected variable the step does not read, or a name no variable has: nothing (a step need not read
  every variable);
* a selected variable whose update cannot be sharded (not an elementwise optimizer update of its summed
  gradient, e.g. a non-float variable or an ``assign`` of a computed value): ``NotImplementedError``
  naming it and the reason;
* a selected variable that ZeRO-1 already sharded (``sharded_state`` has it): ``NotImplementedError``
  (``ShardOptimizerStatePass`` must run after this pass; a pipeline checks it);
* one replica in all (nothing to shard over), or no variable selected: unchanged;
* a second run: the selected variables are no longer whole graph inputs (or already in
  ``sharded_state``), unchanged.

Memory: each replica stores ``1/N`` of every selected weight and of its slots between steps
(:func:`parameter_bytes_per_replica` + ``state_bytes_per_replica``). During a step the gathered copies
are ordinary step values, which the scheduler frees once their last reader has run. The pass marks each
gather (``GATHER_META`` on its first collective, ``WEIGHT_META`` on the gathered weight) so that
:class:`~graphdist.passes.limit_parameter_gathers.LimitParameterGathersPass` can order one layer's gathers
after the previous layer's readers: then a replica holds one layer's gathered weights at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError, PostconditionError, PreconditionError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.liveness import live_nodes
from graphdist.ir.placement import VariableSpec, variable_specs
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.shard_optimizer_state import (
    ShardOptimizerStatePass,
    _gradient_groups,
    _place_sharded,
    _Rewrite,
    _Update,
    _Workers,
)

__all__ = ["ShardParametersPass", "parameter_bytes_per_replica", "normalise_variable_names", "GATHER_META",
           "WEIGHT_META"]

logger = logging.getLogger(__name__)

#: The readers of a weight, by phase: forward readers and backward readers get a gather each.
_FORWARD, _BACKWARD = "forward", "backward"

#: Node meta key of the nodes that cut a whole-stored variable's input into its parts.
_PART_META = "fsdp_part"

#: Node meta keys that mark a gather for ``LimitParameterGathersPass``: the first collective of a gather
#: (it reads the replica's part) and the node whose output is the gathered weight its readers read; both
#: hold the gather's key ``fsdp.<variable>.<forward|backward>``.
GATHER_META, WEIGHT_META = "fsdp_gather", "fsdp_weight"


def normalise_variable_names(names: Iterable[str]) -> tuple[str, ...]:
    """The variable names a ``PipelineConfig.shard_parameters`` holds: sorted, unique, without ``":0"``.

    Raises:
        InvalidArgumentError: A name is not a string (or ``names`` is a single string).
    """
    if isinstance(names, str):
        raise InvalidArgumentError(f"shard_parameters takes variable names (a tuple of strings), got the string "
                                   f"{names!r}; write ({names!r},)")
    out = set()
    for name in names:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"shard_parameters takes variable names (strings), got "
                                       f"{type(name).__name__} {name!r}")
        out.add(name.removesuffix(":0"))
    return tuple(sorted(out))


@dataclass
class _Selected:
    """A selected variable the step reads whole: its input, uid, spec and replicas' parts."""

    value: Value
    uid: str
    spec: VariableSpec
    parts: list[Value] | None = None  # per local replica: the graph input (in parts) or the slice (whole)
    update: _Update | None = None


class ShardParametersPass(PassBase):
    """Stores the chosen weights in per-replica shards, gathers them before use, reduce-scatters their
    gradients and updates each shard on its replica (FSDP / ZeRO-3).

    Args:
        variables: Names of the variables to shard (see the module docstring for the key).
        num_workers: Worker processes in sync (``1``: shard over this process's replicas).
        worker: This worker's index.
        comm_group: The communicator of the cross-worker collectives.
        replica_parts: In one process, store the shards in per-replica parts (``None``: as
            ``PassContext.options[REPLICA_PARTS_OPTION]`` says, else whole). Across workers they always are.
        reshard_after_forward: Gather a weight separately for its forward and its backward readers
            (FSDP2's default); ``False``: one gather per replica serves every reader.
    """

    runs_after = ("InsertCollectivesPass",)

    def __init__(self, variables: Iterable[str], num_workers: int = 1, worker: int = 0, comm_group: str = "",
                 replica_parts: bool | None = None, reshard_after_forward: bool = True) -> None:
        self.variables = normalise_variable_names(variables)
        self.workers = _Workers(int(num_workers), int(worker), str(comm_group))
        self.replica_parts = replica_parts
        self.reshard_after_forward = bool(reshard_after_forward)
        # ZeRO-1's analysis of a gradient group and its rewrite are reused for the weights' updates.
        self._zero = ShardOptimizerStatePass(num_workers, worker, comm_group, replica_parts)

    def __repr__(self) -> str:
        args = [repr(list(self.variables))]
        if self.workers.count > 1:
            args += [f"num_workers={self.workers.count}", f"worker={self.workers.index}",
                     f"comm_group={self.workers.group!r}"]
        if self.replica_parts is not None:
            args.append(f"replica_parts={self.replica_parts}")
        if not self.reshard_after_forward:
            args.append("reshard_after_forward=False")
        return f"{self.name}({', '.join(args)})"

    # ------------------------------------------------------------ contract
    def requires(self, graph: Graph, ctx: PassContext) -> None:
        replication = graph.meta.replication
        if self.variables and replication is None:
            raise PreconditionError("the graph is not replicated (ReplicatePass and InsertCollectivesPass run first)")
        if replication is not None and replication.replicas_in_sync != self.workers.count * replication.replicas:
            raise PreconditionError(f"{replication.replicas_in_sync} replicas in sync are not {self.workers.count} "
                                    f"worker(s) x {replication.replicas} local replicas")
        abstract = [n.name for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN and n.op_type == "ReplicaAllReduce"]
        if abstract:
            raise PreconditionError(f"abstract cross-replica nodes remain ({', '.join(abstract[:3])}): "
                                    "InsertCollectivesPass runs first")

    def ensures(self, graph: Graph, ctx: PassContext) -> None:
        sharded = graph.meta.sharded_state
        inputs = {v.name: v for v in graph.inputs}
        for name, spec in variable_specs(graph):
            layout = sharded.get(spec.uid)
            if spec.name not in self.variables or layout is None or not layout.get("parameter"):
                continue
            whole = inputs.get(name)
            readers = [n for n, _ in whole.uses if not n.meta.get(_PART_META)] if whole is not None else []
            if readers:
                raise PostconditionError(f"variable {spec.name} is sharded and still read whole by "
                                         f"{', '.join(n.name for n in readers[:3])}")
            missing = [part for part in layout.get("parts", []) if part not in inputs]
            if missing:
                raise PostconditionError(f"variable {spec.name}'s parts {missing} are not graph inputs")

    # ------------------------------------------------------------ rewrite
    def _wants_parts(self, ctx: PassContext) -> bool:
        return self._zero._wants_parts(ctx)  # the same settings, so ZeRO-1's rule: parts across workers always

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        replication = graph.meta.replication
        local = replication.replicas if replication is not None else 1
        selected = self._selected(graph)
        if not selected or local * self.workers.count < 2:
            if selected:
                logger.debug("ShardParametersPass: one replica in all, nothing to shard over")
            return PassResult(graph, modified=False)
        in_parts = self._wants_parts(ctx)
        live = live_nodes(graph)
        self._find_updates(graph, selected, in_parts, live)
        builder = _Builder(graph, self.workers, local, self.reshard_after_forward, live)
        sharded: dict[str, dict[str, Any]] = dict(graph.meta.sharded_state)
        for item in selected:
            item.parts = builder.parts(item.value, in_parts)
            builder.gather_readers(item)
            sharded[item.uid] = builder.layout(item, in_parts)
        specs = {spec.uid: (name, spec) for name, spec in variable_specs(graph)}
        rewritten: set[int] = set()
        for item in selected:
            update = item.update
            if update is None or id(update) in rewritten:
                continue
            rewritten.add(id(update))
            update.params = {other.uid: other.parts for other in selected if other.update is update}
            update.params_in_parts = in_parts
            for uid, layout in _Rewrite(graph, update, self.workers, specs).apply().items():
                sharded[uid] = {**layout, "parameter": True} if uid in update.params else layout
        unread = {id(item.value) for item in selected if not item.value.uses}
        graph.inputs = [v for v in graph.inputs if id(v) not in unread]
        graph.topological_sort()
        graph.meta.sharded_state = sharded
        _place_sharded(graph, sharded, ctx)
        return PassResult(graph, modified=True)

    def _selected(self, graph: Graph) -> list[_Selected]:
        """The selected variables that the graph reads whole from an input (not yet sharded)."""
        if not self.variables:
            return []
        inputs = {v.name: v for v in graph.inputs}
        sharded = graph.meta.sharded_state
        chosen = set(self.variables)
        out = []
        for name, spec in variable_specs(graph):
            if spec.name not in chosen:
                continue
            if spec.uid in sharded:
                if sharded[spec.uid].get("parameter"):
                    continue  # this pass sharded it already
                raise NotImplementedError(
                    f"ShardParametersPass: variable {spec.name} is already sharded by ZeRO-1 "
                    "(ShardOptimizerStatePass ran first); shard the parameters before the optimizer state")
            value = inputs.get(name)
            if value is not None and (value.uses or value in graph.outputs):
                out.append(_Selected(value, spec.uid, spec))
        return out

    def _find_updates(self, graph: Graph, selected: list[_Selected], in_parts: bool, live: set[int]) -> None:
        """Gives each selected variable the ZeRO-1 update of its gradient group; raises for one written back
        otherwise.
        """
        specs = {spec.uid: (name, spec) for name, spec in variable_specs(graph)}
        updated = {name: uid for name, uid in graph.meta.variable_updates}
        by_uid = {item.uid: item for item in selected}
        reasons: dict[str, list[str]] = {}
        for key, members in _gradient_groups(graph).items():
            why: list[str] = []
            update = self._zero._analyse(graph, members, live, updated, specs, in_parts, why)
            if update is None:
                reasons[key] = why
                continue
            for _, uid, trainable in update.results:
                if trainable and uid in by_uid:
                    by_uid[uid].update = update
        written = set(updated.values())
        for item in selected:
            if item.uid in written and item.update is None:
                raise NotImplementedError(_unshardable(graph, item, reasons))


def _unshardable(graph: Graph, item: _Selected, reasons: dict[str, list[str]]) -> str:
    """The message for a selected variable written back by something ZeRO's rewrite cannot shard."""
    if not item.spec.trainable:
        return (f"ShardParametersPass: variable {item.spec.name} is not trainable and the step updates it: an "
                "optimizer slot is sharded with its weight (name the weight, not its slots), and other updated "
                "non-trainable variables (moving statistics, counters) cannot be sharded yet; leave it replicated")
    out = next(name for name, uid in graph.meta.variable_updates if uid == item.uid)
    producer = {v.name: v.producer for n in graph.nodes for v in n.outputs}.get(out)
    groups, stack, seen = set(), [producer], set()
    while stack:  # the gradient groups its new value comes from
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "AllReduce":
            groups.add(str(node.attrs.get("group_key") or node.name))
        if node.domain == GRAPHDIST_DOMAIN and node.op_type in ("ReduceScatter", "CrossWorkerReduceScatter"):
            return (f"ShardParametersPass: variable {item.spec.name} is already sharded by ZeRO-1 (its update reads "
                    f"the reduce-scattered gradient {node.name}: ShardOptimizerStatePass ran first); shard the "
                    "parameters before the optimizer state")
        stack.extend(v.producer for v in node.inputs if v is not None)
    why = "; ".join(f"{reason}" for key in sorted(groups) for reason in reasons.get(key, [])) or (
        "it is not updated from a summed gradient (an assign of a computed value)")
    return (f"ShardParametersPass: variable {item.spec.name} ({item.value.type_str()}) cannot be sharded (FSDP): "
            f"its update is not an elementwise optimizer update of its gradient that can be split into shards: "
            f"{why}. Leave it replicated (drop it from the sharded variables)")


class _Builder:
    """Makes a selected variable's parts and the gathers its readers read."""

    def __init__(self, graph: Graph, workers: _Workers, local: int, reshard_after_forward: bool,
                 live: set[int]) -> None:
        self.graph, self.workers, self.local, self.live = graph, workers, local, live
        self.count = workers.count * local
        self.reshard_after_forward = reshard_after_forward

    def _sizes(self, value: Value) -> tuple[int, int]:
        size = int(np.prod(value.shape, dtype=np.int64))
        return size, -(-size // self.count)

    def layout(self, item: _Selected, in_parts: bool) -> dict[str, Any]:
        """``sharded_state``'s record of the variable (its update's rewrite records the same)."""
        size, shard = self._sizes(item.value)
        layout: dict[str, Any] = {"replicas": self.count, "shard": shard, "size": size, "parameter": True}
        if self.workers.count > 1:
            layout.update(workers=self.workers.count, worker=self.workers.index, local=self.local)
        if in_parts:
            layout["parts"] = [v.name for v in item.parts or []]
        return layout

    # ------------------------------------------------------------ parts
    def parts(self, value: Value, in_parts: bool) -> list[Value]:
        """Each local replica's shard of ``value``: a new graph input each, or a slice of the whole input."""
        size, shard = self._sizes(value)
        if in_parts:
            return [self.graph.add_input(f"{value.name}/part{r}", value.dtype, (shard,)) for r in range(self.local)]
        first = next((n for n in self.graph.nodes if any(v is value for v in n.inputs)), None)
        out = []
        with self._before(first):
            for r in range(self.local):
                flat = self._op("Reshape", [value, self._const("flat", [-1])], r, "fsdp_flat")
                flat.producer.meta[_PART_META] = True  # the only reader of the whole input left (ensures checks)
                if shard * self.count != size:
                    pad = self._const("zeros", np.zeros(shard * self.count - size, np.dtype(value.dtype)))
                    flat = self._op("Concat", [flat, pad], r, "fsdp_pad", {"axis": 0})
                index = r * self.workers.count + self.workers.index
                bounds = [self._const(n, [b]) for n, b in (("starts", index * shard), ("ends", (index + 1) * shard),
                                                           ("axes", 0))]
                out.append(self._op("Slice", [flat, *bounds], r, "fsdp_slice"))
        return out

    # ------------------------------------------------------------ gathers
    def gather_readers(self, item: _Selected) -> None:
        """Rewires every reader of the whole input (but the update's own nodes, which the update's rewrite
        replaces) to its replica's gathered copy of the phase it belongs to.

        A gather is a collective every replica takes part in, so only live readers make one: a dead reader
        (another replica's unused copy of something, the gradient of an input nobody asked for) reads a
        gather that exists anyway, and ``EliminateDeadNodesPass`` removes it.
        """
        value, update = item.value, item.update
        doomed = set() if update is None else {id(n) for n in [*update.nodes, *update.dead, *update.members]}
        readers: dict[str, list[tuple[Node, int]]] = {}
        dead: list[tuple[Node, int]] = []
        for node, index in list(value.uses):
            if id(node) in doomed or node.meta.get(_PART_META):  # the update's, or the cut into parts
                continue
            if id(node) not in self.live:
                dead.append((node, index))
                continue
            phase = _BACKWARD if self.reshard_after_forward and node.meta.get("backward") else _FORWARD
            readers.setdefault(phase, []).append((node, index))
        outputs = [position for position, out in enumerate(self.graph.outputs) if out is value]
        if outputs or (dead and not readers):
            readers.setdefault(_FORWARD, [])
        readers[_FORWARD if _FORWARD in readers else _BACKWARD] += dead
        last = self.local - 1
        for phase, uses in readers.items():
            first = min((n for n, _ in uses), key=self._position, default=None)
            gathered = self._gather(item, phase, first)
            for node, index in uses:
                node.replace_input(index, gathered[node.replica if node.replica is not None else last])
            if phase == _FORWARD:
                for position in outputs:  # the step returns the variable: the last replica's copy
                    self.graph.outputs[position] = gathered[last]

    def _position(self, node: Node) -> int:
        return next(i for i, other in enumerate(self.graph.nodes) if other is node)

    def _gather(self, item: _Selected, phase: str, first: Node | None) -> list[Value]:
        """Each local replica's whole copy of the variable, gathered from every replica's part."""
        value, parts = item.value, item.parts or []
        key = f"fsdp.{item.spec.name}.{phase}"
        flats: list[Value] = []
        with self._before(first):
            if self.workers.count > 1:  # this replica's column of shards from every worker, then the local ones
                parts = [self._collective("CrossWorkerAllGather", part, r, {
                    "axis": 0, "num_workers": self.workers.count, "group_key": f"{key}/workers", "per_participant": 1,
                    **({"comm_group": self.workers.group} if self.workers.group else {})}, phase)
                    for r, part in enumerate(parts)]
            if self.local > 1:
                flats = [self._collective("AllGather", part, r, {"axis": 0, "group_key": key,
                                                                 "group_size": self.local}, phase)
                         for r, part in enumerate(parts)]
            else:
                flats = list(parts)
            heads = parts if self.workers.count > 1 else flats
            for head in heads:
                head.producer.meta[GATHER_META] = key
            weights = [self._unflatten(flat, value, r, phase) for r, flat in enumerate(flats)]
            for weight in weights:
                weight.producer.meta[WEIGHT_META] = key
            return weights

    def _collective(self, op_type: str, value: Value, replica: int, attrs: dict[str, Any], phase: str) -> Value:
        node = self.graph.add_node(op_type, [value], attrs, domain=GRAPHDIST_DOMAIN, name=f"fsdp_{phase}_gather")
        self._tag(node, replica, phase)
        node.meta["side_effect"] = True  # every member takes part, even one whose copy no live node reads
        return node.outputs[0]

    def _unflatten(self, flat: Value, like: Value, replica: int, phase: str) -> Value:
        size, shard = self._sizes(like)
        if shard * self.count != size:
            bounds = [self._const(n, [b]) for n, b in (("starts", 0), ("ends", size), ("axes", 0))]
            flat = self._op("Slice", [flat, *bounds], replica, "fsdp_unpad", phase=phase)
        return self._op("Reshape", [flat, self._const("shape", list(like.shape))], replica, "fsdp_weight",
                        phase=phase)

    # ------------------------------------------------------------ helpers
    def _before(self, node: Node | None) -> Any:
        """Inserts before ``node`` (the first reader), or at the end when there is none."""
        from contextlib import nullcontext

        return self.graph.inserting_before(node) if node is not None else nullcontext()

    def _op(self, op_type: str, inputs: list[Value], replica: int, name: str, attrs: dict[str, Any] | None = None,
            phase: str = _FORWARD) -> Value:
        node = self.graph.add_node(op_type, inputs, attrs, name=name)
        self._tag(node, replica, phase)
        return node.outputs[0]

    @staticmethod
    def _tag(node: Node, replica: int, phase: str) -> None:
        node.replica = replica
        node.meta["context"] = "replica"
        if phase == _BACKWARD:
            node.meta["backward"] = True

    def _const(self, name: str, array: Any) -> Value:
        array = np.asarray(array)
        return self.graph.add_initializer(f"fsdp_{name}", array if array.dtype != np.int32 else array.astype(np.int64))


def parameter_bytes_per_replica(graph: Graph) -> int:
    """Bytes of trainable variables one replica keeps between steps.

    A weight sharded by :class:`ShardParametersPass` counts its shard (``shard`` elements, padding included);
    any other trainable variable counts whole (every replica of a mirrored strategy holds a copy). With
    ``state_bytes_per_replica`` (:mod:`graphdist.passes.shard_optimizer_state`) it makes the parameter and
    optimizer-state bytes of a replica.
    """
    sharded = graph.meta.sharded_state
    total = 0
    for _, spec in variable_specs(graph):
        if not spec.trainable:
            continue
        layout = sharded.get(spec.uid)
        elements = layout["shard"] if layout else int(np.prod(spec.shape, dtype=np.int64))
        total += np.dtype(spec.dtype).itemsize * elements
    return total
