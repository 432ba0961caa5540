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

Everything is written into a temporary directory next to ``directory``,
flushed to disk, and renamed into place, so an interrupted export leaves
either nothing or the previous plan at the destination (``overwrite=True``
renames the old plan aside, renames the new one in, then deletes the old).

``plan.json`` (``"format": "graphdist-plan"``, ``"version": 1``) holds the
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

import collections
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphdist import nest
from graphdist.compile.plan import CommTask, Plan, Segment
from graphdist.errors import GraphdistError, PlanError
from graphdist.ir.graph import Graph
from graphdist.ir.placement import KINDS, PlacementSpec, VariablePlacement, VariableSpec
from graphdist.trace.values import DistributedValues, PerReplica

__all__ = ["FORMAT", "FORMAT_VERSION", "LoadedPlan", "export_concrete", "export_plan", "load_plan",
           "write_plan_directory"]

logger = logging.getLogger(__name__)

FORMAT = "graphdist-plan"
FORMAT_VERSION = 1
PLAN_FILE = "plan.json"
STAGES = ("traced", "rewritten", "partitioned")
_REEXPORT = "re-export the plan from the step (concrete_function.export(directory))"


# ====================================================================== helpers
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _array_digest(array: np.ndarray) -> str:
    return _sha256(np.asarray(array, order="C").tobytes())


def _dtype_str(dtype: Any) -> str:
    return np.dtype(dtype).str


def _shape_list(shape: Any) -> list[Any]:
    return [int(d) if isinstance(d, (int, np.integer)) else str(d) for d in shape]


def _jsonable(value: Any, where: str) -> Any:
    """``value`` as plain JSON data (numpy scalars and tuples converted)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, where) for k, v in value.items()}
    raise PlanError(f"{where}: a {type(value).__name__} value ({value!r}) cannot be written to plan.json")


def _npz_bytes(arrays: list[tuple[str, np.ndarray]]) -> bytes:
    """A ``.npz`` archive of ``(entry, array)`` pairs written with ``allow_pickle=False``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for entry, array in arrays:
            if array.dtype.hasobject:
                raise PlanError(f"{entry}: arrays of Python objects cannot be exported (no pickle)")
            data = io.BytesIO()
            np.save(data, np.asarray(array, order="C"), allow_pickle=False)
            archive.writestr(f"{entry}.npy", data.getvalue())
    return buffer.getvalue()


# -------------------------------------------------------------- tree encoding
_KEY_TYPES = (str, int, float, bool)


def encode_treedef(treedef: nest.TreeDef, where: str = "structure") -> dict[str, Any]:
    """A JSON form of a :mod:`graphdist.nest` tree definition.

    Tuples, lists, dicts (keys: str, int, float, bool or None) and
    namedtuples (by type name and fields) are supported.
    """
    kind = treedef[0]
    if kind in ("leaf", "none"):
        return {"kind": kind}
    _, cls, keys, children = treedef
    node: dict[str, Any]
    if kind == "namedtuple":
        node = {"kind": "namedtuple", "type": cls.__name__, "fields": list(cls._fields)}
    elif kind == "dict":
        for key in keys:
            if key is not None and not isinstance(key, _KEY_TYPES):
                raise PlanError(f"{where}: a dict key of type {type(key).__name__} ({key!r}) cannot be exported; "
                                "use str or int keys")
        node = {"kind": "dict", "keys": list(keys)}
        if cls is not dict:
            node["type"] = cls.__name__
    elif issubclass(cls, tuple):
        node = {"kind": "tuple"}
    elif issubclass(cls, list):
        node = {"kind": "list"}
    else:
        raise PlanError(f"{where}: a container of type {cls.__name__} cannot be exported")
    node["children"] = [encode_treedef(c, where) for c in children]
    return node


def decode_treedef(data: Any, where: str = "structure") -> nest.TreeDef:
    """Inverse of :func:`encode_treedef` (namedtuples become look-alike namedtuple classes)."""
    classes: dict[tuple[str, tuple[str, ...]], type] = {}

    def decode(node: Any, path: str) -> nest.TreeDef:
        if not isinstance(node, dict) or not isinstance(node.get("kind"), str):
            raise PlanError(f"plan.json {path}: a structure node needs a 'kind'; {_REEXPORT}")
        kind = node["kind"]
        if kind in ("leaf", "none"):
            return (kind,)
        children_data = node.get("children")
        if not isinstance(children_data, list):
            raise PlanError(f"plan.json {path}: a {kind} node needs a 'children' list; {_REEXPORT}")
        children = tuple(decode(c, f"{path}.children[{i}]") for i, c in enumerate(children_data))
        if kind == "tuple":
            return ("tuple", tuple, None, children)
        if kind == "list":
            return ("list", list, None, children)
        if kind == "dict":
            keys = node.get("keys")
            if not isinstance(keys, list) or len(keys) != len(children):
                raise PlanError(f"plan.json {path}: a dict node needs one key per child; {_REEXPORT}")
            cls = collections.OrderedDict if node.get("type") == "OrderedDict" else dict
            return ("dict", cls, tuple(keys), children)
        if kind == "namedtuple":
            name, fields = node.get("type"), node.get("fields")
            if not isinstance(name, str) or not isinstance(fields, list) or len(fields) != len(children):
                raise PlanError(f"plan.json {path}: a namedtuple node needs 'type' and one field per child; "
                                f"{_REEXPORT}")
            key = (name, tuple(fields))
            if key not in classes:
                try:
                    classes[key] = collections.namedtuple(name, fields)  # noqa: PYI024 - rebuilt from data
                except ValueError as err:
                    raise PlanError(f"plan.json {path}: bad namedtuple {name}{fields}: {err}") from None
            return ("namedtuple", classes[key], None, children)
        raise PlanError(f"plan.json {path}: unknown structure kind {kind!r}; {_REEXPORT}")

    return decode(data, where)


def _outline(treedef: nest.TreeDef) -> Any:
    """The shape of a tree without container types (sequences compare by length, dicts by keys)."""
    kind = treedef[0]
    if kind in ("leaf", "none"):
        return kind
    children = tuple(_outline(c) for c in treedef[3])
    if kind == "dict":
        return ("dict", tuple(treedef[2]), children)
    return ("seq", children)


def _describe_outline(outline: Any) -> str:
    if outline == "leaf":
        return "x"
    if outline == "none":
        return "None"
    if outline[0] == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe_outline(c)}" for k, c in zip(outline[1], outline[2])) + "}"
    return "(" + ", ".join(_describe_outline(c) for c in outline[1]) + ")"


# ============================================================= directory write
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def write_plan_directory(directory: str | os.PathLike[str], files: dict[str, bytes], overwrite: bool = False,
                         marker: str = PLAN_FILE) -> Path:
    """Writes ``files`` (relative path -> bytes) as the directory ``directory``, atomically.

    The files go to a temporary directory next to ``directory``, are flushed
    to disk and the temporary directory is renamed into place (an existing
    empty directory is replaced). With
    ``overwrite`` an existing plan directory is renamed aside, the new one
    renamed in, and the old one deleted. ``marker`` is the file that makes
    an existing directory one this function may replace (``plan.json``; a
    saved Keras model's ``model.json``), so a user's unrelated directory is
    never deleted.

    Raises:
        PlanError: ``directory`` exists and ``overwrite`` is false, or it is
            not empty and has no ``marker`` file.
    """
    dest = Path(directory).absolute()
    if dest.is_dir() and not any(dest.iterdir()):
        pass  # an empty directory is replaced like a missing one
    elif dest.exists():
        if not overwrite:
            raise PlanError(f"{dest} already exists; pass overwrite=True to replace it or choose another directory")
        if not dest.is_dir() or (any(dest.iterdir()) and not (dest / marker).is_file()):
            raise PlanError(f"{dest} exists and is not a directory graphdist wrote (no {marker}); refusing to replace "
                            "it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        for rel, data in files.items():
            _write_file(tmp / rel, data)
        for sub in sorted({(tmp / rel).parent for rel in files}, key=lambda p: -len(p.parts)):
            _fsync_dir(sub)
        _fsync_dir(tmp)
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        if dest.exists():
            aside = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(dest, aside)
            try:
                os.replace(tmp, dest)
            except BaseException:
                os.replace(aside, dest)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


# =================================================================== export
def _segment_file(index: int, name: str) -> str:
    return f"segments/{index:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.onnx"


def _task_dag(plan: Plan) -> list[dict[str, Any]]:
    """Tasks (segments and communication) in a topological order with their dependencies."""
    tasks = [("segment", s) for s in plan.segments] + [("collective", c) for c in plan.comms]
    ids = [f"{kind}:{task.name}" for kind, task in tasks]
    producer = {out: ids[i] for i, (_, task) in enumerate(tasks) for out in task.outputs}
    deps = [sorted({producer[n] for n in task.inputs if n in producer}) for _, task in tasks]
    order: list[dict[str, Any]] = []
    placed: set[str] = set()
    pending = list(range(len(tasks)))
    while pending:
        ready = [i for i in pending if set(deps[i]) <= placed]
        if not ready:
            stuck = ", ".join(ids[i] for i in pending)
            raise PlanError(f"plan {plan.graph.name!r} has a dependency cycle among {stuck}")
        for i in ready:
            order.append({"id": ids[i], "kind": tasks[i][0], "name": tasks[i][1].name, "deps": deps[i]})
            placed.add(ids[i])
        pending = [i for i in pending if ids[i] not in placed]
    return order


def _value_entry(plan: Plan, name: str) -> dict[str, Any]:
    value = plan.graph_value(name)
    if value is None:
        raise PlanError(f"plan {plan.graph.name!r}: value {name!r} is not in the partitioned graph")
    return {"name": name, "dtype": _dtype_str(value.dtype), "shape": _shape_list(value.shape)}


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


def _concrete_interface(concrete: Any) -> _Interface:
    plan: Plan = concrete.plan
    input_names = list(concrete._input_names)
    treedef, leaf_sigs = concrete._signature
    variable_inputs = {id(v): name for name, v in concrete._variable_feeds}
    leaves: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []
    position = 0

    def tensor(sig: Any, leaf: int, replica: int | None) -> str:
        nonlocal position
        name = input_names[position]
        position += 1
        inputs.append({"name": name, "dtype": np.dtype(sig[1]).str, "shape": _shape_list(sig[0]), "arg": leaf,
                       "replica": replica})
        return name

    for index, sig in enumerate(leaf_sigs):
        tag = sig[0] if isinstance(sig[0], str) else None
        if tag is None:
            leaves.append({"kind": "tensor", "input": tensor(sig, index, None)})
        elif tag == "per_replica":
            if not all(len(c) == 2 and not isinstance(c[0], str) for c in sig[1]):
                raise PlanError(f"{concrete.name}: argument leaf {index} is a distributed value whose components "
                                "are not arrays; only arrays can be exported as per-replica inputs")
            leaves.append({"kind": "per_replica",
                           "inputs": [tensor(c, index, r) for r, c in enumerate(sig[1])]})
        elif tag == "variable":
            leaves.append({"kind": "variable", "variable": variable_inputs.get(sig[1])})
        elif tag == "const" and (sig[2] is None or isinstance(sig[2], _KEY_TYPES)):
            leaves.append({"kind": "const", "type": type(sig[2]).__name__, "value": sig[2]})
        else:
            leaves.append({"kind": "opaque", "type": sig[1].__name__ if tag == "const" else "object"})
    if position != len(input_names):
        raise PlanError(f"{concrete.name}: the argument signature feeds {position} inputs but the step has "
                        f"{len(input_names)}")

    num_results = concrete._num_results
    update_of = {id(v): out for out, v in concrete._updates}
    variables, arrays = [], []
    placements = concrete.graph("rewritten").meta.get("placement") or PlacementSpec()
    for index, (name, variable) in enumerate(concrete._variable_feeds):
        array = np.array(variable._value, order="C", copy=True)
        where = placements.get(variable.uid) or VariablePlacement("local", (variable.device or "cpu:0",))
        readers = [s.name for s in plan.segments if name in s.inputs] + [c.name for c in plan.comms if name in c.inputs]
        variables.append({
            "name": variable.name, "input": name, "kind": type(variable).__name__, "dtype": array.dtype.str,
            "shape": list(array.shape), "device": variable.device, "placement": where.kind,
            "devices": list(where.devices), "read_by": readers,
            "trainable": bool(variable.trainable), "update_output": update_of.get(id(variable)),
            "entry": f"v{index}", "sha256": _array_digest(array),
        })
        arrays.append(array)
    updates = []
    for output, variable in concrete._updates:
        if id(variable) not in variable_inputs:
            raise PlanError(f"{concrete.name}: variable {variable.name} is updated but never read by the step")
        updates.append({"output": output, "variable": variable_inputs[id(variable)]})
    outputs = {
        "names": list(plan.output_names[:num_results]),
        "values": [_value_entry(plan, n) for n in plan.output_names[:num_results]],
        "structure": encode_treedef(concrete._output_treedef, "the step's result"),
        "counts": list(concrete._output_counts),
    }
    arguments = {"structure": encode_treedef(treedef, "the step's arguments"), "leaves": leaves}
    return _Interface(arguments, inputs, variables, arrays, updates, outputs)


def _plan_files(plan: Plan, name: str, interface: _Interface, graphs: dict[str, bytes],
                strategy: str | None) -> dict[str, bytes]:
    """Every file of a plan directory (``plan.json`` last, with the others' checksums)."""
    files: dict[str, bytes] = {}

    def add(rel: str, data: bytes) -> dict[str, str]:
        files[rel] = data
        return {"file": rel, "sha256": _sha256(data)}

    segments = []
    for index, seg in enumerate(plan.segments):
        entry = add(_segment_file(index, seg.name), seg.model.SerializeToString())
        segments.append({"name": seg.name, "device": seg.device, **entry, "inputs": list(seg.inputs),
                         "outputs": list(seg.outputs)})
    collectives = []
    for c in plan.comms:
        buffer = plan.graph_value(c.inputs[0]) if c.inputs else None
        collectives.append({
            "name": c.name, "op": c.op, "attrs": _jsonable(c.attrs, f"collective {c.name}"), "inputs": list(c.inputs),
            "outputs": list(c.outputs), "devices": list(c.devices),
            "buffer": None if buffer is None else {"dtype": _dtype_str(buffer.dtype),
                                                   "shape": _shape_list(buffer.shape)},
        })
    constants = [(f"c{i}", np.asarray(a)) for i, a in enumerate(plan.constants.values())]
    constant_entries = [{"name": n, "entry": e, "dtype": a.dtype.str, "shape": list(a.shape),
                         "sha256": _array_digest(a)} for n, (e, a) in zip(plan.constants, constants)]
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "graphdist_version": _version(),
        "name": name,
        "backend": plan.backend_name,
        "strategy": strategy,
        "devices": list(plan.devices),
        "plan_inputs": list(plan.input_names),
        "plan_outputs": list(plan.output_names),
        "arguments": interface.arguments,
        "inputs": interface.inputs,
        "variables": interface.variables,
        "variables_file": add("variables.npz", _npz_bytes([(v["entry"], a) for v, a in
                                                           zip(interface.variables, interface.arrays)])),
        "updates": interface.updates,
        "constants": {**add("constants.npz", _npz_bytes(constants)), "entries": constant_entries},
        "segments": segments,
        "collectives": collectives,
        "tasks": _task_dag(plan),
        "outputs": interface.outputs,
        "graphs": {stage: add(f"graphs/{stage}.onnx", data) for stage, data in graphs.items()},
    }
    files[PLAN_FILE] = (json.dumps(doc, indent=1) + "\n").encode()
    return files


def _version() -> str:
    import graphdist

    return getattr(graphdist, "__version__", "unknown")


def export_concrete(concrete: Any, directory: str | os.PathLike[str], *, overwrite: bool = False) -> str:
    """Writes the plan of ``concrete`` (a ``ConcreteFunction``) with its current variables to ``directory``.

    Returns:
        The directory's absolute path.

    Raises:
        PlanError: ``directory`` exists (without ``overwrite``), the plan is
            not compiled, or the step's arguments or results cannot be
            described in JSON.
    """
    plan: Plan = concrete.plan
    if not plan.compiled:
        raise PlanError(f"{concrete.name}: the plan is not compiled; compile it before exporting")
    interface = _concrete_interface(concrete)
    graphs = {stage: concrete.graph(stage).to_onnx().SerializeToString() for stage in STAGES}
    strategy = type(concrete.strategy).__name__ if concrete.strategy is not None else None
    files = _plan_files(plan, concrete.name, interface, graphs, strategy)
    dest = write_plan_directory(directory, files, overwrite)
    logger.info("exported plan %s (%d segment(s), %d variable(s)) to %s", concrete.name, len(plan.segments),
                len(interface.variables), dest)
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
    graphs = {"partitioned": plan.graph.to_onnx().SerializeToString()}
    files = _plan_files(plan, plan.graph.name, _bare_interface(plan), graphs, None)
    return str(write_plan_directory(directory, files, overwrite))


# ===================================================================== load
class _Reader:
    """Reads and validates the files of a plan directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, bytes] = {}

    def error(self, message: str) -> PlanError:
        return PlanError(f"plan directory {self.directory}: {message}")

    def get(self, obj: Any, key: str, kind: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            if optional:
                return None
            owner = "plan.json" if where == "plan.json" else f"plan.json: {where}"
            raise self.error(f"{owner} lacks the required key {key!r}; the file is damaged or was "
                             f"edited: {_REEXPORT}")
        value = obj[key]
        if optional and value is None:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            path = key if where == "plan.json" else f"{where}.{key}"
            raise self.error(f"plan.json: {path} must be a {names}, got {type(value).__name__}; {_REEXPORT}")
        return value

    def strings(self, obj: Any, key: str, where: str) -> list[str]:
        values = self.get(obj, key, list, where)
        if not all(isinstance(v, str) for v in values):
            raise self.error(f"plan.json: {where}.{key} must be a list of strings; {_REEXPORT}")
        return values

    def read(self, entry: Any, where: str) -> bytes:
        """The bytes of the file ``entry`` names, after checking its SHA-256."""
        rel = self.get(entry, "file", str, where)
        digest = self.get(entry, "sha256", str, where)
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            raise self.error(f"plan.json: {where} names the file {rel!r} outside the plan directory; {_REEXPORT}")
        path = self.directory / rel
        if not path.is_file():
            raise self.error(f"{where}: the file {rel} is missing; the plan directory is incomplete: {_REEXPORT}")
        data = path.read_bytes()
        if _sha256(data) != digest:
            raise self.error(f"{where}: the file {rel} fails its SHA-256 checksum (it was modified, truncated or "
                             f"corrupted after export); {_REEXPORT}")
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
                             f"{_REEXPORT}") from None
        return model

    def arrays(self, data: bytes, entries: list[dict[str, Any]], where: str, rel: str) -> dict[str, np.ndarray]:
        """The arrays of a ``.npz`` file, keyed by entry, checked against ``entries``."""
        out: dict[str, np.ndarray] = {}
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as archive:
                for index, info in enumerate(entries):
                    at = f"{where}[{index}]"
                    entry = self.get(info, "entry", str, at)
                    if entry not in archive.files:
                        raise self.error(f"{rel} has no entry {entry!r} for {info.get('name')!r}; {_REEXPORT}")
                    array = archive[entry]
                    dtype = _parse_dtype(self, self.get(info, "dtype", str, at), at)
                    shape = self.get(info, "shape", list, at)
                    if array.dtype != dtype or list(array.shape) != shape:
                        raise self.error(f"{rel}: {info.get('name')!r} is {array.dtype}{list(array.shape)}, plan.json "
                                         f"says {dtype}{shape}; {_REEXPORT}")
                    if _array_digest(array) != self.get(info, "sha256", str, at):
                        raise self.error(f"{rel}: the value of {info.get('name')!r} fails its SHA-256 checksum; "
                                         f"{_REEXPORT}")
                    out[entry] = array
        except GraphdistError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
            raise self.error(f"{rel} cannot be read ({type(err).__name__}: {err}); {_REEXPORT}") from None
        return out


def _parse_dtype(reader: _Reader, text: str, where: str) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise reader.error(f"plan.json: {where} has an unknown dtype {text!r}; {_REEXPORT}") from None
    if dtype.hasobject or dtype.kind == "V":
        raise reader.error(f"plan.json: {where} has dtype {text!r}; only numeric arrays can be loaded")
    return dtype


def _read_document(reader: _Reader) -> dict[str, Any]:
    directory = reader.directory
    if not directory.is_dir():
        raise PlanError(f"plan directory {directory} does not exist; pass the directory that plan.export() wrote")
    path = directory / PLAN_FILE
    if not path.is_file():
        raise reader.error(f"{PLAN_FILE} is missing, so this is not an exported plan (or the export did not "
                           f"finish); {_REEXPORT}")
    try:
        doc = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise reader.error(f"{PLAN_FILE} is corrupt: it is not valid JSON ({err}); {_REEXPORT}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise reader.error(f"{PLAN_FILE} has format {found!r}, expected {FORMAT!r}; it is not a graphdist plan")
    version = doc.get("version")
    if version != FORMAT_VERSION:
        raise reader.error(f"{PLAN_FILE} has schema version {version!r}, but this graphdist (version {_version()}) "
                           f"reads version {FORMAT_VERSION}; re-export the plan with this version of graphdist")
    return doc


def _check_dag(reader: _Reader, plan: Plan, doc: dict[str, Any], available: set[str]) -> None:
    """The recorded task DAG equals the one the segments and collectives imply, and everything read exists."""
    recorded = reader.get(doc, "tasks", list, "plan.json")
    derived = _task_dag(plan)
    def as_set(tasks: list[Any]) -> set[tuple[Any, ...]]:
        return {(t.get("id"), t.get("kind"), frozenset(t.get("deps") or ())) for t in tasks}

    if not all(isinstance(t, dict) and isinstance(t.get("deps", []), list) for t in recorded) \
            or as_set(recorded) != as_set(derived):
        raise reader.error(f"plan.json: 'tasks' does not match the segments' and collectives' inputs and outputs; "
                           f"the file was edited: {_REEXPORT}")
    produced = set(available) | set(plan.constants)
    for task in plan.segments + plan.comms:
        produced.update(task.outputs)
    for task in plan.segments + plan.comms:
        missing = [n for n in task.inputs if n not in produced]
        if missing:
            raise reader.error(f"plan.json: {task.name} reads {missing[:3]}, which nothing produces; {_REEXPORT}")
    missing = [n for n in plan.output_names if n not in produced]
    if missing:
        raise reader.error(f"plan.json: the outputs {missing[:3]} are produced by no task; {_REEXPORT}")


def _variable_spec(entry: dict[str, Any]) -> tuple[VariableSpec, VariablePlacement]:
    """What a loaded plan knows of a variable: its spec (the uid is its input name) and placement."""
    name = str(entry["name"]).removesuffix(":0")
    spec = VariableSpec(str(entry["input"]), name, np.dtype(entry["dtype"]).str, tuple(int(d) for d in entry["shape"]),
                        bool(entry.get("trainable", True)), str(entry.get("kind", "Variable")))
    kind = entry.get("placement")
    devices = tuple(str(d) for d in entry.get("devices") or ([entry["device"]] if entry.get("device") else []))
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


class LoadedPlan:
    """A plan loaded from a directory: call it like the step it was exported from.

    Arguments are numpy arrays (and the Python constants the step was traced
    with). Where the step took per-replica values, pass a
    :class:`~graphdist.PerReplica` or a plain numpy global batch, which is
    split across replicas as ``experimental_distribute_dataset`` would.
    Results have the step's structure (``PerReplica`` where the step returned
    per-replica values). Every call updates the plan's variables.

    Attributes:
        directory: The directory it was loaded from (or last saved to in place).
        name: The step's name.
        plan: The runnable :class:`~graphdist.compile.plan.Plan`.
        backend_name: The backend its segments were compiled with.
        devices: Devices it runs on.
        metadata: The parsed ``plan.json``.
    """

    def __init__(self, directory: Path, doc: dict[str, Any], plan: Plan, files: dict[str, bytes],
                 variables: dict[str, np.ndarray], arguments: tuple[Any, list[dict[str, Any]]],
                 inputs: dict[str, dict[str, Any]]) -> None:
        # Private: use load_plan().
        self.directory = directory
        self.metadata = doc
        self.name: str = doc["name"]
        self.plan = plan
        self.backend_name = plan.backend_name
        self.devices = list(plan.devices)
        self._files = files
        self._variables = variables
        self._arg_outline, self._arg_leaves = arguments
        self._inputs = inputs
        self._updates = [(u["output"], u["variable"]) for u in doc["updates"]]
        outputs = doc["outputs"]
        self._num_results = len(outputs["names"])
        self._output_treedef = decode_treedef(outputs["structure"], "outputs.structure")
        self._output_counts: list[int | None] = list(outputs["counts"])
        self._graphs: dict[str, Graph] = {"partitioned": plan.graph}
        plan._owner = weakref.ref(self)

    # ------------------------------------------------------------ calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = nest.flatten((args, kwargs), is_leaf=lambda v: isinstance(v, DistributedValues))
        outline = _outline(treedef)
        if outline != self._arg_outline:
            raise PlanError(f"plan {self.name!r} is called with arguments shaped {_describe_outline(outline)}, but "
                            f"the step was exported for {_describe_outline(self._arg_outline)} (x: an array)")
        feeds: dict[str, np.ndarray] = {}
        for index, (leaf, spec) in enumerate(zip(leaves, self._arg_leaves)):
            kind = spec["kind"]
            if kind == "tensor":
                feeds[spec["input"]] = self._tensor(leaf, spec["input"], index)
            elif kind == "per_replica":
                feeds.update(zip(spec["inputs"], self._components(leaf, spec["inputs"], index)))
            elif kind == "const" and _differs(leaf, spec["value"]):
                raise PlanError(f"plan {self.name!r}: argument leaf {index} was the constant {spec['value']!r} when "
                                f"the step was traced (it is part of the plan), got {leaf!r}")
        feeds.update(self._variables)
        outputs = self.plan.run(feeds)
        for (_, variable), value in zip(self._updates, outputs[self._num_results:]):
            current = self._variables[variable]
            self._variables[variable] = np.array(value, dtype=current.dtype, order="C", copy=True)
        outputs = [out[()] if out.ndim == 0 else out for out in outputs[: self._num_results]]
        leaves_out, position = [], 0
        for count in self._output_counts:
            if count is None:
                leaves_out.append(outputs[position])
                position += 1
            else:
                leaves_out.append(PerReplica(outputs[position: position + count]))
                position += count
        return nest.unflatten(self._output_treedef, leaves_out)

    def _tensor(self, value: Any, name: str, index: int) -> np.ndarray:
        spec = self._inputs[name]
        if isinstance(value, DistributedValues):
            raise PlanError(f"plan {self.name!r}: argument leaf {index} ({name}) was a single array when the step "
                            f"was exported, got a {type(value).__name__}")
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
        else:
            try:
                array = np.asarray(value, dtype=spec["dtype"])
            except (TypeError, ValueError) as err:
                raise PlanError(f"plan {self.name!r}: argument leaf {index} ({name}) must be an array, got "
                                f"{type(value).__name__} ({err})") from None
        if array.dtype != spec["dtype"] or tuple(array.shape) != spec["shape"]:
            raise PlanError(f"plan {self.name!r}: argument leaf {index} ({name}) must be "
                            f"{spec['dtype'].name}{list(spec['shape'])}, got {array.dtype.name}{list(array.shape)}; "
                            "an exported plan is specialised to the shapes it was traced with")
        return array

    def _components(self, value: Any, names: list[str], index: int) -> list[np.ndarray]:
        count = len(names)
        if isinstance(value, DistributedValues):
            if len(value.values) != count:
                raise PlanError(f"plan {self.name!r}: argument leaf {index} needs {count} replica components, got "
                                f"{len(value.values)}")
            return [self._tensor(v, n, index) for v, n in zip(value.values, names)]
        from graphdist.data.split import split_global_batch

        array = np.asarray(value)
        shapes = [self._inputs[n]["shape"] for n in names]
        if array.ndim == 0 or any(len(s) == 0 for s in shapes):
            raise PlanError(f"plan {self.name!r}: argument leaf {index} takes one value per replica ({count}); pass "
                            "a PerReplica or a global batch (an array whose first dimension is split across "
                            f"replicas), got {array.dtype.name}{list(array.shape)}")
        full = max(int(array.shape[0]), max(int(s[0]) for s in shapes) * count)
        parts = [part[0] for part in split_global_batch([array], full, count, range(count))]
        if [p.shape for p in parts] != shapes:
            raise PlanError(
                f"plan {self.name!r}: argument leaf {index}: a global batch of shape {list(array.shape)} splits "
                f"into {[list(p.shape) for p in parts]} across {count} replicas, but the plan was exported for "
                f"per-replica shapes {[list(s) for s in shapes]} (global batch "
                f"{sum(int(s[0]) for s in shapes)}); pass a global batch of that size")
        return [self._tensor(p, n, index) for p, n in zip(parts, names)]

    # ------------------------------------------------------------- state
    @property
    def variables(self) -> dict[str, np.ndarray]:
        """Current variable values (copies), keyed by the variable's input name (``mlp/dense_0/kernel``)."""
        return {name: value.copy() for name, value in self._variables.items()}

    def graph(self, stage: str = "partitioned") -> Graph:
        """The exported graph at ``stage`` (``"traced"``, ``"rewritten"`` or ``"partitioned"``)."""
        if stage not in self._graphs:
            from graphdist.ir.onnx_io import from_onnx

            entry = self.metadata["graphs"].get(stage)
            if entry is None:
                raise PlanError(f"plan {self.name!r} has no {stage!r} graph; it has "
                                f"{', '.join(self.metadata['graphs']) or 'none'}")
            graph = from_onnx(onnx.ModelProto.FromString(self._files[entry["file"]]))
            graph.stage = stage
            self._graphs[stage] = graph
        return self._graphs[stage]

    def summary(self) -> str:
        """The plan's summary table (see :meth:`Plan.summary`)."""
        return self.plan.summary()

    # -------------------------------------------------------------- save
    def _current_files(self) -> dict[str, bytes]:
        doc = json.loads(json.dumps(self.metadata))
        arrays = []
        for info in doc["variables"]:
            array = self._variables[info["input"]]
            info["sha256"] = _array_digest(array)
            arrays.append((info["entry"], array))
        data = _npz_bytes(arrays)
        doc["variables_file"] = {"file": doc["variables_file"]["file"], "sha256": _sha256(data)}
        files = dict(self._files)
        files[doc["variables_file"]["file"]] = data
        files[PLAN_FILE] = (json.dumps(doc, indent=1) + "\n").encode()
        return files

    def save(self, directory: str | os.PathLike[str] | None = None, *, overwrite: bool = False) -> str:
        """Writes the plan with its current variables, atomically.

        Args:
            directory: Where to write; ``None`` (default) replaces the
                directory the plan was loaded from (``variables.npz`` and its
                checksum in ``plan.json`` change together: the whole
                directory is rewritten and swapped in, so files other than
                the plan's own are not kept).
            overwrite: Replace an existing plan at ``directory``.

        Returns:
            The directory's absolute path.
        """
        target = Path(directory).absolute() if directory is not None else self.directory
        in_place = target.resolve() == self.directory.resolve()
        files = self._current_files()
        dest = write_plan_directory(target, files, overwrite or in_place)
        if in_place:
            self._files = {k: v for k, v in files.items() if k != PLAN_FILE}
            self.metadata = json.loads(files[PLAN_FILE])
        logger.info("saved plan %s to %s", self.name, dest)
        return str(dest)

    def export(self, directory: str | os.PathLike[str], *, overwrite: bool = False) -> str:
        """Same as :meth:`save` to ``directory`` (what ``loaded.plan.export(directory)`` calls)."""
        return self.save(directory, overwrite=overwrite)

    def __repr__(self) -> str:
        return (f"<LoadedPlan {self.name!r} from {self.directory} segments={len(self.plan.segments)} "
                f"devices={self.devices} backend={self.backend_name}>")


def load_plan(directory: str | os.PathLike[str], backend: str | None = None) -> LoadedPlan:
    """Loads a plan directory written by ``export`` and compiles it.

    Args:
        directory: The plan directory.
        backend: Backend to compile with (default: the one recorded at export).

    Returns:
        A :class:`LoadedPlan`, called like the step it was exported from.

    Raises:
        PlanError: The directory or ``plan.json`` is missing, ``plan.json``
            is not valid JSON, has another format or schema version, or lacks
            a key; a file is missing or fails its SHA-256 checksum; an ONNX
            file is invalid; the segments, collectives and tasks disagree.
    """
    from graphdist.backends import get_backend
    from graphdist.ir.onnx_io import from_onnx

    reader = _Reader(Path(directory).absolute())
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
            raise reader.error(f"plan.json: {where} has unknown kind {kind!r}; {_REEXPORT}")
        unknown = [n for n in names if n not in inputs]
        if unknown:
            raise reader.error(f"plan.json: {where} feeds {unknown}, which 'inputs' does not list; {_REEXPORT}")
    if _count_leaves(arg_treedef) != len(arg_leaves):
        raise reader.error(f"plan.json: arguments.structure has {_count_leaves(arg_treedef)} leaves but "
                           f"arguments.leaves lists {len(arg_leaves)}; {_REEXPORT}")

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
            raise reader.error(f"plan.json: updates[{index}] writes {target!r}, which is not a variable; {_REEXPORT}")

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
                               f"{_REEXPORT}")
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
                               f"{_REEXPORT}")

    # graphs (checked; the partitioned one is the plan's graph)
    graph_entries = get(doc, "graphs", dict, "plan.json")
    models = {stage: reader.model(entry, f"graph {stage}") for stage, entry in graph_entries.items()}
    plan_inputs = strings(doc, "plan_inputs", "plan.json")
    plan_outputs = strings(doc, "plan_outputs", "plan.json")
    if "partitioned" not in models:
        raise reader.error(f"plan.json: 'graphs' lacks the partitioned graph; {_REEXPORT}")
    try:
        graph = from_onnx(models["partitioned"])
    except GraphdistError as err:
        raise reader.error(f"graph partitioned cannot be imported: {err}") from None
    graph.stage = "partitioned"
    _restore_placement(graph, models["partitioned"], segments)
    records = {e["input"]: _variable_spec(e) for e in var_entries}
    graph.meta["variables"] = [(name, spec) for name, (spec, _) in records.items()]
    graph.meta["placement"] = PlacementSpec({spec.uid: where for spec, where in records.values()})
    graph.meta["variable_updates"] = [(u["output"], records[u["variable"]][0].uid) for u in updates]
    if [v.name for v in graph.inputs] != plan_inputs or [v.name for v in graph.outputs] != plan_outputs:
        raise reader.error(f"the partitioned graph's inputs/outputs do not match plan.json's "
                           f"plan_inputs/plan_outputs; {_REEXPORT}")

    # interface consistency
    fed = set(inputs) | set(variables)
    if set(plan_inputs) - fed:
        raise reader.error(f"plan.json: plan inputs {sorted(set(plan_inputs) - fed)[:3]} are fed by no argument or "
                           f"variable; {_REEXPORT}")
    outputs = get(doc, "outputs", dict, "plan.json")
    result_names = strings(outputs, "names", "outputs")
    counts = get(outputs, "counts", list, "outputs")
    if not all(c is None or (type(c) is int and c > 0) for c in counts):
        raise reader.error(f"plan.json: outputs.counts must hold null or positive integers; {_REEXPORT}")
    out_treedef = decode_treedef(get(outputs, "structure", dict, "outputs"), "outputs.structure")
    if (result_names + [u["output"] for u in updates] != plan_outputs
            or sum(1 if c is None else c for c in counts) != len(result_names)
            or _count_leaves(out_treedef) != len(counts)):
        raise reader.error(f"plan.json: 'outputs', 'updates' and 'plan_outputs' disagree; {_REEXPORT}")

    plan = Plan(graph, segments, constants, comms)
    _check_dag(reader, plan, doc, fed)
    plan.compile(get_backend(backend_name))
    loaded = LoadedPlan(reader.directory, doc, plan, reader.files, variables,
                        (_outline(arg_treedef), arg_leaves), inputs)
    logger.info("loaded plan %s from %s (%d segment(s), backend %s)", loaded.name, reader.directory,
                len(segments), plan.backend_name)
    return loaded


def _count_leaves(treedef: nest.TreeDef) -> int:
    if treedef[0] == "leaf":
        return 1
    if treedef[0] == "none":
        return 0
    return sum(_count_leaves(c) for c in treedef[3])


def _differs(value: Any, constant: Any) -> bool:
    """Whether an argument differs from the Python constant the step was traced with."""
    if isinstance(value, (np.ndarray, DistributedValues)) or type(value) is not type(constant):
        return not (isinstance(value, (int, float)) and isinstance(constant, (int, float))
                    and not isinstance(value, bool) and not isinstance(constant, bool) and value == constant)
    return bool(value != constant)
