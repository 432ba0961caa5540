"""The plan directory format: its constants, checksums, JSON helpers and the atomic directory writer.

Shared by the writer (:mod:`graphdist.compile.export`), the reader
(:mod:`graphdist.compile.load`) and saved Keras models. See
:mod:`graphdist.compile.export` for the layout of a plan directory.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.errors import GraphdistError, PlanError, StorageError
from graphdist.fsutil import write_directory

__all__ = ["FORMAT", "FORMAT_VERSION", "READABLE_VERSIONS", "MANIFEST_REQUIRED_FROM", "PLAN_FILE", "PLAN_KIND",
           "STAGES", "encode_treedef", "decode_treedef", "write_plan_directory"]

FORMAT = "graphdist-plan"
FORMAT_VERSION = 3
#: Versions this graphdist reads (version 1 plans run but cannot be re-planned: they lack the step's
#: interface and the traced graph's replica annotations; from version 3 the directory's manifest, with
#: the SHA-256 of plan.json too, is required).
READABLE_VERSIONS = (1, 2, 3)
#: The first version whose directory must hold a manifest (earlier ones load with a warning without it).
MANIFEST_REQUIRED_FROM = 3
PLAN_FILE = "plan.json"
STAGES = ("traced", "rewritten", "partitioned")
REEXPORT = "re-export the plan from the step (concrete_function.export(directory))"


# ====================================================================== helpers
def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def array_digest(array: np.ndarray) -> str:
    return sha256_of(np.asarray(array, order="C").tobytes())


def dtype_str(dtype: Any) -> str:
    return np.dtype(dtype).str


def shape_list(shape: Any) -> list[Any]:
    return [int(d) if isinstance(d, (int, np.integer)) else str(d) for d in shape]


def jsonable(value: Any, where: str) -> Any:
    """``value`` as plain JSON data (numpy scalars and tuples converted)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v, where) for k, v in value.items()}
    raise PlanError(f"{where}: a {type(value).__name__} value ({value!r}) cannot be written to plan.json")


def npz_bytes(arrays: list[tuple[str, np.ndarray]]) -> bytes:
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
KEY_TYPES = (str, int, float, bool)


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
            if key is not None and not isinstance(key, KEY_TYPES):
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
            raise PlanError(f"plan.json {path}: a structure node needs a 'kind'; {REEXPORT}")
        kind = node["kind"]
        if kind in ("leaf", "none"):
            return (kind,)
        children_data = node.get("children")
        if not isinstance(children_data, list):
            raise PlanError(f"plan.json {path}: a {kind} node needs a 'children' list; {REEXPORT}")
        children = tuple(decode(c, f"{path}.children[{i}]") for i, c in enumerate(children_data))
        if kind == "tuple":
            return ("tuple", tuple, None, children)
        if kind == "list":
            return ("list", list, None, children)
        if kind == "dict":
            keys = node.get("keys")
            if not isinstance(keys, list) or len(keys) != len(children):
                raise PlanError(f"plan.json {path}: a dict node needs one key per child; {REEXPORT}")
            cls = collections.OrderedDict if node.get("type") == "OrderedDict" else dict
            return ("dict", cls, tuple(keys), children)
        if kind == "namedtuple":
            name, fields = node.get("type"), node.get("fields")
            if not isinstance(name, str) or not isinstance(fields, list) or len(fields) != len(children):
                raise PlanError(f"plan.json {path}: a namedtuple node needs 'type' and one field per child; "
                                f"{REEXPORT}")
            key = (name, tuple(fields))
            if key not in classes:
                try:
                    classes[key] = collections.namedtuple(name, fields)  # noqa: PYI024 - rebuilt from data
                except ValueError as err:
                    raise PlanError(f"plan.json {path}: bad namedtuple {name}{fields}: {err}") from None
            return ("namedtuple", classes[key], None, children)
        raise PlanError(f"plan.json {path}: unknown structure kind {kind!r}; {REEXPORT}")

    return decode(data, where)


def outline(treedef: nest.TreeDef) -> Any:
    """The shape of a tree without container types (sequences compare by length, dicts by keys)."""
    kind = treedef[0]
    if kind in ("leaf", "none"):
        return kind
    children = tuple(outline(c) for c in treedef[3])
    if kind == "dict":
        return ("dict", tuple(treedef[2]), children)
    return ("seq", children)


def describe_outline(outline: Any) -> str:
    if outline == "leaf":
        return "x"
    if outline == "none":
        return "None"
    if outline[0] == "dict":
        return "{" + ", ".join(f"{k!r}: {describe_outline(c)}" for k, c in zip(outline[1], outline[2])) + "}"
    return "(" + ", ".join(describe_outline(c) for c in outline[1]) + ")"


# ============================================================= directory write
#: The kind recorded in a plan directory's manifest (``graphdist-manifest.json``).
PLAN_KIND = "graphdist-plan"


def write_plan_directory(directory: str | os.PathLike[str], files: dict[str, bytes], overwrite: bool = False,
                         kind: str = PLAN_KIND, what: str = "export") -> Path:
    """Writes ``files`` (relative path -> bytes) as the directory ``directory``, atomically.

    See :mod:`graphdist.fsutil.savedir`: the files and a manifest with their
    SHA-256 are written under a hidden name next to ``directory``, flushed,
    and swapped in. An existing directory is replaced only with
    ``overwrite`` and only when graphdist wrote everything in it (its
    manifest, of the same ``kind``, lists every file); an empty one is
    replaced like a missing one. The manifest is signed with this user's
    key (:mod:`graphdist.fsutil.trust`), so the directory loads from any
    folder for this user.

    Raises:
        PlanError: ``directory`` exists (without ``overwrite``), holds files graphdist did not write or
            another kind of directory, is a file, or is the working directory.
        StorageError: The directory cannot be written (disk full, read-only filesystem, permission
            denied); also an ``OSError``, naming ``directory``. A previous copy there is left intact.
    """
    try:
        return write_directory(directory, files, kind=kind, overwrite=overwrite, error=PlanError, what=what,
                               legacy=legacy_saved_files if kind == PLAN_KIND else legacy_model_files, sign=True)
    except GraphdistError:
        raise
    except OSError as err:  # what the disk refused: the old directory is intact (see fsutil.savedir)
        raise StorageError.from_os_error(err, os.path.abspath(directory), what) from None


def legacy_saved_files(directory: Path) -> set[str] | None:
    """The files of a plan directory exported before manifests (``plan.json`` versions 1 and 2) when every
    file its ``plan.json`` lists is there with its SHA-256; ``None`` when it is no such directory.
    """
    try:
        doc = json.loads((directory / PLAN_FILE).read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") not in (1, 2):
        return None
    entries = [doc.get("variables_file"), doc.get("constants"), *(doc.get("segments") or []),
               *(doc.get("graphs") or {}).values()]
    listed = {PLAN_FILE}
    for entry in entries:
        rel, digest = (entry.get("file"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        path = directory / str(rel)
        if not isinstance(rel, str) or ".." in Path(rel).parts or not path.is_file() \
                or sha256_of(path.read_bytes()) != digest:
            return None
        listed.add(rel)
    return listed


def legacy_model_files(directory: Path) -> set[str] | None:
    """The files of a Keras model saved before manifests (``model.json`` version 1), else ``None``."""
    try:
        config = json.loads((directory / "model.json").read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(config, dict) or config.get("format") != "graphdist-keras-model" or config.get("version") != 1:
        return None
    serving = legacy_saved_files(directory / "serving")
    if serving is None:
        return None
    return {"model.json", "variables.npz", "model.onnx", *(f"serving/{rel}" for rel in serving)}


# =================================================================== export


def graphdist_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("graphdist")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def count_leaves(treedef: nest.TreeDef) -> int:
    if treedef[0] == "leaf":
        return 1
    if treedef[0] == "none":
        return 0
    return sum(count_leaves(c) for c in treedef[3])


def task_dag(plan: Any) -> list[dict[str, Any]]:
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
