"""Calling an existing graph (e.g. an imported ``.onnx`` model) from traced code.

:func:`inline_graph` re-emits a graph's nodes into the trace being recorded,
with the given tensors in place of the graph's inputs, so an imported model
can run inside ``strategy.run`` / ``gd.function`` like any numpy code.
:func:`graph_function` wraps that as a callable; :func:`example_batch` makes
example inputs for it (:mod:`graphdist.compile.inference` builds the
data-parallel inference step of an imported model from both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError, TracingError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.trace.tracer import current_trace

__all__ = ["inline_graph", "graph_function", "example_batch"]


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


def inline_graph(graph: Graph, args: Sequence[Any], *, batch_axis: int | None = None) -> list[Any]:
    """Emits ``graph``'s nodes into the current trace and returns its outputs.

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
    mapping: dict[int, Value] = {}
    for index, (spec, arg) in enumerate(zip(graph.inputs, args)):
        _check_argument(graph, spec, arg, index, batch_axis)
        if isinstance(arg, Tensor):
            ctx.check_owned(arg)
            mapping[id(spec)] = arg.value
        else:
            mapping[id(spec)] = ctx.constant(np.asarray(arg, dtype=spec.dtype), name=spec.name)
    for value in graph.initializers.values():
        mapping[id(value)] = ctx.constant(value.const_value, name=value.name)

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
        outs = ctx.emit(node.op_type, [resolve(v) for v in node.inputs], attrs, domain=node.domain,
                        num_outputs=len(node.outputs), name=node.name)
        for old, new in zip(node.outputs, outs):
            if new.value.dtype != old.dtype:
                raise TracingError(f"graph {graph.name!r}: node {node.name} ({node.op_type}) gives {new.value.dtype} "
                                   f"for %{old.name}, which the graph declares {old.dtype}")
            mapping[id(old)] = new.value
    return [Tensor(resolve(v), ctx) for v in graph.outputs]


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
