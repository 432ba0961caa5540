"""Atomic file writes, the per-directory save lock and the clean-up of interrupted saves.

Every save of a target ``<parent>/<name>`` (a checkpoint file, a plan or
model directory) stages its data under a hidden name next to the target
(``.<name>.<random>.tmp`` for a file, ``.<name>.tmp-<random>`` for a
directory, ``.<name>.old-<random>`` for a directory renamed aside) and renames
it into place. A save killed half-way leaves such names behind; the next save
of the same target removes them while it holds the parent directory's lock
(:func:`directory_lock`), so it never touches the staging files of a save
still in progress.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

try:  # POSIX only; elsewhere saves are not serialised and leftovers are not cleaned
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_TIMEOUT_S", "atomic_write_bytes", "directory_lock", "remove_leftovers", "replace_file",
           "staging_name", "fsync_directory"]

logger = logging.getLogger(__name__)

#: How long a save waits for another save into the same directory to finish.
LOCK_TIMEOUT_S = 300.0


def staging_name(target: str, kind: str) -> str:
    """A fresh hidden name next to ``target``: ``kind`` is ``"file"``, ``"tmp"`` (a directory) or ``"old"``."""
    token = uuid.uuid4().hex[:12]
    return f".{target}.{token}.tmp" if kind == "file" else f".{target}.{kind}-{token}"


def _leftover_pattern(target: str) -> re.Pattern[str]:
    # Names staging_name() gives, plus those of earlier graphdist versions (mkstemp/mkdtemp: 8
    # characters; Keras saves staged in ".<name>.stage-*").
    name = re.escape(target)
    return re.compile(rf"^\.{name}\.(?:[A-Za-z0-9_]{{8,32}}\.tmp|(?:tmp|old|stage)-[A-Za-z0-9_]{{8,32}})$")


def leftovers(parent: Path, target: str) -> list[Path]:
    """Staging files and directories of saves of ``target`` in ``parent`` (sorted by name)."""
    pattern = _leftover_pattern(target)
    try:
        return sorted(p for p in parent.iterdir() if pattern.match(p.name))
    except OSError:
        return []


def remove_leftovers(parent: Path, target: str, keep: Callable[[Path], bool] = lambda _: False) -> list[Path]:
    """Deletes what interrupted saves of ``target`` left in ``parent`` (call it holding the lock).

    Args:
        parent: The target's directory.
        target: The target's name.
        keep: Leftovers it returns true for are kept.

    Returns:
        The paths removed.
    """
    removed = []
    for path in leftovers(parent, target):
        if keep(path):
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as err:
            logger.warning("cannot remove %s, left by an interrupted save: %s", path, err)
            continue
        removed.append(path)
    if removed:
        logger.info("removed %d leftover(s) of interrupted saves of %s: %s", len(removed), parent / target,
                    ", ".join(p.name for p in removed))
    return removed


@contextlib.contextmanager
def directory_lock(directory: Path, *, error: type[Exception] = TimeoutError, what: str = "save",
                   timeout: float = LOCK_TIMEOUT_S) -> Iterator[bool]:
    """Holds an exclusive ``flock`` on ``directory`` so that saves into it run one at a time.

    Yields:
        Whether the lock is held (``False`` where the filesystem or platform cannot lock: the caller
        then must not remove other saves' staging files).

    Raises:
        error: Another process held the lock for ``timeout`` seconds.
    """
    if fcntl is None:
        yield False
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield False
        return
    try:
        locked = _acquire(fd, directory, error, what, timeout)
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, directory: Path, error: type[Exception], what: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise error(f"{what}: another process has been saving into {directory} for {timeout:.0f} s (it "
                            "holds the directory's save lock); wait until it finishes, or stop it") from None
            time.sleep(0.02)
        except OSError as err:  # e.g. a filesystem without flock on directories
            logger.debug("cannot lock %s (%s); saving without the lock", directory, err)
            return False


def fsync_directory(path: Path) -> None:
    """Flushes a directory's entries (renames in it) to disk; a failure is ignored."""
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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically.

    The bytes go to a temporary file in the same directory, are flushed to
    disk and then renamed over ``path``, so readers see either the old file,
    no file, or the complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / staging_name(path.name, "file")
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_file(path: str | os.PathLike[str], data: bytes, *, is_ours: Callable[[Path], bool],
                 error: type[Exception], what: str) -> Path:
    """Writes ``data`` to the file ``path`` atomically, replacing only a file graphdist wrote.

    Holding the parent directory's lock, it removes what interrupted saves of
    ``path`` left, refuses to replace a file ``is_ours`` rejects, and writes.

    Args:
        path: The file.
        data: Its new content.
        is_ours: Whether an existing file at ``path`` may be replaced.
        error: Exception class raised on refusal.
        what: The operation, for messages (``"Checkpoint.save"``).

    Returns:
        The absolute path written.

    Raises:
        error: ``path`` is a directory, a symbolic link, a path under a file, or a file graphdist did not
            write.
        OSError: The file cannot be written (disk full, read-only, permission denied...): the old file is
            intact.
    """
    target = Path(os.path.abspath(path))
    if target.is_symlink():
        raise error(f"{what}: {target} is a symbolic link; pass the path of the file itself")
    if target.is_dir():
        raise error(f"{what}: {target} is a directory; pass a file path inside it, e.g. {target / 'ckpt.npz'}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:  # a parent is a file (other failures: the caller's)
        raise error(f"{what}: cannot create the directory {target.parent} for {target.name}: "
                    f"{err.strerror or err}; choose a path under a writable directory") from None
    with directory_lock(target.parent, error=error, what=what) as locked:
        if locked:
            remove_leftovers(target.parent, target.name)
        if target.exists() and not is_ours(target):
            raise error(f"{what}: {target} exists and is not a file graphdist wrote; refusing to overwrite it: "
                        "delete it yourself or choose another path")
        atomic_write_bytes(target, data)
    fsync_directory(target.parent)
    return target
