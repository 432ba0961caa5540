"""Whether a directory is private to this user, as ssh's StrictModes and pip's cache check it.

Native code (a compiled ``.so``) is loaded from the compile cache only when
nobody else could have put it there: the file and every directory from the
cache root down to it belong to this user and are not writable by group or
others, and every directory above the root belongs to this user or to root
and is not writable by group or others unless it has the sticky bit (as
``/tmp``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["make_private_dir", "private_problem"]


def make_private_dir(path: Path) -> None:
    """Creates ``path`` and its missing parents with mode ``0o700`` (an existing directory is left as it is)."""
    missing = []
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else -1


def _describe(mode: int) -> str:
    who = [w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if mode & bit]
    return f"writable by {' and '.join(who)} (mode {stat.S_IMODE(mode):o})"


def _own_problem(path: Path, info: os.stat_result) -> str | None:
    if info.st_uid != _uid():
        return f"{path} belongs to user id {info.st_uid}, not to this user ({_uid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is {_describe(info.st_mode)}"
    return None


def _ancestor_problem(path: Path, info: os.stat_result) -> str | None:
    if info.st_uid not in (_uid(), 0):
        return f"{path} belongs to user id {info.st_uid}, neither this user nor root"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        return f"{path} is {_describe(info.st_mode)} without the sticky bit"
    return None


def private_problem(path: Path, root: Path) -> str | None:
    """Why ``path`` (a file or directory at or below ``root``) is not private to this user, or ``None``.

    Args:
        path: What is about to be trusted.
        root: The top of the tree graphdist owns (the cache directory); above it, directories only
            need to be safe from renames by other users.
    """
    if not hasattr(os, "getuid"):  # pragma: no cover - no POSIX ownership to check
        return None
    path, root = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    try:
        chain = [path, *path.parents]
        for current in chain:
            info = os.lstat(current)
            if stat.S_ISLNK(info.st_mode) and current.is_relative_to(root):
                return f"{current} is a symbolic link"
            inside = current.is_relative_to(root)
            problem = _own_problem(current, os.stat(current)) if inside else _ancestor_problem(current,
                                                                                                os.stat(current))
            if problem:
                return problem
    except OSError as err:
        return f"cannot check {path}: {err}"
    return None
