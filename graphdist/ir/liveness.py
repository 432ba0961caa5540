"""Liveness: which nodes a step's graph outputs or side effects depend on.

Passes that rewrite a replicated graph ask this before choosing what to keep:
``ShardOptimizerStatePass`` (the updates and slot reads that matter) and
``LowerSingleReaderAllReducesPass`` (which replicas read a collective's
result). Nodes are named by ``id``, as the passes index them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from graphdist.ir.graph import Graph, Node

__all__ = ["live_nodes"]


def live_nodes(graph: Graph, *, through_readers: Collection[int] = (),
               together: Mapping[int, Sequence[Node]] | None = None) -> set[int]:
    """Ids of the nodes whose results reach a graph output or a node with ``meta["side_effect"]``.

    Args:
        graph: The graph.
        through_readers: Ids of side-effecting nodes that are live only when something live reads them
            (a collective whose result may be unused).
        together: Node id -> nodes that are live whenever it is (the members of its collective group,
            which needs every member's input).
    """
    together = together or {}
    stack = [v.producer for v in graph.outputs if v.producer is not None]
    stack += [n for n in graph.nodes if n.meta.get("side_effect") and id(n) not in through_readers]
    live: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in live:
            continue
        live.add(id(node))
        stack.extend(v.producer for v in node.inputs if v is not None and v.producer is not None)
        stack.extend(together.get(id(node), ()))
    return live
