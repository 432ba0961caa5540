"""Jobs across hosts: each "host" a Linux network namespace with its own address (198.18.0.x) on a switch
(benchmarks.netns), so every byte between tasks crosses a real TCP link and no task sees another's loopback.

Started by hand (a plain ``python`` per host with its TF_CONFIG, as the seeds do) and by ``graphdist launch
--hosts`` (mpiexec's ssh launcher, an ssh server in each host, the launch's status folder private to the
launcher's host as on real machines): training equal to one device, a remote worker killed, a link taken down.
Needs root (CI runs as root); elsewhere every test skips with the reason.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.netns import HostBed, unavailable_reason
from tests.distribute import mpi_jobs
from tests.distribute.test_multi_worker import _reference
from tests.distribute.tf_config_tasks import kill_leftovers, start_all, wait_all

pytestmark = pytest.mark.slow

_REASON = unavailable_reason()
if _REASON:
    pytestmark = [pytest.mark.slow, pytest.mark.skip(reason=f"multi-host test bed unavailable: {_REASON}")]

@pytest.fixture(autouse=True)
def _no_task_left() -> None:
    yield
    kill_leftovers()


CLUSTER = {"worker": ["198.18.0.1:2222", "198.18.0.2:2222"]}  # one port: each host has its own
HOSTS = {("worker", 0): 0, ("worker", 1): 1}


@pytest.fixture
def bed():
    with HostBed(2) as hosts:
        yield hosts
        assert not hosts.pids() or _only_sshd(hosts), "processes were left in the hosts"


def _only_sshd(bed: HostBed) -> bool:
    commands = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in bed.pids() if Path(f"/proc/{pid}").exists()]
    return all(command in ("sshd", "sh") for command in commands)


def _assert_like_one_device(out: Path, steps: int) -> list[str]:
    ref_losses, ref_values = _reference(steps)
    addresses = []
    for rank in range(2):
        with np.load(out / f"rank{rank}.npz") as result:
            np.testing.assert_allclose(result["losses"], ref_losses, rtol=1e-5)
            for i, ref in enumerate(ref_values):
                np.testing.assert_allclose(result[f"var{i}"], ref, rtol=1e-5, atol=1e-6)
            addresses.append(str(result["addresses"]))
    return addresses


def test_two_hosts_started_by_hand_train_like_one_device(bed: HostBed, tmp_path: Path) -> None:
    tasks = start_all(["tests/distribute/mw_train_worker.py", "--steps", "4", "--out", str(tmp_path)], CLUSTER,
                      tmp_path, [("worker", 1), ("worker", 0)], delays={("worker", 0): 5.0}, bed=bed, hosts=HOSTS)
    codes = wait_all(tasks)
    assert set(codes.values()) == {0}, "\n".join(t.output[-2000:] for t in tasks.values())
    addresses = _assert_like_one_device(tmp_path, 4)
    assert "198.18.0.1" in addresses[0].split() and "198.18.0.2" in addresses[1].split()


def _launch(bed: HostBed, tmp_path: Path, *args: str) -> tuple[int, str, float]:
    """``graphdist launch --hosts`` run in host 0; the status folder is private to host 0 (the others see an
    empty folder at that path, as another machine would)."""
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("the ssh launcher test needs Debian's openssh-server (make test installs it as root)")
    private = tmp_path / "launcher-tmp"
    private.mkdir()
    client = bed.start_sshd(private=[str(private)])
    command = [mpi_jobs.sys.executable, "-m", "graphdist.cli.main", "launch", "--hosts", "198.18.0.1,198.18.0.2",
               "--workers", "2", "--timeout", "60", "--", mpi_jobs.sys.executable, *args]
    start = time.monotonic()
    done = bed.run(0, command, cwd=mpi_jobs.REPO, capture_output=True, text=True, timeout=150,
                   env=mpi_jobs.env(HYDRA_LAUNCHER_EXEC=client, TMPDIR=str(private)))
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def test_launch_hosts_trains_across_two_hosts(bed: HostBed, tmp_path: Path) -> None:
    code, output, _ = _launch(bed, tmp_path, "tests/distribute/mw_train_worker.py", "--steps", "4", "--out",
                              str(tmp_path))
    assert code == 0, output[-4000:]
    addresses = _assert_like_one_device(tmp_path, 4)
    assert "198.18.0.1" in addresses[0].split() and "198.18.0.2" in addresses[1].split()


def test_launch_hosts_a_remote_worker_killed_ends_the_job_naming_it(bed: HostBed, tmp_path: Path) -> None:
    """The launcher cannot read the remote host's processes or status files: the tasks' own watch tells."""
    code, output, elapsed = _launch(bed, tmp_path, "tests/distribute/mw_train_worker.py", "--steps", "8",
                                    "--die-at-step", "3", "--out", str(tmp_path))
    assert code == 1, output[-4000:]
    assert elapsed < 60  # not the 60 s collective timeout: at once
    assert "TaskLostError" in output
    assert "worker 1 at 198.18.0.2:29401 (rank 1, host " in output and "was lost" in output


def _wait_for(task, pattern: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not re.search(pattern, task.output):
        assert task.process.poll() is None, task.output[-3000:]
        assert time.monotonic() < deadline, task.output[-3000:]
        time.sleep(0.1)


def test_kill_9_of_a_remote_worker_ends_the_other_within_15_s_naming_it(bed: HostBed, tmp_path: Path) -> None:
    tasks = start_all(["tests/multihost/steady_worker.py"], CLUSTER, tmp_path, [("worker", 0), ("worker", 1)],
                      bed=bed, hosts=HOSTS, GRAPHDIST_COLLECTIVE_TIMEOUT="120")
    _wait_for(tasks["worker", 0], r"step 5:")
    killed = time.monotonic()
    os.kill(tasks["worker", 1].process.pid, 9)  # the process started on host 1 (mpiexec since its re-exec)
    codes = wait_all(tasks, timeout=60)
    survivor = tasks["worker", 0]
    assert codes["worker", 0] == 1
    assert survivor.ended - killed < 15
    assert "TaskLostError" in survivor.output
    assert "worker 1 at 198.18.0.2:2222 (rank 1, host " in survivor.output and "was lost" in survivor.output


def test_a_link_taken_down_ends_both_tasks_with_a_clear_error(bed: HostBed, tmp_path: Path) -> None:
    tasks = start_all(["tests/multihost/steady_worker.py"], CLUSTER, tmp_path, [("worker", 0), ("worker", 1)],
                      bed=bed, hosts=HOSTS, GRAPHDIST_COLLECTIVE_TIMEOUT="15")
    _wait_for(tasks["worker", 0], r"step 5:")
    cut = time.monotonic()
    bed.set_link(1, up=False)
    codes = wait_all(tasks, timeout=120)
    assert codes == {("worker", 0): 1, ("worker", 1): 1}
    for (_, index), task in tasks.items():
        other = 1 - index
        assert task.ended - cut < 90
        assert "CollectiveTimeoutError" in task.output
        assert f"did not complete within 15 s: no answer from worker {other} at {CLUSTER['worker'][other]}" in \
            task.output
