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

Overlap (gradient buckets): a device's phase segment that feeds several
gradient buckets (collectives marked ``meta["bucket"]`` by
``BucketCollectivesPass``) is cut further, in the order the buckets'
inputs become ready (the last layer's first): sub-segment ``k`` holds the
nodes that bucket ``k``'s input needs and no earlier bucket's input needs;
nodes that no bucket needs (the loss, index checks) join the last
sub-segment. So bucket ``k``'s all-reduce can run as soon as sub-segments
``0..k`` of every participant are done, while the later sub-segments (the
backward pass of earlier layers) still compute. Each sub-segment is closed
under its ancestors within the phase, so edges only go from a sub-segment
to a later one of the same device (a value read directly, no transfer) or
through a communication node; the segments still form a DAG. The ops are
unchanged and a single-consumer chain is never cut, so ONNX Runtime fuses
the same ops and results are bitwise equal to the uncut plan for the MLP and
the transformer block (tested / benchmarked). A backend still optimises each
segment alone: where its layout rewrites reach across a cut (ONNX Runtime's
transpose optimiser around the ConvNet's NHWC transposes) a sum may be taken
in another order, ~1 ulp (9e-10 on one bias of the ConvNet after a step).
The cut is off by default and turned on by ``PartitionPass(overlap=True)``
or ``GRAPHDIST_OVERLAP=1``: on logical CPU devices, which split the host's
cores between them, there is no idle core for a collective to overlap with,
and the extra segments cost more than the communication wait they hide
(measured: BENCHMARKS.md "Overlap of gradient all-reduces").

Cases:
* all nodes on one device without collectives: one segment named after the
  device (``cpu0``);
* collectives between replicas: segments ``cpu0.p0``, ``cpu0.p1``, ...;
* a phase segment feeding two or more buckets (overlap on): ``cpu0.p0.s0``,
  ``cpu0.p0.s1``, ... in bucket order; feeding fewer, or overlap off: not cut;
* cross-worker groups (MPI): numbered again by phase, then graph order, so
  the order every worker issues them in never has a group wait for a segment
  that waits for a later group (see ``number_cross_worker_groups``);
* a compute node reading another device's value: a ``Transfer`` node on the
  reader's device is inserted (one per value and device);
* a collective that waits for values (``attrs["after"]``, set by
  ``LimitParameterGathersPass``): it counts as reading them (its phase is
  theirs or later, its readers' later still), and ``attrs["after_segments"]``
  names their segments for the scheduler;
* graph already partitioned: unchanged.
"""

from __future__ import annotations

import os

from graphdist.errors import InvalidArgumentError
from graphdist.ir.comm_ops import is_communication
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.insert_cross_worker_collectives import number_cross_worker_groups
from graphdist.passes.limit_parameter_gathers import ordering_edges

__all__ = ["PartitionPass", "segment_name", "overlap_enabled", "OVERLAP_ENV", "AFTER_SEGMENTS_ATTR"]

#: Collective attribute: the segments that must have run before the collective starts (from ``attrs["after"]``).
AFTER_SEGMENTS_ATTR = "after_segments"

#: Environment variable that turns the overlap cut on (``1``, ``true``, ``on``, ``yes``; off by default).
OVERLAP_ENV = "GRAPHDIST_OVERLAP"

#: Meta key BucketCollectivesPass sets on the collectives it decided on (a bucket each).
_BUCKET = "bucket"


def overlap_enabled() -> bool:
    """Whether ``GRAPHDIST_OVERLAP`` turns the overlap cut on (off by default, see the module docstring).

    Raises:
        InvalidArgumentError: The variable holds something other than a boolean word.
    """
    text = os.environ.get(OVERLAP_ENV, "0").strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no", ""):
        return False
    raise InvalidArgumentError(f"{OVERLAP_ENV}={text!r} is not understood; set it to 1 (overlap gradient "
                               "all-reduces with the backward pass) or 0 (one segment per phase, the default)")


def segment_name(device: str, phase: int | None = None, part: int | None = None) -> str:
    """Segment name for a device, phase and overlap part (``cpu:0`` -> ``cpu0``, ``cpu0.p1``, ``cpu0.p0.s1``)."""
    base = device.replace(":", "")
    if phase is None:
        return base
    return f"{base}.p{phase}" if part is None else f"{base}.p{phase}.s{part}"


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


def _phases(graph: Graph, after: dict[int, list[Node]]) -> dict[int, int]:
    phase: dict[int, int] = {}
    for node in graph.nodes:
        best = 0
        producers = [v.producer for v in node.inputs if v is not None and v.producer is not None]
        for producer in (*producers, *after.get(id(node), ())):
            best = max(best, phase[id(producer)] + (1 if is_communication(producer) else 0))
        phase[id(node)] = best
    return phase


def _name_awaited_segments(graph: Graph, after: dict[int, list[Node]]) -> bool:
    """Sets ``attrs["after_segments"]`` of each collective that waits for values: their segments, which the
    scheduler runs first (``LimitParameterGathersPass``).
    """
    modified = False
    for node in graph.nodes:
        if id(node) not in after:
            continue
        names = sorted({p.meta["segment"] for p in after[id(node)] if "segment" in p.meta})
        if node.attrs.get(AFTER_SEGMENTS_ATTR) != names:
            node.attrs[AFTER_SEGMENTS_ATTR] = names
            modified = True
    return modified


def _bucket_parts(graph: Graph, phase: dict[int, int], device_of: dict[int, str]) -> dict[int, int]:
    """Overlap part of every compute node in a (device, phase) segment that feeds two or more buckets.

    Returns:
        Node id -> part index (``0`` for the nodes the first-ready bucket needs); nodes of segments that
        are not cut are absent.
    """
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    buckets: dict[tuple[str, int], dict[str, list[Node]]] = {}
    for node in graph.nodes:
        if not is_communication(node) or _BUCKET not in node.meta:
            continue
        for value in node.inputs:
            producer = value.producer if value is not None else None
            if producer is not None and not is_communication(producer):
                key = (device_of[id(producer)], phase[id(producer)])
                buckets.setdefault(key, {}).setdefault(str(node.meta[_BUCKET]), []).append(producer)
    parts: dict[int, int] = {}
    for (device, at), by_bucket in buckets.items():
        if len(by_bucket) < 2:
            continue
        ready = sorted(by_bucket.values(), key=lambda producers: max(position[id(p)] for p in producers))
        members = [n for n in graph.nodes if not is_communication(n)
                   and device_of[id(n)] == device and phase[id(n)] == at]
        inside = {id(n) for n in members}
        for index, producers in enumerate(ready):
            _claim_ancestors(producers, index, inside, parts)
        last = max(parts[id(n)] for n in members if id(n) in parts)
        for node in members:
            parts.setdefault(id(node), last)  # needed by no bucket: runs after the last one's inputs
        used = sorted({parts[id(n)] for n in members})  # a bucket whose inputs were all claimed adds no part
        renumber = {old: new for new, old in enumerate(used)}
        for node in members:
            parts[id(node)] = renumber[parts[id(node)]]
    return parts


def _claim_ancestors(roots: list[Node], index: int, inside: set[int], parts: dict[int, int]) -> None:
    """Gives part ``index`` to ``roots`` and their ancestors within the segment that no earlier part holds."""
    stack = [n for n in roots if id(n) not in parts]
    while stack:
        node = stack.pop()
        if id(node) in parts:
            continue
        parts[id(node)] = index
        for value in node.inputs:
            producer = value.producer if value is not None else None
            if producer is not None and id(producer) in inside and id(producer) not in parts:
                stack.append(producer)


class PartitionPass(PassBase):
    """Inserts transfers and assigns every compute node to a (device, phase[, overlap part]) segment.

    Args:
        overlap: Cut a device's phase at its gradient buckets (see the module
            docstring). ``None``: as ``GRAPHDIST_OVERLAP`` says (off unless ``1``).
    """

    runs_after = ("AssignDevicesPass", "LowerIndexChecksPass")

    stage = "partitioned"

    def __init__(self, overlap: bool | None = None) -> None:
        if overlap is not None and not isinstance(overlap, bool):
            raise InvalidArgumentError(f"PartitionPass: overlap must be True, False or None, got {overlap!r}")
        self.overlap = overlap

    def __repr__(self) -> str:
        return self.name if self.overlap is None else f"{self.name}(overlap={self.overlap})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        modified = _insert_transfers(graph)
        after = ordering_edges(graph)
        if after:  # the edges' producers come first in the node order, which the phases are computed in
            graph.topological_sort(after=after)
        phase = _phases(graph, after)
        modified = number_cross_worker_groups(graph, phase) or modified
        compute = [n for n in graph.nodes if not is_communication(n)]
        single = not any(is_communication(n) for n in graph.nodes) and len({n.device for n in compute}) <= 1
        device_of = {id(n): n.device or ctx.devices[0] for n in graph.nodes}
        overlap = overlap_enabled() if self.overlap is None else self.overlap
        parts = _bucket_parts(graph, phase, device_of) if overlap and not single else {}
        for node in compute:
            name = segment_name(device_of[id(node)], None if single else phase[id(node)], parts.get(id(node)))
            if node.meta.get("segment") != name:
                node.meta["segment"] = name
                modified = True
        modified = _name_awaited_segments(graph, after) or modified
        return PassResult(graph, modified)
