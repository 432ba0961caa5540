"""``gd.train.Checkpoint``: save and restore variables of models and optimizers.

A checkpoint is one ``.npz`` file (a zip of ``.npy`` arrays, never pickled)
holding every variable reachable from the trackables given to
:class:`Checkpoint`, keyed by its path (``model/dense_0/kernel`` style: the
trackable's name, then the variable's position or name), plus a JSON manifest
(format version, keys, shapes, dtypes and a SHA-256 of each array).

Saving writes a temporary file next to the target and renames it into place,
so an interrupted save never leaves a half-written checkpoint. Restoring reads
and validates everything (manifest, checksums, shapes, dtypes) before it
assigns anything, so a truncated or corrupt file raises
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

from graphdist.errors import CheckpointError
from graphdist.fsutil import atomic_write_bytes
from graphdist.trace.variables import Variable

__all__ = ["Checkpoint", "FORMAT_VERSION"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MANIFEST = "__graphdist_manifest__"


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


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(array, order="C").tobytes()).hexdigest()


class Checkpoint:
    """Groups trackables (variables, models, optimizers) to save and restore.

    Args:
        **trackables: Named objects, e.g. ``Checkpoint(model=model, optimizer=opt)``.
    """

    def __init__(self, **trackables: Any) -> None:
        if not trackables:
            raise CheckpointError("Checkpoint needs at least one named trackable, e.g. Checkpoint(model=model)")
        self._trackables = trackables

    def _variables(self) -> tuple[dict[str, Variable], dict[str, Any]]:
        out: dict[str, Variable] = {}
        pending: dict[str, Any] = {}
        for name, trackable in self._trackables.items():
            _collect(name, trackable, out, pending)
        return out, pending

    # ----------------------------------------------------------------- save
    def save(self, path: str | os.PathLike[str]) -> str:
        """Writes every variable to ``path`` atomically; returns the path."""
        path = Path(path)
        variables, _ = self._variables()
        arrays = {key: np.array(var._value, order="C", copy=True) for key, var in variables.items()}
        entries = {key: f"v{index}.npy" for index, key in enumerate(arrays)}
        manifest = {
            "format": "graphdist-checkpoint",
            "version": FORMAT_VERSION,
            "variables": {k: {"shape": list(a.shape), "dtype": a.dtype.str, "sha256": _digest(a), "entry": entries[k]}
                          for k, a in arrays.items()},
        }
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.writestr(f"{_MANIFEST}.json", json.dumps(manifest, indent=1))
            for key, array in arrays.items():
                entry = io.BytesIO()
                np.save(entry, array, allow_pickle=False)
                archive.writestr(entries[key], entry.getvalue())
        atomic_write_bytes(path, buffer.getvalue())
        logger.info("saved %d variables to %s", len(arrays), path)
        return str(path)

    # -------------------------------------------------------------- restore
    def restore(self, path: str | os.PathLike[str]) -> Checkpoint:
        """Reads ``path`` and assigns every saved value to its variable.

        Raises:
            CheckpointError: The file is missing, truncated, corrupt, of
                another format version, or does not match the variables
                (missing key, shape or dtype). Nothing is assigned then.
        """
        path = Path(path)
        saved = _read_checkpoint(path)
        variables, pending = self._variables()
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
        for key, variable in variables.items():
            variable._write(saved[key])
        for prefix, trackable in pending.items():
            extra = {k[len(prefix) + 1:]: a for k, a in saved.items()
                     if k.startswith(prefix + "/") and k not in variables}
            trackable._restore_pending(extra)
        return self


def _read_checkpoint(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; pass the path that save() returned")
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(f"{_MANIFEST}.json"))
            if manifest.get("format") != "graphdist-checkpoint" or manifest.get("version") != FORMAT_VERSION:
                raise CheckpointError(
                    f"checkpoint {path} has format {manifest.get('format')!r} version {manifest.get('version')!r}; "
                    f"this graphdist reads version {FORMAT_VERSION}"
                )
            saved = {}
            for key, info in manifest["variables"].items():
                array = np.load(io.BytesIO(archive.read(info["entry"])), allow_pickle=False)
                if _digest(array) != info["sha256"] or list(array.shape) != info["shape"]:
                    raise CheckpointError(f"checkpoint {path} is corrupt: the data of {key} fails its checksum")
                saved[key] = array
            return saved
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {err}); restore from another "
            "checkpoint or save again"
        ) from err
