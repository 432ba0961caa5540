"""AssignDevicesPass: place every node on a device.

Invariant established: every node has ``node.device`` (the graph is in stage
``"rewritten"``).

Cases:
* node already placed: kept;
* node traced inside replica ``r`` (``node.replica``): ``ctx.devices[r]``,
  and ``node.replica = r``;
* node in cross-replica context: the first device (where ``strategy.reduce``
  results land);
* a replica without a device: ``GraphError``.
"""

from __future__ import annotations

from graphdist.errors import GraphError
from graphdist.ir.graph import Graph
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["AssignDevicesPass"]


class AssignDevicesPass(PassBase):
    """Places unplaced nodes on their replica's device."""

    runs_after = ("ReplicatePass", "PlaceVariablesPass", "PlacePSVariablesPass", "PlaceLogicalDevicesPass")

    stage = "rewritten"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        modified = False
        for node in graph.nodes:
            if node.device is not None:
                continue
            replica = node.replica
            if replica is not None and replica >= len(ctx.devices):
                raise GraphError(f"node {node.name} belongs to replica {replica} but only {len(ctx.devices)} "
                                 "device(s) are configured; the graph was replicated for more replicas than the "
                                 "pass context's devices (give PassContext(devices=...) one device per replica)")
            node.device = ctx.devices[replica or 0]
            modified = True
        return PassResult(graph, modified)
