"""``graphdist launch``'s supervisor: watches the ranks of a job and ends it when a rank it needs is gone.

``mpiexec`` runs with ``-disable-auto-cleanup`` (a lost parameter-server
worker must not take the job down), so nothing in MPI ends a job whose rank
died; the supervisor does. It polls the job's status folder
(:mod:`graphdist.runtime.launch_status`: each rank wrapper writes how its
task ended the moment it ends) ten times a second, sleeping in between:

* **synchronous jobs** (no ps tasks, e.g. ``MultiWorkerMirroredStrategy``):
  every rank is needed, so any rank that fails (non-zero exit, killed by a
  signal, or its wrapper gone without a report) stops the job at once;
* **parameter-server jobs**: a ps task (it holds variables), the chief (the
  ``chief`` task, else worker 0, as ``ParameterServerStrategy`` counts it)
  or a worker that fails before joining the ps tasks (before its strategy
  connected: the program likely fails on every worker) stops the job; any
  other worker is *lost*: the others go on, as in TensorFlow's asynchronous
  parameter-server training, and the ps tasks stop waiting for it;
* a rank that ended without initialising MPI while another waits in
  ``MPI_Init`` (which returns only once every rank called it) stops the job;
* ``SIGINT`` / ``SIGTERM`` / ``SIGHUP`` to ``graphdist launch`` stop the job.

Stopping sends ``SIGTERM`` to the running tasks, then to every process of
the job (those below ``mpiexec``, and those seen there that became orphans:
the supervisor is their child subreaper), then ``SIGKILL`` to those still
alive, each after a grace period (:data:`TERM_GRACE_S`). Processes are found
by walking ``/proc``: the supervision covers the ranks on this host. Ranks on
other hosts (``--hosts``) write their reports into a folder on their own host:
their tasks watch each other (:mod:`graphdist.runtime.rendezvous`), so a task
lost on any host makes the others fail at once, and the supervisor sees that
here; a rank whose report never arrives counts as succeeded when ``mpiexec``
exits with status 0.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graphdist.runtime import launch_status

__all__ = ["JobSupervisor", "descendants", "TERM_GRACE_S", "POLL_S"]

logger = logging.getLogger(__name__)

POLL_S = 0.1
"""Seconds between two looks at the job (the supervisor sleeps in between)."""

TERM_GRACE_S = 3.0
"""Seconds a stopped process gets between ``SIGTERM`` and ``SIGKILL``."""

_MPIEXEC_GRACE_S = 5.0  # mpiexec's time to exit once every rank has ended
_PS_GRACE_S = 10.0  # ps tasks' time to notice that every worker ended (they check every half second)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


# ------------------------------------------------------------------ processes
def _process_table() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, state letter)}`` of every process (Linux ``/proc``)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        table[int(entry)] = (int(fields[1]), fields[0].decode())
    return table


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> dict[int, str]:
    """``{pid: state}`` of every living process below ``root`` (zombies left out)."""
    table = _process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found[pid] = table[pid][1]
        stack.extend(children.get(pid, []))
    return {pid: state for pid, state in found.items() if state not in ("Z", "X")}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def _end_with_parent() -> None:
    # mpiexec gets SIGTERM when graphdist launch dies (even by SIGKILL), and ends the job's processes.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _reap(pids: set[int]) -> None:
    """Collects the exit of the job's orphans re-parented to this process (the subreaper)."""
    for pid, (parent, state) in _process_table().items():
        if parent == os.getpid() and pid in pids and state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


# ------------------------------------------------------------------ supervisor
class JobSupervisor:
    """Runs ``mpiexec`` for a job's ranks, watches them and reports how they ended.

    Args:
        roles: One entry per rank (``graphdist.cli.launch.build_roles``).
        status_dir: The job's status folder (``GRAPHDIST_LAUNCH_DIR`` of every rank).
        poll_s: Seconds between two looks at the job.
    """

    def __init__(self, roles: Sequence[dict[str, Any]], status_dir: str | Path, poll_s: float = POLL_S) -> None:
        self.roles = list(roles)
        self.folder = Path(status_dir)
        self.poll_s = poll_s
        self.has_ps = any(role["type"] == "ps" for role in self.roles)
        chiefs = [r for r, role in enumerate(self.roles) if role["type"] == "chief"]
        workers = [r for r, role in enumerate(self.roles) if role["type"] == "worker"]
        self.chief_rank = (chiefs or workers or [0])[0]
        self.ended: dict[int, dict[str, Any]] = {}
        self.lost: list[int] = []
        self.stopped: list[int] = []
        self.stop_reason = ""
        self.stop_signal: int | None = None
        self._mpiexec: subprocess.Popen | None = None
        self._seen: set[int] = set()  # every process of the job seen so far (orphans lose their ancestry)
        self._hung_mpiexec = False

    # ------------------------------------------------------------ running
    def run(self, argv: Sequence[str]) -> int:
        """Runs the job to its end; prints what failed and returns ``graphdist launch``'s exit status."""
        previous = self._catch_stop_signals()
        subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        try:
            self._mpiexec = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, start_new_session=True,
                                             preexec_fn=_end_with_parent)
            self._supervise()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if subreaper:
                _prctl(_PR_SET_CHILD_SUBREAPER, 0)
        return self._report()

    def _catch_stop_signals(self) -> dict[int, Any]:
        if sys.platform != "linux" or not _in_main_thread():
            return {}

        def stop(signum: int, frame: Any) -> None:
            self.stop_signal = self.stop_signal or signum

        return {signum: signal.signal(signum, stop) for signum in _STOP_SIGNALS}

    def _job_processes(self) -> set[int]:
        """The living processes of the job: below mpiexec, or seen there before and now this process's orphans."""
        if self._mpiexec is None:
            return set()
        table = _process_table()
        below = set(descendants(self._mpiexec.pid, table))
        if self._mpiexec.poll() is None:
            below.add(self._mpiexec.pid)
        self._seen |= below
        return below | {pid for pid in descendants(os.getpid(), table) if pid in self._seen}

    def _supervise(self) -> None:
        assert self._mpiexec is not None
        all_ended_at = workers_ended_at = None
        polls = 0
        while True:
            polls += 1
            if polls % 10 == 1:
                self._job_processes()  # remember them, in case one is orphaned later
            fatal = self._collect()
            if self.stop_signal is not None:
                return self._stop(f"graphdist launch got {signal.Signals(self.stop_signal).name}")
            if fatal is not None:
                return self._stop(f"{self._name(fatal)} {self._why_fatal(fatal)}")
            stuck = self._stuck_in_mpi_init()
            if stuck:
                return self._stop(stuck)
            if self._mpiexec.poll() is not None:
                return self._after_mpiexec()
            now = time.monotonic()
            if len(self.ended) == len(self.roles):
                all_ended_at = all_ended_at or now
                if now - all_ended_at > _MPIEXEC_GRACE_S:
                    self._hung_mpiexec = True
                    logger.warning("every rank ended but mpiexec did not within %g s: ending it", _MPIEXEC_GRACE_S)
                    return self._stop("")
            elif self.has_ps and all(r in self.ended for r in self._worker_ranks()):
                workers_ended_at = workers_ended_at or now
                if now - workers_ended_at > _PS_GRACE_S:
                    return self._stop("every worker ended but the ps tasks did not")
            time.sleep(self.poll_s)

    def _after_mpiexec(self) -> None:
        """After mpiexec exited: takes the last reports, ends anything left (ranks whose wrapper vanished)."""
        deadline = time.monotonic() + 1.0
        while len(self.ended) < len(self.roles) and time.monotonic() < deadline:
            self._collect()
            time.sleep(self.poll_s / 2)
        if self._job_processes():
            status = self._mpiexec.returncode if self._mpiexec is not None else None
            self._stop(f"mpiexec exited with status {status} before them")

    def _collect(self) -> int | None:
        """Reads new exit reports; returns the first newly failed rank the job cannot go on without."""
        fatal = None
        for rank in range(len(self.roles)):
            if rank in self.ended:
                continue
            status = launch_status.read_exit(rank, self.folder) or self._vanished(rank)
            if status is None:
                continue
            self.ended[rank] = status
            if status["returncode"] == 0:
                continue
            if self._is_fatal(rank):
                fatal = rank if fatal is None else fatal
            else:
                self.lost.append(rank)
                logger.warning("%s lost (%s); the other workers go on", self._name(rank), self._how(rank))
        return fatal

    def _vanished(self, rank: int) -> dict[str, Any] | None:
        """A report for a rank whose wrapper is gone without writing one (killed itself)."""
        start = launch_status.read_start(rank, self.folder)
        if start is None or _alive(int(start["wrapper"])):
            return None
        status = launch_status.read_exit(rank, self.folder)  # written just before the wrapper ended?
        if status is not None:
            return status
        if _alive(int(start["task"])):
            _signal(int(start["task"]), signal.SIGKILL)  # its output goes nowhere any more
        return {"returncode": None, "time": time.time(), "last_line": "",
                "how": "its rank wrapper ended without reporting (killed)"}

    def _stuck_in_mpi_init(self) -> str:
        """Why running ranks can never leave ``MPI_Init`` ('' if none is stuck): a rank ended without it."""
        absent = [r for r in self.ended if launch_status.mpi_stage(r, self.folder) != "ready"]
        if not absent:
            return ""
        waiting = [r for r in range(len(self.roles))
                   if r not in self.ended and launch_status.mpi_stage(r, self.folder) == "init"]
        if not waiting:
            return ""
        return (f"{', '.join(self._name(r) for r in absent)} ended without initialising MPI, so "
                f"{', '.join(self._name(r) for r in waiting)} would wait in MPI_Init for ever")

    def _is_fatal(self, rank: int) -> bool:
        if not self.has_ps or self.roles[rank]["type"] == "ps" or rank == self.chief_rank:
            return True
        return not launch_status.has_joined(rank, self.folder)

    def _why_fatal(self, rank: int) -> str:
        how = self._how(rank)
        if not self.has_ps:
            return f"{how}: a synchronous job needs every rank"
        if self.roles[rank]["type"] == "ps":
            return f"{how}: the job cannot go on without the variables it held"
        if rank == self.chief_rank:
            return f"{how}: the job cannot go on without its chief"
        return f"{how} before joining the ps tasks (the program likely fails on every worker)"

    def _worker_ranks(self) -> list[int]:
        return [r for r, role in enumerate(self.roles) if role["type"] != "ps"]

    # ------------------------------------------------------------ stopping
    def _stop(self, reason: str) -> None:
        """Ends every process of the job: ``SIGTERM`` to the running tasks (their wrappers then report and
        exit, and mpiexec with them), then to whatever is left, then ``SIGKILL`` (each after a grace period).
        """
        self.stop_reason = reason
        self.stopped = [r for r in range(len(self.roles)) if r not in self.ended]
        if reason:
            logger.info("stopping the job: %s", reason)
        living = self._job_processes()
        for rank in self.stopped:
            start = launch_status.read_start(rank, self.folder)
            if start is not None and int(start["task"]) in living:
                _signal(int(start["task"]), signal.SIGTERM)
        for signum, grace in ((None, TERM_GRACE_S), (signal.SIGTERM, 1.0), (signal.SIGKILL, TERM_GRACE_S)):
            if signum is not None:
                for pid in self._job_processes():
                    _signal(pid, signum)
            if self._wait_for_job(grace):
                break
        else:
            logger.warning("processes %s did not end after SIGKILL", sorted(self._job_processes()))
        if self._mpiexec is not None:
            try:
                self._mpiexec.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.warning("mpiexec (pid %d) did not end", self._mpiexec.pid)

    def _wait_for_job(self, limit_s: float) -> bool:
        """Waits until no process of the job is left (True) or ``limit_s`` passed (False)."""
        deadline = time.monotonic() + limit_s
        while True:
            _reap(self._seen)
            if not self._job_processes():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    # ------------------------------------------------------------ reporting
    def _name(self, rank: int) -> str:
        return f"rank {rank} ({self.roles[rank]['name']})"

    def _how(self, rank: int) -> str:
        status = self.ended.get(rank, {})
        if status.get("how"):
            return str(status["how"])
        code = status.get("returncode")
        return "ended" if code is None else launch_status.describe_exit(int(code))

    def _report(self) -> int:
        failures = sorted((float(s["time"]), r) for r, s in self.ended.items() if s["returncode"] != 0)
        missing = [r for r in range(len(self.roles)) if r not in self.ended and r not in self.stopped]
        status = self._mpiexec.returncode if self._mpiexec is not None else 0
        if status == 0:
            # A rank on another host writes its report into a folder there: mpiexec's status covers it.
            missing = []
        lines = []
        for order, (_, rank) in enumerate(failures):
            first = " (first to fail)" if order == 0 and len(failures) > 1 else ""
            lost = " (lost; the other workers went on)" if rank in self.lost else ""
            last = self.ended[rank].get("last_line", "")
            lines.append(f"  {self._name(rank)}{first}: {self._how(rank)}{lost}" + (f": {last}" if last else ""))
        lines += [f"  {self._name(rank)} (on {self.roles[rank]['host']}): ended without a report reaching this "
                  f"host (mpiexec exited with status {status})" for rank in missing]
        if self.stopped and self.stop_reason:
            lines.append(f"  stopped by graphdist launch ({self.stop_reason}): "
                         + ", ".join(self._name(r) for r in self.stopped))
        if self.stop_signal is not None:
            print(f"graphdist launch: stopped by {signal.Signals(self.stop_signal).name}: ended every process "
                  "of the job" + ("\n" + "\n".join(lines) if lines else ""), file=sys.stderr)
            return 128 + int(self.stop_signal)
        if failures or missing:
            print(f"graphdist launch: error: {len(failures) + len(missing)} of {len(self.roles)} process(es) "
                  "failed:\n" + "\n".join(lines), file=sys.stderr)
            return 1
        if self.stopped:
            print("graphdist launch: error:\n" + "\n".join(lines), file=sys.stderr)
            return 1
        if status not in (0, None) and not self._hung_mpiexec:
            print(f"graphdist launch: error: mpiexec exited with status {status}", file=sys.stderr)
            return 1
        return 0


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
