"""Control-flow ops (If, Loop, Scan): subgraph attributes and the outer values they read.

An ONNX subgraph may read values of the enclosing graph by name, without
listing them as node inputs. graphdist's dataflow must see those reads (dead
node elimination, partitioning and renaming all follow node inputs), so an
imported control-flow node lists them as extra inputs after its ONNX inputs,
and the attribute :data:`CAPTURES_ATTR` records the names the subgraphs use
for them. Lowering writes the ONNX inputs only and renames the subgraphs'
references to the current names of the captured values, so a value renamed
by a pass (a replica copy, a transfer) is still found.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import onnx

__all__ = ["CAPTURES_ATTR", "subgraphs_of", "subgraph_ops", "free_names", "split_captures", "renamed_attribute",
           "control_flow_types"]

#: Node attribute (not an ONNX attribute: lowering drops it) listing the outer names a node's subgraphs read.
CAPTURES_ATTR = "graphdist.captures"

_GRAPH_KINDS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def subgraphs_of(attrs: Mapping[str, Any]) -> list[onnx.GraphProto]:
    """The subgraphs held by a node's attributes (kept as ``AttributeProto`` objects at import)."""
    graphs: list[onnx.GraphProto] = []
    for value in attrs.values():
        if isinstance(value, onnx.AttributeProto) and value.type == onnx.AttributeProto.GRAPH:
            graphs.append(value.g)
        elif isinstance(value, onnx.AttributeProto) and value.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(value.graphs)
    return graphs


def subgraph_ops(attr_maps: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """``(op_type, domain)`` of every node in the subgraphs held by these attribute maps, at any depth."""
    ops: set[tuple[str, str]] = set()
    pending = [graph for attrs in attr_maps for graph in subgraphs_of(attrs)]
    while pending:
        graph = pending.pop()
        for node in graph.node:
            ops.add((node.op_type, "" if node.domain == "ai.onnx" else node.domain))
            pending.extend(_nested(node))
    return ops


def _nested(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    nested: list[onnx.GraphProto] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            nested.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            nested.extend(attr.graphs)
    return nested


def _free_in(graph: onnx.GraphProto) -> list[str]:
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.name for t in graph.sparse_initializer}
    free: list[str] = []
    for node in graph.node:
        reads = [*node.input, *(name for sub in _nested(node) for name in _free_in(sub))]
        free.extend(name for name in reads if name and name not in defined and name not in free)
        defined.update(name for name in node.output if name)
    free.extend(v.name for v in graph.output if v.name not in defined and v.name not in free)
    return free


def free_names(graphs: Iterable[onnx.GraphProto]) -> list[str]:
    """Names the subgraphs read from enclosing scopes, in first-use order."""
    names: list[str] = []
    for graph in graphs:
        names.extend(name for name in _free_in(graph) if name not in names)
    return names


def split_captures(inputs: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[list[Any], list[Any], list[str]]:
    """``(onnx_inputs, captured_inputs, captured_names)`` of a node's input list."""
    names = list(attrs.get(CAPTURES_ATTR) or [])
    count = len(inputs) - len(names)
    return list(inputs[:count]), list(inputs[count:]), names


def _rename(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    shadowed = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in mapping and name not in shadowed:
                node.input[index] = mapping[name]
        for sub in _nested(node):
            _rename(sub, {k: v for k, v in mapping.items() if k not in shadowed})
        shadowed.update(node.output)
    for output in graph.output:
        if output.name in mapping and output.name not in shadowed:
            output.name = mapping[output.name]


def renamed_attribute(attr: onnx.AttributeProto, mapping: Mapping[str, str]) -> onnx.AttributeProto:
    """A copy of a subgraph attribute whose outer references follow ``mapping`` (old name -> new)."""
    if attr.type not in _GRAPH_KINDS or not any(k != v for k, v in mapping.items()):
        return attr
    copy = onnx.AttributeProto()
    copy.CopyFrom(attr)
    for graph in ([copy.g] if copy.type == onnx.AttributeProto.GRAPH else list(copy.graphs)):
        _rename(graph, mapping)
    return copy


def _declared(graph: onnx.GraphProto) -> list[onnx.TypeProto | None]:
    """The tensor types a subgraph declares for its outputs (``None`` where there is no rank)."""
    types: list[onnx.TypeProto | None] = []
    for output in graph.output:
        tensor = output.type.tensor_type if output.type.WhichOneof("value") == "tensor_type" else None
        types.append(output.type if tensor is not None and tensor.elem_type and tensor.HasField("shape") else None)
    return types


def _merged(first: onnx.TypeProto, second: onnx.TypeProto) -> onnx.TypeProto | None:
    a, b = first.tensor_type, second.tensor_type
    if a.elem_type != b.elem_type or len(a.shape.dim) != len(b.shape.dim):
        return None
    merged = onnx.TypeProto()
    merged.CopyFrom(first)
    for dim, other in zip(merged.tensor_type.shape.dim, b.shape.dim):
        if dim.HasField("dim_value") and not (other.HasField("dim_value") and other.dim_value == dim.dim_value):
            dim.Clear()  # the branches disagree on this dimension: unknown until run time
    return merged


def _compatible(first: onnx.TypeProto, second: onnx.TypeProto) -> bool:
    """Same element type and rank, and no dimension both give that differs."""
    a, b = first.tensor_type, second.tensor_type
    return a.elem_type == b.elem_type and len(a.shape.dim) == len(b.shape.dim) and all(
        not (x.HasField("dim_value") and y.HasField("dim_value")) or x.dim_value == y.dim_value
        for x, y in zip(a.shape.dim, b.shape.dim))


def control_flow_types(op_type: str, attrs: Mapping[str, Any], input_types: Sequence[onnx.TypeProto | None],
                       trip_count: int | None, count: int) -> list[onnx.TypeProto | None]:
    """Output types of an ``If`` or ``Loop`` from its subgraphs' declared output types, where ONNX's
    inference gives none (``None`` per output it cannot type).

    * ``If``: the branches' types where both have one of the same element type and rank (dimensions
      where they differ are unknown);
    * ``Loop``: a loop-carried value keeps its input's element type and rank, and the dimensions the body
      declares the same (others are unknown: the value may change shape from one iteration to the next);
      a scan output is the body's type with a leading axis of ``trip_count`` (unknown when ``None``).
    """
    result: list[onnx.TypeProto | None] = [None] * count
    if op_type == "If" and isinstance(attrs.get("then_branch"), onnx.AttributeProto) \
            and isinstance(attrs.get("else_branch"), onnx.AttributeProto):
        then, other = _declared(attrs["then_branch"].g), _declared(attrs["else_branch"].g)
        for index, (a, b) in enumerate(zip(then[:count], other[:count])):
            result[index] = _merged(a, b) if a is not None and b is not None else None
    elif op_type == "Loop" and isinstance(attrs.get("body"), onnx.AttributeProto):
        body = _declared(attrs["body"].g)[1:]
        carried = list(input_types[2:])
        for index, declared in enumerate(body[:count]):
            if declared is None:
                continue
            if index < len(carried):
                given = carried[index]  # it may change shape across iterations where the body does not say
                result[index] = _merged(given, declared) if given is not None and _compatible(given, declared) \
                    else None
            else:
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                        for d in declared.tensor_type.shape.dim]
                result[index] = onnx.helper.make_tensor_type_proto(declared.tensor_type.elem_type,
                                                                   [trip_count, *dims])
    return result
