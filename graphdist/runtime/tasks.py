"""The tasks of a plan as the runtime sees them: :class:`Segment` and :class:`CommTask`.

A segment is one device's share of a step (a sub-graph compiled by a
backend); a communication task is a collective or transfer between
segments, executed by a communicator. The scheduler runs both in
dependency order; it does not know which strategy or function made them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from graphdist.ir.graph import Graph
from graphdist.ir.onnx_io import to_onnx

__all__ = ["MICRO_BATCHES_KEY", "Segment", "CommTask", "overlapping_segments"]


#: Segment model metadata: how many micro-batches the segment computes (``AccumulateGradientsPass``).
MICRO_BATCHES_KEY = "graphdist.micro_batches"


@dataclass
class Segment:
    """One device's share of a plan.

    Attributes:
        name: Segment name (unique in the plan).
        device: Device string.
        graph: The segment's sub-graph.
        inputs: Names of the values it reads (graph inputs or other segments' outputs).
        outputs: Names of the values it produces for others.
    """

    name: str
    device: str
    graph: Graph
    inputs: list[str]
    outputs: list[str]
    _model: onnx.ModelProto | None = field(default=None, repr=False)

    @property
    def model(self) -> onnx.ModelProto:
        """The segment lowered to ONNX (cached); a segment of several micro-batches (gradient accumulation)
        says how many in its metadata (:data:`MICRO_BATCHES_KEY`), for backends that plan memory.
        """
        if self._model is None:
            self._model = to_onnx(self.graph)
            micro = {n.meta["micro"] for n in self.graph.nodes if n.meta.get("micro") is not None}
            if len(micro) > 1:
                entry = self._model.metadata_props.add()
                entry.key, entry.value = MICRO_BATCHES_KEY, str(len(micro))
        return self._model


@dataclass
class CommTask:
    """A collective or transfer executed by the communicator between segments.

    Attributes:
        name: Task name (the group key of a collective, the node name of a transfer).
        op: ``AllReduce``, ``AllGather`` or ``Transfer``.
        attrs: The op's attributes (``reduce_op``, ``algorithm``, ``axis``...).
        inputs: Input value names, one per participant in replica order.
        outputs: Output value names, one per participant.
        devices: Device of each participant.
    """

    name: str
    op: str
    attrs: dict[str, Any]
    inputs: list[str]
    outputs: list[str]
    devices: list[str]


def _reach(start: int, edges: dict[int, set[int]]) -> set[int]:
    seen: set[int] = set()
    stack = [start]
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def overlapping_segments(segments: Sequence[Segment], comms: Sequence[CommTask]) -> dict[str, list[str]]:
    """For each collective, the segments the plan lets run at the same time.

    A segment may overlap a communication task when it neither feeds it
    (directly or through other tasks) nor depends on its result: the
    scheduler can then run both at once. Run-time assertions and transfers
    (another name for the same array within a process) are left out.

    Returns:
        Communication task name -> names of the segments it may overlap, in plan order (empty lists left out).
    """
    tasks: list[tuple[str, list[str], list[str]]] = [(s.name, s.inputs, s.outputs) for s in segments]
    tasks += [(c.name, c.inputs, c.outputs) for c in comms]
    producer = {value: index for index, (_, _, outputs) in enumerate(tasks) for value in outputs}
    forward: dict[int, set[int]] = {}
    backward: dict[int, set[int]] = {}
    for index, (_, inputs, _) in enumerate(tasks):
        for value in inputs:
            if value in producer and producer[value] != index:
                forward.setdefault(producer[value], set()).add(index)
                backward.setdefault(index, set()).add(producer[value])
    found: dict[str, list[str]] = {}
    for offset, comm in enumerate(comms):
        if comm.op in ("AssertInRange", "Transfer"):  # a transfer runs no task (the scheduler binds a name)
            continue
        index = len(segments) + offset
        related = _reach(index, forward) | _reach(index, backward)
        names = [s.name for position, s in enumerate(segments) if position not in related]
        if names:
            found[comm.name] = names
    return found
