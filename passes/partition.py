"""PartitionPass: split a placed graph into per-device segments.

Invariant established: every node carries ``meta["segment"]``, the name of
the segment that will run it, and the graph is in stage ``"partitioned"``
(``verify`` then rejects any edge between devices that does not go through
a collective or transfer node).

Cases:
* all nodes on one device: one segment, named after the device;
* nodes on several devices: one segment per device (cutting at collectives
  and transfers arrives with multi-device strategies).
"""

from __future__ import annotations

from graphdist.ir.graph import Graph
from passes.base import PassBase, PassContext, PassResult

__all__ = ["PartitionPass"]


def segment_name(device: str) -> str:
    """Segment name for a device (``cpu:0`` -> ``cpu0``)."""
    return device.replace(":", "")


class PartitionPass(PassBase):
    """Assigns every node to its device's segment."""

    stage = "partitioned"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        modified = False
        for node in graph.nodes:
            name = segment_name(node.device or ctx.devices[0])
            if node.meta.get("segment") != name:
                node.meta["segment"] = name
                modified = True
        return PassResult(graph, modified)
