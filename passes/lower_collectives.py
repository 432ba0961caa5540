"""LowerCollectivesPass: turn collective nodes into executable form.

Invariant established: no ``graphdist.AllReduce``/``AllGather`` node with a
group of one participant remains.

Cases:
* group of one participant: the collective is the identity (SUM, MEAN, MAX or
  MIN of one value is the value; gathering one value is the value), so its
  output is rewired to its input and the node removed;
* groups of several participants: the ring, hierarchical-copy and
  reduce-to-one algorithms chosen by ``cross_device_ops`` are not built yet;
  the pass raises ``NotImplementedError`` naming the group.
"""

from __future__ import annotations

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node
from passes.base import PassBase, PassContext, PassResult

__all__ = ["LowerCollectivesPass", "COLLECTIVE_OPS"]

COLLECTIVE_OPS = ("AllReduce", "AllGather")


def _collectives(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN and n.op_type in COLLECTIVE_OPS]


class LowerCollectivesPass(PassBase):
    """Lowers collectives; single-participant groups become the identity."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        nodes = _collectives(graph)
        wide = [n for n in nodes if int(n.attrs.get("group_size", 1)) > 1]
        if wide:
            node = wide[0]
            raise NotImplementedError(
                f"{node.op_type} over {node.attrs['group_size']} replicas (group {node.attrs.get('group_key')}) "
                "needs multi-device collective lowering, which is not implemented yet; use one replica"
            )
        for node in nodes:
            graph.replace_all_uses_with(node.outputs[0], node.inputs[0])
            graph.remove_node(node)
        return PassResult(graph, modified=bool(nodes))
