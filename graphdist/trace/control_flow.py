"""Control flow of an inlined graph: ``If`` and ``Loop`` nodes whose deciding values the trace knows.

An imported model's ``If`` often decides on something the trace knows: a
sample rate given as a numpy value, a batch size (``Shape -> Gather ->
Equal``), a constant. When the condition is a constant of the trace, the
taken branch is imported with the types its outer values have in the trace
(so its own shape computations and nested ``If`` s fold in turn) and inlined
in the node's place, as ONNX Runtime's constant folding does: the replica's
graph then holds ordinary ops that every pass and backend handles.

A ``Loop`` whose trip count and condition are constants of the trace runs
unrolled (at most :data:`MAX_UNROLLED_ITERATIONS` iterations): one copy of
its body per iteration, imported with the iteration number and incoming
condition as constants, so a condition computed from them folds; a condition
computed from data keeps the node.

Otherwise the node stays, and its subgraphs are imported the same way and
written back: nested ``If`` s on static shapes are gone from them, and their
types are the trace's, so ONNX's inference types the node and ONNX Runtime,
which types subgraphs against the static shapes of a replica's segment,
accepts it.

A ``Scan`` (opset 9 and later) always has a static length in a trace: up to
:data:`MAX_UNROLLED_ITERATIONS` steps it runs unrolled (:func:`scan_plan`),
longer ones stay nodes with their body as written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphdist.errors import GraphError, TracingError
from graphdist.ir.graph import ONNX_DOMAIN, Graph, Value
from graphdist.ir.onnx_io import ORT_IR_VERSION, from_onnx, to_onnx
from graphdist.ir.ops import onnx_dtype
from graphdist.ir.subgraphs import CAPTURES_ATTR, free_names, split_captures

__all__ = ["BRANCHES", "MAX_UNROLLED_ITERATIONS", "known_condition", "taken_branch", "specialised_branches",
           "known_trip_count", "unrolled_iterations", "specialised_body", "ScanPlan", "scan_plan"]

logger = logging.getLogger(__name__)

#: A ``Loop`` with more iterations than this stays a node (an unrolled body per iteration would make the
#: graph, and its compile time, grow with the trip count).
MAX_UNROLLED_ITERATIONS = 64

#: The ``If`` attributes holding its branches, by the condition's value.
BRANCHES = {True: "then_branch", False: "else_branch"}


def known_condition(op_type: str, domain: str, inputs: Sequence[Value | None]) -> bool | None:
    """The value of an ``If`` node's condition when it is a constant of the trace, else ``None``."""
    if op_type != "If" or domain != ONNX_DOMAIN or not inputs or inputs[0] is None:
        return None
    value = inputs[0].const_value
    if value is None or np.size(value) != 1:
        return None
    return bool(np.asarray(value).reshape(-1)[0])


def taken_branch(graph: Graph, node_name: str, attrs: Mapping[str, Any], inputs: Sequence[Value],
                 condition: bool) -> tuple[Graph, list[Value]]:
    """The branch an ``If`` on a known condition takes, as a graph, and the trace values it reads.

    Returns:
        ``(branch, arguments)``: a graph whose inputs are the outer values the
        branch reads (typed as ``arguments``, the trace values in their place),
        ready for :func:`graphdist.trace.inline.inline_graph`.
    """
    _, captured, names = split_captures(inputs, attrs)
    branch = _branch_graph(graph, node_name, BRANCHES[condition], attrs, names, captured)
    used = {value.name for value in branch.inputs}
    arguments = [value for name, value in zip(names, captured) if name in used]
    return branch, arguments


def specialised_branches(graph: Graph, node_name: str, attrs: dict[str, Any],
                         inputs: Sequence[Value]) -> dict[str, Any]:
    """``attrs`` of an ``If`` kept for run time, each branch imported with the trace's types of the values
    it reads and written back: what folds on static shapes (nested ``If`` s on a batch size) is folded.

    A branch that cannot be imported (an op graphdist cannot type) is kept as written.
    """
    _, captured, names = split_captures(inputs, attrs)
    result = dict(attrs)
    for name in BRANCHES.values():
        try:
            branch = _branch_graph(graph, node_name, name, attrs, names, captured)
        except GraphError as err:
            # ONNX Runtime types a subgraph against the segment's static shapes too: it may refuse this one.
            logger.warning("If %s: its %s cannot be typed with the shapes of this trace (%s); it is kept as "
                           "written, and ONNX Runtime may refuse it. Give the inputs deciding the condition as "
                           "numpy values so that graphdist inlines the branch taken", node_name, name, err)
            continue
        proto = to_onnx(branch).graph
        outer = {value.name for value in proto.input}
        del proto.input[:]  # a branch takes no inputs: it reads the captured values by name
        result[name] = helper.make_attribute(name, proto)
        stray = set(free_names([proto])) - outer - set(names)
        if stray:
            raise TracingError(f"If {node_name}: its specialised {name} reads {sorted(stray)}, which it does not "
                               "capture")
    result[CAPTURES_ATTR] = list(names)
    return result


def known_trip_count(op_type: str, domain: str, inputs: Sequence[Value | None]) -> int | None:
    """The iterations a ``Loop`` node may run when its trip count and condition are constants of the trace
    (a missing condition counts as true; a false one as no iteration), else ``None``.
    """
    if op_type != "Loop" or domain != ONNX_DOMAIN or len(inputs) < 2 or inputs[0] is None:
        return None
    trips, condition = inputs[0].const_value, (None if inputs[1] is None else inputs[1].const_value)
    if trips is None or (inputs[1] is not None and condition is None):
        return None
    if condition is not None and not bool(np.asarray(condition).reshape(-1)[0]):
        return 0
    return max(0, int(np.asarray(trips).reshape(-1)[0]))


def unrolled_iterations(graph: Graph, node_name: str, attrs: Mapping[str, Any], inputs: Sequence[Value],
                        trips: int) -> list[Graph] | None:
    """The body of a ``Loop`` with ``trips`` known iterations, one graph per iteration that runs, or
    ``None`` when it cannot be unrolled (too many iterations, a condition computed from data, a loop
    that runs no iteration but has scan outputs, a body graphdist cannot import).

    Each graph is the body imported with its iteration number and incoming condition as constants (so a
    condition computed from them folds) and the trace's types of the loop-carried and captured values:
    its inputs are the loop-carried values then the captured ones; its outputs the body's, less the
    condition (the loop-carried values, then the scan outputs of that iteration).
    """
    onnx_inputs, captured, names = split_captures(inputs, attrs)
    carried = list(onnx_inputs[2:])
    body = attrs["body"].g
    if trips > MAX_UNROLLED_ITERATIONS or (trips == 0 and len(body.output) > 1 + len(carried)):
        return None
    iterations = []
    for index in range(trips):
        try:
            graph_i = _body_graph(graph, node_name, body, index, carried, names, captured)
        except GraphError as err:
            logger.debug("Loop %s kept: its body cannot be imported (%s)", node_name, err)
            return None
        condition = _constant_output(graph_i, 0)
        if condition is None:
            logger.debug("Loop %s kept: its condition is computed from data", node_name)
            return None
        iterations.append(graph_i)
        if not bool(np.asarray(condition).reshape(-1)[0]):
            break
    return iterations


@dataclass(frozen=True)
class ScanPlan:
    """How a ``Scan`` of static length runs unrolled.

    Attributes:
        body: The body imported with the trace's types (states, then one slice of each scan input, then
            the captured values it reads); the same graph for every iteration.
        length: The number of iterations (the scan inputs' length along their axes).
        states: How many loop-carried states the node has.
        input_axes: Per scan input, the axis it is sliced along (non-negative).
        input_reversed: Per scan input, whether it is read from the end.
        output_axes: Per scan output, the axis the iterations' slices are stacked along (non-negative).
        output_reversed: Per scan output, whether the slices are stacked from the last iteration.
        captured: The trace values the body reads from outside, in its input order.
    """

    body: Graph
    length: int
    states: int
    input_axes: tuple[int, ...]
    input_reversed: tuple[bool, ...]
    output_axes: tuple[int, ...]
    output_reversed: tuple[bool, ...]
    captured: tuple[Value, ...]


def scan_plan(graph: Graph, node_name: str, op_type: str, domain: str, attrs: Mapping[str, Any],
              inputs: Sequence[Value | None]) -> ScanPlan | None:
    """The unrolled form of a ``Scan`` node (opset 9 and later) whose length is static and at most
    :data:`MAX_UNROLLED_ITERATIONS`, else ``None`` (the node stays): its body is imported once with the
    trace's types, and kept as a node when a state changes type from one iteration to the next.
    """
    if op_type != "Scan" or domain != ONNX_DOMAIN or graph.opset_imports.get(ONNX_DOMAIN, 0) < 9:
        return None
    onnx_inputs, captured, names = split_captures(inputs, attrs)
    count = int(attrs.get("num_scan_inputs", 0))
    states, scanned = list(onnx_inputs[:len(onnx_inputs) - count]), list(onnx_inputs[len(onnx_inputs) - count:])
    if not scanned or any(v is None for v in (*states, *scanned)):
        return None
    body = attrs["body"].g
    input_axes = tuple(_axis(a, v.rank) for a, v in zip(_ints(attrs, "scan_input_axes", count), scanned))
    lengths = {v.shape[a] for v, a in zip(scanned, input_axes)}
    length = next(iter(lengths)) if len(lengths) == 1 else None
    if not isinstance(length, int) or not 0 < length <= MAX_UNROLLED_ITERATIONS:
        return None
    slices = [(v.dtype, tuple(d for i, d in enumerate(v.shape) if i != a)) for v, a in zip(scanned, input_axes)]
    own = [helper.make_tensor_value_info(vi.name, onnx_dtype(dtype), list(shape)) for vi, (dtype, shape)
           in zip(body.input, [*((v.dtype, v.shape) for v in states), *slices])]
    reads = set(free_names([body]))
    outer = [(name, value) for name, value in zip(names, captured) if name in reads]
    inner = onnx.GraphProto()
    inner.CopyFrom(body)
    del inner.input[:]
    types = tuple((v.dtype.str, tuple(v.shape)) for v in (*states, *scanned, *captured))
    cache = graph.meta.scan_bodies
    if (node_name, types) not in cache:
        try:
            imported = _imported(graph, node_name, inner, [*own, *(helper.make_tensor_value_info(
                name, onnx_dtype(v.dtype), list(v.shape)) for name, v in outer)], "body")
        except GraphError as err:
            logger.debug("Scan %s kept: its body cannot be imported (%s)", node_name, err)
            imported = None
        cache[(node_name, types)] = imported
    imported = cache[(node_name, types)]
    if imported is None or any(out.dtype != v.dtype or tuple(out.shape) != tuple(v.shape)
                               for out, v in zip(imported.outputs, states)):
        return None
    scan_outputs = imported.outputs[len(states):]
    return ScanPlan(
        body=imported, length=length, states=len(states), input_axes=input_axes,
        input_reversed=tuple(bool(d) for d in _ints(attrs, "scan_input_directions", count)),
        output_axes=tuple(_axis(a, v.rank + 1) for a, v in
                          zip(_ints(attrs, "scan_output_axes", len(scan_outputs)), scan_outputs)),
        output_reversed=tuple(bool(d) for d in _ints(attrs, "scan_output_directions", len(scan_outputs))),
        captured=tuple(v for _, v in outer))


def _ints(attrs: Mapping[str, Any], name: str, count: int) -> list[int]:
    value = attrs.get(name)
    return [0] * count if value is None or isinstance(value, onnx.AttributeProto) else [int(v) for v in value]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def specialised_body(graph: Graph, node_name: str, attrs: dict[str, Any], inputs: Sequence[Value]) -> dict[str, Any]:
    """``attrs`` of a ``Loop`` kept for run time, its body imported with the trace's types of the values it
    reads and written back, so that ONNX's inference types the node with the trace's shapes (a body written
    for ``float[N,3]`` run on ``float[2,3]`` gives no types otherwise).

    The body is kept as written when it cannot be imported, or when its loop-carried values change type
    from one iteration to the next (a value that grows).
    """
    onnx_inputs, captured, names = split_captures(inputs, attrs)
    carried = list(onnx_inputs[2:])
    body = attrs["body"].g
    own = list(body.input)
    counter, condition = (helper.make_tensor_value_info(vi.name, onnx_dtype(dtype), [])
                          for vi, dtype in zip(own[:2], (np.dtype(np.int64), np.dtype(np.bool_))))
    loop_inputs = [counter, condition, *(helper.make_tensor_value_info(vi.name, onnx_dtype(v.dtype), list(v.shape))
                                         for vi, v in zip(own[2:], carried))]
    reads = set(free_names([body]))
    outer = [helper.make_tensor_value_info(name, onnx_dtype(v.dtype), list(v.shape))
             for name, v in zip(names, captured) if name in reads]
    inner = onnx.GraphProto()
    inner.CopyFrom(body)
    del inner.input[:]
    try:
        imported = _imported(graph, node_name, inner, [*loop_inputs, *outer], "body")
    except GraphError as err:
        logger.debug("Loop %s: body kept as written (%s)", node_name, err)
        return attrs
    steady = all(out.dtype == value.dtype and tuple(out.shape) == tuple(value.shape)
                 for out, value in zip(imported.outputs[1:1 + len(carried)], carried))
    if not steady:
        return attrs
    proto = to_onnx(imported).graph
    del proto.input[len(loop_inputs):]  # the outer values: read by name, not body inputs
    return {**attrs, "body": helper.make_attribute("body", proto), CAPTURES_ATTR: list(names)}


def _constant_output(graph: Graph, index: int) -> np.ndarray | None:
    value = graph.outputs[index]
    while value.const_value is None and value.producer is not None and value.producer.op_type == "Identity":
        value = value.producer.inputs[0]
    return value.const_value


def _body_graph(graph: Graph, node_name: str, body: onnx.GraphProto, index: int, carried: Sequence[Value],
                names: Sequence[str], captured: Sequence[Value]) -> Graph:
    carried_names = [vi.name for vi in body.input[2:]]
    types = tuple((value.dtype.str, tuple(value.shape)) for value in (*carried, *captured))
    cache = graph.meta.loop_bodies
    key = (node_name, index, types)
    if key not in cache:
        counter, condition = (vi.name for vi in body.input[:2])
        constants = [onnx.numpy_helper.from_array(np.asarray(index, np.int64), counter),
                     onnx.numpy_helper.from_array(np.asarray(True), condition)]
        reads = set(free_names([body])) | set(carried_names)
        outer = [(name, value) for name, value in zip(names, captured) if name in reads]
        inputs = [helper.make_tensor_value_info(name, onnx_dtype(value.dtype), list(value.shape))
                  for name, value in [*zip(carried_names, carried), *outer]]
        renamed = onnx.GraphProto()
        renamed.CopyFrom(body)
        del renamed.input[:]
        renamed.initializer.extend(constants)
        imported = _imported(graph, node_name, renamed, inputs, f"iteration{index}")
        if [v.name for v in imported.inputs] != [vi.name for vi in inputs]:
            raise GraphError(f"the body of Loop {node_name} does not take its inputs as declared")
        cache[key] = imported
    return cache[key]


def _branch_graph(graph: Graph, node_name: str, which: str, attrs: Mapping[str, Any], names: Sequence[str],
                  captured: Sequence[Value]) -> Graph:
    """Branch ``which`` of the ``If`` node ``node_name`` of ``graph`` imported with ``captured``'s types
    (cached on ``graph`` per types: a graph is inlined once per trace, and traced again per input shape).
    """
    types = tuple((name, value.dtype.str, tuple(value.shape)) for name, value in zip(names, captured))
    cache = graph.meta.branches
    key = (node_name, which, types)
    if key not in cache:
        cache[key] = _import_branch(graph, node_name, attrs[which].g, names, captured)
    return cache[key]


def _import_branch(graph: Graph, node_name: str, branch: onnx.GraphProto, names: Sequence[str],
                   captured: Sequence[Value]) -> Graph:
    reads = set(free_names([branch]))
    inputs = [helper.make_tensor_value_info(name, onnx_dtype(value.dtype), list(value.shape))
              for name, value in zip(names, captured) if name in reads]
    return _imported(graph, node_name, branch, inputs, branch.name)


def _imported(graph: Graph, node_name: str, subgraph: onnx.GraphProto, inputs: list[onnx.ValueInfoProto],
              label: str) -> Graph:
    """``subgraph`` as a graph of its own taking ``inputs`` (the outer values it reads), imported at
    ``graph``'s opsets.
    """
    body = helper.make_graph(list(subgraph.node), f"{graph.name}/{node_name}/{label}", inputs,
                             list(subgraph.output), initializer=list(subgraph.initializer),
                             value_info=list(subgraph.value_info))
    opsets = [helper.make_opsetid(domain, version) for domain, version in sorted(graph.opset_imports.items())]
    model = helper.make_model(body, opset_imports=opsets, producer_name="graphdist.control_flow")
    model.ir_version = max(ORT_IR_VERSION, helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    try:
        imported = from_onnx(model)
    except GraphError as err:
        raise GraphError(f"{label} of {node_name}: {err}") from None
    imported.name = body.name
    return imported
