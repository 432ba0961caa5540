"""Building a plan from a traced step: the strategy's pipeline, stage by stage, then compilation.

Shared by ``gd.function`` (a step just traced) and re-planning (a stored
traced step, another strategy): both hand :func:`compile_traced` the traced
graph, how the step is called, the pipeline and the variables' placement.
The pipeline (:func:`graphdist.compile.pipeline.build_pipeline`) holds every
pass; this module only runs its stages and keeps the graph each one ends with.
"""

from __future__ import annotations

from typing import Any

from graphdist.compile.interface import Resolved, StepInterface
from graphdist.compile.pipeline import Pipeline, pass_context
from graphdist.compile.plan import Plan
from graphdist.errors import TracingError
from graphdist.ir.graph import Graph
from graphdist.ir.placement import PlacementSpec
from graphdist.passes.base import PassManager

__all__ = ["compile_traced"]


def compile_traced(traced: Graph, interface: StepInterface, pipeline: Pipeline,
                   placement: PlacementSpec, backend: str | None,
                   options: dict[str, Any] | None = None) -> tuple[dict[str, Graph], Any, Resolved]:
    """Rewrites, partitions and compiles a traced step.

    Args:
        traced: The traced step (not modified).
        interface: How the step is called.
        pipeline: Every pass, from :func:`~graphdist.compile.pipeline.build_pipeline`.
        placement: The variables' placement.
        backend: The backend to compile the segments with (``None``: the default).
        options: ``PassContext.options`` for the passes: what the caller supports, e.g.
            ``REPLICA_PARTS_OPTION`` (see :mod:`graphdist.passes.shard_optimizer_state`) from ``gd.function``,
            which stores a ZeRO-1 slot in per-replica parts.

    Returns:
        ``({"traced", "rewritten", "partitioned"} graphs, compiled plan, resolved interface)``; ``traced`` is
        the graph the ``rebatched`` stage ends with (``traced`` itself when the pipeline does not rebatch), and
        the rewritten graph's results are in result order (``resolved.output_order`` is the identity).
    """
    from graphdist.backends import get_backend  # on first use: importing the backends takes ~25 ms

    ctx = pass_context(pipeline.config, options=dict(options or {}))
    rebatch = pipeline.stage("rebatched")
    if rebatch:
        traced = PassManager(rebatch).run(traced.copy(), ctx).graph
    graph = traced.copy()
    graph.meta.placement = placement
    rewritten = PassManager(pipeline.stage("rewritten")).run(graph, ctx).graph
    resolved = _arrange_results(rewritten, interface)
    partitioned = PassManager(pipeline.stage("partitioned")).run(rewritten.copy(), ctx).graph
    plan = Plan.from_graph(partitioned).compile(get_backend(backend))
    return {"traced": traced, "rewritten": rewritten, "partitioned": partitioned}, plan, resolved


def _arrange_results(graph: Graph, interface: StepInterface) -> Resolved:
    """Puts the result outputs in result order, each per-replica leaf's replicas together and in order
    (variable updates stay last, where ``LowerVariableUpdatesPass`` put them).
    """
    resolved = interface.resolve(graph)
    order = resolved.output_order
    updates = len(graph.meta.variable_updates)
    results = graph.outputs[: len(graph.outputs) - updates]
    if sorted(order) != list(range(len(results))):
        raise TracingError(f"graph {graph.name!r}: the step's results do not map one to one onto its outputs")
    if order != list(range(len(order))):
        graph.outputs = [results[p] for p in order] + graph.outputs[len(results):]
    return Resolved(resolved.input_names, list(range(len(order))), resolved.counts)
