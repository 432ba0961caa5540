"""InsertCollectivesPass: turn the cross-replica ops of a replicated graph into collective groups.

After :class:`graphdist.passes.replicate.ReplicatePass` every replica holds its copy of
each ``ReplicaAllReduce`` / ``ReplicaAllGather`` (joined by their traced
``group_key``), and each ``CrossReplicaReduce`` / ``CrossReplicaGather`` reads
every replica's copy of its value.

Invariant established: no ``ReplicaAllReduce``, ``ReplicaAllGather``,
``CrossReplicaReduce`` or ``CrossReplicaGather`` node remains; in their place
are ``graphdist.AllReduce`` / ``AllGather`` groups (one node per
participant, ``node.replica`` its replica, ``group_key`` shared,
``group_size`` the participants times the workers, i.e. the replicas in
sync for a full group, ``meta["side_effect"]`` so every member runs), which
``InsertCrossWorkerCollectivesPass`` (it narrows ``group_size`` to this
worker's participants) and ``LowerCollectivesPass`` take from there.

Cases:

* ``ReplicaAllReduce`` / ``ReplicaAllGather`` copies sharing a key: each copy
  becomes its replica's member of one group (``reduce_op`` or ``axis``
  kept); a copy alone in its group is a group of one (the default strategy,
  one replica);
* ``CrossReplicaReduce(x_0, ..., x_k)``: one member per input, on its
  replica (``node.replica`` = the input's position); readers of the
  result read replica 0's member (cross-replica results live where replica 0
  runs, as ``strategy.reduce`` results do);
* ``CrossReplicaGather(x_0, ..., x_k)``: the same with ``AllGather``;
* an ``AllGather`` group whose members have different shapes along the
  gathered axis or elsewhere (uneven per-replica batches): ``GraphError``
  naming the group and the shapes;
* no cross-replica ops: unchanged.
"""

from __future__ import annotations

from typing import Any

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["InsertCollectivesPass"]

_IN_REPLICA = {"ReplicaAllReduce": "AllReduce", "ReplicaAllGather": "AllGather"}
_FROM_CROSS = {"CrossReplicaReduce": "AllReduce", "CrossReplicaGather": "AllGather"}


class InsertCollectivesPass(PassBase):
    """Lowers cross-replica ops to ``AllReduce`` / ``AllGather`` groups.

    Args:
        num_workers: Workers (processes) whose replicas are in sync; a group's
            ``group_size`` is its local participants times this.
    """

    runs_after = ("ReplicatePass", "LowerVariableUpdatesPass")

    def __init__(self, num_workers: int = 1) -> None:
        self.num_workers = int(num_workers)

    def __repr__(self) -> str:
        return f"{self.name}(num_workers={self.num_workers})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        targets = [n for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN and n.op_type in {**_IN_REPLICA,
                                                                                              **_FROM_CROSS}]
        if not targets:
            return PassResult(graph, modified=False)
        self._sizes: dict[str, int] = {}
        for node in targets:
            key = self._key(node)
            self._sizes[key] = self._sizes.get(key, 0) + (len(node.inputs) if node.op_type in _FROM_CROSS else 1)
        nodes: list[Node] = []
        for node in graph.nodes:
            if node.domain != GRAPHDIST_DOMAIN:
                nodes.append(node)
            elif node.op_type in _IN_REPLICA:
                nodes.append(self._member(graph, node))
            elif node.op_type in _FROM_CROSS:
                nodes.extend(self._members_of_cross(graph, node))
            else:
                nodes.append(node)
        graph.set_nodes(nodes)
        _check_gather_groups(nodes)
        return PassResult(graph, modified=True)

    @staticmethod
    def _key(node: Node) -> str:
        return str(node.attrs.get("group_key") or node.name)

    def _attrs(self, node: Node, key: str) -> dict[str, Any]:
        attrs = {k: v for k, v in node.attrs.items() if k not in ("group_key", "num_replicas")}
        attrs.update(group_key=key, group_size=self._sizes[key] * self.num_workers)
        return attrs

    def _member(self, graph: Graph, node: Node) -> Node:
        """A replica's copy of a replica-context collective becomes its group member, in place."""
        key = self._key(node)
        node.op_type = _IN_REPLICA[node.op_type]
        node.attrs = self._attrs(node, key)
        node.meta["side_effect"] = True
        return node

    def _members_of_cross(self, graph: Graph, node: Node) -> list[Node]:
        key = self._key(node)
        op_type = _FROM_CROSS[node.op_type]
        attrs = self._attrs(node, key)
        members = []
        result = node.outputs[0]
        for replica, value in enumerate(node.inputs):
            member = Node(op_type, [value], dict(attrs), domain=GRAPHDIST_DOMAIN)
            member.name = graph.unique_name(f"{op_type.lower()}", node=True)
            member.meta = {k: v for k, v in node.meta.items() if k not in ("context", "variant")}
            member.meta.update(context="replica", side_effect=True)
            member.replica = replica
            if replica == 0:
                out = result  # readers of the cross-replica result read replica 0's member
            else:
                out = Value(graph.unique_name(f"{result.name}_r{replica}"), result.dtype, result.shape)
            member.add_output(out)
            members.append(member)
        return members  # the caller's set_nodes removes ``node``, whose output replica 0's member took


def _check_gather_groups(nodes: list[Node]) -> None:
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "AllGather":
            groups.setdefault(str(node.attrs.get("group_key")), []).append(node)
    for key, members in groups.items():
        shapes = {m.inputs[0].shape for m in members}
        if len(shapes) > 1:
            listing = ", ".join(f"replica {'?' if m.replica is None else m.replica}: {m.inputs[0].type_str()}"
                                for m in members)
            raise GraphError(f"all-gather {key} gathers values of different shapes ({listing}); gathering uneven "
                             "per-replica values (a partial batch) is not supported: pad them to one shape, or "
                             "drop the remainder (dataset.batch(..., drop_remainder=True))")
