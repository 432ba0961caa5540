"""A compiled step as data: the traced graph and how the step is called, without its Python code.

A plan directory stores a :class:`StepRecord` next to the plan (``plan.json``'s
``traced`` section and ``graphs/traced.onnx``): the step traced as one
replica, its interface (which arguments feed which inputs, which outputs make
which results), its variables, the replica count and per-replica batch it
was traced for, and whether its constants follow another batch size. That
is all :mod:`graphdist.compile.replan` needs to build a plan for another
strategy, in this process or from a directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.compile.guards import signature_of_key, specialised_from_json, specialised_to_json
from graphdist.compile.interface import StepInterface
from graphdist.compile.plan_files import KEY_TYPES, encode_treedef
from graphdist.errors import GraphdistError, GraphError, PlanError
from graphdist.ir.graph import Graph
from graphdist.ir.placement import VariableSpec

__all__ = ["StepRecord", "record_of_concrete", "check_rebatch", "check_batch_follows"]

#: Per-replica batch size the exporter traces a step at again, relative to the traced one.
_CHECK_FACTOR = 2


@dataclass
class StepRecord:
    """What a plan directory keeps of its step (see the module docstring).

    Attributes:
        name: The step's name.
        traced: The step as traced (one replica); ``meta`` holds its per-replica inputs and outputs,
            replica variants, per-replica batch and variable specs.
        interface: How the call's arguments and results map to the traced graph.
        argument_structure: The arguments' tree (JSON, :func:`~graphdist.compile.plan_files.encode_treedef`).
        argument_details: Per argument leaf that feeds no input (a variable, a Python constant), its entry.
        output_structure: The results' tree (JSON).
        variables: ``(traced input name, spec)`` of every variable the step reads.
        values: Variable values by input name.
        replicas_in_sync: The replica count the step was traced for.
        rebatch: ``{"verified": bool, "reason": str | None}``: whether the traced graph, given another
            per-replica batch size by ``RebatchPass``, equals the step traced at that size.
        accumulate_steps: Micro-batches per replica and step (``gd.function(accumulate_steps=k)``); a
            re-planned step keeps them.
        deterministic_chunks: Op determinism's chunks of the global batch, or ``None``; a re-planned step
            keeps them (and its micro-batches become the chunks per replica of the new replica count).
    """

    name: str
    traced: Graph
    interface: StepInterface
    argument_structure: dict[str, Any]
    argument_details: list[dict[str, Any] | None]
    output_structure: dict[str, Any]
    variables: list[tuple[str, VariableSpec]]
    values: dict[str, np.ndarray]
    replicas_in_sync: int
    rebatch: dict[str, Any] = field(default_factory=lambda: {"verified": False, "reason": "not checked"})
    accumulate_steps: int = 1
    deterministic_chunks: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``traced`` section of ``plan.json`` (the graph itself is ``graphs/traced.onnx``)."""
        meta = self.traced.meta
        return {
            "interface": self.interface.to_json(),
            "variables": [{"input": name, **spec.to_json()} for name, spec in self.variables],
            "per_replica_inputs": dict(meta.per_replica_inputs),
            "per_replica_outputs": {str(k): v for k, v in meta.per_replica_outputs.items()},
            "replica_variants": {k: list(v) for k, v in meta.replica_variants.items()},
            "batch": meta.batch,
            "batch_constants": {name: [None if item is None else list(item) for item in value.meta["batch"]]
                                for name, value in self.traced.initializers.items() if value.meta.get("batch")},
            "reads_num_replicas": list(meta.reads_num_replicas),
            "replicas_in_sync": self.replicas_in_sync,
            "rebatch": dict(self.rebatch),
            "accumulate_steps": self.accumulate_steps,
            # Inputs whose values the trace used as constants (TraceContext.specialise): a call must repeat them.
            "specialised": specialised_to_json(meta.specialised),
            "deterministic_chunks": self.deterministic_chunks,
        }

    @classmethod
    def from_document(cls, doc: dict[str, Any], graph: Graph, values: dict[str, np.ndarray]) -> StepRecord:
        """The record of a plan directory: ``doc`` its ``plan.json``, ``graph`` its ``graphs/traced.onnx``
        imported, ``values`` its variables.

        Raises:
            PlanError: The plan was exported before plans recorded their traced step (schema version 1),
                or the section is malformed.
        """
        section = doc.get("traced")
        if not isinstance(section, dict):
            raise PlanError(f"plan {doc.get('name')!r} was exported by a graphdist that did not record the traced "
                            f"step (plan.json schema version {doc.get('version')}); it runs as it is but cannot be "
                            "re-planned: export it again from the step's code (concrete_function.export(directory))")
        try:
            variables = [(str(v["input"]), VariableSpec.from_json(v)) for v in section["variables"]]
            meta = graph.meta
            meta.per_replica_inputs = dict(section["per_replica_inputs"])
            meta.per_replica_outputs = {int(k): v for k, v in section["per_replica_outputs"].items()}
            meta.replica_variants = {k: list(v) for k, v in section["replica_variants"].items()}
            meta.batch = section["batch"]
            meta.reads_num_replicas = list(section.get("reads_num_replicas", []))
            meta.specialised = specialised_from_json(section.get("specialised"))
            meta.variables = variables
            for name, items in section["batch_constants"].items():
                graph.initializers[name].meta["batch"] = [None if i is None else (int(i[0]), int(i[1]))
                                                          for i in items]
            by_name = {v.name: v for v in graph.inputs}
            for name, spec in variables:
                by_name[name].meta["variable"] = spec
            details = [None if leaf.get("kind") in ("tensor", "per_replica") else dict(leaf)
                       for leaf in doc["arguments"]["leaves"]]
            accumulate = section.get("accumulate_steps", 1)  # absent from plans exported before it existed
            if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
                raise ValueError(f"accumulate_steps must be a positive int, got {accumulate!r}")
            chunks = section.get("deterministic_chunks")  # absent from plans exported before it existed
            if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1):
                raise ValueError(f"deterministic_chunks must be a positive int or null, got {chunks!r}")
            return cls(str(doc["name"]), graph, StepInterface.from_json(section["interface"]),
                       doc["arguments"]["structure"], details, doc["outputs"]["structure"], variables, values,
                       int(section["replicas_in_sync"]), dict(section["rebatch"]), accumulate, chunks)
        except (KeyError, TypeError, ValueError) as err:
            raise PlanError(f"plan {doc.get('name')!r}: plan.json's 'traced' section is malformed "
                            f"({type(err).__name__}: {err}); export the plan again") from None


def record_of_concrete(concrete: Any, check: bool = True) -> StepRecord:
    """The record of a ``ConcreteFunction`` (the variables' current values; the batch check run when
    ``check``).

    Raises:
        PlanError: The step's arguments or results cannot be described in JSON.
    """
    treedef, leaf_sigs = signature_of_key(concrete._signature)
    inputs_of = {id(v): name for name, v in concrete._variable_feeds}
    details: list[dict[str, Any] | None] = []
    for sig in leaf_sigs:
        tag = sig[0] if isinstance(sig[0], str) else None
        if tag is None or tag == "per_replica":
            details.append(None)
        elif tag == "variable":
            details.append({"kind": "variable", "variable": inputs_of.get(sig[1])})
        elif tag == "const" and (sig[2] is None or isinstance(sig[2], KEY_TYPES)):
            details.append({"kind": "const", "type": type(sig[2]).__name__, "value": sig[2]})
        else:
            details.append({"kind": "opaque", "type": sig[1].__name__ if tag == "const" else "object"})
    traced = concrete.graph("traced")
    sharded = [v.name for _, v in concrete._variable_feeds
               if v.worker_shard is not None and v.worker_shard.workers > 1]
    if sharded:
        raise NotImplementedError(
            f"{concrete.name}: exporting or re-planning a step whose optimizer state is sharded across workers "
            f"(ZeRO-1: {', '.join(sharded[:3])}{', ...' if len(sharded) > 3 else ''}) is not implemented yet; save "
            "a gd.Checkpoint on every worker (it gathers the chunks) and restore it into the step of another strategy")
    # A variable stored in per-replica parts (ZeRO-1 in one process) is recorded whole.
    values = {name: np.array(v.whole_value(), order="C", copy=True) for name, v in concrete._variable_feeds}
    record = StepRecord(
        concrete.name, traced, concrete.interface, encode_treedef(treedef, "the step's arguments"), details,
        encode_treedef(concrete._output_treedef, "the step's result"), list(traced.meta.variables),
        values, concrete.config.total_replicas, accumulate_steps=concrete.config.accumulate_steps,
        deterministic_chunks=concrete.config.deterministic_chunks)
    if check:
        record.rebatch = check_rebatch(concrete)
    return record


def check_rebatch(concrete: Any) -> dict[str, Any]:
    """Whether the traced graph can be given another per-replica batch size.

    Traces the step again at ``2 *`` its per-replica batch (the same strategy and arguments otherwise)
    and compares, structurally, with ``RebatchPass`` applied to the traced graph: equal means every
    constant the step computed from the batch size was recorded (see :mod:`graphdist.ir.batch`).
    """
    traced = concrete.graph("traced")
    batch = traced.meta.batch
    if batch is None:
        reason = ("the step was traced with uneven per-replica shapes" if traced.meta.replica_variants
                  else "the step has no per-replica inputs, so its batch size never changes")
        return {"verified": False, "reason": reason}
    function, example = concrete._function, concrete._example
    if function is None or example is None:
        return {"verified": False, "reason": "the step's function is not available to check it"}
    return check_batch_follows(function, example, traced, _CHECK_FACTOR * int(batch),
                               batch_args=bool(getattr(concrete, "_batch_args", False)))


def check_batch_follows(function: Any, example: tuple[tuple, dict], traced: Graph, batch: int, *,
                        batch_args: bool = False) -> dict[str, Any]:
    """Whether ``traced`` given per-replica batch ``batch`` (``RebatchPass``) equals the step traced again
    with that batch (``function._trace``): structurally equal means every constant the step computed from
    the batch size was recorded (see :mod:`graphdist.ir.batch`).

    Args:
        function: The ``gd.function`` that traced ``traced`` from ``example`` (the arguments' specs).
        example: The arguments' specs.
        traced: The traced graph.
        batch: The per-replica batch to check.
        batch_args: Plain array arguments are batches too (one replica, ``accumulate_steps``).

    Returns:
        ``{"verified": bool, "reason": None or why not}``.
    """
    from graphdist.ir.compare import structural_diff
    from graphdist.passes.rebatch import RebatchPass

    try:
        args, kwargs = _with_batch(example, batch, plain=batch_args)
        again = function._trace(args, kwargs, count=False, batch_args=batch_args)[0]
        rebatched = RebatchPass(batch)(traced.copy()).graph
    except (GraphdistError, GraphError) as err:
        return {"verified": False, "reason": f"at per-replica batch {batch}: {err}"}
    difference = structural_diff(rebatched, again)
    if difference is None:
        return {"verified": True, "reason": None}
    return {"verified": False, "reason": (
        f"traced again at per-replica batch {batch}, the step differs from its re-batched graph ({difference}): "
        "it computes something from the batch size (x.shape[0]) that is frozen into its graph, e.g. through int(), "
        "// or a numpy call on the shape")}


def _with_batch(example: tuple[tuple, dict], batch: int, *, plain: bool = False) -> tuple[tuple, dict]:
    """The example arguments with every per-replica component's first dimension set to ``batch`` (and
    every plain array argument's, with ``plain``).
    """
    from graphdist.trace.tracer import TensorSpec
    from graphdist.trace.values import DistributedValues, PerReplica

    def resize(leaf: Any) -> Any:
        if isinstance(leaf, DistributedValues):
            return PerReplica(tuple(TensorSpec((batch, *c.shape[1:]), c.dtype, c.name) if isinstance(c, TensorSpec)
                                    and c.shape else c for c in leaf.values))
        if plain and isinstance(leaf, TensorSpec) and leaf.shape:
            return TensorSpec((batch, *leaf.shape[1:]), leaf.dtype, leaf.name)
        return leaf

    leaves, treedef = nest.flatten(example, is_leaf=lambda v: isinstance(v, DistributedValues))
    args, kwargs = nest.unflatten(treedef, [resize(leaf) for leaf in leaves])
    return tuple(args), dict(kwargs)
