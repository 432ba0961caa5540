"""LowerOpsPass: apply the registered lowerings a pipeline asks for (``graphdist.passes.lowerings``).

Invariant established: no node of a lowered op remains, except groups its
lowering declines (e.g. an all-reduce whose elements do not split evenly
into its participants); every value the old nodes produced is now produced
by the lowering's nodes, so readers and graph outputs are unchanged.

Cases:
* collectives (graphdist-domain ``AllReduce``, ``AllGather``, ``ReduceScatter``):
  lowered one group (``group_key``) at a time, participants in replica order;
* other ops: lowered one node at a time;
* a group the lowering declines, or an op no lowering was asked for: unchanged;
* the lowerings' own output (other ops): unchanged on a second run.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node
from graphdist.passes.base import PassBase, PassContext, PassResult, PostconditionError
from graphdist.passes.lowerings import get_lowering, participants

__all__ = ["LowerOpsPass"]

_GROUPED = ("AllReduce", "AllGather", "ReduceScatter")


class LowerOpsPass(PassBase):
    """Replaces the nodes of each op in ``lowerings`` by that op's registered lowering.

    Args:
        lowerings: Op type -> lowering name, e.g. ``{"AllReduce": "reduce_scatter_all_gather"}``.

    Raises:
        InvalidArgumentError: An op has no lowering of that name (raised when the pass, hence the pipeline,
            is built; the message lists the registered ones).
    """

    runs_after = ("LowerCollectivesPass",)

    def __init__(self, lowerings: Mapping[str, str]) -> None:
        if not lowerings:
            raise InvalidArgumentError("LowerOpsPass needs at least one op -> lowering name")
        self.lowerings = dict(lowerings)
        self._functions = {op: get_lowering(op, name) for op, name in self.lowerings.items()}
        self._declined: set[str] = set()

    def __repr__(self) -> str:
        return f"{self.name}({self.lowerings})"

    def _groups(self, graph: Graph) -> list[list[Node]]:
        groups: dict[str, list[Node]] = {}
        for node in graph.nodes:
            if node.op_type not in self._functions:
                continue
            if node.domain == GRAPHDIST_DOMAIN and node.op_type in _GROUPED:
                groups.setdefault(f"group:{node.attrs.get('group_key', node.name)}", []).append(node)
            else:
                groups[f"node:{id(node)}"] = [node]
        return [participants(members) for members in groups.values()]

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        replaced: list[Node] = []
        self._declined = set()
        for group in self._groups(graph):
            values = self._functions[group[0].op_type](graph, group)
            if values is None:
                self._declined.update(n.name for n in group)
                continue
            graph.replace_all_uses_with_many([(node.outputs[0], new) for node, new in zip(group, values)])
            replaced.extend(group)
        if replaced:
            graph.remove_nodes(replaced)
            graph.topological_sort()  # the new nodes were appended; their readers move after them
        return PassResult(graph, bool(replaced))

    def ensures(self, graph: Graph, ctx: PassContext) -> None:
        left = [n.name for n in graph.nodes if n.op_type in self._functions and n.name not in self._declined]
        if left:
            raise PostconditionError(f"nodes of lowered ops remain: {', '.join(left[:5])}")
