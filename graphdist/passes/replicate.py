"""ReplicatePass: one copy of the traced replica computation per local replica.

A step is traced once, as one replica: the nodes traced inside
``strategy.run`` carry ``meta["context"] == "replica"``, the others (the
step's cross-replica code) do not. This pass makes the replicas.

Invariant established: every replica-region node exists once per local
replica ``r`` (``node.replica = r``), replica ``r``'s copy reading replica
``r``'s copies; no ``ReplicaId``, ``NumReplicas`` or ``ReadReplica`` node
remains; ``graph.meta.replication`` records the replica count, the
replicas' global offset, and how the traced inputs and outputs map to the
rewritten ones (``input_map``: traced name -> ``{replica: name}`` for
per-replica inputs; ``output_map``: traced position -> rewritten position;
``replica_outputs``: traced position -> ``{replica: position}`` for
per-replica outputs).

Cases:

* replica-region node: copied for every replica of its *variant*
  (``meta["variant"]``; without one, every replica). A variant is the set of
  replicas whose per-replica arguments had the same shapes (a partial
  batch splits unevenly: each shape was traced once); the first replica of
  a variant keeps the traced node and names, the others get ``_r<r>`` copies;
* per-replica graph input (``graph.meta.per_replica_inputs``): one input per
  replica of its variant, named ``<traced name>_r<replica>``; other inputs are
  shared by every replica;
* ``ReplicaId``: replica ``r``'s copy becomes the int32 constant
  ``offset + r``; in cross-replica code, ``offset`` (this worker's first
  replica);
* ``NumReplicas``: the int32 constant ``replicas_in_sync`` (every worker's replicas);
* ``ReadReplica(x)`` (``replica`` attribute ``r``, cross-replica code): its
  readers read replica ``r``'s copy of ``x``; ``r`` out of range (a step
  that read a replica's component re-planned to fewer replicas):
  ``GraphError``;
* ``CrossReplicaReduce`` / ``CrossReplicaGather`` reading a replica value:
  their inputs become every replica's copy, in replica order
  (``InsertCollectivesPass`` lowers them); a value that is not per replica
  stays the one input;
* any other cross-replica node reading a replica value: replica 0's copy
  (the first replica that has one): with one replica, ``strategy.run``
  returns its values themselves and cross-replica code may use them;
* per-replica graph output (``graph.meta.per_replica_outputs``): one output per
  replica, in replica order (an ``Identity`` per replica when the value is
  the same on every replica);
* variants naming replicas this pass does not make, or not covering every
  replica it makes (the step was traced with uneven per-replica shapes for
  another replica count): ``GraphError``;
* already replicated (``graph.meta.replication`` set): unchanged.
"""

from __future__ import annotations

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.graph_meta import Replication  # its record's type lives with the graph metadata
from graphdist.ir.replica_ops import CROSS_REPLICA_OPS, is_replica_node
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["ReplicatePass", "Replication"]


class ReplicatePass(PassBase):
    """Copies the replica computation once per local replica.

    Args:
        replicas: Local replicas (devices of this worker).
        offset: Global index of this worker's first replica.
        replicas_in_sync: Replicas over all workers (default ``replicas``).
    """

    runs_after = ("AutodiffPass", "LowerStopGradientsPass", "AccumulateGradientsPass")

    def __init__(self, replicas: int, offset: int = 0, replicas_in_sync: int | None = None) -> None:
        if replicas < 1:
            raise GraphError(f"ReplicatePass needs at least one replica, got {replicas}")
        self.replicas = int(replicas)
        self.offset = int(offset)
        self.replicas_in_sync = int(replicas_in_sync if replicas_in_sync is not None else replicas)

    def __repr__(self) -> str:
        return f"{self.name}(replicas={self.replicas}, offset={self.offset}, replicas_in_sync={self.replicas_in_sync})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        if graph.meta.replication is not None:
            return PassResult(graph, modified=False)
        _Replicator(graph, self).run()
        return PassResult(graph, modified=True)


class _Replicator:
    """One run of :class:`ReplicatePass` over one graph."""

    def __init__(self, graph: Graph, config: ReplicatePass) -> None:
        self.graph = graph
        self.n = config.replicas
        self.offset = config.offset
        self.in_sync = config.replicas_in_sync
        self.variants = {str(k): tuple(int(r) for r in v) for k, v in graph.meta.replica_variants.items()}
        covered = sorted({r for members in self.variants.values() for r in members})
        if self.variants and covered != list(range(self.n)):
            listing = ", ".join(f"{key}: {list(members)}" for key, members in self.variants.items())
            raise GraphError(
                f"graph {graph.name!r} was traced with uneven per-replica shapes for replicas {covered} (variants "
                f"{listing}), but {self.n} replica(s) are being made; trace the step for this strategy, or give "
                "every replica the same shapes (a global batch divisible by the replica count)")
        # copies[id(value)][r]: replica r's copy of a replica value.
        self.copies: dict[int, dict[int, Value]] = {}
        self.constants: dict[tuple[str, int], Value] = {}

    def replicas_of(self, variant: object) -> tuple[int, ...]:
        if variant is None:
            return tuple(range(self.n))
        try:
            return self.variants[str(variant)]
        except KeyError:
            raise GraphError(f"graph {self.graph.name!r}: replica variant {variant!r} is not listed in "
                             "meta.replica_variants") from None

    # ------------------------------------------------------------ driver
    def run(self) -> None:
        input_map = self._replicate_inputs()
        nodes: list[Node] = []
        for node in list(self.graph.nodes):
            if is_replica_node(node):
                nodes.extend(self._replicate_node(node))
            else:
                nodes.extend(self._cross_replica_node(node))
        # The traced nodes left out leave the graph; the graph outputs they computed are rewired right after.
        self.graph.set_nodes(nodes, safe=False)
        output_map, replica_outputs = self._replicate_outputs()
        self.graph.meta.replication = Replication(self.n, self.offset, self.in_sync, input_map, output_map,
                                                     replica_outputs)

    # ------------------------------------------------------------ inputs
    def _replicate_inputs(self) -> dict[str, dict[int, str]]:
        per_replica = self.graph.meta.per_replica_inputs
        inputs: list[Value] = []
        input_map: dict[str, dict[int, str]] = {}
        for value in self.graph.inputs:
            if value.name not in per_replica:
                inputs.append(value)
                continue
            twins: dict[int, Value] = {}
            traced_name = value.name
            for position, replica in enumerate(self.replicas_of(per_replica[traced_name])):
                if position == 0:  # the traced input becomes the variant's first replica's, renamed like the others
                    twin, twin.name = value, self.graph.unique_name(f"{traced_name}_r{replica}")
                else:
                    twin = self._twin(value, replica, name=f"{traced_name}_r{replica}")
                twins[replica] = twin
                inputs.append(twin)
            self.copies[id(value)] = twins
            input_map[traced_name] = {r: v.name for r, v in twins.items()}
        self.graph.inputs = inputs
        return input_map

    def _twin(self, value: Value, replica: int, producer: Node | None = None, name: str | None = None) -> Value:
        twin = Value(self.graph.unique_name(name or f"{value.name}_r{replica}"), value.dtype, value.shape,
                     producer=producer, index=value.index)
        twin.meta = dict(value.meta)
        return twin

    # ------------------------------------------------------------- nodes
    def _replicate_node(self, node: Node) -> list[Node]:
        replicas = self.replicas_of(node.meta.get("variant"))
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "ReplicaId":
            self.copies[id(node.outputs[0])] = {r: self._constant("replica_id", self.offset + r) for r in replicas}
            self._drop(node)
            return []
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "NumReplicas":
            self._replace(node, self._constant("num_replicas", self.in_sync))
            return []
        made = []
        traced_inputs = list(node.inputs)  # the first replica rewires the node itself: clone from these
        for position, replica in enumerate(replicas):
            twin = node if position == 0 else self._clone(node, replica, traced_inputs)
            for index, value in enumerate(traced_inputs):
                wanted = self._for_replica(value, replica, node)
                if wanted is not twin.inputs[index]:
                    twin.replace_input(index, wanted)
            twin.replica = replica
            for out, twin_out in zip(node.outputs, twin.outputs):
                self.copies.setdefault(id(out), {})[replica] = twin_out
            made.append(twin)
        return made

    def _clone(self, node: Node, replica: int, inputs: list[Value | None]) -> Node:
        twin = Node(node.op_type, inputs, dict(node.attrs), domain=node.domain)
        twin.name = self.graph.unique_name(f"{node.name}_r{replica}", node=True)
        twin.device, twin.meta = node.device, dict(node.meta)
        twin.outputs = [self._twin(out, replica, producer=twin) for out in node.outputs]
        return twin

    def _for_replica(self, value: Value | None, replica: int, reader: Node) -> Value | None:
        if value is None or id(value) not in self.copies:
            return value
        twins = self.copies[id(value)]
        if replica not in twins:
            raise GraphError(f"node {reader.name} of replica {replica} reads %{value.name}, which replica {replica} "
                             "does not compute (it belongs to another replica variant)")
        return twins[replica]

    def _first_copy(self, value: Value) -> Value:
        twins = self.copies.get(id(value))
        return value if twins is None else twins[min(twins)]

    def _cross_replica_node(self, node: Node) -> list[Node]:
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "ReplicaId":
            self._replace(node, self._constant("replica_id", self.offset))
            return []
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "NumReplicas":
            self._replace(node, self._constant("num_replicas", self.in_sync))
            return []
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "ReadReplica":
            self._replace(node, self._read_replica(node))
            return []
        if node.domain == GRAPHDIST_DOMAIN and node.op_type in CROSS_REPLICA_OPS:
            self._gather_replica_inputs(node)
            return [node]
        for index, value in enumerate(list(node.inputs)):
            if value is not None and id(value) in self.copies:
                node.replace_input(index, self._first_copy(value))
        return [node]

    def _read_replica(self, node: Node) -> Value:
        replica = int(node.attrs.get("replica", 0))
        value = node.inputs[0]
        twins = self.copies.get(id(value))
        if twins is None:
            return value  # not a per-replica value: every replica's component is the value itself
        if replica not in twins:
            raise GraphError(
                f"{node.name} reads replica {replica}'s component of %{value.name}, but the step has replicas "
                f"{sorted(twins)} here; a step that reads one replica's component (PerReplica.values[i], "
                "experimental_local_results) cannot be re-planned to fewer replicas")
        return twins[replica]

    def _gather_replica_inputs(self, node: Node) -> None:
        """Inputs of a cross-replica reduce/gather: every replica's copy, in replica order."""
        sources = [v for v in node.inputs if v is not None]
        if not any(id(v) in self.copies for v in sources):
            return
        by_replica: dict[int, Value] = {}
        for value in sources:
            for replica, twin in self.copies.get(id(value), {}).items():
                by_replica[replica] = twin
        missing = [r for r in range(self.n) if r not in by_replica]
        if missing:
            raise GraphError(f"{node.qualified_op} {node.name} has no value for replica(s) {missing}")
        node.detach_inputs()
        for replica in range(self.n):
            node._append_input(by_replica[replica])

    # ----------------------------------------------------------- outputs
    def _replicate_outputs(self) -> tuple[dict[int, int], dict[int, dict[int, int]]]:
        per_replica = {int(k): v for k, v in self.graph.meta.per_replica_outputs.items()}
        outputs: list[Value] = []
        output_map: dict[int, int] = {}
        replica_outputs: dict[int, dict[int, int]] = {}
        for position, value in enumerate(self.graph.outputs):
            if position in per_replica:
                replica_outputs[position] = {}
                for replica in self.replicas_of(per_replica[position]):
                    replica_outputs[position][replica] = len(outputs)
                    outputs.append(self._replica_output(value, replica))
            else:
                output_map[position] = len(outputs)
                outputs.append(self._first_copy(value))
        self.graph.outputs = outputs
        return output_map, replica_outputs

    def _replica_output(self, value: Value, replica: int) -> Value:
        twins = self.copies.get(id(value))
        if twins is not None:
            return twins[replica]
        # The same value on every replica (a constant, a cross-replica result): each replica outputs its copy.
        node = self.graph.add_node("Identity", [value], name="replica_output")
        node.meta["context"] = "replica"
        node.replica = replica
        return node.outputs[0]

    # ----------------------------------------------------------- helpers
    def _constant(self, hint: str, number: int) -> Value:
        value = self.constants.get((hint, number))
        if value is None:
            value = self.graph.add_initializer(f"{hint}_{number}", np.array(number, dtype=np.int32))
            self.constants[(hint, number)] = value
        return value

    def _replace(self, node: Node, value: Value) -> None:
        self.graph.replace_all_uses_with(node.outputs[0], value)
        self._drop(node)

    @staticmethod
    def _drop(node: Node) -> None:
        node.detach_inputs()  # now, so that its inputs' uses are current; run()'s set_nodes removes it
