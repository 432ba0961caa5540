"""The meeting of tasks started on their own (graphdist.runtime.rendezvous), in one process: each task is a
thread with its own Rendezvous on a localhost port, as separate processes would have.

What the multi-process tests (tests/distribute/test_tf_config_tasks.py, tests/multihost) show end to end,
here case by case: start order, disagreements named on every task, ports in use, unreachable and
unresolvable addresses, and a lost task reported to every other one.
"""

from __future__ import annotations

import socket
import threading
import time
from multiprocessing.connection import Client
from typing import Any

import pytest

from graphdist.errors import ClusterConfigError
from graphdist.runtime import rendezvous
from graphdist.runtime.cluster_spec import ClusterSpec
from graphdist.runtime.rendezvous import Rendezvous, hub_rank, split_address
from tests.distribute.tf_config_tasks import free_ports


def cluster(workers: int = 2, ps: int = 0) -> ClusterSpec:
    ports = free_ports(workers + ps)
    spec: dict[str, Any] = {"worker": [f"localhost:{p}" for p in ports[:workers]]}
    if ps:
        spec["ps"] = [f"localhost:{p}" for p in ports[workers:]]
    return ClusterSpec(spec)


class Task(threading.Thread):
    """One task's meeting, in a thread: ``outcome`` is the Meeting or the exception."""

    def __init__(self, spec: ClusterSpec, job: str, index: int, version: str = "1.0", timeout: float = 20,
                 delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.args = (spec, job, index, version, timeout)
        self.delay = delay
        self.outcome: Any = None
        self.rendezvous: Rendezvous | None = None

    def run(self) -> None:
        time.sleep(self.delay)
        spec, job, index, version, timeout = self.args
        try:
            self.rendezvous = Rendezvous(spec, job, index, version, timeout=timeout)
            self.outcome = self.rendezvous.meet(lambda: "the-mpi-port")
        except Exception as err:  # noqa: BLE001 - the test inspects it
            self.outcome = err

    def finish(self) -> Any:
        self.join(60)
        assert not self.is_alive()
        return self.outcome


def meet(*tasks: Task) -> list[Any]:
    for task in tasks:
        task.start()
    return [task.finish() for task in tasks]


@pytest.fixture(autouse=True)
def _close_rendezvous(request: pytest.FixtureRequest) -> None:
    yield
    rendezvous.set_current(None)


def test_tasks_meet_in_any_order_and_agree_on_the_port_and_hosts() -> None:
    spec = cluster(3)
    tasks = [Task(spec, "worker", 2), Task(spec, "worker", 1, delay=0.5), Task(spec, "worker", 0, delay=1.5)]
    meetings = meet(*tasks)
    assert [m.port for m in meetings] == ["the-mpi-port"] * 3
    assert [m.rank for m in meetings] == [2, 1, 0]
    assert meetings[0].hosts == {0: socket.gethostname(), 1: socket.gethostname(), 2: socket.gethostname()}
    for task in tasks:
        task.rendezvous.close()


def test_the_hub_is_ps_0_in_a_parameter_server_job_else_rank_0() -> None:
    assert hub_rank(ClusterSpec({"worker": ["a:1", "b:1"]})) == 0
    assert hub_rank(ClusterSpec({"chief": ["c:1"], "worker": ["a:1"], "ps": ["p:1", "q:1"]})) == 2
    spec = cluster(2, ps=1)
    meetings = meet(Task(spec, "worker", 0), Task(spec, "worker", 1), Task(spec, "ps", 0, delay=0.5))
    assert all(m.port == "the-mpi-port" for m in meetings)


def test_clusters_that_differ_fail_on_every_task_naming_the_difference() -> None:
    spec = cluster(2)
    other = ClusterSpec({"worker": [*spec.job_tasks("worker"), "localhost:1"]})
    outcomes = meet(Task(spec, "worker", 0), Task(other, "worker", 1, delay=0.3))
    for outcome in outcomes:
        assert isinstance(outcome, ClusterConfigError)
        assert "worker 1 (from 127.0.0.1:" in str(outcome)
        assert "has another cluster than worker 0: job 'worker' is" in str(outcome)
        assert "'localhost:1'" in str(outcome)


def test_another_graphdist_version_fails_on_every_task() -> None:
    spec = cluster(2)
    outcomes = meet(Task(spec, "worker", 0, version="0.1.0"), Task(spec, "worker", 1, version="0.2.0"))
    for outcome in outcomes:
        assert isinstance(outcome, ClusterConfigError)
        assert "runs graphdist '0.2.0' but worker 0 runs '0.1.0'" in str(outcome)


def test_the_same_task_claimed_twice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes with one TF_CONFIG task index (on two hosts: each could listen on its port)."""
    monkeypatch.setattr(rendezvous, "_GRACE_AFTER_PROBLEM_S", 1.0)  # worker 2 never comes
    spec = cluster(3)
    hub = Rendezvous(spec, "worker", 0, "1.0", timeout=20)
    arrivals: list[Any] = []
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(_meet_or_error(hub)), daemon=True)
    thread.start()
    host, port = split_address(spec.task_address("worker", 0), "hub")
    for pid in (11, 12):
        conn = Client((host, port), authkey=rendezvous._job_key())
        rendezvous._send(conn, {"graphdist": "1.0", "task": "worker 1", "rank": 1, "cluster": spec.as_dict(),
                                "host": f"host{pid}", "pid": pid})
        arrivals.append(conn)
    thread.join(30)
    assert isinstance(outcome[0], ClusterConfigError)
    assert "worker 1 (from 127.0.0.1:" in str(outcome[0]) and "claims the same task as the process from" in str(
        outcome[0])
    for conn in arrivals:
        assert "claims the same task" in rendezvous._receive(conn, 10)["error"]
    hub.close()


def _meet_or_error(point: Rendezvous) -> Any:
    try:
        return point.meet(lambda: "port")
    except ClusterConfigError as err:
        return err


def test_a_port_in_use_is_named() -> None:
    spec = cluster(2)
    _, port = split_address(spec.task_address("worker", 1), "")
    with socket.create_server(("127.0.0.1", port)):
        with pytest.raises(ClusterConfigError, match=rf"worker 1's TF_CONFIG address localhost:{port}: port {port} "
                                                     "is already in use on this host"):
            Rendezvous(spec, "worker", 1, "1.0", timeout=5)


def test_an_unreachable_hub_fails_after_the_connect_timeout_naming_its_address() -> None:
    spec = cluster(2)
    start = time.monotonic()
    outcome = meet(Task(spec, "worker", 1, timeout=2))[0]
    assert 2 <= time.monotonic() - start < 15
    assert isinstance(outcome, ClusterConfigError)
    assert f"cannot reach worker 0 at {spec.task_address('worker', 0)} within 2 s (GRAPHDIST_CONNECT_TIMEOUT)" in str(
        outcome)


def test_a_hub_address_that_does_not_resolve_is_named() -> None:
    port = free_ports(1)[0]
    spec = ClusterSpec({"worker": ["no-such-host.invalid:2222", f"localhost:{port}"]})
    outcome = meet(Task(spec, "worker", 1, timeout=1))[0]
    assert isinstance(outcome, ClusterConfigError)
    assert "worker 0 at no-such-host.invalid:2222" in str(outcome)
    assert "its host 'no-such-host.invalid' does not resolve" in str(outcome)


def test_an_own_address_that_does_not_resolve_fails_at_once() -> None:
    spec = ClusterSpec({"worker": ["localhost:1", "no-such-host.invalid:2222"]})
    with pytest.raises(ClusterConfigError, match="worker 1's TF_CONFIG address 'no-such-host.invalid:2222': the "
                                                 "host 'no-such-host.invalid' does not resolve"):
        Rendezvous(spec, "worker", 1, "1.0", timeout=5)


@pytest.mark.parametrize("address", ["localhost", "localhost:http", "localhost:70000", ":2222"])
def test_an_address_without_a_port_is_refused(address: str) -> None:
    with pytest.raises(ClusterConfigError, match="is not host:port"):
        split_address(address, "worker 0")


def test_a_missing_task_is_named_with_its_address() -> None:
    spec = cluster(3)
    outcomes = meet(Task(spec, "worker", 0, timeout=2), Task(spec, "worker", 1, timeout=20))
    address = spec.task_address("worker", 2)
    for outcome in outcomes:
        assert isinstance(outcome, ClusterConfigError)
        assert f"worker 2 ({address}) did not arrive within 2 s" in str(outcome)


def test_a_task_that_meets_at_a_non_hub_is_told_the_clusters_differ() -> None:
    spec = cluster(2)
    listener = Rendezvous(spec, "worker", 1, "1.0", timeout=20)  # worker 1 of the job, listening
    # Another process's cluster lists that address as its worker 0, where it would meet the others.
    confused = ClusterSpec({"worker": [spec.task_address("worker", 1), f"localhost:{free_ports(1)[0]}"]})
    result = meet(Task(confused, "worker", 1, timeout=5))[0]
    assert isinstance(result, ClusterConfigError)
    assert f"{spec.task_address('worker', 1)} is worker 1, where tasks do not meet" in str(result)
    assert "clusters differ" in str(result)
    listener.close()


def watched_job(spec: ClusterSpec) -> list[Rendezvous]:
    """Every task of ``spec`` met, each watching the others."""
    tasks = [Task(spec, "worker", i) for i in range(spec.num_tasks("worker"))]
    meet(*tasks)
    for task in tasks:
        task.rendezvous.watch()
    return [task.rendezvous for task in tasks]


def first_loss_within(point: Rendezvous, seconds: float = 5) -> str | None:
    deadline = time.monotonic() + seconds
    while point.first_loss() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return point.first_loss()


def test_a_lost_task_is_reported_to_every_other_task_and_a_finished_one_is_not() -> None:
    spec = cluster(3)
    points = watched_job(spec)
    points[2].close()  # worker 2 finishes: says goodbye
    time.sleep(0.5)
    assert points[0].finished(2) and points[0].first_loss() is None
    # Worker 1 vanishes without a word (its connection closes, as when its process is killed).
    for conn in list(points[1]._peers.values()):
        conn.close()
    points[1]._closing = True
    loss = first_loss_within(points[0])
    assert loss is not None and loss.startswith(f"worker 1 at {spec.task_address('worker', 1)} (rank 1, host ")
    assert "its process ended without finishing" in loss
    assert points[0].lost() == {1: points[0].lost()[1]}
    points[0].close()


def test_a_failure_announced_by_a_task_reaches_the_others_with_its_error() -> None:
    points = watched_job(cluster(3))
    points[2].announce_failure("ValueError: batch 3 is corrupt")
    assert "worker 2 at" in first_loss_within(points[1])
    assert "it failed: ValueError: batch 3 is corrupt" in points[1].first_loss()
    assert "it failed: ValueError: batch 3 is corrupt" in points[0].first_loss()
    for point in points:
        point.close()


def test_the_connect_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPHDIST_CONNECT_TIMEOUT", raising=False)
    assert rendezvous.connect_timeout() == 3600
    monkeypatch.setenv("GRAPHDIST_CONNECT_TIMEOUT", "12.5")
    assert rendezvous.connect_timeout() == 12.5
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv("GRAPHDIST_CONNECT_TIMEOUT", bad)
        with pytest.raises(ClusterConfigError, match="GRAPHDIST_CONNECT_TIMEOUT must be"):
            rendezvous.connect_timeout()


def test_a_silent_connection_or_a_wrong_key_does_not_hold_up_the_meeting() -> None:
    """A port scanner that connects and says nothing, and a program with another GRAPHDIST_JOB_KEY: refused
    each in its own thread while the tasks meet."""
    from multiprocessing import AuthenticationError

    spec = cluster(2)
    hub = Task(spec, "worker", 0)
    hub.start()
    host, port = split_address(spec.task_address("worker", 0), "hub")
    time.sleep(0.3)
    silent = socket.create_connection((host, port))
    with pytest.raises(AuthenticationError):
        Client((host, port), authkey=b"another job")
    meetings = meet(Task(spec, "worker", 1))
    assert meetings[0].port == "the-mpi-port" and hub.finish().port == "the-mpi-port"
    silent.close()


def test_a_hub_behind_a_dead_link_fails_after_the_connect_timeout() -> None:
    """198.18.255.1 is in the benchmarking range: no task answers there. The connect is dropped (it would hang
    for the kernel's ~2 minutes) or, in this project's VMs, accepted by the host's network and never answered."""
    spec = ClusterSpec({"worker": ["198.18.255.1:2222", f"localhost:{free_ports(1)[0]}"]})
    start = time.monotonic()
    outcome = meet(Task(spec, "worker", 1, timeout=2))[0]
    assert time.monotonic() - start < 10
    assert isinstance(outcome, ClusterConfigError)
    assert "cannot reach worker 0 at 198.18.255.1:2222 within 2 s" in str(outcome)
