"""Directories graphdist writes (exported plans, saved Keras models): manifest, safe replace, recovery.

Every such directory holds ``graphdist-manifest.json``: the kind of
directory and the SHA-256 of every other file in it (``plan.json`` and
``model.json`` included), so an edit of any file is detected on load.
The manifest is also the mark that graphdist wrote the directory:

* a directory is replaced only when it is empty or holds a manifest of the
  same kind and nothing the manifest does not list; anything else is a
  refusal naming the foreign files (they would be lost otherwise). The
  current working directory (or one containing it) is never a target;
* the new directory is written under a hidden name next to the target,
  flushed, and swapped with the old one in one step (Linux
  ``renameat2(RENAME_EXCHANGE)``), so there is no moment without a complete
  directory at the target. Where the exchange is not available the old
  directory is renamed aside first; a crash between the two renames leaves
  the complete old copy aside, and the next load or save of the target puts
  it back (:func:`recover_directory`);
* the next save of a target removes what interrupted saves of it left
  (:mod:`graphdist.fsutil.atomic`).

The checksums detect corruption and edits; they are not a signature: whoever
can write the directory can also rewrite its manifest. Saves that pass
``sign=True`` also write ``graphdist-signature.json``, an HMAC of the manifest
with this user's key, and loads decide what to trust with
:func:`graphdist.fsutil.trust.check_trusted`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from graphdist.fsutil.atomic import (
    directory_lock,
    fsync_directory,
    leftovers,
    remove_leftovers,
    staging_name,
)
from graphdist.fsutil.trust import SIGNATURE_FILE, signature_file

__all__ = ["MANIFEST_FILE", "Manifest", "manifest_digests", "read_regular_file", "recover_directory",
           "verify_directory", "with_manifest", "write_directory"]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "graphdist-manifest.json"
_FORMAT = "graphdist-saved-directory"
_VERSION = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class _UnreadableError(Exception):
    """A manifest or file that does not verify (internal: callers get their own error class)."""


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A directory's manifest: its kind, ``{relative path: SHA-256}`` of every other file, and its bytes as read
    (what a signature signs).
    """

    kind: str
    files: dict[str, str]
    data: bytes = b""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_relative(rel: str, error: type[Exception], where: str) -> str:
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or ".." in path.parts or "\\" in rel or str(path) != rel:
        raise error(f"{where}: the file name {rel!r} is not a plain relative path inside the directory")
    return rel


def with_manifest(files: dict[str, bytes], kind: str, sign: bool = False) -> dict[str, bytes]:
    """``files`` (relative path -> bytes) plus the manifest that lists them with their SHA-256 and, with
    ``sign`` and a usable signing key, the manifest's signature (:mod:`graphdist.fsutil.trust`).
    """
    own = (MANIFEST_FILE, SIGNATURE_FILE)
    listed = {rel: _sha256(data) for rel, data in sorted(files.items()) if rel not in own}
    doc = {"format": _FORMAT, "version": _VERSION, "kind": kind, "files": listed}
    manifest = (json.dumps(doc, indent=1) + "\n").encode()
    out = {**{rel: data for rel, data in files.items() if rel not in own}, MANIFEST_FILE: manifest}
    signature = signature_file(manifest) if sign else None
    if signature is not None:
        out[SIGNATURE_FILE] = signature
    return out


def _parse_manifest(data: bytes, error: type[Exception], where: str) -> Manifest:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise error(f"{where}: {MANIFEST_FILE} is not valid JSON ({err}); the directory is corrupt") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
        raise error(f"{where}: {MANIFEST_FILE} is not a graphdist manifest of version {_VERSION}")
    kind, files = doc.get("kind"), doc.get("files")
    if not isinstance(kind, str) or not isinstance(files, dict) or set(doc) != {"format", "version", "kind", "files"}:
        raise error(f"{where}: {MANIFEST_FILE} needs exactly 'format', 'version', 'kind' and 'files'")
    for rel, digest in files.items():
        _check_relative(rel, error, f"{where}: {MANIFEST_FILE}")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise error(f"{where}: {MANIFEST_FILE} lists {rel!r} without a SHA-256")
    return Manifest(kind, dict(files), data)


def read_regular_file(path: Path) -> bytes:
    """The bytes of the regular file ``path``, not read through a symbolic link: a plan or model directory in a
    folder others can write (its signature lets it load) could otherwise point a file at ``/dev/zero`` or a FIFO.

    Raises:
        OSError: ``path`` is missing, a symbolic link (``ELOOP``), not a regular file, or unreadable.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def manifest_digests(directory: Path, *, kind: str | None, error: type[Exception], where: str) -> Manifest | None:
    """The validated manifest of ``directory``, or ``None`` when it has none.

    Raises:
        error: The manifest is unreadable or malformed, or of another kind than ``kind``.
    """
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        data = read_regular_file(path)
    except OSError as err:
        raise error(f"{where}: cannot read {path}: {err.strerror or err}") from None
    manifest = _parse_manifest(data, error, where)
    if kind is not None and manifest.kind != kind:
        raise error(f"{where}: {directory} holds a {manifest.kind}, not a {kind}")
    return manifest


def verify_directory(directory: Path, *, kind: str | None, error: type[Exception], where: str,
                     manifest: Manifest | None = None) -> dict[str, bytes] | None:
    """Every file the manifest of ``directory`` lists, after checking its SHA-256; ``None`` without manifest.

    Args:
        directory: The directory.
        kind: The kind of directory its manifest must name (``None``: any).
        error: Exception class raised for a bad directory.
        where: What is read, for messages.
        manifest: Its manifest as already read (:func:`manifest_digests`), so that the files are checked
            against the very manifest a signature was checked on; ``None``: read it here.

    Raises:
        error: The manifest is malformed or of another kind, or a listed file is missing or fails its
            checksum (it was edited, truncated or corrupted after it was written).
    """
    if manifest is None:
        manifest = manifest_digests(directory, kind=kind, error=error, where=where)
    if manifest is None:
        return None
    files = {}
    for rel, digest in manifest.files.items():
        try:
            data = read_regular_file(Path(directory) / rel)
        except FileNotFoundError:
            raise error(f"{where}: {rel} is missing; the directory is incomplete") from None
        except OSError as err:
            raise error(f"{where}: {rel} cannot be read ({err.strerror or err}); save the directory again") from None
        if _sha256(data) != digest:
            raise error(f"{where}: {rel} fails its SHA-256 checksum in {MANIFEST_FILE} (it was edited, truncated "
                        "or corrupted after it was written)")
        files[rel] = data
    return files


# ------------------------------------------------------------------ exchange
@functools.cache
def _renameat2() -> Any:
    if not hasattr(os, "getuid"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Swaps two paths in one atomic step; ``False`` where the platform or filesystem cannot."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


# -------------------------------------------------------------------- write
def _destination(directory: str | os.PathLike[str], error: type[Exception], what: str) -> Path:
    dest = Path(os.path.abspath(directory))
    try:
        cwd = Path(os.path.realpath(os.getcwd()))
    except OSError:
        cwd = None
    real = Path(os.path.realpath(dest))
    if cwd is not None and (real == cwd or real in cwd.parents):
        raise error(f"{what}: {dest} is the current working directory or contains it; the target directory is "
                    f"replaced as a whole, so pass a new subdirectory, e.g. {dest / 'saved'}")
    if dest.is_symlink():
        raise error(f"{what}: {dest} is a symbolic link; pass the directory itself")
    if dest.exists() and not dest.is_dir():
        raise error(f"{what}: {dest} exists and is a file, not a directory; choose another path")
    return dest


def _foreign(dest: Path, manifest: Manifest) -> list[str]:
    """What ``dest`` holds that its manifest does not list (files, directories, links)."""
    listed = set(manifest.files) | {MANIFEST_FILE, SIGNATURE_FILE}
    needed_dirs = {str(parent) for rel in listed for parent in PurePosixPath(rel).parents if str(parent) != "."}
    foreign = []
    for root, dirs, files in os.walk(dest):
        base = PurePosixPath(Path(root).relative_to(dest).as_posix())
        for name in sorted(dirs):
            rel = str(base / name) if str(base) != "." else name
            if rel not in needed_dirs or (Path(root) / name).is_symlink():
                foreign.append(rel + "/")
        dirs[:] = [d for d in dirs if (str(base / d) if str(base) != "." else d) in needed_dirs]
        for name in sorted(files):
            rel = str(base / name) if str(base) != "." else name
            if rel not in listed:
                foreign.append(rel)
    return foreign


def _existing(dest: Path, kind: str, overwrite: bool, error: type[Exception], what: str,
              legacy: Callable[[Path], set[str] | None] | None) -> str:
    """``"none"``, ``"empty"`` or ``"ours"`` (a directory this save may replace); raises otherwise."""
    if not dest.exists():
        return "none"
    entries = sorted(p.name for p in dest.iterdir())
    if not entries:
        return "empty"
    manifest = manifest_digests(dest, kind=None, error=error, where=f"{what}: {dest}")
    listed = legacy(dest) if manifest is None and legacy is not None else None
    if listed is not None:  # written by a graphdist before manifests: its own files list (and check) themselves
        manifest = Manifest(kind, dict.fromkeys(listed, ""))
    if manifest is None:
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        raise error(f"{what}: {dest} is not empty and is not a directory graphdist wrote (it has no {MANIFEST_FILE}; "
                    f"it holds {shown}); refusing to replace it: choose another directory, or move its files out")
    if manifest.kind != kind:
        raise error(f"{what}: {dest} holds a {manifest.kind}, not a {kind}; refusing to replace it: choose another "
                    "directory")
    foreign = _foreign(dest, manifest)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise error(f"{what}: {dest} holds files graphdist did not write ({shown}); refusing to replace it (they "
                    "would be lost): move them out of it or choose another directory")
    if not overwrite:
        raise error(f"{dest} already exists; pass overwrite=True to replace it or choose another directory")
    return "ours"


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _write_tree(root: Path, files: dict[str, bytes], error: type[Exception], what: str) -> None:
    root.mkdir()
    for rel, data in files.items():
        _write_file(root / _check_relative(rel, error, what), data)
    for sub in sorted({(root / rel).parent for rel in files}, key=lambda p: -len(p.parts)):
        fsync_directory(sub)


def _swap_in(tmp: Path, dest: Path, existing: str) -> None:
    if existing == "none":
        os.rename(tmp, dest)
    elif existing == "empty":
        dest.rmdir()
        os.rename(tmp, dest)
    elif _exchange(tmp, dest):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old directory; the next save removes it if this is cut
    else:
        aside = dest.parent / staging_name(dest.name, "old")
        os.rename(dest, aside)
        try:
            os.rename(tmp, dest)
        except BaseException:
            os.rename(aside, dest)
            raise
        shutil.rmtree(aside, ignore_errors=True)


def write_directory(directory: str | os.PathLike[str], files: dict[str, bytes], *, kind: str, overwrite: bool,
                    error: type[Exception], what: str,
                    legacy: Callable[[Path], set[str] | None] | None = None, sign: bool = False) -> Path:
    """Writes ``files`` (relative path -> bytes) and their manifest as the directory ``directory``.

    Args:
        directory: The target.
        files: Its files (a ``graphdist-manifest.json`` among them is replaced by a fresh one).
        kind: What the directory is (``"graphdist-plan"``); only a directory of the same kind is replaced.
        overwrite: Replace an existing directory graphdist wrote.
        error: Exception class raised on refusal.
        what: The operation, for messages.
        legacy: For a directory without a manifest: the files an earlier graphdist wrote there, as its own
            metadata lists and verifies them (``None``: not such a directory); it is then replaced like one
            with a manifest listing them.
        sign: Sign the manifest with this user's key (:mod:`graphdist.fsutil.trust`; unsigned, with a
            warning, when the key is not usable).

    Returns:
        The directory's absolute path.

    Raises:
        error: ``directory`` is the working directory or contains it, is a file or a link, holds files
            graphdist did not write, holds another kind of directory, or exists and ``overwrite`` is false.
    """
    dest = _destination(directory, error, what)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with directory_lock(dest.parent, error=error, what=what) as locked:
        if locked:
            _recover(dest)
            remove_leftovers(dest.parent, dest.name)
        existing = _existing(dest, kind, overwrite, error, what, legacy)
        tmp = dest.parent / staging_name(dest.name, "tmp")
        try:
            _write_tree(tmp, with_manifest(files, kind, sign), error, what)
            fsync_directory(tmp)
            _swap_in(tmp, dest, existing)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    fsync_directory(dest.parent)
    return dest


# ------------------------------------------------------------------ recover
def _complete(directory: Path) -> bool:
    try:
        return verify_directory(directory, kind=None, error=_UnreadableError, where=str(directory)) is not None
    except _UnreadableError:
        return False


def _recover(dest: Path) -> bool:
    if dest.exists() or dest.is_symlink():
        return False
    prefix = f".{dest.name}.old-"
    asides = [p for p in leftovers(dest.parent, dest.name) if p.name.startswith(prefix) and p.is_dir()]
    complete = [p for p in asides if _complete(p)]
    if not complete:
        return False
    newest = max(complete, key=lambda p: p.stat().st_mtime)
    os.rename(newest, dest)
    fsync_directory(dest.parent)
    logger.warning("%s was missing after an interrupted overwrite; restored the previous copy from %s", dest,
                   newest.name)
    return True


def recover_directory(directory: str | os.PathLike[str]) -> bool:
    """Puts back the complete previous copy of a directory whose overwrite was cut between its renames.

    Returns:
        Whether a copy was put back (``False`` when ``directory`` exists or nothing complete is aside).
    """
    dest = Path(os.path.abspath(directory))
    if dest.exists() or not dest.parent.is_dir():
        return False
    with directory_lock(dest.parent, what=f"recovering {dest}") as locked:
        return _recover(dest) if locked else False
