"""The side channel between ``graphdist launch`` and the processes of its job: small files in one folder.

``graphdist launch`` gives every rank the folder in ``GRAPHDIST_LAUNCH_DIR``
(a temporary folder on the launcher's host). Files in it, each written
atomically (a temporary name, then a rename), so a reader never sees half a
file:

* ``rank<R>.start``: written by the rank wrapper when the task started:
  ``{"wrapper": pid, "task": pid}`` (the launcher stops the job by pid);
* ``rank<R>.mpi_init`` / ``rank<R>.mpi_ready``: the task started / finished
  initialising MPI (``MPI_Init`` returns only once every rank called it, so
  a rank that ended without ``mpi_ready`` leaves the others in ``MPI_Init``
  for ever: the launcher ends the job instead);
* ``rank<R>.finishing``: the task's program ended normally and it is leaving
  (written at exit, before ``MPI_Finalize``, which may wait for the other
  ranks): a rank waiting for it in a collective stops waiting at once;
* ``rank<R>.joined``: the task joined the job's communication (a
  ``ParameterServerStrategy`` worker connected to its ps tasks); a worker
  lost after this point does not end a parameter-server job;
* ``rank<R>.json``: how the task ended: ``{"returncode", "time",
  "last_line"}`` (``returncode < 0``: killed by that signal).

The launcher watches the folder to end a job as soon as a rank it needs
has ended, without waiting for a collective timeout; a ps task reads it to
stop waiting for workers that ended without saying ``stop``. Outside
``graphdist launch`` (no ``GRAPHDIST_LAUNCH_DIR``) every function here is a
no-op or answers ``None``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

__all__ = [
    "LAUNCH_DIR_ENV",
    "LAUNCH_RANK_ENV",
    "launch_dir",
    "launch_rank",
    "write_json",
    "record_start",
    "record_joined",
    "record_mpi",
    "record_finishing",
    "finishing",
    "mpi_stage",
    "record_exit",
    "read_start",
    "read_exit",
    "has_joined",
    "describe_exit",
]

logger = logging.getLogger(__name__)

LAUNCH_DIR_ENV = "GRAPHDIST_LAUNCH_DIR"
"""Environment variable naming the job's status folder."""

LAUNCH_RANK_ENV = "GRAPHDIST_LAUNCH_RANK"
"""Environment variable with the task's rank (set by the rank wrapper)."""


def launch_dir() -> Path | None:
    """The job's status folder, or ``None`` outside ``graphdist launch``."""
    text = os.environ.get(LAUNCH_DIR_ENV, "").strip()
    return Path(text) if text else None


def launch_rank() -> int | None:
    """This task's rank as its rank wrapper numbered it, or ``None`` outside ``graphdist launch``."""
    text = os.environ.get(LAUNCH_RANK_ENV, "").strip()
    return int(text) if text.isdigit() else None


def write_json(path: Path, data: dict[str, Any]) -> bool:
    """Writes ``data`` to ``path`` atomically; returns whether it worked (a status file is best effort:
    on another host than the launcher's the folder may not exist).
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(data))
        os.replace(temporary, path)
    except OSError as err:
        logger.debug("could not write the launch status %s: %s", path, err)
        return False
    return True


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def record_start(rank: int, wrapper_pid: int, task_pid: int) -> None:
    """Notes the pids of a rank's wrapper and task (the launcher stops the job by pid)."""
    folder = launch_dir()
    if folder is not None:
        write_json(folder / f"rank{rank}.start", {"wrapper": wrapper_pid, "task": task_pid})


def record_joined(rank: int | None = None) -> None:
    """Notes that this task joined the job's communication (default rank: :func:`launch_rank`)."""
    folder, rank = launch_dir(), launch_rank() if rank is None else rank
    if folder is not None and rank is not None:
        write_json(folder / f"rank{rank}.joined", {"time": time.time()})


def record_mpi(stage: str) -> None:
    """Notes that this task reached ``stage`` of MPI's initialisation: ``"init"`` (about to call
    ``MPI_Init``) or ``"ready"`` (it returned).
    """
    folder, rank = launch_dir(), launch_rank()
    if folder is not None and rank is not None and not (folder / f"rank{rank}.mpi_{stage}").exists():
        write_json(folder / f"rank{rank}.mpi_{stage}", {"time": time.time()})


def record_finishing() -> None:
    """Notes that this task's program ended normally (called at exit, before ``MPI_Finalize``)."""
    folder, rank = launch_dir(), launch_rank()
    if folder is not None and rank is not None:
        write_json(folder / f"rank{rank}.finishing", {"time": time.time()})


def finishing(rank: int, folder: Path | None = None) -> bool:
    """Whether rank ``rank`` recorded :func:`record_finishing` (its program ended; it may still be in MPI)."""
    folder = launch_dir() if folder is None else folder
    return folder is not None and (folder / f"rank{rank}.finishing").exists()


def mpi_stage(rank: int, folder: Path | None = None) -> str | None:
    """``"ready"`` (rank ``rank`` initialised MPI), ``"init"`` (it is in ``MPI_Init``) or ``None``."""
    folder = launch_dir() if folder is None else folder
    if folder is None:
        return None
    for stage in ("ready", "init"):
        if (folder / f"rank{rank}.mpi_{stage}").exists():
            return stage
    return None


def record_exit(rank: int, returncode: int, last_line: str = "", when: float | None = None,
                folder: Path | None = None) -> None:
    """Notes how a rank's task ended (``returncode < 0``: killed by that signal) and when (default: now)."""
    folder = launch_dir() if folder is None else folder
    if folder is not None:
        write_json(folder / f"rank{rank}.json", {"returncode": int(returncode), "time": when or time.time(),
                                                 "last_line": last_line[:300]})


def read_start(rank: int, folder: Path | None = None) -> dict[str, Any] | None:
    """``{"wrapper", "task"}`` pids of a started rank, else ``None``."""
    folder = launch_dir() if folder is None else folder
    return None if folder is None else _read_json(folder / f"rank{rank}.start")


def read_exit(rank: int, folder: Path | None = None) -> dict[str, Any] | None:
    """How rank ``rank`` ended (``{"returncode", "time", "last_line"}``), or ``None`` while it runs."""
    folder = launch_dir() if folder is None else folder
    return None if folder is None else _read_json(folder / f"rank{rank}.json")


def has_joined(rank: int, folder: Path | None = None) -> bool:
    """Whether rank ``rank`` recorded :func:`record_joined`."""
    folder = launch_dir() if folder is None else folder
    return folder is not None and (folder / f"rank{rank}.joined").exists()


def describe_exit(returncode: int) -> str:
    """``"killed by SIGKILL"`` / ``"exited with status 3"``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"
