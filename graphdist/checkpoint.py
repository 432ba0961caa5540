"""``gd.train.Checkpoint``: save and restore variables of models and optimizers.

A checkpoint is one ``.npz`` file (a zip of ``.npy`` arrays, never pickled)
holding every variable reachable from the trackables given to
:class:`Checkpoint`, keyed by its path in the object graph
(``model/layer0/kernel`` style: the trackable's name, then the variable's
position or name), plus a JSON manifest (format version, keys, shapes,
dtypes and a SHA-256 of each array) and the SHA-256 of the manifest itself,
so an edit of any part is detected.

Optimizer slots are keyed by the path of the variable they belong to
(``optimizer/slots/model/layer0/kernel/m``), as TensorFlow's object-based
checkpoints do, not by the variables' generated names: a model rebuilt with
other layer names (another layer was built first) gets its Adam moments
back. A slot whose variable the restoring :class:`Checkpoint` does not
track is an error.

Saving writes a temporary file next to the target and renames it into place,
so an interrupted save never leaves a half-written checkpoint (and the next
save removes the temporary file it left); an existing file is replaced only
when it is a graphdist checkpoint. Restoring reads and validates everything
(manifest schema and checksum, each array's declared size against its bytes
before allocating it, checksums, shapes, dtypes) before it assigns anything,
so a truncated, corrupt or edited file raises
:class:`~graphdist.errors.CheckpointError` and leaves the variables untouched.

Values are plain arrays, so a checkpoint restores under any strategy and
replica count. Optimizer slot variables that do not exist yet in a freshly
built optimizer are kept and used when the slot is created.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from graphdist.errors import CheckpointError, GraphdistError, StorageError
from graphdist.fsutil import read_npz, replace_file
from graphdist.runtime.numerics import warn_non_finite
from graphdist.trace.variables import Variable

__all__ = ["Checkpoint", "CheckpointLoadStatus", "FORMAT_VERSION", "is_checkpoint_file"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
#: Versions this graphdist reads (version 1: no manifest checksum, slots keyed by variable names).
READABLE_VERSIONS = (1, 2)
_FORMAT = "graphdist-checkpoint"
_MANIFEST = "__graphdist_manifest__"
_MANIFEST_JSON = f"{_MANIFEST}.json"
_MANIFEST_SHA = f"{_MANIFEST}.sha256"
_HEX = frozenset("0123456789abcdef")


def _collect(prefix: str, trackable: Any, out: dict[str, Variable], pending: dict[str, Any]) -> None:
    """Adds every variable of ``trackable`` under ``prefix`` to ``out``."""
    if isinstance(trackable, Variable):
        out[prefix] = trackable
        return
    if hasattr(trackable, "_checkpoint_variables"):
        for key, variable in trackable._checkpoint_variables().items():
            out[f"{prefix}/{key}"] = variable
        pending[prefix] = trackable
        return
    if isinstance(trackable, (list, tuple)):
        for index, item in enumerate(trackable):
            _collect(f"{prefix}/{index}", item, out, pending)
        return
    if isinstance(trackable, dict):
        for key, item in trackable.items():
            _collect(f"{prefix}/{key}", item, out, pending)
        return
    variables = getattr(trackable, "trainable_variables", None)
    if variables is None and hasattr(trackable, "variables"):
        variables = trackable.variables() if callable(trackable.variables) else trackable.variables
    if variables is None:
        raise CheckpointError(
            f"cannot checkpoint {prefix!r}: a {type(trackable).__name__} has no variables; pass gd.Variables, "
            "lists/dicts of them, models (with trainable_variables) or optimizers"
        )
    for index, variable in enumerate(variables):
        _collect(f"{prefix}/{index}", variable, out, pending)


def _key_slots_by_owner(out: dict[str, Variable], pending: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Re-keys optimizer slots by the path of the variable they belong to; returns ``{key: {owner, kind}}``."""
    owners: dict[int, str] = {}
    for key, variable in out.items():
        owners.setdefault(id(variable), key)
    slots: dict[str, dict[str, str]] = {}
    for prefix, trackable in pending.items():
        for (owner_id, kind), slot in list(getattr(trackable, "_slots", {}).items()):
            owner = owners.get(owner_id)
            legacy = f"{prefix}/{trackable._slot_keys[(owner_id, kind)]}"
            if owner is None or out.get(legacy) is not slot:
                continue  # the variable is not in this checkpoint: the slot keeps its name-based key
            key = f"{prefix}/slots/{owner}/{kind}"
            out[key] = out.pop(legacy)
            slots[key] = {"owner": owner, "kind": kind}
    return slots


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(array, order="C").tobytes()).hexdigest()


def is_checkpoint_file(path: Path) -> bool:
    """Whether ``path`` is a file :meth:`Checkpoint.save` wrote (a zip holding its manifest)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return _MANIFEST_JSON in archive.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


class Checkpoint:
    """Groups trackables (variables, models, optimizers) to save and restore.

    Args:
        **trackables: Named objects, e.g. ``Checkpoint(model=model, optimizer=opt)``.
    """

    def __init__(self, **trackables: Any) -> None:
        if not trackables:
            raise CheckpointError("Checkpoint needs at least one named trackable, e.g. Checkpoint(model=model)")
        self._trackables = trackables
        self._variables()  # refuses what cannot be checkpointed now, as TF's Checkpoint does

    def _variables(self) -> tuple[dict[str, Variable], dict[str, Any], dict[str, dict[str, str]]]:
        out: dict[str, Variable] = {}
        pending: dict[str, Any] = {}
        for name, trackable in self._trackables.items():
            _collect(name, trackable, out, pending)
        return out, pending, _key_slots_by_owner(out, pending)

    # ----------------------------------------------------------------- save
    def _serialize(self, metadata: dict[str, Any] | None = None, what: str = "Checkpoint.save") -> bytes:
        """The checkpoint file's bytes (``metadata``: JSON data stored in its manifest); warns (``what`` saves)
        when a weight holds NaN or Inf.
        """
        variables, _, slots = self._variables()
        arrays = {key: np.array(var.whole_value(), order="C", copy=True) for key, var in variables.items()}
        warn_non_finite(arrays, what)
        entries = {key: f"v{index}" for index, key in enumerate(arrays)}
        manifest = {
            "format": _FORMAT,
            "version": FORMAT_VERSION,
            "variables": {k: {"shape": list(a.shape), "dtype": a.dtype.str, "sha256": _digest(a),
                              "entry": f"{entries[k]}.npy", **({"slot": slots[k]} if k in slots else {})}
                          for k, a in arrays.items()},
            "metadata": metadata or {},
        }
        text = json.dumps(manifest, indent=1).encode()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.writestr(_MANIFEST_JSON, text)
            archive.writestr(_MANIFEST_SHA, hashlib.sha256(text).hexdigest())
            for key, array in arrays.items():
                if array.dtype.hasobject:
                    raise CheckpointError(f"Checkpoint.save: {key} holds Python objects; only numeric arrays "
                                          "can be saved (no pickle)")
                entry = io.BytesIO()
                np.save(entry, array, allow_pickle=False)
                archive.writestr(f"{entries[key]}.npy", entry.getvalue())
        return buffer.getvalue()

    def _gather_sharded(self) -> None:
        """Takes part in gathering the variables sharded across workers, as a save elsewhere does; writes nothing.

        Under ``MultiWorkerMirroredStrategy(shard_optimizer_state=True)`` each worker stores a chunk of
        every optimizer slot, and a save gathers them (a collective): a worker that does not write the
        checkpoint calls this while the chief saves.
        """
        for variable in self._variables()[0].values():
            if variable.worker_shard is not None:
                variable.whole_value()

    def save(self, path: str | os.PathLike[str]) -> str:
        """Writes every variable to ``path`` atomically; returns the path.

        Optimizer slots sharded across workers (ZeRO-1) are gathered first, a collective: every worker
        saves (to a path of its own) or calls the non-chief side of Keras' callbacks, which take part.

        Raises:
            CheckpointError: ``path`` is a directory, or an existing file there is not a graphdist
                checkpoint (it is never overwritten).
            StorageError: The file cannot be written (disk full, read-only filesystem, permission
                denied); also an ``OSError``. An earlier checkpoint at ``path`` is left intact.
        """
        return self._save(path)

    def _save(self, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None) -> str:
        data = self._serialize(metadata)
        try:
            replace_file(path, data, is_ours=is_checkpoint_file, error=CheckpointError, what="Checkpoint.save")
        except GraphdistError:
            raise
        except OSError as err:  # the disk is full, read-only, not ours...: the old file is intact
            raise StorageError.from_os_error(err, os.path.abspath(path), "Checkpoint.save") from None
        logger.info("saved a checkpoint to %s", path)
        return str(path)

    # -------------------------------------------------------------- restore
    def restore(self, path: str | os.PathLike[str]) -> CheckpointLoadStatus:
        """Reads ``path`` and assigns every saved value to its variable.

        Every variable this checkpoint tracks must have a value in the file (else nothing is assigned and
        :class:`~graphdist.errors.CheckpointError` is raised): unlike TensorFlow, graphdist does not defer
        the restore of variables created later (optimizer slots excepted).

        Returns:
            A :class:`CheckpointLoadStatus` (TF's ``restore(...).assert_consumed()`` idiom): its
            ``assert_consumed()`` raises when the file holds values no tracked object used.

        Raises:
            CheckpointError: The file is missing, truncated, corrupt, edited, of
                another format version, or does not match the variables
                (missing key, shape or dtype; an optimizer slot whose variable
                this checkpoint does not track). Nothing is assigned then.
        """
        unused: list[str] = []
        self._restore(path, unused=unused)
        return CheckpointLoadStatus(str(path), unused)

    def _restore(self, path: str | os.PathLike[str], require: str | None = None,
                 data: bytes | None = None, unused: list[str] | None = None) -> dict[str, Any]:
        """:meth:`restore`; returns the metadata saved with the checkpoint (which must hold ``require``).

        ``data``: the file's bytes, already read and verified by the caller (``path`` then only names it).
        ``unused``: filled with the keys of saved values that no tracked object took.
        """
        path = Path(path)
        manifest, saved = _read_checkpoint(path, data)
        if require is not None and not isinstance(manifest.get("metadata", {}).get(require), dict):
            raise CheckpointError(f"checkpoint {path} holds no {require!r} state; it was not written for this use: "
                                  "delete it or pass another path")
        variables, pending, _ = self._variables()
        _check_matching(path, variables, saved)
        lazy, legacy = _unmatched_slots(path, manifest, variables, pending, saved)
        for key, variable in variables.items():
            variable.write_back(saved[key])
        for optimizer, owner, kind, value in lazy:
            optimizer._restore_slot(owner, kind, value)
        for prefix, extra in legacy.items():
            pending[prefix]._restore_pending(extra)
        if unused is not None:
            unused.extend(key for key in manifest["variables"]
                          if key not in variables and _owner_prefix(key, pending) is None)
        return manifest.get("metadata") or {}


class CheckpointLoadStatus:
    """What :meth:`Checkpoint.restore` returns (like TF's ``CheckpointLoadStatus``).

    By the time it exists every tracked variable has its value (a restore that cannot give one raises),
    so :meth:`assert_existing_objects_matched` always passes; :meth:`assert_consumed` also checks that
    every value in the file was used.
    """

    def __init__(self, path: str, unused: list[str]) -> None:
        self.path = path
        #: Keys of saved values no tracked object took (objects this Checkpoint was not given).
        self.unused_keys = tuple(unused)

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Raises :class:`~graphdist.errors.CheckpointError` if the file holds values nothing used.

        Returns:
            ``self``.
        """
        if self.unused_keys:
            shown = ", ".join(self.unused_keys[:5]) + (" ..." if len(self.unused_keys) > 5 else "")
            raise CheckpointError(
                f"checkpoint {self.path} holds {len(self.unused_keys)} value(s) that no object of this Checkpoint "
                f"took: {shown}; pass those objects to Checkpoint(...) under the names they were saved with, or "
                "call expect_partial() if a partial restore is intended")
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Passes: every tracked variable was restored (else ``restore`` raised). Returns ``self``."""
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """Passes: at least the tracked variables were restored. Returns ``self``."""
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Marks a partial restore as intended (graphdist warns about none). Returns ``self``."""
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """Nothing to run: values are assigned by ``restore`` itself (TF1 graph-mode compatibility)."""

    def __repr__(self) -> str:
        return f"<CheckpointLoadStatus {self.path} unused={len(self.unused_keys)}>"


def _check_matching(path: Path, variables: dict[str, Variable], saved: dict[str, np.ndarray]) -> None:
    missing = sorted(set(variables) - set(saved))
    if missing:
        raise CheckpointError(
            f"checkpoint {path} has no value for {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''}; it was saved from different objects"
        )
    for key, variable in variables.items():
        array = saved[key]
        if array.shape != variable.shape or array.dtype != variable.dtype:
            raise CheckpointError(
                f"checkpoint {path}: {key} is {array.dtype}{list(array.shape)} but the variable is "
                f"{variable.dtype}{list(variable.shape)}; build the model with the same sizes"
            )


def _owner_prefix(key: str, pending: dict[str, Any]) -> str | None:
    return next((prefix for prefix in pending if key.startswith(prefix + "/")), None)


def _unmatched_slots(path: Path, manifest: dict[str, Any], variables: dict[str, Variable], pending: dict[str, Any],
                     saved: dict[str, np.ndarray]) -> tuple[list[tuple[Any, Variable, str, np.ndarray]],
                                                            dict[str, dict[str, np.ndarray]]]:
    """Saved values no current variable holds yet: optimizer slots matched to their variable by the object
    graph (created lazily), and name-keyed extras (version 1 files; other trackables' keys).

    Raises:
        CheckpointError: A slot belongs to a variable this checkpoint does not track, or has its shape wrong.
    """
    lazy, legacy = [], {}
    for key, info in manifest["variables"].items():
        prefix = _owner_prefix(key, pending)
        if key in variables or prefix is None:
            continue  # restored directly, or the state of an object this Checkpoint does not hold
        slot = info.get("slot")
        if slot is None:
            legacy.setdefault(prefix, {})[key[len(prefix) + 1:]] = saved[key]
            continue
        owner = variables.get(slot["owner"])
        if owner is None:
            raise CheckpointError(
                f"checkpoint {path}: the optimizer state {key} belongs to {slot['owner']}, which this Checkpoint "
                "does not track; restore the optimizer together with the objects it trains, e.g. "
                "Checkpoint(model=model, optimizer=optimizer), under the names they were saved with")
        if saved[key].shape != owner.shape or not hasattr(pending[prefix], "_restore_slot"):
            raise CheckpointError(f"checkpoint {path}: the optimizer state {key} is {saved[key].dtype}"
                                  f"{list(saved[key].shape)} but {slot['owner']} is {owner.dtype}{list(owner.shape)}")
        lazy.append((pending[prefix], owner, slot["kind"], saved[key]))
    if any("slots/" in k for extra in legacy.values() for k in extra):
        logger.warning("checkpoint %s was written by an older graphdist (version %s): its optimizer slots are "
                       "matched by variable name, so slots of variables named otherwise now restart from zero; "
                       "save the checkpoint again to key them by the object graph", path, manifest.get("version"))
    return lazy, legacy


# ------------------------------------------------------------------- read
def _schema_error(path: Path, message: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} is corrupt or was edited: {message}; restore from another "
                           "checkpoint or save again")


def _check_entry(path: Path, key: Any, info: Any) -> tuple[str, tuple[np.dtype, tuple[int, ...]]]:
    if not isinstance(key, str) or not isinstance(info, dict):
        raise _schema_error(path, f"the manifest entry {key!r} is not an object")
    shape, dtype, digest, entry = info.get("shape"), info.get("dtype"), info.get("sha256"), info.get("entry")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise _schema_error(path, f"{key}: 'shape' must be a list of sizes, got {shape!r}")
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        raise _schema_error(path, f"{key}: 'sha256' must be a SHA-256 hex digest")
    if not isinstance(entry, str) or not entry.endswith(".npy"):
        raise _schema_error(path, f"{key}: 'entry' must name a .npy entry, got {entry!r}")
    try:
        parsed = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        parsed = None
    if parsed is None or parsed.hasobject or parsed.kind == "V":
        raise _schema_error(path, f"{key}: 'dtype' must be a numeric dtype, got {dtype!r}")
    slot = info.get("slot")
    if slot is not None and not (isinstance(slot, dict) and isinstance(slot.get("owner"), str)
                                 and isinstance(slot.get("kind"), str)):
        raise _schema_error(path, f"{key}: 'slot' must hold the owner variable's key and the slot kind")
    return entry[: -len(".npy")], (parsed, tuple(shape))


def _read_manifest(path: Path, archive: zipfile.ZipFile) -> dict[str, Any]:
    try:
        text = archive.read(_MANIFEST_JSON)
    except KeyError:
        raise CheckpointError(f"{path} is not a graphdist checkpoint (it has no {_MANIFEST_JSON}); pass a file "
                              "Checkpoint.save wrote") from None
    try:
        manifest = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise _schema_error(path, f"its manifest is not JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT \
            or manifest.get("version") not in READABLE_VERSIONS:
        found = (manifest.get("format"), manifest.get("version")) if isinstance(manifest, dict) else (None, None)
        raise CheckpointError(f"checkpoint {path} has format {found[0]!r} version {found[1]!r}; this graphdist reads "
                              f"{_FORMAT} versions {', '.join(map(str, READABLE_VERSIONS))}")
    if manifest["version"] >= 2:
        names = archive.namelist()
        expected = archive.read(_MANIFEST_SHA).decode(errors="replace").strip() if _MANIFEST_SHA in names else None
        if expected != hashlib.sha256(text).hexdigest():
            raise _schema_error(path, "its manifest fails its SHA-256 checksum")
    if not isinstance(manifest.get("variables"), dict) or not isinstance(manifest.get("metadata", {}), dict):
        raise _schema_error(path, "its manifest needs a 'variables' object")
    return manifest


def _read_checkpoint(path: Path, data: bytes | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The validated manifest and the arrays by key (each checked before it is allocated, then its checksum),
    from ``path`` or from its bytes ``data``.
    """
    if data is None and not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; pass the path that save() returned")
    source: bytes | Path = path if data is None else data
    try:
        with zipfile.ZipFile(path if data is None else io.BytesIO(data)) as archive:
            manifest = _read_manifest(path, archive)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {err}); restore "
                              "from another checkpoint or save again") from None
    wanted = dict(_check_entry(path, key, info) for key, info in manifest["variables"].items())
    if len(wanted) != len(manifest["variables"]):
        raise _schema_error(path, "two variables name the same entry")
    arrays = read_npz(source, wanted, error=CheckpointError, where=f"checkpoint {path}")
    saved = {}
    for key, info in manifest["variables"].items():
        array = arrays[info["entry"][: -len(".npy")]]
        if _digest(array) != info["sha256"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: the data of {key} fails its checksum")
        saved[key] = array
    return manifest, saved
