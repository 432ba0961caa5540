"""ModelParallelStrategy across 2 MPI workers (tests/distribute/mw_model_parallel_fsdp_worker.py): a mesh whose
``batch`` axis spans the workers, every MLP weight laid out over ``batch`` (FSDP), trains like one device on the
global batch; each process stores only its shards; a checkpoint saved by every worker restores into OneDevice.
With a model axis too, it splits weights within each worker."""

from __future__ import annotations

import pytest

import graphdist as gd
from graphdist.distribute.cluster import SimpleClusterResolver
from tests.distribute import mpi_jobs


@pytest.mark.slow
@pytest.mark.parametrize("positions", [2, 4])
def test_batch_axis_across_two_workers_with_fsdp_weights_trains_like_one_device(tmp_path, positions: int) -> None:
    job = mpi_jobs.launch("--workers", "2", "--timeout", "120", "--", mpi_jobs.sys.executable,
                          "tests/distribute/mw_model_parallel_fsdp_worker.py", str(tmp_path), str(positions), "1")
    assert job.returncode == 0, job.stdout + job.stderr
    sizes = (112, 7, 35, 5)  # the kernels and biases of MLP (16, 7, 5), float32
    local = positions // 2
    for worker in (0, 1):
        line = next(text for text in job.stdout.splitlines() if f"worker {worker} ok" in text).split()
        numbers = dict(zip(line[3::2], line[4::2]))
        assert int(numbers["replicas"]) == positions and int(numbers["local"]) == local, line
        # Against one device: the gradients are summed in another order (per replica, then across workers).
        assert float(numbers["trained"]) < 1e-5 and float(numbers["restored"]) < 1e-5, line
        # Every weight gathered forward (and the second kernel again backward), every gradient reduce-scattered.
        assert int(numbers["gathers"]) == 5 * local and int(numbers["scatters"]) == 4 * local, line
        assert int(numbers["weights"]) == 4 and int(numbers["whole"]) == 4 * sum(sizes), line
        # Each worker stores `local` shards of ceil(size / positions) elements of every weight.
        assert int(numbers["stored"]) == 4 * sum(local * -(-n // positions) for n in sizes), line



@pytest.mark.slow
def test_model_axis_within_each_worker_and_fsdp_across_workers_trains_like_one_device(tmp_path) -> None:
    """Mesh (2, 2) on 2 workers: worker w runs batch position w on its 2 devices; the first kernel (16, 7) is
    split over "model" within each worker, the second kernel FSDP over "batch" across the workers."""
    job = mpi_jobs.launch("--workers", "2", "--timeout", "120", "--", mpi_jobs.sys.executable,
                          "tests/distribute/mw_model_parallel_fsdp_worker.py", str(tmp_path), "2", "2")
    assert job.returncode == 0, job.stdout + job.stderr
    for worker in (0, 1):
        line = next(text for text in job.stdout.splitlines() if f"worker {worker} ok" in text).split()
        numbers = dict(zip(line[3::2], line[4::2]))
        assert int(numbers["replicas"]) == 2 and int(numbers["local"]) == 1, line
        assert float(numbers["trained"]) < 1e-5 and float(numbers["restored"]) < 1e-5, line
        assert int(numbers["part0"]) == 8 * 7 * 4, line  # each model device stores half of the first kernel
        # The second kernel gathered forward and backward, its gradient reduce-scattered, across the workers, once
        # per replica: on its first model device, whose copy the other reads (it is whole on both).
        assert int(numbers["gathers"]) == 2 and int(numbers["scatters"]) == 1, line
        # Weights: the first kernel whole over its 2 blocks, the second in one of 2 shards, the biases whole.
        assert int(numbers["stored"]) == 4 * (112 + 7 + 35 // 2 + 1 + 5), line


def _two_workers() -> SimpleClusterResolver:
    return SimpleClusterResolver({"worker": ["localhost:1", "localhost:2"]}, task_type="worker", task_id=0)


def test_a_batch_axis_the_workers_cannot_share_is_refused() -> None:
    mesh = gd.experimental.DeviceMesh((3,), ("batch",))
    with pytest.raises(gd.errors.InvalidArgumentError, match="3 positions, which 2 worker processes"):
        gd.experimental.ModelParallelStrategy(device_mesh=mesh, cluster_resolver=_two_workers())


def test_a_model_axis_spanning_workers_is_not_built_and_says_so() -> None:
    mesh = gd.experimental.DeviceMesh((1, 2), ("batch", "model"))
    with pytest.raises(NotImplementedError, match="model axis would span processes"):
        gd.experimental.ModelParallelStrategy(device_mesh=mesh, cluster_resolver=_two_workers())


def test_one_worker_cluster_is_the_one_process_strategy() -> None:
    mesh = gd.experimental.DeviceMesh((2,), ("batch",))
    one = SimpleClusterResolver({"worker": ["localhost:1"]}, task_type="worker", task_id=0)
    strategy = gd.experimental.ModelParallelStrategy(device_mesh=mesh, cluster_resolver=one)
    assert type(strategy) is gd.experimental.ModelParallelStrategy and strategy.num_replicas_in_sync == 2
