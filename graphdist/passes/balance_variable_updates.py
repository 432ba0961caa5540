"""BalanceVariableUpdatesPass: spread the variable updates over the local replicas.

After :class:`graphdist.passes.insert_collectives.InsertCollectivesPass` every
replica holds its copy of the step's variable updates, and
``LowerVariableUpdatesPass`` writes back the last replica's: the other copies
are dead, so the whole optimizer update runs on one device while the others
wait. An update computed only from *replica-invariant* values gives the same
bits on every replica: the result of an ``AllReduce`` group (every member
receives the same array), variables and other inputs that are not per
replica, initializers, and cross-replica values (computed once). This pass
writes such updates back from the copy of a replica chosen to balance the
work; the copies no longer written back are dead, and ``EliminateDeadNodesPass``
removes them.

Invariant established: the write-back output of every replica-invariant
update in ``graph.meta.variable_updates`` is computed by the replica the
balance chose. The balance works on *units*: updates whose computations share
an intermediate value of more than one element (a momentum or Adam slot and
its weight) form one unit, so nothing large is computed twice. Each unit
weighs the bytes it writes back plus ``NODE_COST_BYTES`` (16 KiB) per node
computing it (a node's fixed cost on a CPU backend, which dominates tiny
updates). Units that cannot move are counted first, on the replica that
computes them; then the movable units, heaviest first (ties in write-back
order), go to the local replica with the least weight so far (ties: the
highest replica, so the heaviest unit stays on the last one).
The graph order of the nodes is unchanged (no node is created, except an
``Identity`` as below), so every replica's update still follows its sums.

Cases:

* one local replica, or no variable updates: unchanged;
* an update that reads a per-replica value (the batch, a replica's own
  statistics, its ``ReplicaId`` constant), a collective other than
  ``AllReduce``, a random op, a node with side effects or a subgraph, or one
  that some replica has no copy of: stays where it is (today's behaviour:
  the last replica), and so does the rest of its unit;
* ZeRO-1 (``ShardOptimizerStatePass`` ran before): its updates read the
  ``ReduceScatter`` / ``AllGather`` groups (or their ``CrossWorker``
  forms), so they stay; they are already spread, so their bytes count
  ``1/N`` on every replica (and their nodes fully: each replica runs them);
* an ``AllReduce`` group spanning other workers (``group_size`` above its
  local members, MultiWorkerMirrored): ``InsertCrossWorkerCollectivesPass``
  later makes every local member's readers read the member's cross-worker
  result, which combines the same local sum with the same values of the
  other workers on every local replica, so the update is balanced within
  the process like a local one;
* the optimizer's ``iterations`` counter (the variable plus a constant): a
  unit of its own, of 8 bytes and one node;
* scalars shared by several updates (a learning-rate schedule, Adam's bias
  correction from ``iterations``, a global-norm clip factor) do not tie
  units together: every replica that updates something computes its own
  copy (a few scalar ops; for a global norm, one reduction per gradient);
* the chosen replica's copy of the update is already a graph output (a
  per-replica user output) or an input: an ``Identity`` on that replica gives
  the write-back its own output;
* a write-back produced in cross-replica code (no replica; e.g. the
  ``Identity`` ``LowerVariableUpdatesPass`` adds for a value the step also
  returns): unchanged;
* a second run: every unit already is where the balance puts it, since the
  balance does not depend on where the units are (an ``Identity`` this pass
  added is looked through): unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from graphdist.ir.compare import same_attr
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["BalanceVariableUpdatesPass", "NODE_COST_BYTES"]

logger = logging.getLogger(__name__)

#: Ops whose copies on two replicas may give different values from equal inputs.
_RANDOM = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
                     "Multinomial", "Dropout"})
#: Ops with subgraphs, which may read values of their replica by name.
_SUBGRAPHS = frozenset({"If", "Loop", "Scan"})
#: Collectives whose result is already spread over the replicas (ZeRO-1).
_SPREAD = frozenset({"ReduceScatter", "AllGather", "CrossWorkerReduceScatter", "CrossWorkerAllGather"})


@dataclass
class _Update:
    """One write-back: graph output ``position`` updates variable ``uid``."""

    position: int
    uid: str
    value: Value
    replica: int
    nbytes: int
    nodes: list[Node] = field(default_factory=list)  # its computation on ``replica``, in graph order
    problem: str | None = None  # why it cannot move, or None
    spread: bool = False  # reads a ReduceScatter / AllGather: already spread over the replicas


class BalanceVariableUpdatesPass(PassBase):
    """Writes each replica-invariant variable update back from a replica chosen to balance the work."""

    runs_after = ("LowerVariableUpdatesPass", "InsertCollectivesPass")

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        replication = graph.meta.replication
        replicas = replication.replicas if replication is not None else len(ctx.devices)
        if replicas < 2 or not graph.meta.variable_updates:
            return PassResult(graph, modified=False)
        twins = _Twins(graph)
        updates = self._updates(graph, twins)
        units = _units(updates)
        targets = _balance(units, replicas, twins)
        renamed: dict[str, str] = {}
        for unit in units:
            target = targets.get(id(unit[0]))
            for update in unit:
                if target is None or target == update.replica:
                    continue
                new = _twin_output(graph, twins, update, target)
                renamed[graph.outputs[update.position].name] = new.name
                graph.outputs[update.position] = new
                logger.debug("BalanceVariableUpdatesPass: %s written back from replica %d (was %d)",
                             update.uid, target, update.replica)
        if not renamed:
            return PassResult(graph, modified=False)
        graph.meta.variable_updates = [(renamed.get(out, out), uid)
                                          for out, uid in graph.meta.variable_updates]
        return PassResult(graph, modified=True)

    @staticmethod
    def _updates(graph: Graph, twins: _Twins) -> list[_Update]:
        """The write-backs computed in a replica (cross-replica ones are left out), with their analysis."""
        pairs = graph.meta.variable_updates
        start = len(graph.outputs) - len(pairs)  # the write-backs are the last outputs, in order
        updates = []
        for position, (name, uid) in enumerate(pairs, start=start):
            value = graph.outputs[position] if position >= 0 else None
            if value is None or value.name != name:
                continue
            producer = value.producer
            if producer is not None and producer.meta.get("update_copy"):  # this pass's Identity: look through it
                value = producer.inputs[0]
                producer = value.producer
            if producer is None or producer.replica is None:
                continue
            update = _Update(position, str(uid), value, int(producer.replica), int(value.nbytes or 0))
            update.nodes, update.problem, update.spread = twins.closure(value, update.replica)
            updates.append(update)
        return updates


class _Twins:
    """Finds a replica's copy of a value computed on another replica, by structure."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.members: dict[str, dict[int, Node]] = {}
        for node in graph.nodes:
            if node.domain == GRAPHDIST_DOMAIN and node.op_type == "AllReduce":
                key = str(node.attrs.get("group_key") or node.name)
                self.members.setdefault(key, {})[node.replica or 0] = node
        replication = graph.meta.replication
        input_map = replication.input_map if replication is not None else {}
        self.per_replica = {name for names in input_map.values() for name in names.values()}
        self.order = {id(n): i for i, n in enumerate(graph.nodes)}
        self._memo: dict[tuple[int, int], Value | None] = {}

    def is_leaf(self, value: Value) -> bool:
        """A value that is the same on every replica, or one the closure does not look behind."""
        producer = value.producer
        return producer is None or producer.replica is None or (
            producer.domain == GRAPHDIST_DOMAIN and producer.op_type == "AllReduce")

    def closure(self, value: Value, replica: int) -> tuple[list[Node], str | None, bool]:
        """``(nodes computing value on replica, why it is not replica-invariant or None, reads ZeRO groups)``."""
        seen: dict[int, Node] = {}
        stack = [value]
        problem = None
        spread = False
        while stack:
            current = stack.pop()
            if current is None:
                continue
            if current.producer is None and current.name in self.per_replica:
                problem = problem or f"it reads the per-replica input %{current.name}"
            if self.is_leaf(current):
                continue
            node = current.producer
            if id(node) in seen:
                continue
            seen[id(node)] = node
            if node.domain == GRAPHDIST_DOMAIN:
                spread = spread or node.op_type in _SPREAD
                problem = problem or f"it reads {node.qualified_op} ({node.name})"
                continue  # not looked behind: the ZeRO groups' inputs are whole backward passes
            if node.op_type in _RANDOM or node.op_type in _SUBGRAPHS:
                problem = problem or f"it uses {node.op_type} ({node.name})"
            elif node.meta.get("side_effect"):
                problem = problem or f"{node.name} has side effects"
            elif node.replica != replica:
                problem = problem or f"it reads %{current.name} of replica {node.replica}"
            stack.extend(node.inputs)
        return sorted(seen.values(), key=lambda n: self.order[id(n)]), problem, spread

    def twin(self, value: Value, nodes: list[Node], replica: int) -> Value | None:
        """Replica ``replica``'s copy of ``value`` (computed by ``nodes``, in graph order), or ``None``."""
        for node in nodes:
            self._twin_node(node, replica)
        return self._map(value, replica)

    def _map(self, value: Value | None, replica: int) -> Value | None:
        if value is None:
            return None
        producer = value.producer
        if producer is None or producer.replica is None:
            return value  # one value, whoever reads it
        if producer.replica == replica:
            return value
        if producer.domain == GRAPHDIST_DOMAIN and producer.op_type == "AllReduce":
            member = self.members.get(str(producer.attrs.get("group_key") or producer.name), {}).get(replica)
            return member.outputs[0] if member is not None else None
        return self._memo.get((id(value), replica))

    def _twin_node(self, node: Node, replica: int) -> None:
        if all((id(out), replica) in self._memo for out in node.outputs):
            return
        if node.replica == replica:
            found: Node | None = node
        else:
            found = self._find(node, replica)
        for index, out in enumerate(node.outputs):
            self._memo[(id(out), replica)] = found.outputs[index] if found is not None else None

    def _find(self, node: Node, replica: int) -> Node | None:
        """The node of ``replica`` that applies ``node``'s op to replica ``replica``'s copies of its inputs."""
        inputs = [self._map(v, replica) for v in node.inputs]
        if all(new is not None or old is None for old, new in zip(node.inputs, inputs)):
            readers = next((new.uses for new in inputs if new is not None), None)
            candidates = [n for n, _ in readers] if readers is not None else self.graph.nodes
            return next((n for n in candidates if n.replica == replica and _same_node(n, node, inputs)),
                        None)
        return None


def _same_node(candidate: Node, node: Node, inputs: list[Value | None]) -> bool:
    """``candidate`` applies ``node``'s op, with the same attributes, to ``inputs``."""
    return (candidate.op_type == node.op_type and candidate.domain == node.domain
            and len(candidate.outputs) == len(node.outputs) and len(candidate.inputs) == len(inputs)
            and all(a is b for a, b in zip(candidate.inputs, inputs))
            and candidate.attrs.keys() == node.attrs.keys()
            and all(same_attr(candidate.attrs[k], node.attrs[k]) for k in node.attrs))


def _units(updates: list[_Update]) -> list[list[_Update]]:
    """Updates grouped by the intermediate values of more than one element they share, in write-back order."""
    parent = list(range(len(updates)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, update in enumerate(updates):
        for node in _large_nodes(update):
            j = owner.setdefault(id(node), i)
            parent[root(i)] = root(j)
    units: dict[int, list[_Update]] = {}
    for i, update in enumerate(updates):
        units.setdefault(root(i), []).append(update)
    return sorted(units.values(), key=lambda unit: unit[0].position)


def _large_nodes(update: _Update) -> list[Node]:
    """The update's nodes reached from its output without passing through a value of at most one element."""
    inside = {id(n) for n in update.nodes}
    seen: dict[int, Node] = {}
    stack = [update.value]
    while stack:
        value = stack.pop()
        node = value.producer if value is not None else None
        if node is None or id(node) not in inside or id(node) in seen or _elements(value) <= 1:
            continue
        seen[id(node)] = node
        stack.extend(node.inputs)
    return list(seen.values())


def _elements(value: Value) -> int:
    return int(np.prod(value.shape, dtype=np.int64)) if value.is_static else 1 << 62


#: What one node of an update costs, in bytes written back: running a node costs a backend on a CPU
#: about 1-2 us, the time one core takes to stream ~16 KiB. Without it, tiny updates (a ConvNet's biases
#: and small kernels, each an Adam update of ~10 nodes) all landed on one device.
NODE_COST_BYTES = 16 * 1024


def _weight(unit: list[_Update]) -> float:
    """A unit's cost: the bytes it writes back plus ``NODE_COST_BYTES`` per node computing it."""
    nodes = {id(n) for update in unit for n in update.nodes}
    return sum(u.nbytes for u in unit) + NODE_COST_BYTES * len(nodes)


def _balance(units: list[list[_Update]], replicas: int, twins: _Twins) -> dict[int, int]:
    """Target replica of each movable unit (keyed by ``id`` of its first update)."""
    loads = [0.0] * replicas
    movable = []
    for unit in units:
        nbytes = _weight(unit)
        for update in unit:
            missing = [r for r in range(replicas) if twins.twin(update.value, update.nodes, r) is None]
            if update.problem is None and missing:
                update.problem = f"replica(s) {missing} compute no copy of it"
        problems = [f"{u.uid}: {u.problem}" for u in unit if u.problem is not None]
        if problems:
            for update in unit:
                logger.debug("BalanceVariableUpdatesPass: %s stays on replica %d (%s)", update.uid, update.replica,
                             "; ".join(problems))
                if update.spread:  # every replica runs the nodes on its slice of the bytes
                    share = update.nbytes / replicas + NODE_COST_BYTES * len(update.nodes)
                    loads = [load + share for load in loads]
                elif 0 <= update.replica < replicas:
                    loads[update.replica] += _weight([update])
        else:
            movable.append((nbytes, unit))
    targets = {}
    for nbytes, unit in sorted(movable, key=lambda item: (-item[0], item[1][0].position)):
        target = min(range(replicas), key=lambda r: (loads[r], -r))
        loads[target] += nbytes
        targets[id(unit[0])] = target
    return targets


def _twin_output(graph: Graph, twins: _Twins, update: _Update, target: int) -> Value:
    """Replica ``target``'s copy of the update, as a value of its own (not yet a graph output)."""
    new = twins.twin(update.value, update.nodes, target)
    assert new is not None  # _balance only picks replicas with a copy
    if new.producer is None or any(new is out for out in graph.outputs):
        node = graph.add_node("Identity", [new], name="update")
        node.replica = target
        node.meta.update(context="replica", update_copy=True)
        new = node.outputs[0]
    return new
