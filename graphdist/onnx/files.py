"""Reading and writing ONNX model files for :func:`graphdist.onnx.load` and ``OnnxModel.save``.

:func:`read_model` turns a path, an ``onnx.ModelProto`` or serialized bytes
into a checked model whose tensors are all in memory: external data
(``onnx.save(..., save_as_external_data=True)``) is read from the files next
to the model (for a ``ModelProto`` or bytes, only from an explicit
``base_dir``), and every way that can fail (a missing or truncated model
file, a missing, short or escaping external-data file, a value defined
twice, a tensor whose data does not match its dims, a model newer than ONNX
Runtime runs) is a :class:`~graphdist.errors.GraphError` naming the file and
saying what to do. ``gd.onnx.load`` and ``graphdist.onnx.backend.prepare``
both read models through it.

:func:`write_model` writes a model atomically (a temporary file renamed into
place, :func:`graphdist.fsutil.atomic_write_bytes`); models over protobuf's
2 GiB limit keep their large tensors in one external-data file next to it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx
from onnx import external_data_helper

from graphdist.errors import GraphError, InvalidArgumentError, StorageError
from graphdist.fsutil import atomic_write_bytes
from graphdist.ir.onnx_checks import check_model_tensors, check_single_assignment, drop_duplicate_initializers
from graphdist.ir.onnx_io import MAX_OPSET

__all__ = ["read_model", "write_model", "external_tensors", "INLINE_LIMIT", "EXTERNAL_THRESHOLD"]

logger = logging.getLogger(__name__)

#: Serialized models larger than this keep their big tensors in an external-data file (protobuf's
#: limit is 2 GiB; the margin leaves room for the graph itself).
INLINE_LIMIT = 1_800_000_000
#: Tensors of at least this many bytes go to the external-data file (ONNX's own default threshold).
EXTERNAL_THRESHOLD = 1024


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The model's tensors (initializers, Constant values, subgraphs' too) stored as external data."""
    return [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]


def _location(tensor: onnx.TensorProto) -> str:
    return next((entry.value for entry in tensor.external_data if entry.key == "location"), "")


def read_model(model: onnx.ModelProto | bytes | str | os.PathLike[str], *,
               base_dir: str | os.PathLike[str] | None = None,
               caller: str = "gd.onnx.load") -> tuple[onnx.ModelProto, str | None]:
    """The model with every tensor in memory, checked; and the file it came from (``None`` otherwise).

    One reading for :func:`graphdist.onnx.load` and
    :func:`graphdist.onnx.backend.prepare`, so that a file means the same
    thing to both (and to ONNX Runtime):

    * External data is read only from the model's own directory: a path's
      directory, or ``base_dir`` for a ``ModelProto`` or serialized bytes
      (which have no directory; without ``base_dir`` their external data is
      refused). Locations are confined to that directory by ONNX's own
      reader (no absolute paths, no ``..``, no symbolic links out of it).
    * Single assignment (:func:`graphdist.ir.onnx_checks.check_single_assignment`):
      a value defined twice is refused.
    * Repeated initializers: the last one is kept, with a warning (as ONNX Runtime does).
    * Every tensor's data matches its dims (:func:`graphdist.ir.onnx_checks.check_tensor_data`).

    A ``ModelProto`` is copied (the caller's object is never changed).

    Args:
        model: A path to an ``.onnx`` file, an ``onnx.ModelProto`` or its serialized bytes.
        base_dir: For a ``ModelProto`` or bytes: the directory holding its external-data files.
        caller: The API named by argument errors.

    Raises:
        GraphError: The file is missing, not an ONNX model (truncated, or
            another format), its external data is missing, short, outside its
            directory or has no directory to be read from, a value is defined
            twice, a tensor's data does not match its dims, or the model's
            opset is newer than ONNX Runtime runs.
        InvalidArgumentError: ``model`` is neither a path, a ``ModelProto``
            nor bytes, or ``base_dir`` is given with a path.
    """
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        source = None
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = _parse_bytes(bytes(model))
        source = None
    elif isinstance(model, (str, os.PathLike)):
        if base_dir is not None:
            raise InvalidArgumentError(f"{caller}: base_dir={os.fspath(base_dir)!r} is for a ModelProto or bytes; the "
                                       f"external data of the file {os.fspath(model)!r} is read from its own "
                                       "directory: leave base_dir out")
        source = os.fspath(model)
        proto = _parse_file(source)
    else:
        raise InvalidArgumentError(f"{caller}: model must be an onnx.ModelProto, its serialized bytes or a path to "
                                   f"an .onnx file, got {type(model).__name__}")
    what = _describe(source, proto)
    if source is not None:
        _load_external_data(proto, os.path.dirname(os.path.abspath(source)), what)
    elif external_tensors(proto):
        if base_dir is None:
            pending = external_tensors(proto)
            names = ", ".join(sorted(t.name for t in pending)[:5])
            kind = "ModelProto" if isinstance(model, onnx.ModelProto) else "serialized model"
            raise GraphError(f"the {kind}'s tensor(s) {names} are stored as external data "
                             f"({_location(pending[0])!r}), and a {kind} has no directory to read it from (it "
                             "is never read from the current directory): pass the model's path instead, or pass "
                             "base_dir='<the directory holding its data files>' (gd.onnx.load(model, base_dir=...), "
                             "graphdist.onnx.backend.prepare(model, base_dir=...))")
        _load_external_data(proto, os.fspath(base_dir), what)
    _check_graph(proto, source)
    drop_duplicate_initializers(proto.graph, what)
    check_single_assignment(proto.graph, what)
    check_model_tensors(proto, what)
    return proto, source


def _describe(source: str | None, proto: onnx.ModelProto | None = None) -> str:
    if source is not None:
        return f"ONNX file {source!r}"
    return f"ONNX model {proto.graph.name!r}" if proto is not None and proto.graph.name else "the ONNX model"


def _parse_bytes(data: bytes) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise GraphError(f"the bytes given ({len(data):,}) are not a serialized ONNX model "
                         f"({type(err).__name__}: {err})") from None
    return proto


def _parse_file(path: str) -> onnx.ModelProto:
    if not os.path.exists(path):
        raise GraphError(f"ONNX file {path!r} does not exist; check the path")
    if os.path.isdir(path):
        raise GraphError(f"{path!r} is a directory; give the path of an .onnx file")
    data = Path(path).read_bytes()
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise GraphError(f"ONNX file {path!r} ({len(data):,} bytes) cannot be parsed as an ONNX model "
                         f"({type(err).__name__}: {err}); it is truncated or not an ONNX file: copy or export "
                         "it again") from None
    return proto


def _check_graph(proto: onnx.ModelProto, source: str | None) -> None:
    """Catches files that parse (protobuf reads a prefix cut at a field boundary) but hold no whole model."""
    what = _describe(source, proto)
    if not proto.graph.node and not proto.graph.output:
        raise GraphError(f"{what} holds no ONNX graph (empty, truncated or not an ONNX file)")
    if not proto.opset_import:
        raise GraphError(f"{what} declares no opset (opset_import is empty): it is truncated or was not "
                         "written by an ONNX exporter; export it again")
    defined = {vi.name for vi in proto.graph.input} | {t.name for t in proto.graph.initializer}
    defined |= {name for node in proto.graph.node for name in node.output}
    missing = [vi.name for vi in proto.graph.output if vi.name not in defined]
    if missing:
        raise GraphError(f"{what}: graph output(s) {', '.join(map(repr, missing))} are computed by no node; the "
                         "file is truncated or the model is incomplete: export it again")
    versions = {o.domain or "ai.onnx": int(o.version) for o in proto.opset_import}
    if versions.get("ai.onnx", 0) > MAX_OPSET:
        raise GraphError(f"{what} uses opset {versions['ai.onnx']} of ai.onnx; ONNX Runtime (and so graphdist) "
                         f"runs opsets up to {MAX_OPSET}: export it with opset {MAX_OPSET} or older")


def _load_external_data(proto: onnx.ModelProto, base: str, what: str) -> None:
    """Reads the external data of ``proto``'s tensors from ``base`` (the model's directory) only."""
    tensors = external_tensors(proto)
    if not tensors:
        return
    if not os.path.isdir(base):
        raise GraphError(f"{what}: base_dir {base!r}, where its external data should be, is not a directory")
    for tensor in tensors:
        location = _location(tensor)
        file = os.path.join(base, location)
        if not location or not os.path.isfile(file):
            raise GraphError(f"{what} keeps tensor {tensor.name!r} in the external-data file "
                             f"{location!r}, which does not exist (looked for {file!r}); copy it next to the "
                             "model, or export the model without external data")
    try:
        external_data_helper.load_external_data_for_model(proto, base)
    except Exception as err:  # noqa: BLE001 - onnx raises ValueError/OSError for short, unreadable or escaping files
        raise GraphError(f"{what}: its external data in "
                         f"{sorted({_location(t) for t in tensors})} cannot be read ({type(err).__name__}: "
                         f"{err}); the data file is truncated, belongs to another model, or lies outside the "
                         f"model's directory {base!r}") from None
    for tensor in external_tensors(proto):
        raise GraphError(f"{what}: tensor {tensor.name!r} was not read from {_location(tensor)!r}")
    logger.debug("read external data of %d tensor(s) for %s from %s", len(tensors), what, base)


def write_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> str:
    """Writes ``model`` to ``path`` atomically; returns the path.

    Models whose serialized size passes :data:`INLINE_LIMIT` keep their
    tensors in ``<name>.data`` next to the file (written first, also
    atomically), as ``onnx.save(..., save_as_external_data=True)`` does.

    Raises:
        StorageError: The file cannot be written (disk full, read-only filesystem, permission denied, a
            directory in the way); also an ``OSError``, naming ``path``. An earlier file there is intact.
    """
    dest = Path(path)
    try:
        size = model.ByteSize()
        if size <= INLINE_LIMIT:
            atomic_write_bytes(dest, model.SerializeToString())
        else:
            _write_with_external_data(model, dest)
    except OSError as err:
        raise StorageError.from_os_error(err, os.path.abspath(dest), "OnnxModel.save") from None
    return str(dest)


def _write_with_external_data(model: onnx.ModelProto, dest: Path) -> None:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    location = f"{dest.name}.data"
    data = bytearray()
    for tensor in external_data_helper._get_all_tensors(copy):
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < EXTERNAL_THRESHOLD:
            continue
        raw = tensor.raw_data
        offset = len(data)
        data += raw
        external_data_helper.set_external_data(tensor, location, offset=offset, length=len(raw))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
    atomic_write_bytes(dest.parent / location, bytes(data))
    atomic_write_bytes(dest, copy.SerializeToString())
    logger.info("wrote %s with its tensors in %s (%d bytes)", dest, location, len(data))
