"""The data-parallel inference step of an existing graph (e.g. an imported ``.onnx`` model).

:func:`make_inference_step` builds the step that ``graphdist inspect/export
model.onnx`` compile: the global batch is split across the strategy's
replicas, each replica evaluates the model on its share, and the results are
gathered back into the global batch::

    graph = gd.ir.from_onnx("model.onnx")
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    step, example_args = make_inference_step(graph, strategy, batch=16)
    logits = step(*example_args)                    # (16, classes), computed 8 + 8
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphdist.compile.function import function
from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import Graph
from graphdist.trace.inline import example_batch, graph_function
from graphdist.trace.values import PerReplica

__all__ = ["make_inference_step"]


def make_inference_step(graph: Graph, strategy: Any, batch: int | None = None, *, backend: str | None = None,
                        seed: int = 0, model: Callable[..., Any] | None = None) -> tuple[Any, tuple[Any, ...]]:
    """A data-parallel inference step for ``graph`` under ``strategy``, with example arguments.

    The step takes every graph input as a per-replica value (each replica's
    share of the global batch, split along axis 0), evaluates the graph on
    every replica and gathers each output along axis 0, so it returns the
    outputs for the whole global batch. With one replica too the arguments
    are per-replica values (of one component), so that an exported plan
    re-plans to more replicas by splitting its batch.

    Args:
        graph: The model (e.g. ``from_onnx(path)``).
        strategy: A ``gd.Strategy``.
        batch: Global batch size; default: the first input's static first
            dimension when it divides by the replica count, else 8 per replica.
        backend: Backend of the ``gd.function``.
        seed: Seed of the example inputs.
        model: A traceable callable that computes ``graph`` on its inputs
            (default: the graph inlined with its initializers as constants),
            e.g. ``gd.onnx.load(path)`` made in the strategy's scope, whose
            initializers are the strategy's variables (what a
            ``ModelParallelStrategy`` splits by name).

    Returns:
        ``(step, example_args)``: ``step`` is a ``gd.function``; call it (or
        ``step.get_concrete_function(*example_args)``).

    Raises:
        InvalidArgumentError: ``batch`` does not divide by the number of replicas,
            or the graph has no inputs or a scalar input.
    """
    replicas = strategy.num_replicas_in_sync
    if not graph.inputs:
        raise InvalidArgumentError(f"graph {graph.name!r} has no inputs: there is no batch to split across replicas")
    if batch is None:
        first = graph.inputs[0].shape[0] if graph.inputs[0].rank else None
        batch = first if isinstance(first, int) and first % replicas == 0 else 8 * replicas
    if batch <= 0 or batch % replicas:
        raise InvalidArgumentError(f"the global batch ({batch}) must be a positive multiple of the number of "
                                   f"replicas ({replicas}); pick another batch size")
    arrays = example_batch(graph, batch, seed)
    share = batch // replicas
    # Per-replica values even for one replica: the plan then knows its arguments are the batch, and a plan
    # exported for one device re-plans to N replicas of a share each (RebatchPass), not to one device.
    example = tuple(PerReplica([a[r * share:(r + 1) * share] for r in range(replicas)]) for a in arrays)
    model = model if model is not None else graph_function(graph, batch_axis=0)

    def inference_step(*args: Any) -> Any:
        result = strategy.run(model, args=args)
        if isinstance(result, tuple):
            return tuple(strategy.gather(r, axis=0) for r in result)
        return strategy.gather(result, axis=0)

    name = f"{getattr(model, '__name__', None) or _identifier(graph.name)}_inference"
    step = function(inference_step, backend=backend, name=name)
    # The model's own input and output names, kept in an exported plan (graphdist run reads and writes them).
    step.io_names = {"inputs": [v.name for v in graph.inputs], "outputs": [v.name for v in graph.outputs]}
    return step, example


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name) or "graph"
