"""FSDP across 2 MPI workers (tests/distribute/mw_fsdp_worker.py): every MLP weight sharded over the workers'
replicas trains like one device on the global batch, each process stores only its shards, and a checkpoint
saved by every worker holds whole values that OneDevice restores."""

from __future__ import annotations

import pytest

from tests.distribute import mpi_jobs


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_fsdp_across_two_workers_trains_like_one_device_and_checkpoints_whole(tmp_path, devices: int) -> None:
    job = mpi_jobs.launch("--workers", "2", "--devices-per-worker", str(devices), "--timeout", "120", "--",
                          mpi_jobs.sys.executable, "tests/distribute/mw_fsdp_worker.py", str(tmp_path))
    assert job.returncode == 0, job.stdout + job.stderr
    sizes = (112, 7, 35, 5)  # the kernels and biases of MLP (16, 7, 5), float32
    shards = 2 * devices  # each worker stores its `devices` shards of ceil(size / shards) elements
    for worker in (0, 1):
        line = next(text for text in job.stdout.splitlines() if f"worker {worker} ok" in text).split()
        numbers = dict(zip(line[3::2], line[4::2]))
        # Against one device: the gradients are summed in another order (per replica, then across workers).
        assert float(numbers["trained"]) < 1e-5 and float(numbers["restored"]) < 1e-5, line
        # Every weight gathered forward (and the second kernel again backward), every gradient reduce-scattered.
        assert int(numbers["gathers"]) == 5 * devices and int(numbers["scatters"]) == 4 * devices, line
        assert int(numbers["weights"]) == 4 and int(numbers["whole"]) == 4 * sum(sizes), line
        assert int(numbers["stored"]) == 4 * sum(devices * -(-n // shards) for n in sizes), line
