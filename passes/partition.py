"""PartitionPass: split a placed graph into per-device segments.

Invariant established: every compute node carries ``meta["segment"]``; no
compute node reads a value produced on another device except through a
``graphdist.Transfer`` node; segments form a DAG; the graph is in stage
``"partitioned"``.

Segments are cut per device at communication nodes (collectives and
transfers): a node's *phase* is the number of communication steps on the
longest path from the step's inputs to it, and a segment holds the nodes of
one device and one phase. Every edge between two segments then goes through
a communication node and strictly increases the phase, so the segments of a
plan can run in dependency order and overlap across devices.

Cases:
* all nodes on one device without collectives: one segment named after the
  device (``cpu0``);
* collectives between replicas: segments ``cpu0.p0``, ``cpu0.p1``, ...;
* a compute node reading another device's value: a ``Transfer`` node on the
  reader's device is inserted (one per value and device);
* graph already partitioned: unchanged.
"""

from __future__ import annotations

from graphdist.ir.comm_ops import is_communication
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node
from passes.base import PassBase, PassContext, PassResult

__all__ = ["PartitionPass", "segment_name"]


def segment_name(device: str, phase: int | None = None) -> str:
    """Segment name for a device and phase (``cpu:0`` -> ``cpu0`` or ``cpu0.p1``)."""
    base = device.replace(":", "")
    return base if phase is None else f"{base}.p{phase}"


def _insert_transfers(graph: Graph) -> bool:
    made: dict[tuple[int, str], object] = {}
    modified = False
    for node in list(graph.nodes):
        if is_communication(node):
            continue
        for index, value in enumerate(node.inputs):
            producer = value.producer if value is not None else None
            if producer is None or producer.device == node.device:
                continue
            key = (id(value), node.device)
            moved = made.get(key)
            if moved is None:
                transfer = Node("Transfer", [value], domain=GRAPHDIST_DOMAIN)
                transfer.name = graph.unique_name("transfer", node=True)
                transfer.device, transfer.replica = node.device, node.replica
                out = type(value)(graph.unique_name(f"{value.name}_to_{node.device.replace(':', '')}"),
                                  value.dtype, value.shape, producer=transfer)
                transfer.outputs.append(out)
                graph.insert_before(node, transfer)
                made[key] = moved = out
            node.replace_input(index, moved)
            modified = True
    return modified


def _phases(graph: Graph) -> dict[int, int]:
    phase: dict[int, int] = {}
    for node in graph.nodes:
        best = 0
        for value in node.inputs:
            producer = value.producer if value is not None else None
            if producer is not None:
                best = max(best, phase[id(producer)] + (1 if is_communication(producer) else 0))
        phase[id(node)] = best
    return phase


class PartitionPass(PassBase):
    """Inserts transfers and assigns every compute node to a (device, phase) segment."""

    stage = "partitioned"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        modified = _insert_transfers(graph)
        phase = _phases(graph)
        compute = [n for n in graph.nodes if not is_communication(n)]
        single = not any(is_communication(n) for n in graph.nodes) and len({n.device for n in compute}) <= 1
        for node in compute:
            name = segment_name(node.device or ctx.devices[0], None if single else phase[id(node)])
            if node.meta.get("segment") != name:
                node.meta["segment"] = name
                modified = True
        return PassResult(graph, modified)
