"""Cluster configuration: ClusterSpec, the resolvers and their validation errors."""

from __future__ import annotations

import json
import os
import sys

import pytest

import graphdist as gd
from graphdist.distribute.cluster import parse_config, rank_task, task_rank
from graphdist.runtime.comm import mpi_join

REAL_REEXECUTE = mpi_join._reexecute  # tests/conftest.py keeps in-process tests from re-executing pytest

CLUSTER = {"worker": ["host1:2222", "host2:2222", "host3:2222"], "ps": ["host4:2222", "host5:2222"]}


def _config(task_type: str = "worker", index: int = 1, cluster: dict | None = None, **extra: object) -> str:
    return json.dumps({"cluster": cluster or CLUSTER, "task": {"type": task_type, "index": index}, **extra})


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("GRAPHDIST_CONFIG", raising=False)


def test_cluster_spec_jobs_tasks_and_dict() -> None:
    spec = gd.cluster_resolver.ClusterSpec(CLUSTER)
    assert spec.jobs == ["worker", "ps"]
    assert spec.num_tasks("worker") == 3 and spec.num_tasks("ps") == 2 and spec.num_tasks("chief") == 0
    assert spec.task_address("ps", 1) == "host5:2222"
    assert spec.task_indices("worker") == [0, 1, 2]
    assert spec.as_dict() == CLUSTER
    assert spec == gd.cluster_resolver.ClusterSpec(spec)
    assert not gd.cluster_resolver.ClusterSpec({})


def test_cluster_spec_sparse_job() -> None:
    spec = gd.cluster_resolver.ClusterSpec({"worker": {1: "a:1", 3: "b:1"}})
    assert spec.task_indices("worker") == [1, 3]
    assert spec.as_dict() == {"worker": {1: "a:1", 3: "b:1"}}


@pytest.mark.parametrize(("cluster", "fragment"), [
    ({"trainer": ["a:1"]}, "unknown job 'trainer'"),
    ({"worker": "a:1"}, "must be a list of addresses"),
    ({"worker": ["a:1", 7]}, "address must be a non-empty string"),
    ({"chief": ["a:1", "b:1"]}, "at most one chief"),
])
def test_cluster_spec_rejects_bad_jobs(cluster: dict, fragment: str) -> None:
    with pytest.raises(gd.ClusterConfigError, match=fragment):
        gd.cluster_resolver.ClusterSpec(cluster)


def test_tf_config_resolver_reads_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", _config("worker", 1))
    resolver = gd.cluster_resolver.TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict() == CLUSTER
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.master() == "host2:2222"
    assert resolver.master("ps", 0, rpc_layer="grpc") == "grpc://host4:2222"
    assert isinstance(resolver.num_accelerators(), dict)


def test_graphdist_config_wins_over_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", _config("worker", 1))
    monkeypatch.setenv("GRAPHDIST_CONFIG", _config("ps", 0, local_devices=["cpu:0", "cpu:1"]))
    resolver = gd.cluster_resolver.TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)
    assert resolver.local_devices == ["cpu:0", "cpu:1"]


def test_tf_config_resolver_without_config_is_empty() -> None:
    resolver = gd.cluster_resolver.TFConfigClusterResolver()
    assert not resolver.cluster_spec() and resolver.task_type is None and resolver.master() == ""


def test_resolver_overrides_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", _config("worker", 1))
    resolver = gd.cluster_resolver.TFConfigClusterResolver(task_type="ps", task_id=1)
    assert (resolver.task_type, resolver.task_id) == ("ps", 1)
    with pytest.raises(gd.ClusterConfigError, match="out of range"):
        gd.cluster_resolver.TFConfigClusterResolver(task_type="ps", task_id=2)


@pytest.mark.parametrize(("text", "fragment"), [
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (_config("trainer", 0), "task type 'trainer' is unknown"),
    (_config("worker", 3), "task index 3 is out of range for job 'worker', which has 3 task"),
    (_config("worker", -1), "out of range"),
    (_config("chief", 0), "the cluster has no 'chief' job"),
    (_config("worker", "1"), "task index must be an int"),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 0}, "tasks": {}}), "unknown key"),
    (json.dumps({"cluster": CLUSTER, "task": "worker"}), "'task' must be an object"),
    (_config("worker", 0, local_devices="cpu:0"), "local_devices must be a non-empty list"),
])
def test_bad_configs_raise_clear_errors(monkeypatch: pytest.MonkeyPatch, text: str, fragment: str) -> None:
    monkeypatch.setenv("TF_CONFIG", text)
    with pytest.raises(gd.ClusterConfigError, match=fragment) as info:
        gd.cluster_resolver.TFConfigClusterResolver()
    assert "TF_CONFIG" in str(info.value) or "job" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_simple_cluster_resolver() -> None:
    resolver = gd.cluster_resolver.SimpleClusterResolver(gd.cluster_resolver.ClusterSpec(CLUSTER), task_type="ps",
                                                         task_id=1, num_accelerators={"GPU": 2})
    assert resolver.cluster_spec().num_tasks("worker") == 3
    assert resolver.num_accelerators() == {"GPU": 2}
    with pytest.raises(gd.ClusterConfigError, match="unknown"):
        gd.cluster_resolver.SimpleClusterResolver(CLUSTER, task_type="boss", task_id=0)


def test_mpi_cluster_resolver_in_one_process() -> None:
    resolver = gd.cluster_resolver.MPIClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert resolver.cluster_spec().num_tasks("worker") == 1
    with pytest.raises(gd.ClusterConfigError, match="too few"):
        gd.cluster_resolver.MPIClusterResolver(num_ps=1)


def test_ranks_are_numbered_chief_workers_ps() -> None:
    spec = gd.cluster_resolver.ClusterSpec({"ps": ["p:1"], "worker": ["w:1", "w:2"], "chief": ["c:1"]})
    order = [rank_task(spec, r) for r in range(4)]
    assert order == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert [task_rank(spec, *task) for task in order] == [0, 1, 2, 3]
    with pytest.raises(gd.ClusterConfigError):
        rank_task(spec, 4)


def test_parse_config_keeps_rpc_layer() -> None:
    spec, task_type, task_id, extra = parse_config(_config("worker", 0, rpc_layer="grpc"))
    assert spec.num_tasks("ps") == 2 and (task_type, task_id) == ("worker", 0) and extra == {"rpc_layer": "grpc"}


def test_multi_worker_strategy_rejects_ps_and_missing_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", _config("worker", 0))
    with pytest.raises(gd.ClusterConfigError, match="ps task.*synchronous.*ParameterServerStrategy"):
        gd.MultiWorkerMirroredStrategy()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]}}))
    with pytest.raises(gd.ClusterConfigError, match="no 'task'"):
        gd.MultiWorkerMirroredStrategy()


def test_a_task_started_on_its_own_reexecutes_itself_under_mpiexec(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-worker TF_CONFIG in a process no MPI launcher started: the strategy re-executes the program as
    ``mpiexec -n 1 <python> <arguments>`` with MPI over TCP on the interface towards the other task."""
    monkeypatch.setenv("TF_CONFIG", _config("worker", 0, cluster={"worker": ["localhost:2222", "127.0.0.1:2223"]}))
    for name in mpi_join._LAUNCHER_VARIABLES + (mpi_join.REEXEC_ENV, "FI_TCP_IFACE", "MPIR_CVAR_CH4_NETMOD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(mpi_join, "_reexecute", REAL_REEXECUTE)
    executed = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        executed.append((path, argv, env))
        raise SystemExit("replaced")

    monkeypatch.setattr(mpi_join.os, "execve", execve)
    with pytest.raises(SystemExit, match="replaced"):
        gd.MultiWorkerMirroredStrategy()
    path, argv, env = executed[0]
    assert path.endswith("mpiexec") and argv[:4] == [path, "-n", "1", sys.executable]
    assert argv[4:] == sys.orig_argv[1:]  # the arguments this process was started with
    assert env[mpi_join.REEXEC_ENV] == "1" and env["TF_CONFIG"] == os.environ["TF_CONFIG"]
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["FI_PROVIDER"], env["FI_TCP_IFACE"]) == ("ofi", "tcp", "lo")
    # Re-executed already, yet no MPI launcher variables: refused instead of looping.
    monkeypatch.setenv(mpi_join.REEXEC_ENV, "1")
    with pytest.raises(gd.ClusterConfigError, match="re-executed itself under mpiexec, but MPI's process manager"):
        gd.MultiWorkerMirroredStrategy()


def test_parameter_server_strategy_needs_ps_and_a_worker_role(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(gd.ClusterConfigError, match="needs ps tasks"):
        gd.ParameterServerStrategy()
    monkeypatch.setenv("TF_CONFIG", _config("ps", 0))
    with pytest.raises(gd.ClusterConfigError, match="ps tasks run the built-in server"):
        gd.ParameterServerStrategy()


def test_server_is_for_ps_tasks_only() -> None:
    with pytest.raises(gd.ClusterConfigError, match="job_name='ps'"):
        gd.Server(CLUSTER, job_name="worker", task_index=0)
    with pytest.raises(gd.ClusterConfigError, match="worker 1's TF_CONFIG address: the address 'host2' is not "
                                                    "host:port"):
        gd.Server({"worker": ["host1:2222", "host2"], "ps": ["host3:2222"]}, job_name="ps", task_index=0)


# ------------------------------------------------------------------ Slurm
def _slurm(monkeypatch: pytest.MonkeyPatch, procid: int, tasks: int, nodes: str, per_node: str) -> None:
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(tasks))
    monkeypatch.setenv("SLURM_STEP_NODELIST", nodes)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", per_node)


def test_slurm_host_lists_and_tasks_per_node_expand_as_slurm_writes_them() -> None:
    from graphdist.distribute.cluster import expand_hostlist, expand_tasks_per_node

    assert expand_hostlist("n[1-2],m5,o[03-04,6,7-9]") == ["n1", "n2", "m5", "o03", "o04", "o6", "o7", "o8", "o9"]
    assert expand_hostlist("gpu-[08-10]") == ["gpu-08", "gpu-09", "gpu-10"]
    assert expand_hostlist("solo") == ["solo"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    for bad in ("n[1-2", "n[a-b]"):
        with pytest.raises(gd.ClusterConfigError, match="Slurm host list"):
            expand_hostlist(bad)
    with pytest.raises(gd.ClusterConfigError, match="is not N or N"):
        expand_tasks_per_node("2(xa)")


def test_slurm_step_gives_roles_and_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    # srun -N 3 -n 5 (block distribution: 2, 2, 1), this process the fourth task.
    _slurm(monkeypatch, 3, 5, "node[1-3]", "2(x2),1")
    resolver = gd.cluster_resolver.SlurmClusterResolver(jobs={"worker": 4, "ps": 1}, port_base=2222)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node1:2222", "node1:2223", "node2:2222", "node2:2223"], "ps": ["node3:2222"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert resolver.master() == "node2:2223"
    _slurm(monkeypatch, 0, 2, "198.18.0.[1-2]", "1(x2)")
    default = gd.cluster_resolver.SlurmClusterResolver()
    assert default.cluster_spec().as_dict() == {"worker": ["198.18.0.1:8888", "198.18.0.2:8888"]}
    assert (default.task_type, default.task_id) == ("worker", 0)


def test_slurm_errors_name_the_variable_or_the_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    _slurm(monkeypatch, 0, 2, "n1", "2")
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.raises(gd.ClusterConfigError, match="SLURM_PROCID is not set; it works inside a Slurm job step"):
        gd.cluster_resolver.SlurmClusterResolver()
    _slurm(monkeypatch, 0, 2, "n1", "2")
    with pytest.raises(gd.ClusterConfigError, match=r"jobs \{'worker': 3\} ask for 3 tasks but the step has 2"):
        gd.cluster_resolver.SlurmClusterResolver(jobs={"worker": 3})
    _slurm(monkeypatch, 0, 3, "n1", "2")
    with pytest.raises(gd.ClusterConfigError, match="the step has 3 tasks but its nodes hold 2"):
        gd.cluster_resolver.SlurmClusterResolver()
