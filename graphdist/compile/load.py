"""Reading a plan directory: validate every file, rebuild the plan, compile it (``gd.load_plan``).

A plan is code (its segments are ONNX graphs that run), so first the
directory itself must be trusted (:func:`graphdist.fsutil.trust.check_trusted`):
signed with this user's key, or in a folder no other user can write, or
loaded with ``trust=True``. Then nothing is trusted: every file (a regular
file, not read through a symbolic link), ``plan.json`` included, is checked against
the SHA-256 the directory's manifest (``graphdist-manifest.json``) lists for
it, ``plan.json`` against its schema and every other file against its
SHA-256 there too, every array's declared size against its bytes before it
is allocated, every ONNX model with the checker, and the segments,
collectives and task DAG against each other. No pickle is ever loaded.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphdist.compile.loaded import LoadedPlan
from graphdist.compile.plan import CommTask, Plan, Segment
from graphdist.compile.plan_files import (
    FORMAT,
    MANIFEST_REQUIRED_FROM,
    PLAN_FILE,
    PLAN_KIND,
    READABLE_VERSIONS,
    REEXPORT,
    array_digest,
    count_leaves,
    decode_treedef,
    graphdist_version,
    outline,
    sha256_of,
    task_dag,
)
from graphdist.errors import GraphdistError, PlanError
from graphdist.fsutil import MANIFEST_FILE, manifest_digests, read_npz, recover_directory
from graphdist.fsutil.savedir import read_regular_file
from graphdist.fsutil.trust import check_trusted
from graphdist.ir.graph import Graph
from graphdist.ir.placement import KINDS, PlacementSpec, VariablePlacement, VariableSpec

__all__ = ["load_plan", "load_files"]

logger = logging.getLogger(__name__)


class _Reader:
    """Reads and validates the files of a plan directory (or of a plan made in memory: ``memory``)."""

    def __init__(self, directory: Path | None, memory: dict[str, bytes] | None = None, label: str = "",
                 trust: bool = False) -> None:
        self.directory = directory
        self.trust = trust
        self.memory = memory
        self.label = label or f"plan directory {directory}"
        self.files: dict[str, bytes] = {}
        #: SHA-256 of every file by relative path, from the directory's manifest (``None``: none, or in memory).
        self.manifest: dict[str, str] | None = None

    def error(self, message: str) -> PlanError:
        return PlanError(f"{self.label}: {message}")

    def raw(self, rel: str, where: str) -> bytes:
        """The bytes of ``rel`` (unchecked)."""
        if self.memory is not None:
            if rel not in self.memory:
                raise self.error(f"{where}: the file {rel} is missing")
            return self.memory[rel]
        path = self.directory / rel
        if not os.path.lexists(path):
            raise self.error(f"{where}: the file {rel} is missing; the plan directory is incomplete: {REEXPORT}")
        try:
            data = read_regular_file(path)
        except OSError as err:
            raise self.error(f"{where}: the file {rel} cannot be read ({err.strerror or err}); {REEXPORT}") from None
        if self.manifest is not None:
            if rel not in self.manifest:
                raise self.error(f"{where}: the file {rel} is not listed in {MANIFEST_FILE}; plan.json was edited: "
                                 f"{REEXPORT}")
            if sha256_of(data) != self.manifest[rel]:
                raise self.error(f"{where}: the file {rel} fails its SHA-256 checksum in {MANIFEST_FILE} (it was "
                                 f"edited, truncated or corrupted after export); {REEXPORT}")
        return data

    def get(self, obj: Any, key: str, kind: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            if optional:
                return None
            owner = "plan.json" if where == "plan.json" else f"plan.json: {where}"
            raise self.error(f"{owner} lacks the required key {key!r}; the file is damaged or was "
                             f"edited: {REEXPORT}")
        value = obj[key]
        if optional and value is None:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            path = key if where == "plan.json" else f"{where}.{key}"
            raise self.error(f"plan.json: {path} must be a {names}, got {type(value).__name__}; {REEXPORT}")
        return value

    def strings(self, obj: Any, key: str, where: str) -> list[str]:
        values = self.get(obj, key, list, where)
        if not all(isinstance(v, str) for v in values):
            raise self.error(f"plan.json: {where}.{key} must be a list of strings; {REEXPORT}")
        return values

    def read(self, entry: Any, where: str) -> bytes:
        """The bytes of the file ``entry`` names, after checking its SHA-256."""
        rel = self.get(entry, "file", str, where)
        digest = self.get(entry, "sha256", str, where)
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            raise self.error(f"plan.json: {where} names the file {rel!r} outside the plan directory; {REEXPORT}")
        data = self.raw(rel, where)
        if sha256_of(data) != digest:
            raise self.error(f"{where}: the file {rel} fails its SHA-256 checksum (it was modified, truncated or "
                             f"corrupted after export); {REEXPORT}")
        self.files[rel] = data
        return data

    def model(self, entry: Any, where: str) -> onnx.ModelProto:
        data = self.read(entry, where)
        rel = entry["file"]
        try:
            model = onnx.ModelProto.FromString(data)
            onnx.checker.check_model(model)
        except Exception as err:  # noqa: BLE001 - protobuf and the checker raise assorted types
            raise self.error(f"{where}: {rel} is not a valid ONNX model ({type(err).__name__}: {err}); "
                             f"{REEXPORT}") from None
        return model

    def arrays(self, data: bytes, entries: list[dict[str, Any]], where: str, rel: str) -> dict[str, np.ndarray]:
        """The arrays of a ``.npz`` file, keyed by entry, checked against ``entries`` (each header's
        declared size against its bytes before anything is allocated).
        """
        wanted: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        for index, info in enumerate(entries):
            at = f"{where}[{index}]"
            entry = self.get(info, "entry", str, at)
            shape = self.get(info, "shape", list, at)
            if not all(type(d) is int and d >= 0 for d in shape):
                raise self.error(f"plan.json: {at}.shape must be a list of sizes, got {shape!r}; {REEXPORT}")
            wanted[entry] = (_parse_dtype(self, self.get(info, "dtype", str, at), at), tuple(shape))
        out = read_npz(data, wanted, error=PlanError, where=f"{self.label}: {rel}")
        for index, info in enumerate(entries):
            if array_digest(out[info["entry"]]) != self.get(info, "sha256", str, f"{where}[{index}]"):
                raise self.error(f"{rel}: the value of {info.get('name')!r} fails its SHA-256 checksum; "
                                 f"{REEXPORT}")
        return out


def _parse_dtype(reader: _Reader, text: str, where: str) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise reader.error(f"plan.json: {where} has an unknown dtype {text!r}; {REEXPORT}") from None
    if dtype.hasobject or dtype.kind == "V":
        raise reader.error(f"plan.json: {where} has dtype {text!r}; only numeric arrays can be loaded")
    return dtype


def _read_manifest(reader: _Reader) -> None:
    """Puts back a plan whose overwrite was cut between its renames, then reads the directory's manifest."""
    directory = reader.directory
    recover_directory(directory)
    if not directory.is_dir():
        raise PlanError(f"plan directory {directory} does not exist; pass the directory that plan.export() wrote")
    if not (directory / PLAN_FILE).is_file():
        raise reader.error(f"{PLAN_FILE} is missing, so this is not an exported plan (or the export did not "
                           f"finish); {REEXPORT}")
    manifest = manifest_digests(directory, kind=PLAN_KIND, error=PlanError, where=reader.label)
    check_trusted(directory, manifest, trust=reader.trust, error=PlanError, what="gd.load_plan")
    reader.manifest = None if manifest is None else manifest.files


def _read_document(reader: _Reader) -> dict[str, Any]:
    if reader.memory is None:
        _read_manifest(reader)
    try:
        doc = json.loads(reader.raw(PLAN_FILE, PLAN_FILE))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise reader.error(f"{PLAN_FILE} is corrupt: it is not valid JSON ({err}); {REEXPORT}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise reader.error(f"{PLAN_FILE} has format {found!r}, expected {FORMAT!r}; it is not a graphdist plan")
    version = doc.get("version")
    if version not in READABLE_VERSIONS:
        raise reader.error(f"{PLAN_FILE} has schema version {version!r}, but this graphdist (version "
                           f"{graphdist_version()}) reads versions {', '.join(map(str, READABLE_VERSIONS))}; "
                           "re-export the plan with this version of graphdist")
    if reader.memory is None and reader.manifest is None:
        if version >= MANIFEST_REQUIRED_FROM:
            raise reader.error(f"{MANIFEST_FILE} is missing: a version {version} plan lists its files' checksums "
                               f"there, so the directory is incomplete or was edited; {REEXPORT}")
        logger.warning("%s: written by an older graphdist (plan.json version %s, no %s): plan.json is not "
                       "covered by a checksum, so edits to it go undetected; save it again to add one",
                       reader.label, version, MANIFEST_FILE)
    return doc


def _check_dag(reader: _Reader, plan: Plan, doc: dict[str, Any], available: set[str]) -> None:
    """The recorded task DAG equals the one the segments and collectives imply, and everything read exists."""
    recorded = reader.get(doc, "tasks", list, "plan.json")
    derived = task_dag(plan)
    def as_set(tasks: list[Any]) -> set[tuple[Any, ...]]:
        return {(t.get("id"), t.get("kind"), frozenset(t.get("deps") or ())) for t in tasks}

    if not all(isinstance(t, dict) and isinstance(t.get("deps", []), list) for t in recorded) \
            or as_set(recorded) != as_set(derived):
        raise reader.error(f"plan.json: 'tasks' does not match the segments' and collectives' inputs and outputs; "
                           f"the file was edited: {REEXPORT}")
    produced = set(available) | set(plan.constants)
    for task in plan.segments + plan.comms:
        produced.update(task.outputs)
    for task in plan.segments + plan.comms:
        missing = [n for n in task.inputs if n not in produced]
        if missing:
            raise reader.error(f"plan.json: {task.name} reads {missing[:3]}, which nothing produces; {REEXPORT}")
    missing = [n for n in plan.output_names if n not in produced]
    if missing:
        raise reader.error(f"plan.json: the outputs {missing[:3]} are produced by no task; {REEXPORT}")


def _variable_spec(entry: dict[str, Any]) -> tuple[VariableSpec, VariablePlacement]:
    """What a loaded plan knows of a variable: its spec (uid: the recorded one, else its input name)
    and placement.
    """
    name = str(entry["name"]).removesuffix(":0")
    shape = tuple(int(d) for d in entry["shape"])
    spec = VariableSpec(str(entry.get("uid") or entry["input"]), name, np.dtype(entry["dtype"]).str, shape,
                        bool(entry.get("trainable", True)), str(entry.get("kind", "Variable")))
    kind = entry.get("placement")
    devices = tuple(str(d) for d in entry.get("devices") or ([entry["device"]] if entry.get("device") else []))
    if kind == "ps":
        return spec, VariablePlacement.from_json({"kind": "ps", "devices": devices, "shards": entry.get("shards", [])})
    return spec, VariablePlacement(kind if kind in KINDS else "local", devices)


def _restore_placement(graph: Graph, model: onnx.ModelProto, segments: list[Segment]) -> None:
    """Copies device/replica (ONNX metadata) and segment membership back onto imported nodes."""
    by_name = {n.name: n for n in graph.nodes}
    for proto in model.graph.node:
        node = by_name.get(proto.name)
        if node is None:
            continue
        for prop in proto.metadata_props:
            if prop.key == "device":
                node.device = prop.value
            elif prop.key == "replica" and prop.value.lstrip("-").isdigit():
                node.replica = int(prop.value)
    for seg in segments:
        for proto in seg.model.graph.node:
            node = by_name.get(proto.name)
            if node is not None:
                node.meta["segment"] = seg.name


def load_plan(directory: str | os.PathLike[str], backend: str | None = None, *, trust: bool = False) -> LoadedPlan:
    """Loads a plan directory written by ``export`` and compiles it.

    A plan is code: its segments are ONNX graphs that run. Which directories load:

    1. With ``trust=True``, any (rules 2 and 3 are skipped; the checksums are still checked).
    2. A plan signed with this user's key (every export and save signs with it) loads from any folder.
       A signature that names this user's key but does not match the plan's manifest (a file was changed
       and its checksums rewritten: a forgery), or a malformed signature file, is refused.
    3. Any other plan (unsigned, signed by another user, or exported before signatures) loads only from a
       folder no other user can write: the directory, everything in it and every directory above it belong
       to this user or root and are not writable by group or others (sticky directories such as ``/tmp``
       above it excepted).

    See :mod:`graphdist.fsutil.trust` for the signing key (``~/.config/graphdist/signing-key``,
    ``GRAPHDIST_SIGNING_KEY``).

    Args:
        directory: The plan directory.
        backend: Backend to compile with (default: the one recorded at export).
        trust: Load it even from a folder others can write, signed by someone else or with a signature
            that does not verify: only for plans from people you trust.

    Returns:
        A :class:`LoadedPlan`, called like the step it was exported from.

    Raises:
        PlanError: The directory or ``plan.json`` is missing, ``plan.json``
            is not valid JSON, has another format or schema version, or lacks
            a key; a file is missing or fails its SHA-256 checksum; an ONNX
            file is invalid; the segments, collectives and tasks disagree;
            the directory is not trusted (rules above): the message names the
            folder, why, and the fix.
    """
    return _load(_Reader(Path(directory).absolute(), trust=trust), backend)


def load_files(files: dict[str, bytes], backend: str | None = None, label: str = "re-planned plan") -> LoadedPlan:
    """A :class:`LoadedPlan` from the files of a plan directory made in memory (a re-planned step),
    validated exactly as a directory is; its ``directory`` is ``None`` until it is saved.
    """
    return _load(_Reader(None, files, label), backend)


def _load(reader: _Reader, backend: str | None) -> LoadedPlan:
    from graphdist.backends import get_backend
    from graphdist.ir.onnx_io import from_onnx

    doc = _read_document(reader)
    get, strings = reader.get, reader.strings
    get(doc, "name", str, "plan.json")
    backend_name = backend or get(doc, "backend", str, "plan.json")

    # arguments and inputs
    arguments = get(doc, "arguments", dict, "plan.json")
    arg_treedef = decode_treedef(get(arguments, "structure", dict, "arguments"), "arguments.structure")
    arg_leaves = get(arguments, "leaves", list, "arguments")
    inputs: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(get(doc, "inputs", list, "plan.json")):
        where = f"inputs[{index}]"
        inputs[get(entry, "name", str, where)] = {
            "dtype": _parse_dtype(reader, get(entry, "dtype", str, where), where),
            "shape": tuple(get(entry, "shape", list, where)),
        }
    for index, leaf in enumerate(arg_leaves):
        where = f"arguments.leaves[{index}]"
        kind = get(leaf, "kind", str, where)
        names = [get(leaf, "input", str, where)] if kind == "tensor" else (
            strings(leaf, "inputs", where) if kind == "per_replica" else [])
        if kind not in ("tensor", "per_replica", "const", "variable", "opaque"):
            raise reader.error(f"plan.json: {where} has unknown kind {kind!r}; {REEXPORT}")
        unknown = [n for n in names if n not in inputs]
        if unknown:
            raise reader.error(f"plan.json: {where} feeds {unknown}, which 'inputs' does not list; {REEXPORT}")
    if count_leaves(arg_treedef) != len(arg_leaves):
        raise reader.error(f"plan.json: arguments.structure has {count_leaves(arg_treedef)} leaves but "
                           f"arguments.leaves lists {len(arg_leaves)}; {REEXPORT}")

    # variables and constants
    var_entries = get(doc, "variables", list, "plan.json")
    for index, entry in enumerate(var_entries):
        for key in ("name", "input", "entry"):
            get(entry, key, str, f"variables[{index}]")
    var_data = reader.read(get(doc, "variables_file", dict, "plan.json"), "variables_file")
    var_arrays = reader.arrays(var_data, var_entries, "variables", doc["variables_file"]["file"])
    variables = {entry["input"]: np.array(var_arrays[entry["entry"]], order="C", copy=True) for entry in var_entries}
    constants_info = get(doc, "constants", dict, "plan.json")
    const_entries = get(constants_info, "entries", list, "constants")
    const_arrays = reader.arrays(reader.read(constants_info, "constants"), const_entries, "constants.entries",
                                 constants_info["file"])
    constants = {get(e, "name", str, "constants.entries"): const_arrays[e["entry"]] for e in const_entries}
    updates = get(doc, "updates", list, "plan.json")
    for index, entry in enumerate(updates):
        target = get(entry, "variable", str, f"updates[{index}]")
        get(entry, "output", str, f"updates[{index}]")
        if target not in variables:
            raise reader.error(f"plan.json: updates[{index}] writes {target!r}, which is not a variable; {REEXPORT}")

    # segments and collectives
    segments = []
    for index, entry in enumerate(get(doc, "segments", list, "plan.json")):
        where = f"segments[{index}]"
        name = get(entry, "name", str, where)
        model = reader.model(entry, f"segment {name}")
        seg_inputs, seg_outputs = strings(entry, "inputs", where), strings(entry, "outputs", where)
        model_inputs = [v.name for v in model.graph.input
                        if v.name not in {t.name for t in model.graph.initializer}]
        if model_inputs != seg_inputs or [v.name for v in model.graph.output] != seg_outputs:
            raise reader.error(f"segment {name}: the inputs/outputs of {entry['file']} do not match plan.json; "
                               f"{REEXPORT}")
        try:
            graph = from_onnx(model)
        except GraphdistError as err:
            raise reader.error(f"segment {name}: {entry['file']} cannot be imported: {err}") from None
        graph.stage = "partitioned"
        segments.append(Segment(name, get(entry, "device", str, where), graph, seg_inputs, seg_outputs,
                                _model=model))
    comms = []
    for index, entry in enumerate(get(doc, "collectives", list, "plan.json")):
        where = f"collectives[{index}]"
        comms.append(CommTask(get(entry, "name", str, where), get(entry, "op", str, where),
                              get(entry, "attrs", dict, where), strings(entry, "inputs", where),
                              strings(entry, "outputs", where), strings(entry, "devices", where)))
        if not len(comms[-1].inputs) == len(comms[-1].outputs) == len(comms[-1].devices):
            raise reader.error(f"plan.json: {where} needs one input, output and device per participant; "
                               f"{REEXPORT}")

    # graphs (checked; the partitioned one is the plan's graph)
    graph_entries = get(doc, "graphs", dict, "plan.json")
    models = {stage: reader.model(entry, f"graph {stage}") for stage, entry in graph_entries.items()}
    plan_inputs = strings(doc, "plan_inputs", "plan.json")
    plan_outputs = strings(doc, "plan_outputs", "plan.json")
    if "partitioned" not in models:
        raise reader.error(f"plan.json: 'graphs' lacks the partitioned graph; {REEXPORT}")
    try:
        graph = from_onnx(models["partitioned"])
    except GraphdistError as err:
        raise reader.error(f"graph partitioned cannot be imported: {err}") from None
    graph.stage = "partitioned"
    _restore_placement(graph, models["partitioned"], segments)
    records = {e["input"]: _variable_spec(e) for e in var_entries}
    graph.meta.variables = [(name, spec) for name, (spec, _) in records.items()]
    graph.meta.placement = PlacementSpec({spec.uid: where for spec, where in records.values()})
    graph.meta.variable_updates = [(u["output"], records[u["variable"]][0].uid) for u in updates]
    if [v.name for v in graph.inputs] != plan_inputs or [v.name for v in graph.outputs] != plan_outputs:
        raise reader.error(f"the partitioned graph's inputs/outputs do not match plan.json's "
                           f"plan_inputs/plan_outputs; {REEXPORT}")

    # interface consistency
    fed = set(inputs) | set(variables)
    if set(plan_inputs) - fed:
        raise reader.error(f"plan.json: plan inputs {sorted(set(plan_inputs) - fed)[:3]} are fed by no argument or "
                           f"variable; {REEXPORT}")
    outputs = get(doc, "outputs", dict, "plan.json")
    result_names = strings(outputs, "names", "outputs")
    counts = get(outputs, "counts", list, "outputs")
    if not all(c is None or (type(c) is int and c > 0) for c in counts):
        raise reader.error(f"plan.json: outputs.counts must hold null or positive integers; {REEXPORT}")
    out_treedef = decode_treedef(get(outputs, "structure", dict, "outputs"), "outputs.structure")
    if (result_names + [u["output"] for u in updates] != plan_outputs
            or sum(1 if c is None else c for c in counts) != len(result_names)
            or count_leaves(out_treedef) != len(counts)):
        raise reader.error(f"plan.json: 'outputs', 'updates' and 'plan_outputs' disagree; {REEXPORT}")

    chunks = (doc.get("traced") or {}).get("deterministic_chunks")
    if chunks:  # op determinism: Plan.compile keeps to the intra-op thread counts it was checked with
        graph.meta.deterministic_chunks = chunks
    plan = Plan(graph, segments, constants, comms)
    _check_dag(reader, plan, doc, fed)
    plan.compile(get_backend(backend_name))
    loaded = LoadedPlan(reader.directory, doc, plan, reader.files, variables,
                        (outline(arg_treedef), arg_leaves), inputs)
    logger.info("loaded plan %s from %s (%d segment(s), backend %s)", loaded.name, reader.label,
                len(segments), plan.backend_name)
    return loaded
