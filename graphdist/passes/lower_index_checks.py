"""LowerIndexChecksPass: turn ``graphdist.CheckIndices`` nodes into ONNX ops and run-time assertions.

Invariant established: no ``CheckIndices`` node remains. For each one, the
backends compute the checked values' ``[min, max]`` (int64; min > max
when there are none) with ``Reshape``/``Concat``/``ReduceMin``/``ReduceMax``, and a
``graphdist.AssertInRange`` node (a task the scheduler runs between
segments, like a collective) reads it and raises after the step when it
leaves ``[low, high)``. See :mod:`graphdist.ir.check_ops`.

Cases:
* the checked indices are read (a ``Gather``): they become
  ``Where(indices < low or indices >= high, 0, indices)``, so no backend
  reads outside a buffer before the assertion fails;
* nothing reads them (class labels): only the range is computed;
* a replica's copy (after ``ReplicatePass``): its assertion names the global
  replica (``graph.meta.replication.offset + node.replica``; with one replica
  in sync, none) and has a group of its own, so each replica's check is one
  task;
* runs after device assignment: the new nodes take the checked node's
  device, replica and region.
"""

from __future__ import annotations

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["LowerIndexChecksPass"]

_PLACEMENT_META = ("context", "variant")


class LowerIndexChecksPass(PassBase):
    """Expands every ``CheckIndices`` node into ONNX ops plus an ``AssertInRange`` task."""

    runs_after = ("AssignDevicesPass",)

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        checks = graph.find_nodes("CheckIndices", GRAPHDIST_DOMAIN)
        replication = graph.meta.replication
        offset = int(getattr(replication, "offset", 0) or 0)
        # Messages name the replica only where there are several.
        named = int(getattr(replication, "replicas_in_sync", 1) or 1) > 1
        for node in checks:
            created = _lower(graph, node, offset if named else None)
            for new in created:
                new.device, new.replica = node.device, node.replica
                new.meta.update({k: node.meta[k] for k in _PLACEMENT_META if k in node.meta})
            graph.insert_before(node, created)  # add_node appended them: moved to where the check was
            graph.remove(node)
        return PassResult(graph, modified=bool(checks))


def _lower(graph: Graph, node: Node, offset: int | None) -> list[Node]:
    """The nodes replacing ``node`` (appended to ``graph``; the caller moves them into place)."""
    created: list[Node] = []

    def add(op: str, inputs: list[Value], attrs: dict | None = None, domain: str = "") -> Value:
        new = graph.add_node(op, inputs, attrs, domain=domain, name=f"{node.name}_{op.lower()}")
        created.append(new)
        return new.outputs[0]

    def const(value: np.ndarray, hint: str) -> Value:
        return graph.add_initializer(f"{node.name}_{hint}", value)

    indices = node.inputs[0]
    low, high = int(node.attrs.get("low", 0)), int(node.attrs.get("high", 0))
    dtype = np.dtype(indices.dtype)
    flat = add("Reshape", [indices, const(np.array([-1], np.int64), "flat")])
    # The type's extremes join the values so that no reduction sees an empty tensor (empty: min > max).
    info = np.iinfo(dtype)
    smallest = add("ReduceMin", [add("Concat", [flat, const(np.array([info.max], dtype), "top")], {"axis": 0})],
                   {"keepdims": 1})
    largest = add("ReduceMax", [add("Concat", [flat, const(np.array([info.min], dtype), "bottom")], {"axis": 0})],
                  {"keepdims": 1})
    bounds = add("Concat", [smallest, largest], {"axis": 0})
    if dtype != np.int64:
        bounds = add("Cast", [bounds], {"to": 7})  # onnx INT64
    replica = -1 if node.replica is None or offset is None else offset + int(node.replica)
    attrs = {k: node.attrs[k] for k in ("low", "high", "op", "argument", "hint") if k in node.attrs}
    attrs.update(replica=replica, group_key=f"{node.name}.assert")
    add("AssertInRange", [bounds], attrs, domain=GRAPHDIST_DOMAIN)
    created[-1].meta["side_effect"] = True
    checked = node.outputs[0]
    if checked.uses or any(out is checked for out in graph.outputs):
        outside = add("Or", [add("Less", [indices, const(np.array(low, dtype), "lo")]),
                             add("GreaterOrEqual", [indices, const(np.array(high, dtype), "hi")])])
        masked = add("Where", [outside, const(np.array(0, dtype), "zero"), indices])
        graph.replace_all_uses_with(checked, masked)
    return created
