"""How a collective learns that a peer's task ended (graphdist/runtime/comm/mpi_world.py ``task_ended``): from
``graphdist launch``'s status folder (a ``finishing`` note written at exit before MPI_Finalize, or the exit
record), ``None`` while the task runs or outside a launched job. The end-to-end cases (a collective failing at once
instead of at its timeout) are slow tests in tests/runtime/test_comm_mpi.py and test_tf_config_tasks.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdist.runtime import launch_status
from graphdist.runtime.comm.mpi_world import task_ended


def test_outside_a_launched_job_nobody_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch_status.LAUNCH_DIR_ENV, raising=False)
    assert task_ended(1) is None


def test_the_status_folder_says_how_a_rank_ended(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(launch_status.LAUNCH_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(launch_status.LAUNCH_RANK_ENV, "1")
    assert task_ended(1) is None  # running
    launch_status.record_finishing()  # rank 1's program ended; it may wait in MPI_Finalize
    assert launch_status.finishing(1) and not launch_status.finishing(0)
    assert task_ended(1) == "finished"
    launch_status.record_exit(2, 3)
    assert task_ended(2) == "exited with status 3"
    launch_status.record_exit(3, -9)
    assert task_ended(3) == "killed by SIGKILL"
