"""ParameterServerStrategy: partitioners, the ps placement pass, and (slow) real runs with ps tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest

import graphdist as gd
from graphdist.distribute.parameter_server import ClusterCoordinator
from graphdist.ir.placement import PlacementSpec, Shard, VariablePlacement
from graphdist.passes.autodiff import AutodiffPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.lower_stop_gradients import LowerStopGradientsPass
from graphdist.passes.lower_variable_updates import LowerVariableUpdatesPass
from graphdist.passes.place_ps_variables import PlacePSVariablesPass
from tests.distribute import mpi_jobs


# ------------------------------------------------------------ partitioners
def test_fixed_shards_partitioner() -> None:
    partitioner = gd.FixedShardsPartitioner(3)
    assert partitioner((10, 4), np.float32) == [3, 1]
    assert partitioner((2, 4), np.float32) == [2, 1]  # never more shards than rows
    assert partitioner((), np.float32) == []
    with pytest.raises(gd.InvalidArgumentError, match="num_shards must be an int >= 1"):
        gd.FixedShardsPartitioner(0)


def test_min_and_max_size_partitioners() -> None:
    assert gd.MinSizePartitioner(min_shard_bytes=64, max_shards=4)((16, 4), np.float32) == [4, 1]  # 256 B
    assert gd.MinSizePartitioner(min_shard_bytes=128, max_shards=4)((16, 4), np.float32) == [2, 1]
    assert gd.MinSizePartitioner(min_shard_bytes=1024, max_shards=4)((16, 4), np.float32) == [1, 1]
    assert gd.MaxSizePartitioner(max_shard_bytes=100)((16, 4), np.float32) == [3, 1]
    assert gd.MaxSizePartitioner(max_shard_bytes=100, max_shards=2)((16, 4), np.float32) == [2, 1]
    with pytest.raises(gd.InvalidArgumentError, match="max_shards must be an int >= 1"):
        gd.MinSizePartitioner(max_shards=0)


def test_cluster_coordinator_is_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match="ClusterCoordinator.*graphdist launch"):
        ClusterCoordinator(None)


# ------------------------------------------------------------ the pass
def test_place_ps_variables_pulls_each_shard_and_pushes_updates() -> None:
    w = gd.Variable(np.ones((4, 3), np.float32), name="w")
    b = gd.Variable(np.zeros(3, np.float32), name="b")
    scale = gd.Variable(np.float32(2.0), name="scale", trainable=False)
    w._ps_shards = [Shard(0, "w/part_0", 0, 2), Shard(1, "w/part_1", 2, 4)]
    b._ps_shards = [Shard(1, "b", 0, 3)]
    scale._ps_shards = [Shard(0, "scale", 0, 1)]
    optimizer = gd.optimizers.SGD(0.1)

    @gd.function
    def step(x):
        with gd.GradientTape() as tape:
            loss = np.sum((x @ w + b) * scale)
        grads = tape.gradient(loss, [w, b])
        optimizer.apply_gradients(zip(grads, [w, b]))
        return loss

    traced = step.get_concrete_function(np.ones((2, 4), np.float32)).graph("traced").copy()
    # The placement spec a ParameterServerStrategy writes from the variables' shards:
    traced.meta.placement = PlacementSpec({v.uid: VariablePlacement("ps", (), tuple(v._ps_shards))
                                              for v in (w, b, scale)})
    passes = [AutodiffPass(), LowerStopGradientsPass(), LowerVariableUpdatesPass(), PlacePSVariablesPass()]
    graph = PassManager(passes).run(traced, PassContext(devices=("cpu:0",))).graph
    pulls = {n.attrs["key"]: n for n in graph.find_nodes("PSPull", "graphdist")}
    pushes = {n.attrs["key"]: n for n in graph.find_nodes("PSPush", "graphdist")}
    assert set(pulls) == {"w/part_0", "w/part_1", "b", "scale"}
    assert set(pushes) == {"w/part_0", "w/part_1", "b"}  # scale is only read
    assert {k: n.attrs["ps"] for k, n in pulls.items()} == {"w/part_0": 0, "w/part_1": 1, "b": 1, "scale": 0}
    assert (pulls["w/part_1"].attrs["row_start"], pulls["w/part_1"].attrs["row_stop"]) == (2, 4)
    assert pulls["w/part_1"].outputs[0].shape == (2, 3) and "row_start" not in pulls["b"].attrs
    inputs = {v.name: v for v in graph.inputs}
    for name in ("w", "b", "scale"):  # variables are read only through their pulls
        assert {user.op_type for user, _ in inputs[name].uses} == {"PSPull"}
    for node in pushes.values():  # a push sends new value - pulled value
        assert node.inputs[0].producer.op_type == "Sub" and node.device == "cpu:0"
    updates = {uid: name for name, uid in graph.meta.variable_updates}
    outputs = {v.name: v for v in graph.outputs}
    assert outputs[updates[w.uid]].producer.op_type == "Concat"  # the shards' new values, joined
    assert outputs[updates[b.uid]].producer is pushes["b"]
    again = PassManager([PlacePSVariablesPass()]).run(graph, PassContext(devices=("cpu:0",)))
    assert not again.modified


# ------------------------------------------------------------ several processes
def _run_ps_job(tmp_path, ps: int, *extra: str) -> list[dict]:
    job = mpi_jobs.launch("--workers", "2", "--ps", str(ps), "--timeout", "60", "--", mpi_jobs.sys.executable,
                          "tests/distribute/ps_train_worker.py", "--out", str(tmp_path), *extra)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "[ps 0]" in job.stderr and "every worker finished" in job.stderr
    results = []
    for worker in range(2):
        data = np.load(tmp_path / f"worker{worker}.npz")
        results.append({"accuracy": float(data["accuracy"]), "steps": int(data["steps"]),
                        "global_step": int(data["global_step"]), "tasks": json.loads(str(data["plan_tasks"])),
                        "placement": json.loads(str(data["placement"]))})
    return results


def _check_placement(result: dict, num_ps: int) -> set[int]:
    keys: dict[str, set[int]] = {}
    for task in result["tasks"]:
        keys.setdefault(task["key"], set()).add(task["ps"])
    assert all(len(where) == 1 for where in keys.values()), keys  # every shard lives on exactly one ps
    placed = {key: ps for shards in result["placement"].values() for ps, key, _, _ in shards}
    assert {key: next(iter(where)) for key, where in keys.items()} == placed  # the plan follows the strategy
    assert all(0 <= ps < num_ps for ps in placed.values())
    return set(placed.values())


@pytest.mark.slow
def test_two_workers_one_ps_converge_on_digits(tmp_path) -> None:
    results = _run_ps_job(tmp_path, 1)
    for result in results:
        assert result["accuracy"] >= 0.9
        assert _check_placement(result, 1) == {0}
        assert len(result["placement"]) == 5  # 4 weights + the optimizer's iterations
    # Async updates: the ps counts every worker's steps; the worker that finished last saw them all.
    assert max(r["global_step"] for r in results) == sum(r["steps"] for r in results)


@pytest.mark.slow
def test_two_workers_two_ps_with_sharded_variables_and_two_devices(tmp_path) -> None:
    results = _run_ps_job(tmp_path, 2, "--shards", "2", "--devices", "2")
    for result in results:
        assert result["accuracy"] >= 0.9
        assert _check_placement(result, 2) == {0, 1}
        kernel = result["placement"]["mlp/dense_0/kernel"]
        assert [(ps, start, stop) for ps, _, start, stop in kernel] == [(0, 0, 32), (1, 32, 64)]
    assert max(r["global_step"] for r in results) == sum(r["steps"] for r in results)


@pytest.mark.slow
def test_a_step_outside_the_scope_updates_the_ps() -> None:
    """A gd.function that updates a ps variable without strategy.run and outside strategy.scope() compiles
    under the variable's strategy (its update once reached only the worker's cached copy, silently)."""
    job = mpi_jobs.launch("--workers", "1", "--ps", "1", "--timeout", "60", "--", mpi_jobs.sys.executable,
                          "tests/distribute/ps_outside_scope_worker.py")
    assert job.returncode == 0, job.stdout + job.stderr
    assert "ps holds [2.0, 2.0, 2.0]" in job.stdout, job.stdout + job.stderr
    assert "live on the parameter servers of ParameterServerStrategy, but the step runs under MirroredStrategy" \
        in job.stdout, job.stdout + job.stderr
