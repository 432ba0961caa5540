"""Plan export and load: a plan directory that runs without the step's Python code.

``ConcreteFunction.export(directory)`` (or ``plan.export(directory)`` for a
plan reached through a concrete function) writes::

    directory/
      plan.json              versioned schema (below)
      segments/NNN_<name>.onnx   one ONNX model per segment
      variables.npz          current variable values (``.npy`` entries, never pickled)
      constants.npz          constant plan values (outputs and collective inputs)
      graphs/traced.onnx     the step as traced (for Netron)
      graphs/rewritten.onnx  after the strategy's passes
      graphs/partitioned.onnx  with placement and communication nodes
      graphdist-manifest.json  the SHA-256 of every other file, plan.json included

Everything is written into a hidden temporary directory next to
``directory``, flushed to disk, and swapped in (see
:mod:`graphdist.fsutil.savedir`): an interrupted export leaves either
nothing or the previous plan at the destination, never a moment without a
complete plan; the next export to the same place removes what an
interrupted one left. An existing directory is replaced only with
``overwrite=True`` and only when graphdist wrote every file in it.

``plan.json`` (``"format": "graphdist-plan"``, ``"version": 3``) holds the
plan's name, backend, devices; ``arguments`` (the step's argument structure
as JSON and, per argument leaf, which plan inputs it feeds); ``inputs``
(name, dtype, shape, argument leaf, replica); ``variables`` (name, input,
kind, dtype, shape, device, placement, component devices, trainable, update
output, ``.npz`` entry and SHA-256 of the value); ``updates`` (which output
updates which variable); ``segments`` (name, device, file, SHA-256, inputs,
outputs); ``collectives`` (name, op, attrs, inputs, outputs, devices, buffer
dtype and shape; transfers included); ``tasks`` (the task DAG in a
topological order: ``id``, ``kind``, ``name``, ``deps``); ``outputs`` (names,
dtypes and shapes, the output structure as JSON and the number of replica
components of each output leaf); ``graphs``; and the SHA-256 of every file.

:func:`load_plan` validates all of it (schema, file presence, checksums,
ONNX well-formedness, consistency of segments, collectives and the task DAG)
and returns a :class:`LoadedPlan`: call it like the step it came from.
Variables live in the loaded plan, are updated by every call, and
:meth:`LoadedPlan.save` writes them back.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.compile.interface import Resolved
from graphdist.compile.pipeline import PipelineConfig
from graphdist.compile.plan import Plan
from graphdist.compile.plan_files import (
    FORMAT,
    FORMAT_VERSION,
    PLAN_FILE,
    STAGES,
    array_digest,
    dtype_str,
    encode_treedef,
    graphdist_version,
    jsonable,
    npz_bytes,
    sha256_of,
    shape_list,
    task_dag,
    write_plan_directory,
)
from graphdist.compile.step import StepRecord
from graphdist.errors import PlanError
from graphdist.ir.onnx_io import to_onnx
from graphdist.ir.placement import PlacementSpec, VariablePlacement

__all__ = ["concrete_files", "export_concrete", "export_plan", "step_files"]

logger = logging.getLogger(__name__)


def _segment_file(index: int, name: str) -> str:
    return f"segments/{index:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.onnx"


def _value_entry(plan: Plan, name: str) -> dict[str, Any]:
    value = plan.graph_value(name)
    if value is None:
        raise PlanError(f"plan {plan.graph.name!r}: value {name!r} is not in the partitioned graph")
    return {"name": name, "dtype": dtype_str(value.dtype), "shape": shape_list(value.shape)}


class _Interface:
    """How a step is called: arguments, inputs, variables, updates and outputs (JSON-ready)."""

    def __init__(self, arguments: dict[str, Any], inputs: list[dict[str, Any]], variables: list[dict[str, Any]],
                 arrays: list[np.ndarray], updates: list[dict[str, str]], outputs: dict[str, Any]) -> None:
        self.arguments, self.inputs, self.variables = arguments, inputs, variables
        self.arrays, self.updates, self.outputs = arrays, updates, outputs


def _bare_interface(plan: Plan) -> _Interface:
    """A plan without a step: positional array arguments, a list of outputs, no variables."""
    names = list(plan.input_names)
    leaves = [{"kind": "tensor", "input": n} for n in names]
    _, treedef = nest.flatten((tuple(names), {}))
    inputs = [dict(_value_entry(plan, n), arg=i, replica=None) for i, n in enumerate(names)]
    outputs = {"names": list(plan.output_names), "structure": encode_treedef(nest.flatten(list(plan.output_names))[1]),
               "counts": [None] * len(plan.output_names)}
    return _Interface({"structure": encode_treedef(treedef), "leaves": leaves}, inputs, [], [], [], outputs)


def _step_interface(plan: Plan, rewritten: Any, record: StepRecord, resolved: Resolved) -> _Interface:
    """The interface of a compiled step: ``resolved`` gives its plan inputs in call order and its result
    counts, ``rewritten`` its variable updates and placement.
    """
    names = iter(resolved.input_names)
    leaves: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []

    def entry(name: str, leaf: int, replica: int | None) -> str:
        inputs.append(dict(_value_entry(plan, name), arg=leaf, replica=replica))
        return name

    for index, (feed, detail) in enumerate(zip(record.interface.arguments, record.argument_details)):
        if feed.kind == "tensor":
            leaves.append({"kind": "tensor", "input": entry(next(names), index, None)})
        elif feed.kind == "per_replica":
            if any(name is None for name in feed.inputs):
                raise PlanError(f"{record.name}: argument leaf {index} is a distributed value whose components "
                                "are not arrays; only arrays can be exported as per-replica inputs")
            leaves.append({"kind": "per_replica",
                           "inputs": [entry(next(names), index, r) for r in range(len(feed.inputs))]})
        else:
            leaves.append(dict(detail or {"kind": "opaque", "type": "object"}))
    input_of = {spec.uid: name for name, spec in record.variables}
    update_of = {uid: out for out, uid in rewritten.meta.variable_updates}
    placements = rewritten.meta.placement or PlacementSpec()
    variables, arrays = [], []
    for index, (name, spec) in enumerate(record.variables):
        array = np.array(record.values[name], order="C", copy=True)
        where = placements.get(spec.uid) or VariablePlacement("local", ("cpu:0",))
        readers = [s.name for s in plan.segments if name in s.inputs] + [c.name for c in plan.comms if name in c.inputs]
        variables.append({
            "name": f"{spec.name}:0", "input": name, "uid": spec.uid, "kind": spec.kind, "dtype": array.dtype.str,
            "shape": list(array.shape), "device": where.devices[0] if where.devices else None,
            "placement": where.kind, "devices": list(where.devices), "read_by": readers,
            **({"shards": where.to_json()["shards"]} if where.shards else {}),
            "trainable": spec.trainable, "update_output": update_of.get(spec.uid),
            "entry": f"v{index}", "sha256": array_digest(array),
        })
        arrays.append(array)
    updates = []
    for output, uid in rewritten.meta.variable_updates:
        if uid not in input_of:
            raise PlanError(f"{record.name}: variable {uid} is updated but never read by the step")
        updates.append({"output": output, "variable": input_of[uid]})
    num_results = len(plan.output_names) - len(updates)
    outputs = {
        "names": list(plan.output_names[:num_results]),
        "values": [_value_entry(plan, n) for n in plan.output_names[:num_results]],
        "structure": record.output_structure,
        "counts": list(resolved.counts),
    }
    arguments = {"structure": record.argument_structure, "leaves": leaves}
    return _Interface(arguments, inputs, variables, arrays, updates, outputs)


def _plan_files(plan: Plan, name: str, interface: _Interface, graphs: dict[str, bytes],
                strategy: str | None, extra: dict[str, Any] | None = None) -> dict[str, bytes]:
    """Every file of a plan directory (``plan.json`` last, with the others' checksums)."""
    files: dict[str, bytes] = {}

    def add(rel: str, data: bytes) -> dict[str, str]:
        files[rel] = data
        return {"file": rel, "sha256": sha256_of(data)}

    segments = []
    for index, seg in enumerate(plan.segments):
        entry = add(_segment_file(index, seg.name), seg.model.SerializeToString())
        segments.append({"name": seg.name, "device": seg.device, **entry, "inputs": list(seg.inputs),
                         "outputs": list(seg.outputs)})
    collectives = []
    for c in plan.comms:
        buffer = plan.graph_value(c.inputs[0]) if c.inputs else None
        collectives.append({
            "name": c.name, "op": c.op, "attrs": jsonable(c.attrs, f"collective {c.name}"), "inputs": list(c.inputs),
            "outputs": list(c.outputs), "devices": list(c.devices),
            "buffer": None if buffer is None else {"dtype": dtype_str(buffer.dtype),
                                                   "shape": shape_list(buffer.shape)},
        })
    constants = [(f"c{i}", np.asarray(a)) for i, a in enumerate(plan.constants.values())]
    constant_entries = [{"name": n, "entry": e, "dtype": a.dtype.str, "shape": list(a.shape),
                         "sha256": array_digest(a)} for n, (e, a) in zip(plan.constants, constants)]
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "graphdist_version": graphdist_version(),
        "name": name,
        "backend": plan.backend_name,
        "strategy": strategy,
        "devices": list(plan.devices),
        "plan_inputs": list(plan.input_names),
        "plan_outputs": list(plan.output_names),
        "arguments": interface.arguments,
        "inputs": interface.inputs,
        "variables": interface.variables,
        "variables_file": add("variables.npz", npz_bytes([(v["entry"], a) for v, a in
                                                           zip(interface.variables, interface.arrays)])),
        "updates": interface.updates,
        "constants": {**add("constants.npz", npz_bytes(constants)), "entries": constant_entries},
        "segments": segments,
        "collectives": collectives,
        "tasks": task_dag(plan),
        "outputs": interface.outputs,
        "graphs": {stage: add(f"graphs/{stage}.onnx", data) for stage, data in graphs.items()},
        **(extra or {}),
    }
    files[PLAN_FILE] = (json.dumps(doc, indent=1) + "\n").encode()
    return files


def step_files(plan: Plan, graphs: dict[str, Any], record: StepRecord, resolved: Resolved,
               config: PipelineConfig, io_names: dict[str, list[str]] | None = None) -> dict[str, bytes]:
    """Every file of the plan directory of a compiled step (``plan.json`` with its ``traced`` section).

    Raises:
        PlanError: The plan is not compiled, or the step's arguments or results cannot be described in JSON.
    """
    if not plan.compiled:
        raise PlanError(f"{record.name}: the plan is not compiled; compile it before exporting")
    interface = _step_interface(plan, graphs["rewritten"], record, resolved)
    data = {stage: to_onnx(graphs[stage]).SerializeToString() for stage in STAGES}
    extra = {"replicas": {"local": config.replicas, "in_sync": config.total_replicas,
                          "offset": config.replica_offset},
             "traced": record.to_json()}
    if io_names:  # an ONNX model's input and output names (make_inference_step)
        extra["io_names"] = io_names
    return _plan_files(plan, record.name, interface, data, config.strategy, extra)


def concrete_files(concrete: Any) -> dict[str, bytes]:
    """Every file of the plan directory of ``concrete`` (a ``ConcreteFunction``), in memory.

    Raises:
        PlanError: The plan is not compiled, or the step's arguments or results cannot be described in JSON.
    """
    from graphdist.compile.step import record_of_concrete

    record = record_of_concrete(concrete)
    io_names = getattr(getattr(concrete, "_function", None), "io_names", None)
    if concrete._part_feeds:
        # ZeRO-1 slots stored in per-replica parts: a plan directory holds each variable as one array, so the
        # exported plan is the same step built with its slots stored whole (sliced and joined in the plan).
        graphs, plan, resolved = concrete._whole_storage_build()
        return step_files(plan, graphs, record, resolved, concrete.config, io_names)
    graphs = {stage: concrete.graph(stage) for stage in STAGES}
    return step_files(concrete.plan, graphs, record, concrete.resolved, concrete.config, io_names)


def export_concrete(concrete: Any, directory: str | os.PathLike[str], *, overwrite: bool = False) -> str:
    """Writes the plan of ``concrete`` (a ``ConcreteFunction``) with its current variables to ``directory``.

    The directory also holds the traced step (graph, interface, variables), so ``gd.load_plan(dir)``
    can re-plan it for another strategy without the step's code; whether its constants follow another
    per-replica batch size is checked here, by tracing the step again at another batch size.

    Returns:
        The directory's absolute path.

    Raises:
        PlanError: ``directory`` exists (without ``overwrite``) or holds files graphdist did not write,
            the plan is not compiled, or the step's arguments or results cannot be described in JSON.
    """
    files = concrete_files(concrete)
    dest = write_plan_directory(directory, files, overwrite)
    logger.info("exported plan %s (%d segment(s)) to %s", concrete.name, len(concrete.plan.segments), dest)
    return str(dest)


def export_plan(plan: Plan, directory: str | os.PathLike[str], *, overwrite: bool = False) -> str:
    """``plan.export(directory)``: through its concrete function or loaded plan when it has one.

    A plan built directly (``Plan.from_graph(...).compile(...)``) is exported
    with a flat interface: positional arrays in ``plan.input_names`` order,
    a list of outputs, no variables.
    """
    owner_ref = getattr(plan, "_owner", None)
    owner = owner_ref() if owner_ref is not None else None
    if owner is not None:
        return owner.export(directory, overwrite=overwrite)
    if not plan.compiled:
        raise PlanError(f"plan {plan.graph.name!r} is not compiled; call plan.compile(backend) before exporting")
    graphs = {"partitioned": to_onnx(plan.graph).SerializeToString()}
    files = _plan_files(plan, plan.graph.name, _bare_interface(plan), graphs, None)
    return str(write_plan_directory(directory, files, overwrite))
