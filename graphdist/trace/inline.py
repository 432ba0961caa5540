"""Calling an existing graph (e.g. an imported ``.onnx`` model) from traced code.

:func:`inline_graph` re-emits a graph's nodes into the trace being recorded,
with the given tensors in place of the graph's inputs, so an imported model
can run inside ``strategy.run`` / ``gd.function`` like any numpy code.
:func:`graph_function` wraps that as a callable; :func:`example_batch` makes
example inputs for it (:mod:`graphdist.compile.inference` builds the
data-parallel inference step of an imported model from both).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError, TracingError
from graphdist.ir.batch_fold import folded_provenance
from graphdist.ir.fold import fold_node
from graphdist.ir.graph import GRAPHDIST_DOMAIN, ONNX_DOMAIN, Graph, Value
from graphdist.ir.onnx_schema_ops import schema_since
from graphdist.ir.subgraphs import split_captures, subgraph_ops
from graphdist.trace.control_flow import (
    ScanPlan,
    known_condition,
    known_trip_count,
    scan_plan,
    specialised_body,
    specialised_branches,
    taken_branch,
    unrolled_iterations,
)
from graphdist.trace.tracer import current_trace

__all__ = ["inline_graph", "graph_function", "example_batch", "converted_graph"]

logger = logging.getLogger(__name__)


def _check_argument(graph: Graph, spec: Value, arg: Any, index: int, batch_axis: int | None) -> None:
    shape = tuple(arg.shape) if hasattr(arg, "shape") else np.shape(arg)
    dtype = np.dtype(arg.dtype) if hasattr(arg, "dtype") else np.asarray(arg).dtype
    where = f"graph {graph.name!r} input {index} (%{spec.name}: {spec.type_str()})"
    if dtype != spec.dtype:
        raise TracingError(f"{where} got a {dtype.name} value; cast it with .astype(np.{spec.dtype.name})")
    if len(shape) != spec.rank:
        raise TracingError(f"{where} got a value of rank {len(shape)} (shape {list(shape)}); it needs rank {spec.rank}")
    for axis, (want, got) in enumerate(zip(spec.shape, shape)):
        if isinstance(want, int) and isinstance(got, int) and want != got and axis != batch_axis:
            raise TracingError(f"{where} got shape {list(shape)}: dimension {axis} must be {want}")


def inline_graph(graph: Graph, args: Sequence[Any], *, batch_axis: int | None = None,
                 bindings: Mapping[str, Any] | None = None, own_opset: bool = False) -> list[Any]:
    """Emits ``graph``'s nodes into the current trace and returns its outputs.

    The graph keeps its ops' forms: a graph at a newer opset than the trace
    raises the trace's opset (graphdist's own ops keep their meaning in newer
    opsets); one at an older opset whose ops changed form since is converted
    up with ONNX's version converter first (with the ops of its ``If``/``Loop``/``Scan``
    bodies). Nodes whose values are known now (``Shape`` of a static shape,
    small arithmetic on constants) become constants
    (:func:`graphdist.ir.fold.fold_node`); an ``If`` on a known condition is
    replaced by its taken branch and a ``Loop`` of a known trip count is
    unrolled (:mod:`graphdist.trace.control_flow`).

    Args:
        graph: A graph of ONNX ops (typically from :func:`graphdist.ir.from_onnx`
            or ``gd.trace``); ``graphdist``-domain nodes (collectives, gradients,
            variable updates) are refused.
        args: One value per graph input: traced tensors of the current trace,
            or numpy values (which become constants).
        batch_axis: An axis along which the arguments may have another size
            than the graph's inputs declare (the batch, when a model exported
            for batch 8 runs on a replica's share of 4). Output types are
            always re-inferred from the arguments.
        bindings: Values for some of the graph's initializers, by name (a
            model's variables, read in the trace); the others become constants.
        own_opset: Trace the graph at its own opset (the trace must be empty:
            nothing else will be emitted at that opset); for running an
            imported model by itself.

    Returns:
        Traced tensors, one per graph output.

    Raises:
        TracingError: Not tracing, wrong number of arguments, a dtype, rank or
            static dimension mismatch, or an op that cannot be inlined.
    """
    from graphdist.trace.tensor import Tensor

    ctx = current_trace()
    if ctx is None:
        raise TracingError(f"inline_graph({graph.name!r}) must be called while tracing: inside a function run by "
                           "strategy.run, gd.function or gd.trace")
    if len(args) != len(graph.inputs):
        names = ", ".join(f"%{v.name}: {v.type_str()}" for v in graph.inputs)
        raise TracingError(f"graph {graph.name!r} takes {len(graph.inputs)} input(s) ({names}), got {len(args)}")
    special = sorted({n.qualified_op for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN})
    if special:
        raise TracingError(f"graph {graph.name!r} holds {', '.join(special)} nodes, which belong to one compiled "
                           "step and cannot be inlined into another; inline a graph of ONNX ops (a traced "
                           "forward pass or an imported model)")
    model_opset = graph.opset
    graph = _at_trace_opset(graph, ctx, own_opset)
    mapping: dict[int, Value] = {}
    for index, (spec, arg) in enumerate(zip(graph.inputs, args)):
        _check_argument(graph, spec, arg, index, batch_axis)
        if isinstance(arg, Tensor):
            ctx.check_owned(arg)
            mapping[id(spec)] = arg.value
        else:
            mapping[id(spec)] = ctx.constant(np.asarray(arg, dtype=spec.dtype), name=spec.name)
    bound = dict(bindings or {})
    for value in graph.initializers.values():
        if value.name in bound:
            mapping[id(value)] = _bound_value(graph, value, bound.pop(value.name), ctx)
        else:
            mapping[id(value)] = ctx.constant(value.const_value, name=value.name)
    if bound:
        raise TracingError(f"graph {graph.name!r} has no initializer(s) {sorted(bound)} to bind")

    def resolve(value: Value | None) -> Value | None:
        if value is None:
            return None
        try:
            return mapping[id(value)]
        except KeyError:
            raise TracingError(f"graph {graph.name!r}: value %{value.name} is read before it is defined; the graph "
                               "is not in topological order (call graph.topological_sort())") from None

    for node in graph.nodes:
        attrs = {k: list(v) if isinstance(v, list) else v for k, v in node.attrs.items()}
        inputs = [resolve(v) for v in node.inputs]
        condition = known_condition(node.op_type, node.domain, inputs)
        if condition is not None:  # the taken branch's ops in the node's place, folded in turn
            branch, arguments = taken_branch(graph, node.name, attrs, inputs, condition)
            results = inline_graph(branch, [Tensor(v, ctx) for v in arguments])
            _map_results(graph, node, [r.value for r in results], mapping)
            continue
        trips = known_trip_count(node.op_type, node.domain, inputs)
        iterations = None if trips is None else unrolled_iterations(graph, node.name, attrs, inputs, trips)
        if iterations is not None:  # each iteration's body in turn, its scan outputs stacked
            _map_results(graph, node, _unrolled(node, attrs, inputs, iterations, ctx), mapping)
            continue
        plan = scan_plan(graph, node.name, node.op_type, node.domain, attrs, inputs)
        if plan is not None:  # the body once per element of the scanned axis, its scan outputs stacked
            _map_results(graph, node, _unrolled_scan(plan, inputs, ctx), mapping)
            continue
        if node.op_type == "If" and node.domain == ONNX_DOMAIN:
            attrs = specialised_branches(graph, node.name, attrs, inputs)
        elif node.op_type == "Loop" and node.domain == ONNX_DOMAIN:
            attrs = specialised_body(graph, node.name, attrs, inputs)
        folded = fold_node(node.op_type, node.domain, attrs, inputs, len(node.outputs), ctx.graph.opset_imports)
        if folded is not None and all(a.dtype == old.dtype for a, old in zip(folded, node.outputs)):
            # Elements computed from the per-replica batch size stay recorded, so the step re-plans.
            records = folded_provenance(node.op_type, node.domain, attrs, inputs, folded, ctx.graph.opset_imports)
            for old, array, record in zip(node.outputs, folded, records):
                mapping[id(old)] = ctx.constant(array, name=old.name, provenance=record)
            continue
        outs = ctx.emit(node.op_type, inputs, attrs, domain=node.domain, num_outputs=len(node.outputs),
                        name=node.name)
        if outs and outs[0].value.producer is not None:  # errors about the node name the model and its opset
            outs[0].value.producer.meta.update(model=graph.name, model_opset=model_opset)
        for old, new in zip(node.outputs, outs):
            if new.value.dtype != old.dtype:
                raise TracingError(f"graph {graph.name!r}: node {node.name} ({node.op_type}) gives {new.value.dtype} "
                                   f"for %{old.name}, which the graph declares {old.dtype}")
            mapping[id(old)] = new.value
    return [Tensor(resolve(v), ctx) for v in graph.outputs]


def _unrolled(node: Any, attrs: dict[str, Any], inputs: list[Value], iterations: list[Graph], ctx: Any) -> list[Value]:
    """A Loop's outputs from its iterations' bodies: the last loop-carried values, the scan outputs stacked."""
    from graphdist.trace.tensor import Tensor

    onnx_inputs, captured, names = split_captures(inputs, attrs)
    carried = list(onnx_inputs[2:])
    scans: list[list[Value]] = []
    for body in iterations:
        reads = {v.name for v in body.inputs[len(carried):]}
        outer = [v for name, v in zip(names, captured) if name in reads]
        outs = [t.value for t in inline_graph(body, [Tensor(v, ctx) for v in (*carried, *outer)])]
        carried, step_scans = outs[1:1 + len(carried)], outs[1 + len(carried):]
        scans = [[] for _ in step_scans] if not scans else scans
        for collected, value in zip(scans, step_scans):
            collected.append(_unsqueezed(value, 0, ctx))
    stacked = [values[0] if len(values) == 1 else ctx.emit1("Concat", values, {"axis": 0}).value
               for values in scans]
    return [*carried, *stacked]


def _unrolled_scan(plan: ScanPlan, inputs: list[Value], ctx: Any) -> list[Value]:
    """A Scan's outputs from its body run once per element: the last states, the scan outputs stacked."""
    from graphdist.trace.tensor import Tensor

    count = len(plan.input_axes)
    states = list(inputs[:plan.states])
    scanned = list(inputs[plan.states:plan.states + count])
    collected: list[list[Value]] = [[] for _ in plan.output_axes]
    for step in range(plan.length):
        slices = [ctx.emit1("Gather", [value, ctx.constant(np.int64(plan.length - 1 - step if back else step))],
                            {"axis": axis}).value
                  for value, axis, back in zip(scanned, plan.input_axes, plan.input_reversed)]
        outs = [t.value for t in inline_graph(plan.body, [Tensor(v, ctx) for v in (*states, *slices,
                                                                                 *plan.captured)])]
        states = outs[:plan.states]
        for values, value, axis in zip(collected, outs[plan.states:], plan.output_axes):
            values.append(_unsqueezed(value, axis, ctx))
    stacked = []
    for values, axis, back in zip(collected, plan.output_axes, plan.output_reversed):
        values = values[::-1] if back else values
        stacked.append(values[0] if len(values) == 1 else ctx.emit1("Concat", values, {"axis": axis}).value)
    return [*states, *stacked]


def _unsqueezed(value: Value, axis: int, ctx: Any) -> Value:
    if ctx.graph.opset < 13:  # a trace at an old model's own opset (an eager call): axes an attribute
        return ctx.emit1("Unsqueeze", [value], {"axes": [axis]}).value
    return ctx.emit1("Unsqueeze", [value, ctx.int64s([axis])]).value


def _map_results(graph: Graph, node: Any, results: list[Value], mapping: dict[int, Value]) -> None:
    for old, new in zip(node.outputs, results):
        if new.dtype != old.dtype:
            raise TracingError(f"graph {graph.name!r}: node {node.name} ({node.op_type}) gives {new.dtype} "
                               f"for %{old.name}, which the graph declares {old.dtype}")
        mapping[id(old)] = new


def _bound_value(graph: Graph, spec: Value, bound: Any, ctx: Any) -> Value:
    from graphdist.trace.tensor import Tensor

    if not isinstance(bound, Tensor):
        return ctx.constant(np.asarray(bound, dtype=spec.dtype), name=spec.name)
    ctx.check_owned(bound)
    if bound.value.dtype != spec.dtype or tuple(bound.value.shape) != tuple(spec.shape):
        raise TracingError(f"graph {graph.name!r}: initializer %{spec.name} is {spec.type_str()}, but the value "
                           f"bound to it is {bound.value.type_str()}")
    return bound.value


def _at_trace_opset(graph: Graph, ctx: Any, own_opset: bool) -> Graph:
    """``graph`` with ops in forms valid in the trace; raises the trace's opset where needed."""
    trace = ctx.graph
    if own_opset:
        if trace.nodes:
            raise TracingError(f"inline_graph({graph.name!r}, own_opset=True) needs an empty trace: ops already "
                               f"traced are at opset {trace.opset}")
        trace.opset_imports.update(graph.opset_imports)
        return graph
    for domain, version in graph.opset_imports.items():
        if domain and trace.opset_imports.setdefault(domain, version) != version:
            raise TracingError(f"graph {graph.name!r} uses opset {version} of domain {domain!r}, but the trace "
                               f"already uses opset {trace.opset_imports[domain]} of it; convert one of the models")
    if graph.opset >= trace.opset:
        trace.opset_imports[ONNX_DOMAIN] = graph.opset  # the trace's own ops keep their meaning in newer opsets
        return graph
    # An If/Loop/Scan body runs at the graph's opset too: its ops count (a ReduceMean in a branch).
    ops = {(n.op_type, n.domain) for n in graph.nodes} | subgraph_ops(n.attrs for n in graph.nodes)
    changed = sorted({op for op, domain in ops if domain == ONNX_DOMAIN
                      and schema_since(op, ONNX_DOMAIN, graph.opset) != schema_since(op, ONNX_DOMAIN, trace.opset)})
    return graph if not changed else converted_graph(graph, trace.opset, changed)


def converted_graph(graph: Graph, opset: int, changed: Sequence[str] = ()) -> Graph:
    """``graph`` converted to default-domain ``opset`` by ONNX's version converter (cached on the graph).

    Raises:
        TracingError: The converter fails (its message, and the ops whose form changed).
    """
    cache = graph.meta.converted
    if opset not in cache:
        from onnx import version_converter

        from graphdist.ir.onnx_io import from_onnx, to_onnx

        try:
            model = version_converter.convert_version(to_onnx(graph), opset)
        except Exception as err:  # noqa: BLE001 - the converter raises assorted errors
            raise TracingError(
                f"graph {graph.name!r} is at opset {graph.opset} and the trace at {opset}; its op(s) "
                f"{', '.join(changed) or '?'} changed form since, and ONNX's version converter failed "
                f"({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}); "
                f"export the model at opset {opset} or newer") from None
        result = from_onnx(model)
        result.name = graph.name
        _check_same_signature(graph, result, opset, changed)
        cache[opset] = result
        logger.info("converted %s from opset %d to %d (%s changed form)", graph.name, graph.opset, opset,
                    ", ".join(changed))
    return cache[opset]


def _check_same_signature(graph: Graph, converted: Graph, opset: int, changed: Sequence[str]) -> None:
    """The converter keeps the graph's inputs and outputs (for Scan-8 it drops their batch axis instead)."""
    def signature(g: Graph) -> list[tuple[Any, int]]:
        return [(v.dtype, v.rank) for v in (*g.inputs, *g.outputs)]

    if signature(converted) != signature(graph):
        raise TracingError(
            f"graph {graph.name!r} is at opset {graph.opset} and the trace at {opset}; ONNX's version converter "
            f"changes its inputs or outputs converting {', '.join(changed) or 'its ops'} (from "
            f"{[v.type_str() for v in graph.inputs]} to {[v.type_str() for v in converted.inputs]}); export "
            f"the model at a newer opset")


def graph_function(graph: Graph, *, batch_axis: int | None = None) -> Callable[..., Any]:
    """A traceable function computing ``graph``: ``fn(*inputs)`` returns its
    output (a tuple when it has several). Use it in ``strategy.run`` or a
    ``gd.function`` step.
    """

    def fn(*args: Any) -> Any:
        outs = inline_graph(graph, args, batch_axis=batch_axis)
        return outs[0] if len(outs) == 1 else tuple(outs)

    fn.__name__ = fn.__qualname__ = "".join(c if c.isalnum() else "_" for c in graph.name) or "graph"
    return fn


def example_batch(graph: Graph, batch: int, seed: int = 0) -> list[np.ndarray]:
    """Example inputs for ``graph`` with ``batch`` rows: standard-normal floats,
    zeros for integers and booleans (valid indices for embeddings); symbolic
    dimensions other than the first become 1.

    Raises:
        InvalidArgumentError: An input is a scalar (no batch dimension).
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for value in graph.inputs:
        if value.rank == 0:
            raise InvalidArgumentError(f"input %{value.name} of {graph.name!r} is a scalar; a data-parallel step "
                                       "splits every input along its first (batch) dimension")
        shape = (batch, *[d if isinstance(d, int) else 1 for d in value.shape[1:]])
        if value.dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(value.dtype))
        else:
            arrays.append(np.zeros(shape, value.dtype))
    return arrays
