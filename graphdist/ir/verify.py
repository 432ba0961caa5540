"""Per-stage invariants of a graph, checked after every pass in tests.

Stages and what :func:`verify` checks:

* every stage: value names and node names unique; each node's op
  registered; every input defined before use (topological order, no cycles);
  use lists consistent with inputs in both directions; every output typed and
  equal to what the op's shape rule infers (as many outputs as it gives);
  graph outputs defined.
* ``"rewritten"`` and ``"partitioned"``: every node placed on a device.
* ``"partitioned"``: no edge crosses devices except into a collective or
  transfer node of the ``graphdist`` domain.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphdist.errors import GraphError
from graphdist.ir.comm_ops import is_communication
from graphdist.ir.graph import Graph, Node
from graphdist.ir.ops import node_opdef

__all__ = ["verify", "STAGES"]

STAGES = ("traced", "rewritten", "partitioned")



def verify(graph: Graph, stage: str | None = None) -> None:
    """Checks the invariants of ``stage`` (default: ``graph.stage``).

    Raises:
        GraphError: Listing every violated invariant.
    """
    stage = stage or graph.stage
    if stage not in STAGES:
        raise GraphError(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    problems = _check_structure(graph)
    if stage in ("rewritten", "partitioned"):
        problems += [f"node {n.name} ({n.qualified_op}) has no device" for n in graph.nodes if n.device is None]
    if stage == "partitioned":
        problems += _check_cross_device_edges(graph)
    if problems:
        listing = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise GraphError(f"graph {graph.name!r} fails verification at stage {stage!r}:\n  {listing}{more}")


def _check_structure(graph: Graph) -> list[str]:
    problems: list[str] = []
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    problems += [f"value name {n!r} is used more than once" for n in _duplicates(v.name for v in graph.values())]
    problems += [f"node name {n!r} is used more than once" for n in _duplicates(n.name for n in graph.nodes)]
    in_graph = {id(n) for n in graph.nodes}
    for node in graph.nodes:
        problems += _check_node(node, defined)
        defined.update(id(v) for v in node.outputs)
    for value in graph.values():
        for user, index in value.uses:
            if id(user) not in in_graph:
                problems.append(f"use list of %{value.name} names node {user.name}, which is not in the graph")
            elif index >= len(user.inputs) or user.inputs[index] is not value:
                problems.append(f"use list of %{value.name} names input {index} of {user.name}, which reads "
                                "another value")
    problems += [f"graph output %{v.name} is not defined" for v in graph.outputs if id(v) not in defined]
    return problems


def _duplicates(names: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    repeated: set[str] = set()
    for name in names:
        (repeated if name in seen else seen).add(name)
    return sorted(repeated)


def _check_node(node: Node, defined: set[int]) -> list[str]:
    problems = []
    try:
        opdef = node_opdef(node)
    except GraphError as err:
        return [str(err)]
    for index, value in enumerate(node.inputs):
        if value is None:
            continue
        if id(value) not in defined:
            problems.append(f"node {node.name} reads %{value.name} before it is defined")
        if (node, index) not in value.uses:
            problems.append(f"use list of %{value.name} misses node {node.name} input {index}")
    for out in node.outputs:
        if out.producer is not node:
            problems.append(f"output %{out.name} of {node.name} names another producer")
    try:
        inferred = opdef.infer(node, len(node.outputs))
    except GraphError as err:
        return [*problems, f"node {node.name}: {err}"]
    if len(inferred) != len(node.outputs):
        problems.append(f"node {node.name} ({node.qualified_op}) has {len(node.outputs)} outputs but its shape "
                        f"rule gives {len(inferred)}")
    for out, (dtype, shape) in zip(node.outputs, inferred):
        if out.dtype != dtype or _static(out.shape) != _static(shape):
            problems.append(
                f"node {node.name} ({node.qualified_op}): output %{out.name} is {out.type_str()} "
                f"but its shape rule gives {dtype.name}{list(shape)}"
            )
    return problems


def _static(shape: tuple) -> tuple:
    # Symbolic names may be spelt differently by importers; compare static dims only.
    return tuple(d if isinstance(d, int) else "?" for d in shape)


def _check_cross_device_edges(graph: Graph) -> list[str]:
    problems = []
    for node in graph.nodes:
        if is_communication(node):
            continue
        for value in node.inputs:
            producer = value.producer if value is not None else None
            if producer is not None and producer.device != node.device:
                problems.append(
                    f"edge %{value.name} crosses from {producer.device} ({producer.name}) to "
                    f"{node.device} ({node.name}) without a transfer or collective"
                )
    return problems
