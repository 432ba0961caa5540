"""One MPI communicator for tasks started on their own, with TF_CONFIG addresses (as the seeds start them).

A process started by plain ``python train.py`` whose ``TF_CONFIG`` (or
``GRAPHDIST_CONFIG``) lists several tasks joins them here when it first needs
MPI (``MultiWorkerMirroredStrategy()``, ``ParameterServerStrategy()``,
``gd.Server(...)``):

1. **Under MPI.** MPICH 5.0's singleton processes (started without
   ``mpiexec``) cannot connect to each other ("Local and remote groups in
   MPI_Intercomm_create must not overlap", an open MPICH bug), and a process
   started by ``mpiexec -n 1`` can. So a task not started by an MPI launcher
   re-executes itself as ``mpiexec -n 1 <this python> <its arguments>``,
   with the same environment, working directory and process id (what ran
   before the strategy was created runs once more in the new image). The
   network settings that reach the other hosts are added unless given:
   ``MPIR_CVAR_CH4_NETMOD=ofi``, ``FI_PROVIDER=tcp`` and ``FI_TCP_IFACE``,
   the interface this host reaches the chief's (else another task's)
   address through (``GRAPHDIST_MPI_IFACE`` overrides it). MPICH's default
   network module hangs between two hosts here; TCP through libfabric works.
2. **Meet** (:mod:`graphdist.runtime.rendezvous`): every task listens on
   its own TF_CONFIG address; the chief checks that all tasks run the same
   cluster and graphdist version and that no task is claimed twice, opens an
   MPI port (``MPI_Open_port``) and hands it out.
3. **Join**: each task calls ``MPI_Comm_connect`` on the port; the tasks
   already joined ``MPI_Comm_accept`` it together and merge
   (``MPI_Intercomm_merge``), one task at a time in arrival order; the last
   merge is split with every task's rank as key, so ranks follow
   :func:`graphdist.runtime.cluster_spec.task_rank` as under ``graphdist
   launch``. The whole join must finish within the connect timeout, else
   the process ends with a message (MPI's accept has no timeout).

From then on :func:`graphdist.runtime.comm.mpi.world` returns this
communicator, and the rendezvous watches for lost tasks.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import shutil
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from graphdist.errors import ClusterConfigError, GraphdistError
from graphdist.runtime import rendezvous
from graphdist.runtime.cluster_spec import ClusterSpec, rank_task, task_rank
from graphdist.version import __version__

__all__ = ["REEXEC_ENV", "IFACE_ENV", "WATCH_ENV", "find_mpiexec", "require_mpi4py", "missing_mpi_message",
           "under_mpi_launcher", "meeting_ranks", "join", "network_settings", "interface_towards", "reexec_command"]

logger = logging.getLogger(__name__)

REEXEC_ENV = "GRAPHDIST_REEXECUTED"
"""Set in a task that re-executed itself under ``mpiexec -n 1`` (it never does so twice)."""

IFACE_ENV = "GRAPHDIST_MPI_IFACE"
"""Overrides the network interface MPI uses between hosts (``FI_TCP_IFACE``)."""

WATCH_ENV = "GRAPHDIST_WATCH"
"""Set by ``graphdist launch --hosts``: the launched tasks also meet at their addresses, only to hear at once of
a task lost on another host (the launcher's supervision sees only its own host)."""

_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")
_SIOCGIFADDR = 0x8915


def under_mpi_launcher() -> bool:
    """Whether an MPI process manager (``mpiexec``, ``srun``) started this process."""
    return any(os.environ.get(name) for name in _LAUNCHER_VARIABLES)


def meeting_ranks(spec: ClusterSpec) -> list[int]:
    """Ranks of the tasks that form the MPI job (every task but evaluators)."""
    return [task_rank(spec, job, i) for job in spec.jobs if job != "evaluator" for i in spec.task_indices(job)]


# ------------------------------------------------------------------ network
def interface_towards(ip: str) -> str | None:
    """The name of this host's interface that traffic to ``ip`` leaves through (IPv4), else ``None``."""
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        probe.connect((ip, 9))  # a UDP "connect" only picks the route: nothing is sent
        local = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return _interface_with(local)


def _interface_with(ip: str) -> str | None:
    if ipaddress.ip_address(ip).is_loopback:
        return "lo"
    request = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(request.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    finally:
        request.close()
    return None


def _peer_ips(spec: ClusterSpec, rank: int) -> list[str]:
    """IPv4 addresses of the other tasks, the chief's first (those that resolve)."""
    ips = []
    for other in meeting_ranks(spec):
        if other == rank:
            continue
        job, index = rank_task(spec, other)
        host, port = rendezvous.split_address(spec.task_address(job, index), f"{job} {index}")
        try:
            ips.append(socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
        except (OSError, UnicodeError):
            continue
    return ips


def network_settings(spec: ClusterSpec, rank: int) -> dict[str, str]:
    """MPICH's settings for reaching the other tasks over TCP: netmod, provider and interface."""
    settings = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp",
                # A task that is lost must not keep the others in MPI_Finalize (a parameter server's
                # workers may end at any time): finalize locally.
                "MPIR_CVAR_NO_COLLECTIVE_FINALIZE": "1"}
    iface = os.environ.get(IFACE_ENV, "").strip()
    if not iface:
        iface = next((found for ip in _peer_ips(spec, rank) if (found := interface_towards(ip))), "")
    if iface:
        settings["FI_TCP_IFACE"] = iface
    return settings


# ------------------------------------------------------------------ re-exec
def require_mpi4py() -> None:
    """Raises the error that names the ``[mpi]`` extra when mpi4py cannot be imported (MPI is not initialised).

    Raises:
        GraphdistError: mpi4py is not installed.
    """
    try:
        import mpi4py  # noqa: F401 - the package only: importing mpi4py.MPI would initialise MPI
    except ImportError as err:
        raise GraphdistError(missing_mpi_message(err)) from None


def missing_mpi_message(err: ImportError) -> str:
    """What to install when mpi4py or the MPI library is missing."""
    return (f"multi-process training needs mpi4py and an MPI library ({err}); install them with "
            "`pip install 'graphdist[mpi]'` (mpi4py and the mpich wheel)")


def find_mpiexec() -> str:
    """``mpiexec`` next to this Python (the venv's, from the ``mpich`` wheel), else on ``PATH``.

    Raises:
        GraphdistError: There is none.
    """
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise GraphdistError("mpiexec was not found next to this Python or on PATH; install MPI with "
                             "`pip install 'graphdist[mpi]'` (mpi4py and the mpich wheel; `make install` does)")
    return found


def reexec_command(mpiexec: str) -> list[str]:
    """``mpiexec -n 1 <this python> <the arguments this process was started with>``.

    Raises:
        ClusterConfigError: This is an interactive session (no program to run again).
    """
    arguments = list(getattr(sys, "orig_argv", [])[1:])
    interactive = not arguments or arguments == ["-i"] or (sys.flags.interactive and not sys.argv[0])
    if interactive or hasattr(sys, "ps1"):
        raise ClusterConfigError(
            "this task of a multi-task TF_CONFIG cluster runs in an interactive session, which cannot join the job "
            "(MPI needs the task started by a process manager); run the program as a script, or start Python as "
            "`mpiexec -n 1 python ...` (mpiexec from the mpich wheel, next to this Python)")
    return [mpiexec, "-n", "1", sys.executable, *arguments]


def _reexecute(spec: ClusterSpec, rank: int) -> None:
    """Replaces this process by itself under ``mpiexec -n 1`` (see the module docstring); never returns."""
    if os.environ.get(REEXEC_ENV):
        raise ClusterConfigError("this task re-executed itself under mpiexec, but MPI's process manager variables "
                                 f"({', '.join(_LAUNCHER_VARIABLES[:3])}) are missing; start it as "
                                 "`mpiexec -n 1 python ...`")
    try:
        mpiexec = find_mpiexec()
    except GraphdistError as err:
        raise ClusterConfigError(f"joining a multi-task cluster needs MPI: {err}") from None
    command = reexec_command(mpiexec)
    environment = dict(os.environ)
    for key, value in network_settings(spec, rank).items():
        environment.setdefault(key, value)
    environment[REEXEC_ENV] = "1"
    environment.setdefault("PYTHONUNBUFFERED", "1")
    logger.info("re-executing under MPI: %s", " ".join(command))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, environment)


# ------------------------------------------------------------------ join
def join(spec: ClusterSpec, task_type: str, task_id: int) -> Any:
    """This task's communicator with every task of ``spec`` (ranks by :func:`task_rank`).

    Started by an MPI launcher with as many processes as the cluster has
    tasks, that is ``MPI.COMM_WORLD``; started on its own, the task re-executes
    itself under ``mpiexec -n 1`` if needed, meets the others and joins them.

    Raises:
        ClusterConfigError: The MPI job does not match the cluster, or the tasks cannot meet (see
            :class:`graphdist.runtime.rendezvous.Rendezvous`).
    """
    rank = task_rank(spec, task_type, task_id)
    if not under_mpi_launcher():
        # Before the process is replaced: every address has a port, and mpi4py is there.
        for other in meeting_ranks(spec):
            job, index = rank_task(spec, other)
            rendezvous.split_address(spec.task_address(job, index), f"{job} {index}'s TF_CONFIG address")
        require_mpi4py()
        _reexecute(spec, rank)
    from graphdist.runtime.comm.mpi_world import world_of_launcher

    launched = world_of_launcher()
    if launched.Get_size() != 1:
        # Started as one MPI job (graphdist launch, mpiexec -n N, srun): its callers check the sizes.
        if os.environ.get(WATCH_ENV) and launched.Get_size() == len(meeting_ranks(spec)):
            _watch(rendezvous.Rendezvous(spec, task_type, task_id, version=__version__), lambda: "")
        return launched
    meeting_point = rendezvous.Rendezvous(spec, task_type, task_id, version=__version__)
    from mpi4py import MPI

    meeting = _watch(meeting_point, MPI.Open_port)
    done = threading.Event()
    threading.Thread(target=_end_if_not_joined, args=(done, meeting_point), daemon=True).start()
    comm = _merge(MPI, meeting, len(meeting_ranks(spec)), meeting_point.hub)
    done.set()
    logger.info("%s joined the job as rank %d of %d (hosts %s)", meeting_point.name, comm.Get_rank(),
                comm.Get_size(), meeting.hosts)
    return comm


def _watch(meeting_point: rendezvous.Rendezvous, open_port: Any) -> rendezvous.Meeting:
    """Meets the other tasks, then watches them for the rest of the process (goodbye at a normal exit)."""
    import atexit

    meeting = meeting_point.meet(open_port)
    rendezvous.set_current(meeting_point)
    meeting_point.watch()
    atexit.register(meeting_point.close)
    return meeting


def _merge(mpi: Any, meeting: rendezvous.Meeting, size: int, hub: int) -> Any:
    """Accepts / connects and merges until all ``size`` tasks are in one communicator, ordered by rank."""
    remaining = np.zeros(1, np.int64)
    if meeting.rank == hub:
        comm, remaining[0] = mpi.COMM_SELF, size - 1
    else:
        comm = _absorb(mpi.COMM_SELF.Connect(meeting.port, root=0), high=True)
        comm.Bcast(remaining, root=0)
    while remaining[0] > 0:
        comm = _absorb(comm.Accept(meeting.port if meeting.rank == hub else "", root=0), high=False)
        if meeting.rank == hub:
            remaining[0] = size - comm.Get_size()
        comm.Bcast(remaining, root=0)
    if meeting.rank == hub:
        mpi.Close_port(meeting.port)
    ordered = comm.Split(0, key=meeting.rank)
    if comm is not mpi.COMM_SELF:
        comm.Free()
    return ordered


def _absorb(intercomm: Any, high: bool) -> Any:
    merged = intercomm.Merge(high=high)
    intercomm.Free()
    return merged


def _end_if_not_joined(done: threading.Event, meeting_point: rendezvous.Rendezvous) -> None:
    """Ends the process when the MPI join hangs (a task died between the meeting and its connect)."""
    if done.wait(meeting_point.timeout):
        return
    sys.stderr.write(f"graphdist: {meeting_point.name}: ClusterConfigError: the MPI join of the job's tasks did not "
                     f"finish within {meeting_point.timeout:g} s ({rendezvous.CONNECT_TIMEOUT_ENV}): a task died "
                     "after the meeting, or MPI cannot reach another host (see GRAPHDIST_MPI_IFACE)\n")
    sys.stderr.flush()
    os._exit(1)
