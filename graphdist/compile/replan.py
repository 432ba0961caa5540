"""Re-planning: a compiled step for another strategy or device count, made by passes, without its code.

A step is traced once, as one replica, so its traced graph holds nothing of
the strategy it was compiled for. :func:`replan` takes the
:class:`~graphdist.compile.step.StepRecord` of a plan (a concrete function's,
or a plan directory's) and a strategy, and builds the new plan the way
``gd.function`` does: the strategy's placement for each variable, its pass
pipeline, partitioning, compilation. The variables keep their values.

The global batch stays the same: a step traced for ``N`` replicas of ``B``
rows is re-planned for ``N'`` replicas of ``N * B / N'`` rows
(``RebatchPass``), which must divide evenly; the exporter has checked that
the step's constants follow the batch size (``StepRecord.rebatch``).
Called on the same global batch, the re-planned step trains exactly like
the original (to float tolerance: the sums over replicas group differently).

Refused, each with a :class:`~graphdist.errors.PlanError` that says why and
what to do: a replica count that does not divide the global batch; a step
traced with uneven per-replica shapes; a step whose constants do not follow
the batch size, re-planned to another batch size; a step that read
``num_replicas_in_sync`` into its graph, re-planned to another replica
count; a plan exported before plans recorded their traced step. A
``MultiWorkerMirroredStrategy`` or ``ParameterServerStrategy`` target must
run inside ``graphdist launch`` (its constructor says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from graphdist.compile.build import compile_traced
from graphdist.compile.export import step_files
from graphdist.compile.load import load_files
from graphdist.compile.loaded import LoadedPlan
from graphdist.compile.pipeline import Pipeline, build_pipeline, deterministic_config
from graphdist.compile.step import StepRecord
from graphdist.compile.target import CompileTarget
from graphdist.errors import GraphError, PlanError
from graphdist.ir.graph import Graph
from graphdist.ir.placement import PlacementSpec
from graphdist.passes.base import PassManager

__all__ = ["replan"]

logger = logging.getLogger(__name__)


def replan(record: StepRecord, strategy: CompileTarget, *, backend: str | None = None, plan_backend: str | None = None,
           checker: Callable[[], dict[str, Any]] | None = None,
           io_names: dict[str, list[str]] | None = None) -> LoadedPlan:
    """A plan of ``record``'s step for ``strategy`` (see the module docstring).

    Args:
        record: The step (``record_of_concrete(concrete)`` or a plan directory's).
        strategy: The target strategy.
        backend: Backend to compile with (default: the strategy's, e.g. ``tvm`` for TPU, else
            ``plan_backend``, else ``ort``).
        plan_backend: The backend the step was compiled with before.
        checker: Computes ``record.rebatch`` when the per-replica batch changes and the record has
            not been checked (a concrete function checks by tracing again).
        io_names: An ONNX model's input and output names (``make_inference_step``), kept in the new plan.

    Returns:
        A :class:`LoadedPlan` (``directory`` ``None`` until saved), called like the original step.

    Raises:
        PlanError: The step cannot be re-planned for ``strategy`` (see the module docstring).
    """
    if not isinstance(strategy, CompileTarget):
        raise PlanError(f"replan: strategy must be a gd.Strategy (e.g. gd.MirroredStrategy(['cpu:0', 'cpu:1'])), "
                        f"got {type(strategy).__name__}")
    config = strategy.pipeline_config().replace(accumulate_steps=record.accumulate_steps)
    stored_step_config = getattr(strategy, "stored_step_config", None)
    if stored_step_config is not None:  # a strategy choosing by variable (ModelParallelStrategy's FSDP weights)
        config = stored_step_config(config, record.traced)
    if record.deterministic_chunks:  # the micro-batches are the chunks per replica of the new replica count
        try:
            config = deterministic_config(config, record.deterministic_chunks)
        except GraphError as err:
            raise PlanError(f"plan {record.name!r} was compiled with op determinism: {err}") from None
    config = config.replace(rebatch=_rebatch_options(record, config.total_replicas, checker))
    pipeline = build_pipeline(config)
    graph = _rebatched(record, pipeline)
    _check_replica_count(record, config.total_replicas)
    _check_accumulation(record, graph, config.replicas, config.accumulate_steps)
    interface = record.interface.for_replicas(config.replicas)
    placement = PlacementSpec({spec.uid: strategy.value_placement(spec, record.values[name])
                               for name, spec in record.variables})
    graphs, plan, resolved = compile_traced(graph, interface, pipeline, placement,
                                            backend or config.backend or plan_backend)
    replanned = StepRecord(record.name, graphs["traced"], interface, record.argument_structure,
                           record.argument_details, record.output_structure, record.variables, record.values,
                           config.total_replicas, record.rebatch, config.accumulate_steps,
                           record.deterministic_chunks)
    files = step_files(plan, graphs, replanned, resolved, config, io_names)
    loaded = load_files(files, plan.backend_name, label=f"plan {record.name!r} re-planned for {config.strategy}")
    logger.info("re-planned %s for %s on %s: %d segment(s)", record.name, config.strategy,
                ", ".join(config.devices), len(loaded.plan.segments))
    return loaded


def _rebatch_options(record: StepRecord, replicas: int,
                     checker: Callable[[], dict[str, Any]] | None) -> dict[str, Any] | None:
    """``PipelineConfig.rebatch``: the per-replica batch the new replica count gives the same global batch
    (``None``: the traced graph is kept as it is).
    """
    graph = record.traced
    batch = graph.meta.batch
    if graph.meta.replica_variants:
        if replicas != record.replicas_in_sync:
            raise PlanError(f"plan {record.name!r} was traced with per-replica arguments of different shapes (an "
                            f"uneven batch over {record.replicas_in_sync} replicas); it can only be re-planned for "
                            f"{record.replicas_in_sync} replicas. Export it from a step whose global batch divides "
                            "among the replicas")
        return None
    if batch is None:  # no per-replica inputs: every replica computes on the same shapes
        if replicas > 1:
            logger.warning("plan %s takes no per-replica arguments, so each of the %d replicas computes on the "
                           "whole arguments (nothing is split; the outputs are one replica's). To split a batch, "
                           "export a step whose arguments are per-replica values (a distributed dataset's "
                           "elements, or gd.PerReplica; `graphdist export model.onnx` does this)", record.name,
                           replicas)
        return {"batch": None, "replicas": replicas}
    total = int(batch) * record.replicas_in_sync
    if total % replicas:
        raise PlanError(f"plan {record.name!r} has a global batch of {total} ({record.replicas_in_sync} replica(s) of "
                        f"{batch}), which does not divide among {replicas} replicas; pick a replica count that "
                        f"divides {total}, or export the step with another global batch")
    wanted = total // replicas
    if wanted == int(batch):
        return {"batch": wanted, "replicas": replicas}
    check = record.rebatch
    if not check.get("verified") and checker is not None:
        check = record.rebatch = checker()
    if not check.get("verified"):
        raise PlanError(f"plan {record.name!r} cannot be re-planned for {replicas} replicas: that needs a "
                        f"per-replica batch of {wanted} instead of {batch}, and {check.get('reason')}. Re-plan for "
                        f"{record.replicas_in_sync} replicas (same per-replica batch), or rewrite the step so its "
                        "graph follows x.shape[0]")
    return {"batch": wanted, "replicas": replicas}


def _rebatched(record: StepRecord, pipeline: Pipeline) -> Graph:
    """The traced graph after the pipeline's ``rebatched`` stage (a copy; the record's graph is kept)."""
    graph = record.traced.copy()
    try:
        return PassManager(pipeline.stage("rebatched")).run(graph).graph
    except GraphError as err:
        raise PlanError(f"plan {record.name!r}: {err}") from None


def _check_accumulation(record: StepRecord, graph: Graph, local_replicas: int, steps: int) -> None:
    """A step compiled with ``accumulate_steps=k`` keeps it: the new per-replica batch must divide by ``k``
    (``steps``: ``k``, or op determinism's chunks per replica), and a step whose plain array arguments were one
    replica's batch stays at one replica per process.
    """
    if steps == 1:
        return
    batch = graph.meta.batch
    if batch is not None and int(batch) % steps:
        raise PlanError(f"plan {record.name!r} accumulates gradients over {steps} micro-batches per replica, and a "
                        f"per-replica batch of {int(batch)} rows does not divide into {steps}; pick a replica count "
                        f"that leaves each replica a multiple of {steps} rows")
    per_replica = graph.meta.per_replica_inputs
    plain_batches = [f.inputs[0] for f in record.interface.arguments if f.kind == "tensor" and f.inputs
                     and f.inputs[0] in per_replica]
    if plain_batches and local_replicas > 1:
        raise PlanError(f"plan {record.name!r} took its batch as plain arrays (one replica per process, "
                        f"accumulate_steps={steps}), so it can be re-planned only for one replica per process; "
                        "export it from a step that takes per-replica values (a distributed dataset's elements) to "
                        "re-plan it for more")


def _check_replica_count(record: StepRecord, replicas: int) -> None:
    reads = record.traced.meta.reads_num_replicas or []
    if reads and replicas != record.replicas_in_sync:
        raise PlanError(
            f"plan {record.name!r} read num_replicas_in_sync ({record.replicas_in_sync}) while it was traced "
            f"(at {', '.join(reads[:3])}), so that number is frozen into its graph; it can only be re-planned for "
            f"{record.replicas_in_sync} replicas. Let the step not depend on it (gd.nn.compute_average_loss "
            "without global_batch_size counts the replicas itself)")
