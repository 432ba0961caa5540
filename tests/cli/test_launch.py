"""``graphdist launch``: roles, the mpiexec command line, usage errors and (slow) real jobs."""

from __future__ import annotations

import json
import os
import sys

import pytest

import graphdist as gd
from graphdist.cli.launch import build_roles, core_shares, mpiexec_command
from graphdist.cli.main import main
from graphdist.distribute.cluster import parse_config, task_rank
from tests.distribute import mpi_jobs


def test_roles_are_numbered_chief_workers_ps() -> None:
    roles = build_roles(2, ps=1, chief=True, hosts=["h1", "h2"], devices_per_worker=2)
    assert [(r["type"], r["index"], r["host"]) for r in roles] == [
        ("chief", 0, "h1"), ("worker", 0, "h2"), ("worker", 1, "h1"), ("ps", 0, "h2")]
    for rank, role in enumerate(roles):
        spec, task_type, task_id, extra = parse_config(role["config"], "GRAPHDIST_CONFIG")
        assert (task_type, task_id) == (role["type"], role["index"])
        assert task_rank(spec, task_type, task_id) == rank  # the config's rank is the MPI rank
        assert spec.task_address(task_type, task_id) == f"{role['host']}:{rank}"
        if role["type"] != "ps":
            assert extra["local_devices"] in (["cpu:0", "cpu:1"], ["cuda:0", "cuda:1"])
        else:
            assert "local_devices" not in extra


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"workers": 0}, "--workers must be an int >= 1"),
    ({"workers": 1, "ps": -1}, "--ps must be an int >= 0"),
    ({"workers": 1, "devices_per_worker": 0}, "--devices-per-worker must be an int >= 1"),
    ({"workers": 1, "hosts": ["a", ""]}, "empty host name"),
])
def test_bad_roles(kwargs: dict, fragment: str) -> None:
    with pytest.raises(gd.InvalidArgumentError, match=fragment):
        build_roles(**kwargs)


def test_mpiexec_command_runs_each_rank_under_the_wrapper() -> None:
    roles = build_roles(1, ps=1)
    argv = mpiexec_command(roles, ["python", "train.py"], "/tmp/status", timeout=7)
    assert argv[0].endswith("mpiexec") and argv[1] == "-disable-auto-cleanup"
    sections = " ".join(argv[2:]).split(" : ")
    assert len(sections) == 2
    assert "GRAPHDIST_COLLECTIVE_TIMEOUT 7.0" in sections[0] and "-host" not in sections[0]
    assert sections[0].endswith("--rank-wrapper 0 worker 0 -- python train.py")
    assert "graphdist.runtime.ps_server import main" in sections[1] and "train.py" not in sections[1]
    config = json.loads(argv[argv.index("GRAPHDIST_CONFIG") + 1])
    assert config["task"] == {"type": "worker", "index": 0}


def test_hosts_go_through_the_ssh_launcher_round_robin_with_watched_addresses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    roles = build_roles(3, hosts=["127.0.0.1", "localhost"], base_port=29400)
    assert [(r["host"], json.loads(r["config"])["cluster"]["worker"][i]) for i, r in enumerate(roles)] == [
        ("127.0.0.1", "127.0.0.1:29400"), ("localhost", "localhost:29401"), ("127.0.0.1", "127.0.0.1:29402")]
    monkeypatch.delenv("GRAPHDIST_MPI_IFACE", raising=False)
    argv = mpiexec_command(roles, ["python", "train.py"], "/tmp/status", hosts=["127.0.0.1", "localhost"])
    assert argv[1:6] == ["-disable-auto-cleanup", "-launcher", "ssh", "-hosts", "127.0.0.1:1,localhost:1"]
    assert "-iface" not in argv  # only loopback reaches these hosts: mpiexec's own default
    sections = " ".join(argv).split(" : ")
    assert all("GRAPHDIST_WATCH 1" in section for section in sections)  # the tasks watch each other
    monkeypatch.setenv("GRAPHDIST_MPI_IFACE", "eth7")
    assert mpiexec_command(roles, ["true"], "/tmp/status", hosts=["a", "b"])[6:8] == ["-iface", "eth7"]
    with pytest.raises(gd.InvalidArgumentError, match="--hosts lists a host twice"):
        build_roles(2, hosts=["a", "a"])
    with pytest.raises(gd.InvalidArgumentError, match="--port must leave room for 2 ports below 65536"):
        build_roles(2, hosts=["a", "b"], base_port=65535)


def test_core_shares_split_the_cores_among_workers() -> None:
    roles = build_roles(2)
    assert core_shares(roles, [0, 1, 2, 3]) == {0: [0, 1], 1: [2, 3]}
    assert core_shares(build_roles(3, chief=True), [0, 1]) == {0: [0], 1: [1], 2: [0], 3: [1]}
    assert core_shares(build_roles(2, ps=1), [0, 1, 2, 3]) == {}  # the ps serves all the time: no pinning
    argv = mpiexec_command(roles, ["true"], "/tmp/status", cpus={0: [0], 1: [1]})
    assert argv.count("GRAPHDIST_LAUNCH_CPUS") == 2


@pytest.mark.parametrize(("args", "fragment"), [
    (["launch", "--workers", "2"], "give the command after --"),
    (["launch", "--workers", "2", "--timeout", "0", "--", "true"], "--timeout must be > 0"),
    (["launch", "--workers", "0", "--", "true"], "--workers must be an int >= 1"),
])
def test_usage_errors(args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) in (1, 2)
    assert fragment in capsys.readouterr().err


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--devices-per-worker" in out and "graphdist launch --workers 2 --ps 1" in out


@pytest.mark.slow
def test_output_is_prefixed_and_a_failing_rank_is_named() -> None:
    # Rank 1 fails once rank 0 has ended (a failing rank stops the others at once).
    script = ("import os, sys, time, pathlib; rank = int(os.environ['PMI_RANK']); print('hello from', rank); "
              "print('cores', len(os.sched_getaffinity(0)), os.cpu_count()); "
              "done = pathlib.Path(os.environ['GRAPHDIST_LAUNCH_DIR'], 'rank0.json'); "
              "[time.sleep(0.05) for _ in range(400) if rank == 1 and not done.exists()]; "
              "sys.exit(3 if rank == 1 else 0)")
    job = mpi_jobs.launch("--workers", "2", "--", sys.executable, "-c", script)
    assert job.returncode == 1
    assert "[worker 0] hello from 0" in job.stdout and "[worker 1] hello from 1" in job.stdout
    cores = os.cpu_count() or 1
    if cores >= 2:  # each worker got its share of this host's cores
        assert f"[worker 0] cores {cores // 2} {cores}" in job.stdout
    assert "graphdist launch: error: 1 of 2 process(es) failed" in job.stderr
    assert "rank 1 (worker 1): exited with status 3: cores" in job.stderr


@pytest.mark.slow
def test_success_and_missing_program() -> None:
    ok = mpi_jobs.launch("--workers", "2", "--", sys.executable, "-c", "print('fine')")
    assert ok.returncode == 0 and ok.stdout.count("fine") == 2 and ok.stderr == ""
    missing = mpi_jobs.launch("--workers", "1", "--", "/no/such/program")
    assert missing.returncode == 1
    assert "rank 0 (worker 0): exited with status 127: cannot start '/no/such/program'" in missing.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("launch_args", "example"), [
    (["--workers", "2"], "examples/digits_multi_worker.py"),
    (["--workers", "2", "--ps", "1"], "examples/digits_parameter_server.py"),
])
def test_examples_train_digits(tmp_path, launch_args: list[str], example: str) -> None:
    extra = ["--checkpoint", str(tmp_path / "ckpt.npz")] if "multi_worker" in example else []
    job = mpi_jobs.launch(*launch_args, "--timeout", "60", "--", sys.executable, example, "--epochs", "6", *extra)
    assert job.returncode == 0, job.stdout + job.stderr
    accuracies = [float(line.rsplit("test accuracy ", 1)[1].split()[0].rstrip(","))
                  for line in job.stdout.splitlines() if "test accuracy" in line]
    assert accuracies and min(accuracies) >= 0.9
    if extra:
        assert (tmp_path / "ckpt.npz").exists()  # written by the chief


@pytest.mark.parametrize(("command", "replaced"), [
    (["python", "train.py"], True), (["python3", "-m", "x"], True), (["python3.11", "t.py"], True),
    (["/usr/bin/python3", "t.py"], False), (["./venv/bin/python", "t.py"], False), (["pythonista"], False),
    (["bash", "-c", "python t.py"], False),
])
def test_bare_python_runs_with_the_launching_interpreter(command: list[str], replaced: bool) -> None:
    from graphdist.cli.launch import resolve_python

    got = resolve_python(command)
    assert got[1:] == command[1:]
    assert got[0] == (sys.executable if replaced else command[0])


@pytest.mark.slow
def test_bare_python_without_the_venv_on_path_imports_graphdist() -> None:
    """The venv is not active (not on PATH): ``-- python`` still gets the interpreter graphdist runs in."""
    result = mpi_jobs.launch("--workers", "1", "--", "python", "-c",
                             "import sys, graphdist; print('rank python:', sys.executable)",
                             PATH="/usr/bin:/bin", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"rank python: {sys.executable}" in result.stdout
