"""Process failures in ``graphdist launch`` jobs: noticed at once, never waiting for a collective timeout.

The jobs run ``tests/runtime/failure_worker.py`` with the default timeouts
(300 s), so every bound below is met only because a death is noticed
directly. Each job has a hard limit (``mpi_jobs.HARD_TIMEOUT``) so a bug
cannot hang the suite, and every process a test starts is killed at its end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import graphdist as gd
from graphdist.cli.launch_supervisor import descendants
from graphdist.cli.main import main
from tests.distribute import mpi_jobs

WORKER = "tests/runtime/failure_worker.py"
NOTICE_S = 10.0  # a job must end this soon after a rank it needs dies


class Job:
    """A running ``graphdist launch`` whose output is read line by line."""

    def __init__(self, *args: str) -> None:
        command = [sys.executable, "-m", "graphdist.cli.main", "launch", *args]
        self.process = subprocess.Popen(command, cwd=mpi_jobs.REPO, env=mpi_jobs.env(), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.seen: set[int] = set()  # the job's processes, killed at the end of the test even if orphaned
        self._readers = [threading.Thread(target=self._read, args=(self.process.stdout, self.stdout), daemon=True),
                         threading.Thread(target=self._read, args=(self.process.stderr, self.stderr), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line)

    def ready_pids(self, count: int, limit_s: float = 60.0) -> dict[str, int]:
        """``{"worker 1": pid, ...}`` of the tasks once ``count`` of them printed ``ready``."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            found = {}
            for line in list(self.stdout):
                if "] ready rank=" in line:
                    name = line[1: line.index("]")]
                    found[name] = int(line.rsplit("pid=", 1)[1])
            if len(found) >= count:
                self.seen |= set(descendants(self.process.pid))
                return found
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"the tasks did not get ready:\n{self.output}")

    def wait(self, limit_s: float) -> tuple[int, float]:
        """The exit status and the seconds it took (AssertionError after ``limit_s``)."""
        start = time.monotonic()
        try:
            status = self.process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end within {limit_s} s:\n{self.output}") from None
        for reader in self._readers:
            reader.join(timeout=5)
        return status, time.monotonic() - start

    @property
    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def kill_everything(self) -> None:
        for pid in {*self.seen, *descendants(self.process.pid), self.process.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:
        job.kill_everything()


def start(jobs: list[Job], *args: str) -> Job:
    job = Job(*args)
    jobs.append(job)
    return job


# ------------------------------------------------------------------ synchronous jobs
@pytest.mark.slow
@pytest.mark.parametrize(("launch_args", "victim", "signum", "how"), [
    (["--workers", "2"], "worker 1", signal.SIGKILL, "killed by SIGKILL"),
    (["--chief", "--workers", "1"], "chief 0", signal.SIGKILL, "killed by SIGKILL"),
    (["--workers", "2"], "worker 1", signal.SIGINT, "killed by SIGINT"),  # the interrupted rank is the one named
])
def test_a_dead_rank_ends_a_synchronous_job(jobs: list[Job], launch_args: list[str], victim: str, signum: int,
                                            how: str) -> None:
    job = start(jobs, *launch_args, "--", sys.executable, WORKER, "--mode", "mwm", "--steps", "2000")
    pids = job.ready_pids(2)
    os.kill(pids[victim], signum)
    status, seconds = job.wait(NOTICE_S)
    assert status == 1 and seconds < NOTICE_S, job.output
    rank = {"worker 1": 1, "chief 0": 0}[victim]
    assert f"graphdist launch: error: 1 of 2 process(es) failed:\n  rank {rank} ({victim}): {how}" in job.output
    assert "stopped by graphdist launch" in job.output and "a synchronous job needs every rank" in job.output
    assert "finished" not in job.output


# ------------------------------------------------------------------ parameter-server jobs
@pytest.mark.slow
def test_a_dead_ps_ends_the_job(jobs: list[Job]) -> None:
    job = start(jobs, "--workers", "2", "--ps", "1", "--", sys.executable, WORKER, "--mode", "ps", "--steps", "2000")
    job.ready_pids(2)
    ps_pid = next(pid for pid, state in descendants(job.process.pid).items()
                  if "ps_server" in Path(f"/proc/{pid}/cmdline").read_text() and
                  "graphdist.cli.launch" not in Path(f"/proc/{pid}/cmdline").read_text())
    os.kill(ps_pid, signal.SIGKILL)
    status, seconds = job.wait(NOTICE_S)
    assert status == 1 and seconds < NOTICE_S, job.output
    assert "rank 2 (ps 0): killed by SIGKILL" in job.output
    assert "the job cannot go on without the variables it held" in job.output


@pytest.mark.slow
def test_a_dead_chief_ends_a_parameter_server_job(jobs: list[Job]) -> None:
    """Worker 0 is the chief (ParameterServerStrategy counts it so): losing it ends the job, unlike another
    worker."""
    job = start(jobs, "--workers", "2", "--ps", "1", "--", sys.executable, WORKER, "--mode", "ps", "--steps", "2000")
    pids = job.ready_pids(2)
    os.kill(pids["worker 0"], signal.SIGKILL)
    status, seconds = job.wait(NOTICE_S)
    assert status == 1 and seconds < NOTICE_S, job.output
    assert "graphdist launch: error: 1 of 3 process(es) failed:\n  rank 0 (worker 0): killed by SIGKILL" in job.output
    assert "(rank 0 (worker 0) killed by SIGKILL: the job cannot go on without its chief)" in job.output
    assert "finished" not in job.output


@pytest.mark.slow
def test_a_lost_worker_lets_the_others_finish(jobs: list[Job]) -> None:
    job = start(jobs, "--workers", "2", "--ps", "1", "--", sys.executable, WORKER, "--mode", "ps", "--steps", "40")
    pids = job.ready_pids(2)
    os.kill(pids["worker 1"], signal.SIGKILL)
    status, _ = job.wait(60)
    assert status == 1, job.output
    assert "[worker 0] finished 40 steps" in job.output  # the survivor trained to its end
    assert "ps 0: worker 1 (rank 1) ended without saying stop (killed by SIGKILL)" in job.output
    assert ("graphdist launch: error: 1 of 3 process(es) failed:\n"
            "  rank 1 (worker 1): killed by SIGKILL (lost; the other workers went on)") in job.output
    assert "stopped by graphdist launch" not in job.output


@pytest.mark.slow
@pytest.mark.parametrize(("launch_args", "mode"), [
    (["--workers", "2", "--ps", "1"], "ps"),  # worker 1 fails, the others would wait for it
    (["--workers", "2"], "mwm"),
])
def test_a_worker_failing_before_its_strategy_ends_the_job(jobs: list[Job], launch_args: list[str],
                                                          mode: str) -> None:
    job = start(jobs, *launch_args, "--", sys.executable, WORKER, "--mode", mode, "--steps", "2000",
                "--fail-before-strategy", "1")
    status, seconds = job.wait(NOTICE_S + 5)  # + the start of the job
    assert status == 1 and seconds < NOTICE_S + 5, job.output
    assert "rank 1 (worker 1): exited with status 3: rank 1: failing before its strategy" in job.output
    assert "stopped by graphdist launch" in job.output


@pytest.mark.slow
def test_a_worker_leaving_before_mpi_ends_the_job(jobs: list[Job]) -> None:
    # The others would wait in MPI_Init for ever (it returns once every rank called it).
    job = start(jobs, "--workers", "2", "--ps", "1", "--", sys.executable, WORKER, "--mode", "ps", "--steps", "2000",
                "--leave-before-strategy", "1")
    status, seconds = job.wait(NOTICE_S + 5)
    assert status == 1 and seconds < NOTICE_S + 5, job.output
    assert "stopped by graphdist launch (rank 1 (worker 1) ended without initialising MPI, so " in job.output
    assert "would wait in MPI_Init for ever)" in job.output


@pytest.mark.slow
def test_mirrored_script_with_a_ps_task_fails_clearly(jobs: list[Job]) -> None:
    job = start(jobs, "--workers", "1", "--ps", "1", "--", sys.executable, WORKER, "--mode", "mwm")
    status, seconds = job.wait(NOTICE_S + 5)
    assert status == 1, job.output
    assert "rank 0 (worker 0): exited with status 1: graphdist.errors.ClusterConfigError: the cluster lists 1 ps" \
        in job.output


@pytest.mark.slow
def test_the_ps_refuses_mismatched_requests_and_keeps_serving(jobs: list[Job], tmp_path: Path) -> None:
    job = start(jobs, "--workers", "2", "--ps", "1", "--", sys.executable, WORKER, "--mode", "mismatch",
                "--steps", "10", "--out", str(tmp_path))
    status, _ = job.wait(60)
    output = job.output
    assert status == 0, output
    refusals = [line for line in job.stdout if line.startswith("[worker 1]") and ": refused: " in line]
    assert len(refusals) == 4 and "NOT REFUSED" not in output, output
    wider, wrong_dtype, narrower, unknown = refusals
    assert "ps 0 (rank 2) refused the create of 'w': this worker's 'w' is float32[8], but ps 0 holds float32[4] " \
           "(created by worker 0 (rank 0))" in wider
    assert "refused the pull of 'w': this worker's 'w' is float64[4], but ps 0 holds float32[4]" in wrong_dtype
    assert "refused the push of 'w': this worker's 'w' is float32[2], but ps 0 holds float32[4]" in narrower
    assert "refused the pull of 'no_such_variable': no worker created 'no_such_variable' on ps 0" in unknown
    assert "[worker 0] finished" in output  # its w counts exactly its own steps (checked by the worker)
    tally = re.search(r"ps 0: every worker finished .*'refused': (\d+)", output)  # the ps served to the end
    assert tally and int(tally.group(1)) >= 4, output  # (+ worker 1's pulls of w before worker 0 created it)


# ------------------------------------------------------------------ stopping graphdist launch
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_launch_leaves_no_process(jobs: list[Job], signum: int) -> None:
    job = start(jobs, "--workers", "2", "--ps", "1", "--", sys.executable, WORKER, "--mode", "ps", "--steps", "2000")
    job.ready_pids(2)
    processes = descendants(job.process.pid)
    assert len(processes) >= 8  # mpiexec, its proxy, 3 rank wrappers, 3 tasks
    job.process.send_signal(signum)
    status, seconds = job.wait(NOTICE_S)
    assert status == 128 + signum, job.output
    name = signal.Signals(signum).name
    assert f"graphdist launch: stopped by {name}: ended every process of the job" in job.output
    survivors = [pid for pid in processes if _alive(pid)]
    assert survivors == [], f"still running: {survivors}"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# ------------------------------------------------------------------ clear errors
def test_unknown_host_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--workers", "1", "--hosts", "nohost.invalid", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "launch: --hosts: cannot resolve host 'nohost.invalid'" in err and "--hosts node1,node2" in err
    assert "mpiexec" in err and "HYD" not in err  # no process-manager traceback


def test_remote_tpu_resolver_is_a_clear_error() -> None:
    with pytest.raises(gd.GraphdistError, match=r"only local\[N\], '' and None are supported here"):
        gd.cluster_resolver.TPUClusterResolver("grpc://10.0.0.2:8470")
    with pytest.raises(NotImplementedError):  # still a NotImplementedError for code written against TF
        gd.cluster_resolver.TPUClusterResolver("my-cloud-tpu")


# ------------------------------------------------------------------ the rules, without processes
def test_which_failures_end_a_parameter_server_job(tmp_path: Path) -> None:
    from graphdist.cli.launch import build_roles
    from graphdist.cli.launch_supervisor import JobSupervisor
    from graphdist.runtime import launch_status

    supervisor = JobSupervisor(build_roles(3, ps=1), tmp_path)  # workers 0..2 (worker 0 is the chief), ps rank 3
    for rank in (0, 1, 3):
        launch_status.write_json(tmp_path / f"rank{rank}.joined", {})
    assert [supervisor._is_fatal(r) for r in range(4)] == [True, False, True, True]  # worker 2 never joined
    assert JobSupervisor(build_roles(2), tmp_path)._is_fatal(1)  # synchronous: every rank


def test_ps_request_checks() -> None:
    from graphdist.runtime.ps_server import _request_problem

    good = {"op": "push", "key": "w", "dtype": "<f4", "shape": [2, 3]}
    assert _request_problem(good, bytearray(24)) == ""
    assert "sent 12 bytes, but a float32[2, 3] value has 24" in _request_problem(good, bytearray(12))
    assert "unknown request 'drop'" in _request_problem({**good, "op": "drop"}, None)
    assert "names no variable" in _request_problem({**good, "key": ""}, bytearray(24))
    assert "is not valid" in _request_problem({**good, "dtype": "float99"}, bytearray(24))
    assert "unknown request None" in _request_problem({"op": None, "key": None, "malformed": True}, None)
