"""Whether what graphdist is about to use could have been put there by another user (ssh's StrictModes).

One rule, for the compile cache (native code and ONNX models it runs), exported plans and saved
models (ONNX graphs it runs): :func:`private_problem` checks a *path* (a file, or a directory and,
with ``below=True``, everything in it) and every directory from it up to a *root* (the cache
directory; for a plan, the plan directory itself):

* each is owned by this user (the compile cache) or by this user or root (``allow_root=True``:
  a plan installed by root is as safe as root is);
* none is writable by group or others; a group write bit is accepted when the group is this
  user's private group (named like the user, with no other members, and the user's primary group:
  the "user private group" scheme of Debian and Red Hat, whose default umask 002 makes every new
  file group-writable; Debian's ssh accepts it the same way);
* none is a symbolic link (a link inside the tree could point anywhere).

Above the root, symbolic links are followed, and every directory on the path as written and on
the resolved path must belong to this user or root and not be writable by group or others unless
it has the sticky bit (as ``/tmp``: others may create entries in a sticky directory, but not
rename or delete the ones this user owns, so a private directory inside it stays private).
"""

from __future__ import annotations

import functools
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


@functools.cache
def _private_group(gid: int, uid: int) -> bool:
    """Whether ``gid`` is the private group of user ``uid`` (named like the user, no other members, primary)."""
    try:
        import grp
        import pwd

        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == user.pw_name and user.pw_gid == gid and set(group.gr_mem) <= {user.pw_name}


def _writable_by_others(info: os.stat_result) -> bool:
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and not _private_group(info.st_gid, _uid())


def _describe(info: os.stat_result) -> str:
    who = [w for bit, w in ((stat.S_IWGRP, f"group {info.st_gid}"), (stat.S_IWOTH, "others"))
           if info.st_mode & bit]
    return f"writable by {' and '.join(who)} (mode {stat.S_IMODE(info.st_mode):o})"


def _owner_problem(path: Path, info: os.stat_result, allow_root: bool) -> str | None:
    if info.st_uid == _uid() or (allow_root and info.st_uid == 0):
        return None
    owners = "this user or root" if allow_root else "this user"
    return f"{path} belongs to user id {info.st_uid}, not to {owners} ({_uid()})"


def _own_problem(path: Path, info: os.stat_result, allow_root: bool) -> str | None:
    """Why ``path`` (inside the root: lstat ``info``) is not private, or ``None``."""
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    problem = _owner_problem(path, info, allow_root)
    if problem:
        return problem
    if _writable_by_others(info):
        return f"{path} is {_describe(info)}"
    return None


def _ancestor_problem(path: Path, info: os.stat_result) -> str | None:
    """Why the directory ``path`` above the root (stat ``info``) lets others replace what is below it."""
    if info.st_uid not in (_uid(), 0):
        return f"{path} belongs to user id {info.st_uid}, neither this user nor root"
    if _writable_by_others(info) and not info.st_mode & stat.S_ISVTX:
        return f"{path} is {_describe(info)} without the sticky bit"
    return None


def _below_problem(directory: Path, allow_root: bool) -> str | None:
    """The first entry below ``directory`` that is not private (walked without following links)."""
    for top, dirs, files in os.walk(directory, followlinks=False):
        for name in sorted(dirs) + sorted(files):
            entry = Path(top) / name
            problem = _own_problem(entry, os.lstat(entry), allow_root)
            if problem:
                return problem
    return None


def private_problem(path: Path, root: Path, *, allow_root: bool = False, below: bool = False) -> str | None:
    """Why ``path`` is not private to this user (see the module docstring), or ``None`` when it is.

    Args:
        path: What is about to be trusted (a file or directory at or below ``root``; it must exist).
        root: The top of the tree that must be private (the compile cache's directory; a plan
            directory itself). Above it, directories need only be safe from renames by others.
        allow_root: Entries owned by root are accepted too (plans and saved models; the compile cache
            holds only what this user wrote).
        below: Also check everything inside ``path`` (a directory).

    Returns:
        The first problem found, naming the path and what is wrong with it.
    """
    if not hasattr(os, "getuid"):  # pragma: no cover - no POSIX ownership to check
        return None
    path, root = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    try:
        if not path.is_relative_to(root):  # the root does not exist yet: only directories above it to check
            return _ancestors_problem([path, *path.parents])
        real_root = Path(os.path.realpath(root))
        parts = path.relative_to(root).parts
        for count in range(len(parts), 0, -1):  # inside the root: nothing may be a link
            current = real_root.joinpath(*parts[:count])
            problem = _own_problem(current, os.lstat(current), allow_root)
            if problem:
                return problem
        problem = _own_problem(real_root, os.stat(real_root), allow_root) or _ancestors_problem(
            [*root.parents, *real_root.parents])
        if problem:
            return problem
        if below and path.is_dir():
            return _below_problem(real_root.joinpath(*parts), allow_root)
    except OSError as err:
        return f"cannot check {path}: {err.strerror or err}"
    return None


def _ancestors_problem(directories: list[Path]) -> str | None:
    for directory in dict.fromkeys(directories):
        problem = _ancestor_problem(directory, os.stat(directory))
        if problem:
            return problem
    return None
