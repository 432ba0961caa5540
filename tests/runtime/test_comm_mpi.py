"""The MPI communicator: one-process behaviour and (slow) real two-rank runs."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

import graphdist as gd
from graphdist.runtime.comm import mpi
from tests.distribute import mpi_jobs


def test_single_rank_collectives_are_copies() -> None:
    comm = mpi.MPICommunicator(timeout=5)
    x = np.arange(4, dtype=np.float32)
    result = comm.all_reduce(x, "MEAN")
    assert result is not x and result.tolist() == x.tolist()
    assert comm.all_gather(x.reshape(2, 2), axis=1).shape == (2, 2)
    assert comm.reduce_scatter(x).tolist() == x.tolist()
    assert comm.all_to_all(x.reshape(2, 2), 1, 0).tolist() == x.reshape(2, 2).tolist()
    assert comm.sequence == 4


@pytest.mark.parametrize(("call", "fragment"), [
    (lambda c: c.all_reduce(np.ones(2), "PROD"), "SUM, MEAN, MAX or MIN"),
    (lambda c: c.all_reduce(np.ones(2), algorithm="butterfly"), "unknown algorithm 'butterfly'; use one of ring, tree"),
    (lambda c: c.all_reduce(np.ones(2), out=np.ones(3)), "out is float64"),
    (lambda c: c.all_reduce(np.array(["a"])), "numeric buffers"),
    (lambda c: c.all_gather(np.float32(1)), "rank >= 1"),
    (lambda c: c.all_gather(np.ones(2), axis=1), "axis 1 is out of range"),
    (lambda c: c.all_to_all(np.float32(1)), "all_to_all: the buffer must have rank >= 1"),
    (lambda c: c.all_to_all(np.ones((2, 3)), concat_axis=2), "all_to_all: axis 2 is out of range"),
    (lambda c: c.broadcast(np.ones(2), root=3), "root 3 is not a rank"),
    (lambda c: c.all_reduce(np.array([True]), "MEAN"), "MEAN of booleans"),
])
def test_bad_arguments(call, fragment: str) -> None:
    with pytest.raises(gd.InvalidArgumentError, match=fragment):
        call(mpi.MPICommunicator(timeout=5))


def test_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPHDIST_COLLECTIVE_TIMEOUT", raising=False)
    assert mpi.default_timeout() == 300.0
    monkeypatch.setenv("GRAPHDIST_COLLECTIVE_TIMEOUT", "2.5")
    assert mpi.default_timeout() == 2.5 and mpi.MPICommunicator().timeout == 2.5
    monkeypatch.setenv("GRAPHDIST_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(gd.InvalidArgumentError, match="number of seconds"):
        mpi.default_timeout()
    with pytest.raises(gd.InvalidArgumentError, match="> 0"):
        mpi.MPICommunicator(timeout=0)


def _ranks(directory) -> dict[int, dict]:
    return {r: json.loads((directory / f"rank{r}.json").read_text()) for r in range(2)
            if (directory / f"rank{r}.json").exists()}


@pytest.mark.slow
def test_two_ranks_every_collective(tmp_path) -> None:
    job = mpi_jobs.mpiexec(2, "tests/runtime/comm_mpi_worker.py", "ops", str(tmp_path))
    assert job.returncode == 0, job.stdout + job.stderr
    ranks = _ranks(tmp_path)
    assert set(ranks) == {0, 1}
    x = [np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * r for r in range(2)]
    for r, out in ranks.items():
        assert out["sum"] == out["ring"] == (x[0] + x[1]).tolist() and out["sum_out_is_out"]
        assert out["mean"] == ((x[0] + x[1]) / 2).tolist()
        assert out["max"] == x[1].tolist() and out["min"] == x[0].tolist()
        assert out["int_mean"] == [3, -4]  # 7 // 2 and -7 // 2 (floor, like Strategy.reduce)
        assert out["bool_sum"] == [True, False] and out["scalar"] == 3.0
        assert out["gather0"] == np.concatenate(x, 0).tolist()
        assert out["gather1"] == np.concatenate(x, 1).tolist()
        assert out["bcast"] == x[1].tolist()
        # rank r gets columns [2r, 2r + 2) of both ranks' (2, 4) buffers, rank 0's rows first
        blocks = [np.arange(8).reshape(2, 4) + 100 * q for q in range(2)]
        assert out["alltoall"] == np.concatenate([b[:, 2 * r:2 * r + 2] for b in blocks], 0).tolist()
        total = np.arange(5) * 3.0
        assert out["scatter"] == (total[:2] if r == 0 else total[2:]).tolist()
        assert out["objects"] == [{"rank": 0}, {"rank": 1}]
        assert out["transposed"] == (x[0] + x[1]).T.tolist()
        assert ("worker 0 called #" in out["mismatch"] and "float32[3]" in out["mismatch"]
                and "worker 1 called #" in out["mismatch"] and "float32[4]" in out["mismatch"])
        assert "unusable after an earlier failure" in out["broken"]


@pytest.mark.slow
def test_tree_all_reduce_adds_in_one_pairwise_tree_on_every_rank(tmp_path) -> None:
    from tests.runtime.comm_mpi_worker import tree_buffer

    job = mpi_jobs.mpiexec(4, "tests/runtime/comm_mpi_worker.py", "tree", str(tmp_path))
    assert job.returncode == 0, job.stdout + job.stderr
    b = [tree_buffer(r) for r in range(4)]
    total = (b[0] + b[1]) + (b[2] + b[3])
    assert total.tobytes() != (((b[0] + b[1]) + b[2]) + b[3]).tobytes()  # the order shows in these bits
    for r in range(4):
        out = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert out["sum"] == total.tobytes().hex()
        assert out["mean"] == (total / np.float32(4)).tobytes().hex()


@pytest.mark.slow
def test_a_stuck_rank_is_named_after_the_timeout(tmp_path) -> None:
    job = mpi_jobs.mpiexec(2, "tests/runtime/comm_mpi_worker.py", "stuck", str(tmp_path))
    ranks = _ranks(tmp_path)
    assert 0 in ranks, job.stdout + job.stderr
    error = ranks[0]["error"]
    assert error is not None, job.stdout + job.stderr
    assert "all_reduce loss" in error and "did not complete within 1.5 s" in error
    assert "no answer from rank 1" in error
    assert 1.5 <= ranks[0]["seconds"] < 10


@pytest.mark.slow
def test_a_collective_whose_peer_finished_fails_at_once_under_launch() -> None:
    """graphdist launch: worker 1's program ends (it waits in MPI_Finalize) while the chief alone gathers a sharded
    weight; the chief fails within seconds naming worker 1 (the rank's "finishing" note), not at the timeout."""
    start = time.monotonic()
    job = mpi_jobs.launch("--workers", "2", "--timeout", "120", "--", sys.executable,
                          "tests/distribute/lone_gather_worker.py")
    assert job.returncode == 1, job.stdout + job.stderr
    assert "worker 1 (rank 1) ended (finished) without taking part in it" in job.stdout + job.stderr
    assert time.monotonic() - start < 60
