"""Backend protocol, backend registry and the compile cache.

A backend turns one ONNX segment into an :class:`Executable` for one device.
Backends never see strategies or plans: they get an ``onnx.ModelProto``, a
:class:`~graphdist.runtime.devices.Device` and a thread budget.

Compiled executables are cached twice (:class:`CompileCache`):

* in memory, per process, keyed by the segment's bytes, the backend, its
  target, its library version and the thread budget;
* on disk, in ``<cache dir>/<backend>/<key>/``; the backend decides what it
  persists there (see each backend's docstring). The cache directory is
  ``$GRAPHDIST_CACHE_DIR``, else ``~/.cache/graphdist``.

Files in the disk cache are written atomically (:func:`atomic_write_bytes`),
so a killed process never leaves half a file behind. Next to each artefact a
``.sha256`` file records its SHA-256 and the key it was stored under
(``<backend>/<key>/<file>``): a backend that finds an unreadable artefact, a
checksum mismatch, or a copy of another entry's files discards it and
compiles again.

Every entry holds code graphdist runs (TVM's native ``.so``, ONNX Runtime's
optimized model), and a checksum stops no one who can write the directory: an
entry is read or written only when no other user could have put it there
(:func:`cache_entry_allowed`: the file, its entry and the cache directory belong
to this user, are not writable by group or others and are no symbolic links,
and the directories above the cache directory are safe from renames by
others; see :mod:`graphdist.fsutil.private`). Otherwise the segment is
compiled in memory, without the disk cache, with one warning per reason that
says how to fix it. Cache directories are created with mode ``0o700``.

The disk cache holds at most ``$GRAPHDIST_CACHE_MAX_BYTES`` bytes (default
2 GiB): after each compile that wrote an entry, the least recently used
entries (by the last time one was written or loaded) are deleted until it
fits. TVM's tuning database (``<cache dir>/tvm-tuning``) is not an entry and
is never evicted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from graphdist import stats
from graphdist.errors import InvalidArgumentError, PlanError
from graphdist.fsutil import atomic_write_bytes, make_private_dir, private_problem

if TYPE_CHECKING:
    import onnx

    from graphdist.runtime.devices import Device

__all__ = [
    "DEFAULT_BACKEND",
    "MAX_IR_VERSION",
    "Backend",
    "CompileCache",
    "Executable",
    "atomic_write_bytes",
    "available_backends",
    "cache_dir",
    "cache_key",
    "cache_max_bytes",
    "default_cache",
    "cache_entry_allowed",
    "get_backend",
    "discard_artifact",
    "evict_least_recently_used",
    "make_cache_dir",
    "prepare_model",
    "read_verified_artifact",
    "register_backend",
    "write_artifact_checksum",
]

logger = logging.getLogger(__name__)

#: Backend used when neither an argument nor ``GRAPHDIST_BACKEND`` names one.
DEFAULT_BACKEND = "ort"

#: Highest ONNX IR version handed to backends (ONNX Runtime 1.31 reads at
#: most 13, onnx 1.23 writes 14; 10 is understood by every supported version).
MAX_IR_VERSION = 10


@runtime_checkable
class Executable(Protocol):
    """A compiled segment, ready to run on its device.

    Attributes:
        input_names: Names of the segment's graph inputs, in order.
        output_names: Names of the segment's graph outputs, in order.
    """

    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the segment.

        Args:
            feeds: One array per graph input, by name.

        Returns:
            One array per graph output, in ``output_names`` order.

        Raises:
            BackendError: The backend rejected the feeds or failed.
        """
        ...


@runtime_checkable
class Backend(Protocol):
    """Compiles ONNX segments for devices.

    Attributes:
        name: Registry name, e.g. ``"ort"``.
        version: Version of the underlying library (part of the cache key).
    """

    name: str
    version: str

    def target(self, device: Device) -> str:
        """Returns the compile target for ``device`` (e.g. ``"cpu"``,
        ``"cuda:0"``); devices with equal targets share compiled code.
        """
        ...

    def compile(
        self,
        model: onnx.ModelProto,
        device: Device,
        *,
        threads: int | None = None,
        cache_dir: Path | None = None,
        shared: dict[str, Any] | None = None,
    ) -> Executable:
        """Compiles ``model`` for ``device``.

        Args:
            model: The segment. Not modified.
            device: Where it will run.
            threads: Intra-op thread budget; ``None`` means all host cores.
            cache_dir: Directory this compile may persist artefacts in and
                reuse them from; ``None`` disables the disk cache.
            shared: A mapping the compile cache gives every compile it makes, where a
                backend may keep what executables of equal segments can share (TVM
                keeps built libraries by structure key); ``None``: nothing shared.

        Raises:
            BackendError: The segment cannot be compiled.
            DeviceError: The device is not available.
        """
        ...


_registry: dict[str, Backend] = {}
_registry_lock = threading.Lock()


def register_backend(backend: Backend) -> None:
    """Makes ``backend`` available under ``backend.name`` (replacing any
    backend registered under that name).
    """
    with _registry_lock:
        if backend.name in _registry:
            logger.debug("replacing backend %r", backend.name)
        _registry[backend.name] = backend


def available_backends(device_kind: str | None = None) -> list[str]:
    """Returns the names of the registered backends, sorted.

    Args:
        device_kind: Only the backends whose ``device_kinds`` include this kind
            (``"cuda"``...); a backend without ``device_kinds`` counts as ``("cpu",)``.
    """
    with _registry_lock:
        return sorted(name for name, backend in _registry.items()
                      if device_kind is None or device_kind in getattr(backend, "device_kinds", ("cpu",)))


def get_backend(name: str | None = None) -> Backend:
    """Returns the backend registered as ``name``.

    Args:
        name: Backend name (case-insensitive). ``None`` means
            ``$GRAPHDIST_BACKEND``, else ``"ort"``.

    Raises:
        PlanError: No backend has that name; the message lists the choices.
    """
    source = "backend"
    if name is None:
        env = os.environ.get("GRAPHDIST_BACKEND", "").strip()
        source, name = (
            ("GRAPHDIST_BACKEND", env) if env else ("backend", DEFAULT_BACKEND)
        )
    key = name.strip().lower() if isinstance(name, str) else name
    with _registry_lock:
        backend = _registry.get(key)
        choices = ", ".join(repr(n) for n in sorted(_registry))
    if backend is None:
        raise PlanError(f"unknown {source} {name!r}; choose one of {choices}")
    return backend


def cache_dir() -> Path:
    """Returns the on-disk compile cache directory (not created here):
    ``$GRAPHDIST_CACHE_DIR``, else ``~/.cache/graphdist``.
    """
    env = os.environ.get("GRAPHDIST_CACHE_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "graphdist"


def cache_key(
    backend: Backend, model: onnx.ModelProto, device: Device, threads: int | None = None
) -> str:
    """Returns the hex SHA-256 identifying a compile of ``model``.

    It covers the serialized model (deterministic serialization), the backend
    name, its target for ``device``, its library version and ``threads``.
    """
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    for part in (backend.name, backend.target(device), backend.version, str(threads)):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


#: Suffix of the file holding an artefact's SHA-256 (and the key it was stored under) next to it.
CHECKSUM_SUFFIX = ".sha256"
#: Default size limit of the disk cache (``GRAPHDIST_CACHE_MAX_BYTES`` overrides it).
DEFAULT_CACHE_MAX_BYTES = 2 * 1024**3
_KEY = re.compile(r"^[0-9a-f]{64}$")
_warned_unsafe: set[str] = set()


def _checksum_path(path: Path) -> Path:
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _entry_parts(path: Path) -> tuple[Path, str] | None:
    """``(cache root, key)`` of the entry ``path`` is (``<root>/<backend>/<key>``) or lies in, else ``None``."""
    parts = Path(os.path.abspath(path)).parts
    for index in range(len(parts) - 1, 1, -1):
        if _KEY.match(parts[index]):
            return Path(*parts[: index - 1]), "/".join(parts[index - 1:])
    return None


def _entry_identity(path: Path) -> str:
    """What an artefact is stored under: ``<backend>/<key>/<file>`` (its absolute path outside a cache)."""
    parts = _entry_parts(path)
    return parts[1] if parts is not None else str(Path(os.path.abspath(path)))


def write_artifact_checksum(path: Path) -> None:
    """Writes the SHA-256 of the (complete, already renamed) artefact ``path`` next to it, atomically,
    with the key it is stored under, so a copy of it under another key is rejected.
    """
    data = path.read_bytes()
    record = {"key": _entry_identity(path), "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    atomic_write_bytes(_checksum_path(path), json.dumps(record).encode())


def _verify(path: Path, data: bytes, sidecar: bytes) -> str | None:
    """Why ``data`` is not the artefact stored at ``path``, or ``None``."""
    try:
        record = json.loads(sidecar)
        key, digest = record["key"], record["sha256"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "its checksum file is not in this graphdist's format"
    if key != _entry_identity(path):
        return f"it was stored under another key ({key}): a copy of another entry"
    if hashlib.sha256(data).hexdigest() != digest:
        return "checksum mismatch"
    return None


def read_verified_artifact(path: Path, what: str) -> bytes | None:
    """Returns the bytes of a cached artefact whose checksum file matches, else ``None``.

    A missing artefact or checksum is a plain miss; an artefact another user could have
    written (:func:`cache_entry_allowed`) is left alone and not read (warned once); an
    unreadable one is logged; a mismatch (or an artefact stored under another key) is
    logged and both files are discarded (the caller compiles again). A hit marks the
    entry as recently used.

    Args:
        path: The artefact.
        what: What it is, for log messages (``"cached model"``).
    """
    if not os.path.lexists(path) or not cache_entry_allowed(path):
        return None
    try:
        data = path.read_bytes()
        sidecar = _checksum_path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        logger.warning("cannot read %s %s (%s); recompiling", what, path, err)
        return None
    problem = _verify(path, data, sidecar)
    if problem is not None:
        logger.warning("%s %s is rejected (%s); recompiling", what, path, problem)
        discard_artifact(path)
        return None
    with contextlib.suppress(OSError):  # least-recently-used eviction reads this time
        os.utime(_checksum_path(path))
    return data


def cache_entry_allowed(path: Path) -> bool:
    """Whether the disk cache may read ``path`` (an artefact) or write there (an entry's directory).

    Only when no other user could have put anything there (:func:`graphdist.fsutil.private_problem`:
    ``path``, or the nearest part of it that exists, and every directory up to the cache directory
    belong to this user, are not writable by group or others and are no symbolic links; above the
    cache directory, directories belong to this user or root and are not writable by others unless
    sticky), as ssh and pip require. Otherwise warns once per reason and returns ``False``: the
    segment is compiled in memory, without the disk cache.
    """
    parts = _entry_parts(path)
    root = parts[0] if parts is not None else Path(os.path.abspath(path)).parent
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    problem = private_problem(existing, root)
    if problem is None:
        return True
    if problem not in _warned_unsafe:
        _warned_unsafe.add(problem)
        logger.warning("not using the compile cache %s: %s, so another user could have put code there that "
                       "graphdist would run; compiling without it (in memory) instead. Fix it with `chmod go-w` on "
                       "that directory (remove a symbolic link, `rm -r` what another user owns), or point "
                       "GRAPHDIST_CACHE_DIR at a directory only you can write", root, problem)
    return False


def make_cache_dir(path: Path) -> None:
    """Creates a disk cache directory (and missing parents) private to this user (mode ``0o700``)."""
    make_private_dir(path)


def discard_artifact(path: Path) -> None:
    """Removes a cached artefact and its checksum (failures are only logged)."""
    for file in (path, _checksum_path(path)):
        try:
            file.unlink(missing_ok=True)
        except OSError as err:
            logger.debug("cannot remove %s: %s", file, err)


def cache_max_bytes() -> int:
    """The disk cache's size limit: ``$GRAPHDIST_CACHE_MAX_BYTES``, else 2 GiB (``0``: only the newest entry).

    Raises:
        InvalidArgumentError: The variable is not a non-negative integer.
    """
    text = os.environ.get("GRAPHDIST_CACHE_MAX_BYTES", "").strip()
    if not text:
        return DEFAULT_CACHE_MAX_BYTES
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(f"GRAPHDIST_CACHE_MAX_BYTES must be a number of bytes (an integer >= 0), got "
                                   f"{text!r}; unset it for the default of {DEFAULT_CACHE_MAX_BYTES} bytes")
    return value


def _entries(root: Path) -> list[tuple[float, int, Path]]:
    """``(last use, bytes, directory)`` of every entry (``<root>/<backend>/<key>``) of the disk cache."""
    found = []
    for backend_dir in (p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        for entry in (p for p in backend_dir.iterdir() if _KEY.match(p.name) and p.is_dir()):
            used, size = 0.0, 0
            for file in entry.rglob("*"):
                with contextlib.suppress(OSError):
                    info = file.lstat()
                    size += info.st_size
                    used = max(used, info.st_mtime)
            found.append((used, size, entry))
    return found


def evict_least_recently_used(root: Path, keep: Path | None = None, limit: int | None = None) -> list[Path]:
    """Deletes least-recently-used entries of the disk cache ``root`` until it holds at most ``limit`` bytes.

    Args:
        root: The cache directory.
        keep: An entry never deleted (the one just written).
        limit: Bytes allowed; default :func:`cache_max_bytes`.

    Returns:
        The entries deleted.
    """
    limit = cache_max_bytes() if limit is None else limit
    try:
        entries = sorted(_entries(root))
    except OSError:
        return []
    total = sum(size for _, size, _ in entries)
    evicted = []
    for _, size, entry in entries:
        if total <= limit:
            break
        if keep is not None and entry == keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        total -= size
        evicted.append(entry)
    if evicted:
        logger.info("compile cache %s over its %d-byte limit (GRAPHDIST_CACHE_MAX_BYTES): evicted %d least recently "
                    "used entr%s", root, limit, len(evicted), "y" if len(evicted) == 1 else "ies")
    return evicted


def prepare_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """Returns ``model`` with an IR version every backend can read.

    The caller's model is never modified: when the IR version is above
    :data:`MAX_IR_VERSION` a copy with that version is returned, otherwise
    ``model`` itself.
    """
    if model.ir_version <= MAX_IR_VERSION:
        return model
    copy = type(model)()
    copy.CopyFrom(model)
    copy.ir_version = MAX_IR_VERSION
    return copy


class CompileCache:
    """Compiled executables by cache key, in memory, backed by a disk cache.

    Thread-safe: concurrent requests for the same key compile once; requests
    for different keys compile in parallel. Memory holds the ``max_entries``
    most recently used executables (a plan keeps its own, so dropping one
    from the cache only means compiling or loading it again from disk when
    another plan asks for it).

    Args:
        directory: Root of the disk cache; ``None`` means :func:`cache_dir`
            at the time of each compile (so ``GRAPHDIST_CACHE_DIR`` may be
            changed at run time).
        max_entries: Executables kept in memory (default :data:`MEMORY_CACHE_ENTRIES`).
    """

    def __init__(self, directory: Path | None = None, max_entries: int | None = None) -> None:
        self._directory = directory
        self.max_entries = MEMORY_CACHE_ENTRIES if max_entries is None else max(1, int(max_entries))
        self._memory: OrderedDict[str, Executable] = OrderedDict()
        self._pending: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        #: What backends share between executables of equal segments (see ``Backend.compile``).
        self.shared: dict[str, Any] = {}

    @property
    def directory(self) -> Path:
        """Root directory of the disk cache."""
        return self._directory if self._directory is not None else cache_dir()

    def __len__(self) -> int:
        with self._lock:
            return len(self._memory)

    def clear(self) -> None:
        """Forgets every executable held in memory (the disk cache stays)."""
        with self._lock:
            self._memory.clear()
            self.shared.clear()

    def get_or_compile(
        self,
        backend: Backend,
        model: onnx.ModelProto,
        device: Device,
        threads: int | None = None,
    ) -> Executable:
        """Returns the executable for ``model`` on ``device``, compiling it
        (or loading it from disk) the first time.

        Counts ``memory_cache_hits`` in :mod:`graphdist.stats` on a memory
        hit; the backend counts ``compiles`` or ``disk_cache_hits``.

        Raises:
            BackendError: The backend failed to compile the segment.
            DeviceError: The device is not available.
        """
        key = cache_key(backend, model, device, threads)
        with self._lock:
            hit = self._memory.get(key)
            if hit is None:
                key_lock = self._pending.setdefault(key, threading.Lock())
            else:
                self._memory.move_to_end(key)
        if hit is not None:
            stats.increment("memory_cache_hits")
            return hit
        with key_lock:
            with self._lock:
                hit = self._memory.get(key)
            if hit is not None:
                stats.increment("memory_cache_hits")
                return hit
            directory = self.directory / backend.name / key
            limit = cache_max_bytes()  # a bad GRAPHDIST_CACHE_MAX_BYTES fails before any work
            logger.debug(
                "compiling %s segment for %s (key %s)", backend.name, device, key
            )
            trusted = cache_entry_allowed(directory)
            executable = backend.compile(
                model, device, threads=threads, cache_dir=directory if trusted else None, shared=self.shared
            )
            if trusted and directory.is_dir():
                evict_least_recently_used(self.directory, keep=directory, limit=limit)
            with self._lock:
                self._memory[key] = executable
                self._pending.pop(key, None)
                while len(self._memory) > self.max_entries:  # least recently used first
                    self._memory.popitem(last=False)
                while len(self.shared) > self.max_entries:
                    self.shared.pop(next(iter(self.shared)))
        return executable


#: Executables a :class:`CompileCache` keeps in memory by default (bounds a process's memory when it
#: compiles many distinct segments, e.g. a ``gd.function`` called with many shapes).
MEMORY_CACHE_ENTRIES = 256

_default_cache: CompileCache | None = None
_default_lock = threading.Lock()


def default_cache() -> CompileCache:
    """Returns the process-wide :class:`CompileCache`."""
    global _default_cache
    with _default_lock:
        if _default_cache is None:
            _default_cache = CompileCache()
        return _default_cache
