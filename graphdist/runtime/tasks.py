"""The tasks of a plan as the runtime sees them: :class:`Segment` and :class:`CommTask`.

A segment is one device's share of a step (a sub-graph compiled by a
backend); a communication task is a collective or transfer between
segments, executed by a communicator. The scheduler runs both in
dependency order; it does not know which strategy or function made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from graphdist.ir.graph import Graph

__all__ = ["Segment", "CommTask"]


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
        """The segment lowered to ONNX (cached)."""
        if self._model is None:
            self._model = self.graph.to_onnx()
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
