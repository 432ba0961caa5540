"""LowerVariableUpdatesPass: turn ``graphdist.AssignVariable`` nodes into plan outputs.

Invariant established: no ``AssignVariable`` node remains; the final value
assigned to each variable in the step is a graph output, and
``graph.meta.variable_updates`` lists ``(output name, variable uid)`` pairs
the runtime writes back after the step.

Cases:
* one assign of a variable: its value becomes an output;
* several assigns of one variable: reads in between already use the earlier
  values; only the last value is written back (after ``ReplicatePass``,
  every replica assigns: the last replica's value is written, which equals
  the others' when the update is computed from all-reduced values);
* an assigned value that is also a user output or an input: an ``Identity``
  gives the update its own output name.
"""

from __future__ import annotations

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["LowerVariableUpdatesPass"]


class LowerVariableUpdatesPass(PassBase):
    """Replaces variable-update nodes by outputs written back by the runtime."""

    runs_after = ("ReplicatePass",)

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        assigns = graph.find_nodes("AssignVariable", GRAPHDIST_DOMAIN)
        if not assigns:
            return PassResult(graph, modified=False)
        last = {}
        for node in assigns:
            last[node.attrs["variable"]] = node
        updates = list(graph.meta.variable_updates)
        # Linear in the graph: outputs are tracked in a set (and appended after the loop: no assign's output
        # is among them, so the rewiring below never has to see them), assigns removed in one pass at the end.
        taken = {id(v) for v in graph.outputs}
        written: list[Value] = []
        for node in assigns:
            value = node.inputs[0]
            if id(node.outputs[0]) in taken:  # an output read the assigned value: it now reads ``value``
                taken.add(id(value))
            graph.replace_all_uses_with(node.outputs[0], value)
            node.detach_inputs()
            if last[node.attrs["variable"]] is not node:
                continue
            if value.producer is None or id(value) in taken:
                value = graph.add_node("Identity", [value], name="update").outputs[0]
            written.append(value)
            taken.add(id(value))
            updates.append((value.name, str(node.attrs["variable"])))
        graph.remove_nodes(assigns)
        graph.outputs.extend(written)
        graph.meta.variable_updates = updates
        return PassResult(graph, modified=True)
