"""EliminateDeadNodesPass: remove nodes that no graph output depends on.

Invariant established: every node contributes to at least one graph output,
and every initializer is read by a node or is an output.

Cases:
* node whose outputs are unused (e.g. the other replicas' copy of a reduce
  whose result is read from replica 0 only): removed;
* chains of such nodes: removed in one pass (reverse order);
* nodes with side effects (``meta["side_effect"]``, e.g. variable updates): kept;
* unused initializers: dropped.
"""

from __future__ import annotations

from graphdist.ir.graph import Graph
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["EliminateDeadNodesPass"]


class EliminateDeadNodesPass(PassBase):
    """Removes nodes and initializers that no output depends on."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        outputs = {id(v) for v in graph.outputs}
        dead = []
        for node in reversed(graph.nodes):
            if node.meta.get("side_effect"):
                continue
            if all(not out.uses and id(out) not in outputs for out in node.outputs):
                dead.append(node)
                node.detach_inputs()  # now, so that its producers' outputs count as unread further up
        graph.remove(dead)  # one pass, however many are dead
        used = {id(v) for n in graph.nodes for v in n.inputs if v is not None} | outputs
        unused = [name for name, v in graph.initializers.items() if id(v) not in used]
        for name in unused:
            del graph.initializers[name]
        return PassResult(graph, modified=bool(dead or unused))
