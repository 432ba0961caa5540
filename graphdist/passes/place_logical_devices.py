"""PlaceLogicalDevicesPass: honour ``experimental_assign_to_logical_device`` annotations.

Invariant established: no ``graphdist.LogicalDevice`` node remains; the node
that computed each annotated value runs on the annotated logical device of its
replica (``cores[replica][logical_device]``); readers of the annotation read
that value directly. Readers left on other devices get their copy through the
``Transfer`` that ``PartitionPass`` inserts for every cross-device edge.

Cases:
* value computed by a node of the replica: that node is placed on the logical
  device (a node already placed elsewhere keeps its place: the first
  placement wins, as in TensorFlow);
* value with no producer (a step input, a constant) or produced by a
  collective: only the annotation's readers change; an ``Identity`` on the
  logical device carries the value there, so the annotation still moves it;
* logical device out of range for the device assignment: ``ValueError`` (the
  strategy checks it when the annotation is made; a hand-built graph is
  checked here);
* no annotations: unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphdist.ir.comm_ops import is_communication
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node
from graphdist.ir.placement_ops import LOGICAL_DEVICE
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["PlaceLogicalDevicesPass"]


def logical_device(cores: Sequence[Sequence[str]], node: Node, logical: int) -> str:
    """The device of logical device ``logical`` in ``node``'s replica (``ValueError`` when out of range)."""
    replica = node.replica or 0
    if not 0 <= replica < len(cores):
        raise ValueError(f"{node.name}: replica {replica} has no logical devices; the device assignment has "
                         f"{len(cores)} replicas")
    if not 0 <= logical < len(cores[replica]):
        raise ValueError(f"{node.name}: logical device {logical} is not consistent with the device assignment "
                         f"({len(cores[replica])} logical devices per replica, ids 0 to {len(cores[replica]) - 1})")
    return cores[replica][logical]


class PlaceLogicalDevicesPass(PassBase):
    """Places annotated values' producers on their logical devices.

    Args:
        cores: ``cores[replica][logical_device]`` -> device string.
    """

    runs_after = ("ShardLogicalDevicesPass",)

    def __init__(self, cores: Sequence[Sequence[str]]) -> None:
        self.cores = [list(c) for c in cores]

    def __repr__(self) -> str:
        return f"{self.name}(cores={self.cores})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        annotations = graph.find_nodes(LOGICAL_DEVICE, GRAPHDIST_DOMAIN)
        for node in annotations:
            device = logical_device(self.cores, node, int(node.attrs.get("logical_device", 0)))
            value = node.inputs[0]
            producer = value.producer
            computed_here = producer is not None and producer.domain != GRAPHDIST_DOMAIN \
                and not is_communication(producer)
            if computed_here:
                if producer.device is None:
                    producer.device, producer.replica = device, node.replica
                graph.replace_all_uses_with(node.outputs[0], value)
                graph.remove_node(node)
            else:
                # Nothing of the replica computes the value: an Identity on the logical device moves it there.
                node.op_type, node.domain, node.attrs = "Identity", "", {}
                node.device = device
        return PassResult(graph, modified=bool(annotations))
