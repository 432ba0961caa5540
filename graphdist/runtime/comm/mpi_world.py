"""The MPI job as a process joins it: its communicator (MPI's world, or the tasks a cluster spec names, joined),
the collective timeout, and leaving without ``MPI_Finalize`` once a peer is lost.

Split from :mod:`graphdist.runtime.comm.mpi` (the communicator), which uses these.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from graphdist.errors import GraphdistError, InvalidArgumentError
from graphdist.runtime import launch_status, rendezvous

__all__ = ["world", "world_of_launcher", "default_timeout", "skip_finalize", "task_ended"]


def world(spec: Any = None, task_type: str | None = None, task_id: int | None = None) -> Any:
    """The communicator of every task of the job (initialising MPI on first use).

    Under an MPI launcher (``graphdist launch``, ``mpiexec -n N``, ``srun``)
    that is ``MPI.COMM_WORLD``. A task started on its own with a multi-task
    cluster (``spec``, with this task's ``task_type`` / ``task_id``) joins the
    other tasks first (:func:`graphdist.runtime.comm.mpi_join.join`); later
    calls return the same communicator.

    Raises:
        GraphdistError: mpi4py or an MPI library is not installed.
        ClusterConfigError: The tasks cannot meet or join.
    """
    global _joined
    if _joined is not None:
        return _joined
    if spec is not None and task_type is not None and task_id is not None:
        from graphdist.runtime.comm import mpi_join

        if len(mpi_join.meeting_ranks(spec)) > 1 and task_type != "evaluator":
            _joined = mpi_join.join(spec, task_type, int(task_id))
            return _joined
    return world_of_launcher()


_joined: Any = None


def world_of_launcher() -> Any:
    """``MPI.COMM_WORLD``: the processes the MPI launcher started together (initialising MPI)."""
    return _import_mpi().COMM_WORLD


def _import_mpi() -> Any:
    # graphdist launch ends a job whose rank ended without MPI while another waits in MPI_Init (for ever).
    launch_status.record_mpi("init")
    try:
        from mpi4py import MPI  # MPI_Init: returns once every rank of the job called it
    except ImportError as err:  # mpi4py is an optional dependency (the [mpi] extra)
        from graphdist.runtime.comm.mpi_join import missing_mpi_message

        raise GraphdistError(missing_mpi_message(err)) from None
    launch_status.record_mpi("ready")
    # Registered after mpi4py's own exit handler, so it runs first: the other ranks learn that this one's program
    # ended before MPI_Finalize (which may wait for them).
    atexit.register(launch_status.record_finishing)
    return MPI


def default_timeout() -> float:
    """Seconds a collective may wait: ``GRAPHDIST_COLLECTIVE_TIMEOUT`` or 300."""
    text = os.environ.get("GRAPHDIST_COLLECTIVE_TIMEOUT", "").strip()
    if not text:
        return 300.0
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgumentError(f"GRAPHDIST_COLLECTIVE_TIMEOUT must be a number of seconds, got {text!r}") from None
    if value <= 0:
        raise InvalidArgumentError(f"GRAPHDIST_COLLECTIVE_TIMEOUT must be > 0, got {value}")
    return value


_broken_processes: list[str] = []


def skip_finalize(reason: str) -> None:
    """Makes this process leave without ``MPI_Finalize`` (after flushing, with status 1): a peer it waited
    for is dead or unreachable, and finalizing would wait for it for ever (``reason`` says why).
    """
    if not _broken_processes:
        atexit.register(_skip_finalize_when_broken)
    _broken_processes.append(reason)


def _skip_finalize_when_broken() -> None:
    # MPI_Finalize would wait for a dead rank forever; leave without it (after flushing output).
    if _broken_processes:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def task_ended(rank: int) -> str | None:
    """How task ``rank`` of the job ended (``"finished"``, ``"exited with status 1"``...), ``None`` while it runs
    or when nobody knows: the job's meeting knows the tasks started with TF_CONFIG (a goodbye, or a lost
    connection), ``graphdist launch``'s status folder the ranks it started. A collective waiting for a task that
    ended can end at once instead of at its timeout.
    """
    how = rendezvous.task_ended(rank)
    if how is not None:
        return how
    ended = launch_status.read_exit(rank)
    if ended is None:
        return "finished" if launch_status.finishing(rank) else None
    code = int(ended.get("returncode", 0))
    return "finished" if code == 0 else launch_status.describe_exit(code)
