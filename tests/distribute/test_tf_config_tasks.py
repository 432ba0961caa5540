"""Jobs whose tasks are started by hand, each a plain ``python`` with its own TF_CONFIG (localhost ports), as
the seeds start multi-worker and parameter-server training: no ``graphdist launch``, no ``mpiexec`` typed.

Everything that works under ``graphdist launch`` works this way too: custom loops and Keras ``fit`` under
MultiWorkerMirroredStrategy equal to one device, checkpoints by the chief, parameter servers with sharded
variables, collective mismatch detection; and the start-up errors are clear graphdist errors.
(tests/multihost runs the same across network-namespace hosts.)
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits
from tests.distribute.test_multi_worker import _reference
from tests.distribute.tf_config_tasks import Task, free_ports, kill_leftovers, start_all, tf_config, wait_all
from tests.keras.test_keras_multi_worker import _one_device

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_task_left() -> None:
    yield
    kill_leftovers()


TRAIN = ["tests/distribute/mw_train_worker.py", "--steps", "4", "--out", "{out}"]


def _cluster(workers: int, ps: int = 0) -> dict[str, list[str]]:
    ports = free_ports(workers + ps)
    cluster = {"worker": [f"localhost:{p}" for p in ports[:workers]]}
    if ps:
        cluster["ps"] = [f"localhost:{p}" for p in ports[workers:]]
    return cluster


def _assert_trained_like_one_device(out, steps: int = 4) -> None:
    ref_losses, ref_values = _reference(steps)
    results = [np.load(out / f"rank{r}.npz") for r in range(2)]
    for result in results:
        np.testing.assert_allclose(result["losses"], ref_losses, rtol=1e-5)
        for i, ref in enumerate(ref_values):
            np.testing.assert_allclose(result[f"var{i}"], ref, rtol=1e-5, atol=1e-6)
        assert int(result["iterations"]) == steps
    seen = [set(r["seen"].tolist()) for r in results]
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 16 * steps  # disjoint halves of each batch


def test_two_workers_started_by_hand_train_like_one_device(tmp_path) -> None:
    """Worker 1 starts five seconds before worker 0; SGD on the same global batches as one device."""
    cluster = _cluster(2)
    argv = [a.format(out=tmp_path) if a == "{out}" else a for a in TRAIN]
    tasks = start_all(argv, cluster, tmp_path, [("worker", 1), ("worker", 0)], delays={("worker", 0): 5.0})
    codes = wait_all(tasks)
    assert codes == {("worker", 1): 0, ("worker", 0): 0}, "\n".join(t.output[-2000:] for t in tasks.values())
    _assert_trained_like_one_device(tmp_path)


def test_tasks_of_a_slurm_step_train_like_one_device(tmp_path) -> None:
    """The environment ``srun -N 1 -n 2`` gives its tasks (Slurm itself is not installed here), without an MPI
    plugin: the tasks find each other from SlurmClusterResolver's addresses and join as tasks started by hand.
    """
    base = free_ports(1)[0]
    tasks = {}
    for procid in (1, 0):
        slurm = {"SLURM_PROCID": str(procid), "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost",
                 "SLURM_STEP_TASKS_PER_NODE": "2"}
        tasks[procid] = Task(["tests/distribute/mw_train_worker.py", "--steps", "4", "--out", str(tmp_path),
                              "--slurm-port-base", str(base)], "", tmp_path / f"task{procid}.log", **slurm)
    codes = {procid: task.wait() for procid, task in tasks.items()}
    assert codes == {1: 0, 0: 0}, "\n".join(t.output[-2000:] for t in tasks.values())
    _assert_trained_like_one_device(tmp_path)


def test_keras_fit_and_the_chiefs_saved_model_by_hand(tmp_path) -> None:
    cluster = _cluster(2)
    tasks = start_all(["tests/keras/keras_mw_worker.py", "--out", str(tmp_path)], cluster, tmp_path,
                      [("worker", 0), ("worker", 1)])
    codes = wait_all(tasks)
    assert set(codes.values()) == {0}, "\n".join(t.output[-2000:] for t in tasks.values())
    reference = _one_device()
    for rank in range(2):
        with np.load(tmp_path / f"rank{rank}.npz") as got:
            for i, want in enumerate(reference["weights"]):
                np.testing.assert_allclose(got[f"arr_{i}"], want, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}")
            np.testing.assert_allclose(got["loss"], reference["loss"], rtol=1e-4, atol=1e-6)
    saved = gd.keras.load_model(tmp_path / "saved")  # written by the chief only
    np.testing.assert_allclose(saved.predict(digits().x_test[:70], batch_size=32, verbose=0),
                               reference["predictions"], rtol=1e-4, atol=1e-5)


def test_parameter_servers_started_by_hand_train_with_sharded_variables_and_end_cleanly(tmp_path) -> None:
    cluster = _cluster(2, ps=2)
    order = [("ps", 1), ("worker", 1), ("ps", 0), ("worker", 0)]
    tasks = start_all(["tests/distribute/ps_train_worker.py", "--out", str(tmp_path), "--epochs", "3",
                       "--shards", "2"], cluster, tmp_path, order)
    codes = wait_all(tasks)
    assert set(codes.values()) == {0}, "\n".join(t.output[-2000:] for t in tasks.values())
    for worker in range(2):
        with np.load(tmp_path / f"worker{worker}.npz") as got:
            assert float(got["accuracy"]) > 0.85
            placement = __import__("json").loads(str(got["placement"]))
            assert any(len(shards) == 2 for shards in placement.values())  # split over both ps tasks


def test_a_lost_parameter_server_worker_lets_the_others_finish(tmp_path) -> None:
    """Worker 1 is killed: the ps drops it (named in its log) and worker 0 finishes; the ps ends cleanly."""
    cluster = _cluster(2, ps=1)
    tasks = start_all(["tests/distribute/ps_train_worker.py", "--out", str(tmp_path), "--epochs", "6",
                       "--die-at-step", "20"], cluster, tmp_path, [("ps", 0), ("worker", 0), ("worker", 1)])
    codes = wait_all(tasks)
    assert codes["worker", 0] == 0 and codes["ps", 0] == 0, "\n".join(t.output[-2000:] for t in tasks.values())
    assert codes["worker", 1] != 0
    log = tasks["ps", 0].output
    assert f"ps 0: lost worker 1 at {cluster['worker'][1]} (rank 1, host {socket.gethostname()}): its process " \
           "ended without finishing" in log
    assert "ps 0: worker 1 (rank 1) ended without saying stop (its process ended without finishing" in log
    with np.load(tmp_path / "worker0.npz") as got:
        assert int(got["steps"]) == 6 * (len(digits().x_train[0::2]) // 32)  # every batch of its shard
        assert float(got["accuracy"]) > 0.85


def test_a_lost_parameter_server_ends_the_workers_at_once_naming_it(tmp_path) -> None:
    cluster = _cluster(2, ps=1)
    tasks = start_all(["tests/distribute/ps_train_worker.py", "--out", str(tmp_path), "--epochs", "200"],
                      cluster, tmp_path, [("ps", 0), ("worker", 0), ("worker", 1)],
                      GRAPHDIST_COLLECTIVE_TIMEOUT="120")
    deadline = time.monotonic() + 60
    while not all("joined" in tasks["worker", i].output for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    tasks["ps", 0].process.kill()
    killed = time.monotonic()
    codes = wait_all(tasks, timeout=60)
    logs = "\n".join(f"--- {t.name}\n{t.output[-2500:]}" for t in tasks.values())
    assert codes["worker", 0] != 0 and codes["worker", 1] != 0, logs
    for index in range(2):
        worker = tasks["worker", index]
        assert worker.ended - killed < 15, logs  # not the 120 s timeout
        assert "TaskLostError" in worker.output, logs
        assert f"ps 0 at {cluster['ps'][0]} (rank 2, host {socket.gethostname()}) was lost" in worker.output, logs


def test_a_failing_worker_ends_the_other_at_once_naming_it_and_its_error(tmp_path) -> None:
    cluster = _cluster(2)
    tasks = start_all(["tests/distribute/mw_train_worker.py", "--steps", "6", "--raise-at-step", "2", "--out",
                       str(tmp_path)], cluster, tmp_path, [("worker", 0), ("worker", 1)],
                      GRAPHDIST_COLLECTIVE_TIMEOUT="120")
    codes = wait_all(tasks, timeout=100)
    assert codes == {("worker", 0): 1, ("worker", 1): 1}
    survivor = tasks["worker", 0].output
    assert "TaskLostError" in survivor
    assert f"worker 1 at {cluster['worker'][1]} (rank 1, host {socket.gethostname()}) was lost: it failed: " \
           "ValueError: worker 1 cannot read batch 2" in survivor
    assert tasks["worker", 0].ended - tasks["worker", 1].ended < 10  # not the 120 s collective timeout


def test_collectives_that_differ_between_tasks_fail_on_every_task(tmp_path) -> None:
    cluster = _cluster(2)
    tasks = start_all(["tests/distribute/mismatch_worker.py"], cluster, tmp_path, [("worker", 0), ("worker", 1)],
                      GRAPHDIST_COLLECTIVE_TIMEOUT="60")
    codes = wait_all(tasks)
    assert codes == {("worker", 0): 1, ("worker", 1): 1}
    for task in tasks.values():
        assert "[2. 2.]" in task.output  # the agreed reduce
        assert "CollectiveMismatchError: ranks called different collectives at the same point" in task.output
        assert "float32[3]" in task.output and "float32[4]" in task.output


# ------------------------------------------------------------------ bad input
def _fails(task: Task, *fragments: str, within: float = 60) -> str:
    assert task.wait(within) != 0
    output = task.output
    for fragment in fragments:
        assert fragment in output, output[-3000:]
    assert "mpi4py" not in output.split("ClusterConfigError")[-1]  # no raw MPI traceback after the error
    return output


def test_clusters_that_differ_fail_on_every_task(tmp_path) -> None:
    cluster = _cluster(2)
    other = {"worker": [*cluster["worker"], f"localhost:{free_ports(1)[0]}"]}
    tasks = {0: Task(TRAIN[:1] + ["--out", str(tmp_path)], tf_config(cluster, "worker", 0), tmp_path / "w0.log",
                     GRAPHDIST_CONNECT_TIMEOUT="60"),
             1: Task(TRAIN[:1] + ["--out", str(tmp_path)], tf_config(other, "worker", 1), tmp_path / "w1.log",
                     GRAPHDIST_CONNECT_TIMEOUT="60")}
    for task in tasks.values():
        _fails(task, "ClusterConfigError", "has another cluster than worker 0: job 'worker' is")


def test_a_port_in_use_is_named(tmp_path) -> None:
    cluster = _cluster(2)
    port = int(cluster["worker"][1].rsplit(":", 1)[1])
    with socket.create_server(("127.0.0.1", port)):
        task = Task(TRAIN[:1] + ["--out", str(tmp_path)], tf_config(cluster, "worker", 1), tmp_path / "w1.log")
        _fails(task, "ClusterConfigError", f"port {port} is already in use on this host", within=30)


def test_an_unreachable_chief_is_named_after_the_connect_timeout(tmp_path) -> None:
    cluster = _cluster(2)
    task = Task(TRAIN[:1] + ["--out", str(tmp_path)], tf_config(cluster, "worker", 1), tmp_path / "w1.log",
                GRAPHDIST_CONNECT_TIMEOUT="4")
    _fails(task, "ClusterConfigError", f"cannot reach worker 0 at {cluster['worker'][0]} within 4 s", within=40)


def test_an_address_that_does_not_resolve_is_named(tmp_path) -> None:
    cluster = {"worker": [f"localhost:{free_ports(1)[0]}", "no-such-host.invalid:2222"]}
    task = Task(TRAIN[:1] + ["--out", str(tmp_path)], tf_config(cluster, "worker", 1), tmp_path / "w1.log")
    _fails(task, "ClusterConfigError", "the host 'no-such-host.invalid' does not resolve", within=30)


def test_a_collective_whose_peer_finished_fails_at_once_naming_it(tmp_path) -> None:
    """The chief alone reads a weight sharded across the workers; worker 1 has finished. Before, the chief waited
    out the collective timeout and then hung probing the finished task (a send to a process that left the joined
    communicator blocks in MPICH); now it fails within seconds, naming the task and the likely mistake."""
    tasks = start_all(["tests/distribute/lone_gather_worker.py"], _cluster(2), tmp_path, [("worker", 0), ("worker", 1)],
                      GRAPHDIST_COLLECTIVE_TIMEOUT="120")
    codes = wait_all(tasks, timeout=100)
    chief, other = tasks["worker", 0], tasks["worker", 1]
    assert codes == {("worker", 0): 1, ("worker", 1): 0}, chief.output[-3000:]
    assert "finished" in other.output
    assert "worker 1" in chief.output and "ended (finished) without taking part in it" in chief.output
    assert "variable.numpy()" in chief.output
    assert chief.ended - chief.started < 60  # not the 120 s timeout
