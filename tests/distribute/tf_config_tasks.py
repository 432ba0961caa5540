"""Helpers of the tests that start every task by hand, each a plain ``python`` with its own ``TF_CONFIG``
(as the seeds start a multi-worker job), on localhost or in namespace hosts (``benchmarks.netns``)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.distribute import mpi_jobs

HARD_TIMEOUT = 150  # seconds: nothing a test starts may hang the suite
_started: list[Task] = []


def kill_leftovers() -> None:
    """Kills every task a test started that still runs (a test that failed before waiting for them)."""
    while _started:
        task = _started.pop()
        if task.process.poll() is None:
            task.process.kill()
            task.process.wait()
        task._file.close()


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports free on localhost now."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def tf_config(cluster: dict[str, list[str]], job: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


class Task:
    """One task started by hand: its process, and its output in a file (no pipe to fill up)."""

    def __init__(self, argv: list[str], config: str, log: Path, bed: Any = None, host: int | None = None,
                 **env: str) -> None:
        self.log = log
        self.name = log.stem
        environment = mpi_jobs.env(TF_CONFIG=config, **env)
        command = [sys.executable, *argv]
        if bed is not None:
            command = bed.command(host, command)
        self._file = open(log, "w")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(command, cwd=mpi_jobs.REPO, env=environment, stdout=self._file,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.started = time.monotonic()
        self.ended: float | None = None
        _started.append(self)

    def wait(self, timeout: float = HARD_TIMEOUT) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.name} did not end within {timeout} s:\n{self.output[-3000:]}") from None
        finally:
            self._file.close()
        self.ended = time.monotonic()
        return code

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_all(argv: list[str], cluster: dict[str, list[str]], out: Path, order: list[tuple[str, int]],
              delays: dict[tuple[str, int], float] | None = None, bed: Any = None,
              hosts: dict[tuple[str, int], int] | None = None, **env: str) -> dict[tuple[str, int], Task]:
    """Starts one task per ``(job, index)`` of ``order`` (after its delay since the first), each with its
    TF_CONFIG; ``argv`` may hold ``{job}`` / ``{index}``.
    """
    tasks = {}
    begin = time.monotonic()
    for job, index in order:
        pause = (delays or {}).get((job, index), 0.0) - (time.monotonic() - begin)
        if pause > 0:
            time.sleep(pause)
        args = [a.format(job=job, index=index) for a in argv]
        host = (hosts or {}).get((job, index))
        tasks[job, index] = Task(args, tf_config(cluster, job, index), out / f"{job}{index}.log", bed=bed,
                                 host=host, **env)
    return tasks


def wait_all(tasks: dict[tuple[str, int], Task], timeout: float = HARD_TIMEOUT) -> dict[tuple[str, int], int]:
    """Every task's exit status; a task still running after ``timeout`` fails the test, and none is left."""
    deadline = time.monotonic() + timeout
    try:
        return {key: task.wait(max(1.0, deadline - time.monotonic())) for key, task in tasks.items()}
    finally:
        for task in tasks.values():
            if task.process.poll() is None:
                task.process.kill()
                task.process.wait()
