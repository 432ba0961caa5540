"""Re-planning: a compiled step for another strategy or device count, from its traced graph, without its code.

The oracle is the original step run on the same global batch: every
re-planned plan must end with the same weights (float tolerance).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.mlp import MLP
from graphdist.runtime.tasks import MICRO_BATCHES_KEY
from tests.distribute import mpi_jobs

PLAN_V1 = Path(__file__).parent / "data" / "plan_v1_mlp"

GLOBAL = 16
SIZES = (6, 5, 3)
RNG = np.random.default_rng(3)
X = RNG.standard_normal((2 * GLOBAL, 6)).astype(np.float32)
LABELS = (np.arange(2 * GLOBAL) % 3).astype(np.int64)


def _train_step(strategy: gd.Strategy, global_batch_size: int | None = GLOBAL):
    """An MLP training step with Adam under ``strategy`` (the loss summed over replicas), and its model."""
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(0.05)
    replica_step = model.make_train_step(optimizer, global_batch_size)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    return train, model


def _per_replica(array: np.ndarray, replicas: int) -> gd.PerReplica:
    return gd.PerReplica(tuple(np.split(array, replicas)))


def _variables_after(steps: int) -> dict[str, np.ndarray]:
    """The oracle: the weights after ``steps`` global batches on one device."""
    train, model = _train_step(gd.OneDeviceStrategy("cpu:0"))
    for step in range(steps):
        train(X[step * GLOBAL:(step + 1) * GLOBAL], LABELS[step * GLOBAL:(step + 1) * GLOBAL])
    return {v._name: v.numpy() for v in model.trainable_variables}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> str:
    """A Mirrored(2) Adam training plan, exported before any step (fresh weights)."""
    train, _ = _train_step(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    concrete = train.get_concrete_function(_per_replica(X[:GLOBAL], 2), _per_replica(LABELS[:GLOBAL], 2))
    return concrete.export(tmp_path_factory.mktemp("plans") / "mirrored2")


def _check_weights(variables: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    for name, want in expected.items():
        np.testing.assert_allclose(variables[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("target", [
    lambda: gd.OneDeviceStrategy("cpu:0"),
    lambda: gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"]),
    lambda: gd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    lambda: gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:5"),
    lambda: gd.TPUStrategy(gd.cluster_resolver.TPUClusterResolver(tpu="local[4]")),
], ids=["one_device", "mirrored4", "central2", "central2_cpu5", "tpu4"])
def test_loaded_plan_replans_and_trains_like_one_device(exported: str, target) -> None:
    expected = _variables_after(2)
    plan = gd.load_plan(exported).replan(target())
    assert plan.directory is None
    for step in range(2):  # a global batch: split over the new replicas
        plan(X[step * GLOBAL:(step + 1) * GLOBAL], LABELS[step * GLOBAL:(step + 1) * GLOBAL])
    _check_weights(plan.variables, expected)


def test_replanned_per_replica_batch_and_graphs(exported: str) -> None:
    plan = gd.load_plan(exported).replan(gd.MirroredStrategy([f"cpu:{i}" for i in range(4)]))
    shapes = [tuple(v.shape) for v in plan.graph("rewritten").inputs if v.name.startswith("arg0")]
    assert shapes == [(4, 6)] * 4  # 16 rows over 4 replicas
    assert plan.graph("traced").meta.batch is None or True  # imported graphs carry no meta
    traced = gd.load_plan(exported).graph("traced")
    assert len(traced.find_nodes("MatMul")) == 2  # one replica, as stored
    assert len(plan.graph("rewritten").find_nodes("MatMul")) > 4 * 2
    # A PerReplica of the new replica count works too.
    result = plan(_per_replica(X[:GLOBAL], 4), _per_replica(LABELS[:GLOBAL], 4))
    assert np.isfinite(result)


def test_concrete_function_replans_in_process() -> None:
    train, model = _train_step(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    concrete = train.get_concrete_function(_per_replica(X[:GLOBAL], 2), _per_replica(LABELS[:GLOBAL], 2))
    plan = concrete.replan(gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"]))
    plan(X[:GLOBAL], LABELS[:GLOBAL])
    _check_weights(plan.variables, _variables_after(1))
    # The original's variables are untouched by the re-planned plan (it holds copies).
    assert all(np.array_equal(v.numpy(), MLP(SIZES, seed=0).trainable_variables[i])
               for i, v in enumerate(model.trainable_variables))


def test_replanned_plan_saves_loads_and_replans_again(exported: str, tmp_path) -> None:
    one = gd.load_plan(exported).replan(gd.OneDeviceStrategy("cpu:0"))
    one(X[:GLOBAL], LABELS[:GLOBAL])
    saved = one.save(tmp_path / "one")
    assert one.directory is not None and str(one.directory) == saved
    doc = json.loads((tmp_path / "one" / "plan.json").read_text())
    assert doc["replicas"] == {"local": 1, "in_sync": 1, "offset": 0} and doc["traced"]["rebatch"]["verified"]
    again = gd.load_plan(saved).replan(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    again(X[GLOBAL:], LABELS[GLOBAL:])
    _check_weights(again.variables, _variables_after(2))


def test_cli_replan_and_run(exported: str, tmp_path) -> None:
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, arg0=X[:GLOBAL], arg1=LABELS[:GLOBAL])
    out = tmp_path / "four"
    command = [sys.executable, "-m", "graphdist.cli.main"]
    replanned = subprocess.run([*command, "replan", exported, "--strategy", "mirrored", "--devices",
                                "cpu:0,cpu:1,cpu:2,cpu:3", "-o", str(out)], capture_output=True, text=True,
                               env=mpi_jobs.env(), timeout=120, check=False)
    assert replanned.returncode == 0, replanned.stderr
    # 4 forward+backward segments, then every replica updates some of the variables (BalanceVariableUpdatesPass)
    assert "8 segment(s) on cpu:0, cpu:1, cpu:2, cpu:3" in replanned.stdout
    ran = subprocess.run([*command, "run", str(out), "--inputs", str(inputs), "--save"], capture_output=True,
                         text=True, env=mpi_jobs.env(), timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    _check_weights(gd.load_plan(out).variables, _variables_after(1))
    bad = subprocess.run([*command, "replan", exported, "--strategy", "mirrored", "--devices", "cpu:0,cpu:1,cpu:2",
                          "-o", str(tmp_path / "three")], capture_output=True, text=True, env=mpi_jobs.env(),
                         timeout=120, check=False)
    assert bad.returncode == 1 and "global batch of 16" in bad.stderr and "does not divide among 3" in bad.stderr
    ps = subprocess.run([*command, "replan", exported, "--strategy", "parameter_server", "-o", str(tmp_path / "ps")],
                        capture_output=True, text=True, env=mpi_jobs.env(), timeout=120, check=False)
    assert ps.returncode == 2 and "graphdist launch" in ps.stderr


# ------------------------------------------------------------------ refusals
def test_replica_count_must_divide_the_global_batch(exported: str) -> None:
    with pytest.raises(gd.PlanError, match="global batch of 16.*does not divide among 3 replicas"):
        gd.load_plan(exported).replan(gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]))


def test_plan_from_before_replanning_runs_but_is_refused(tmp_path) -> None:
    """A real schema-1 plan (exported by graphdist 48f7770, before re-planning) still loads and trains.

    The fixture is a Mirrored(2) SGD(0.1) step of MLP(6, 5, 3) on
    ``arange(48) / 48`` with labels ``arange(8) % 3``; the oracle is the same
    step traced and run by this graphdist on one device.
    """
    x = np.arange(48, dtype=np.float32).reshape(8, 6) / 48.0
    labels = np.arange(8) % 3
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    replica_step = model.make_train_step(optimizer, 8)
    expected_loss = float(gd.function(lambda a, b: strategy.run(replica_step, args=(a, b)))(x, labels))

    old = gd.load_plan(PLAN_V1, trust=True)   # the repository's own unsigned fixture; a checkout may be another user's
    assert json.loads((PLAN_V1 / "plan.json").read_text())["version"] == 1
    np.testing.assert_allclose(float(old(x, labels)), expected_loss, rtol=1e-5)
    after = old.variables
    for variable in model.trainable_variables:
        np.testing.assert_allclose(after[variable._name], variable.numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(gd.PlanError, match="did not record the traced step.*schema version 1.*export it again"):
        old.replan(gd.OneDeviceStrategy("cpu:0"))


def test_parameter_server_target_outside_launch_is_refused() -> None:
    with pytest.raises(gd.ClusterConfigError, match="graphdist launch"):
        gd.ParameterServerStrategy()


def test_step_that_freezes_the_batch_size_is_refused_for_another_batch(tmp_path) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(x):
        # float(int(...)) leaves no trace of where the number came from: the graph divides by a frozen 4.
        return strategy.reduce("SUM", strategy.run(lambda v: np.sum(v) / float(int(v.shape[0])), args=(x,)),
                               axis=None)

    concrete = step.get_concrete_function(_per_replica(X[:8], 2))
    directory = concrete.export(tmp_path / "frozen")
    check = json.loads((tmp_path / "frozen" / "plan.json").read_text())["traced"]["rebatch"]
    assert not check["verified"] and "per-replica batch 8" in check["reason"]
    with pytest.raises(gd.PlanError, match="per-replica batch of 8 instead of 4"):
        gd.load_plan(directory).replan(gd.OneDeviceStrategy("cpu:0"))
    with pytest.raises(gd.PlanError, match="per-replica batch of 8 instead of 4"):
        concrete.replan(gd.OneDeviceStrategy("cpu:0"))
    same = gd.load_plan(directory).replan(gd.CentralStorageStrategy(["cpu:0", "cpu:1"]))  # same batch: fine
    np.testing.assert_allclose(same(X[:8]), np.sum(X[:4]) / 4 + np.sum(X[4:8]) / 4, rtol=1e-5)


def test_step_that_reads_the_replica_count_is_refused_for_another_count() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    def replica_fn(v):
        return np.sum(v) / np.float32(gd.get_replica_context().num_replicas_in_sync)

    @gd.function
    def step(x):
        return strategy.reduce("SUM", strategy.run(replica_fn, args=(x,)), axis=None)

    concrete = step.get_concrete_function(_per_replica(X[:8], 2))
    assert concrete.graph("traced").meta.reads_num_replicas
    with pytest.raises(gd.PlanError, match="read num_replicas_in_sync.*test_replan.py"):
        concrete.replan(gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"]))
    concrete.replan(gd.CentralStorageStrategy(["cpu:0", "cpu:1"]))  # the same count: fine


def test_uneven_per_replica_shapes_replan_only_to_the_same_count() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    step = gd.function(lambda x: strategy.run(lambda v: v * 2.0, args=(x,)))
    concrete = step.get_concrete_function(gd.PerReplica((X[:3], X[3:5])))
    with pytest.raises(gd.PlanError, match="different shapes.*only be re-planned for 2 replicas"):
        concrete.replan(gd.OneDeviceStrategy("cpu:0"))
    result = concrete.replan(gd.CentralStorageStrategy(["cpu:0", "cpu:1"]))(gd.PerReplica((X[:3], X[3:5])))
    np.testing.assert_allclose(result.values[1], X[3:5] * 2.0)


def test_replan_needs_a_strategy(exported: str) -> None:
    with pytest.raises(gd.PlanError, match="strategy must be a gd.Strategy"):
        gd.load_plan(exported).replan("mirrored")


# ------------------------------------------------------------------ several processes
@pytest.mark.slow
def test_plan_replanned_for_two_workers_trains_like_one_device(exported: str, tmp_path) -> None:
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=X, labels=LABELS)
    job = mpi_jobs.launch("--workers", "2", "--timeout", "60", "--", sys.executable, "tests/compile/replan_worker.py",
                          exported, "--inputs", str(inputs), "--steps", "2", "--out", str(tmp_path))
    assert job.returncode == 0, job.stdout + job.stderr
    expected = _variables_after(2)
    results = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    for result in results:
        _check_weights(result, expected)
    np.testing.assert_array_equal(results[0]["losses"], results[1]["losses"])  # the loss summed over all replicas


@pytest.mark.slow
def test_plan_replanned_for_a_parameter_server_trains_like_one_device(exported: str, tmp_path) -> None:
    """One worker and one ps: the worker pulls, steps and pushes each step in turn, so the weights on
    the ps follow the one-device training exactly."""
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=X, labels=LABELS)
    job = mpi_jobs.launch("--workers", "1", "--ps", "1", "--timeout", "60", "--", sys.executable,
                          "tests/compile/replan_worker.py", exported, "--inputs", str(inputs), "--steps", "2",
                          "--strategy", "parameter_server", "--out", str(tmp_path))
    assert job.returncode == 0, job.stdout + job.stderr
    _check_weights(dict(np.load(tmp_path / "rank0.npz")), _variables_after(2))


def test_imported_model_inference_plan_replans_like_ort(tmp_path) -> None:
    """An opset-21 ONNX model (Gemm, LayerNormalization, Gelu) served under Mirrored(2), its plan re-planned
    for one device and for four replicas: the gathered outputs equal ONNX Runtime's on the global batch."""
    import onnxruntime as ort

    from graphdist.compile.inference import make_inference_step
    from tests.ir.test_onnx_opsets import gelu_layer_norm_model

    model = gelu_layer_norm_model(21)
    step, (shares,) = make_inference_step(gd.ir.from_onnx(model), gd.MirroredStrategy(["cpu:0", "cpu:1"]), batch=8)
    plan_dir = step.get_concrete_function(shares).export(tmp_path / "served")
    x = np.concatenate(shares.values)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    loaded = gd.load_plan(plan_dir)
    for target in (gd.OneDeviceStrategy("cpu:0"), gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"])):
        np.testing.assert_allclose(loaded.replan(target)(x), expected, rtol=1e-5, atol=1e-6)


def test_an_accumulating_plan_keeps_its_micro_batches_when_replanned(tmp_path) -> None:
    """A Mirrored(2) step with accumulate_steps=2 (4 rows per micro-batch), exported and re-planned for one
    device and for Mirrored(4): still 2 micro-batches per replica, training like one device; a replica count
    that leaves a replica fewer rows than micro-batches is refused."""
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(0.05)
    replica_step = model.make_train_step(optimizer, GLOBAL)
    train = gd.function(lambda x, y: strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None),
                        accumulate_steps=2)
    concrete = train.get_concrete_function(_per_replica(X[:GLOBAL], 2), _per_replica(LABELS[:GLOBAL], 2))
    loaded = gd.load_plan(concrete.export(tmp_path / "accumulating"))
    expected = _variables_after(2)
    for target in (gd.OneDeviceStrategy("cpu:0"), gd.MirroredStrategy([f"cpu:{i}" for i in range(4)])):
        plan = loaded.replan(target)
        marks = {p.value for s in plan.plan.segments for p in s.model.metadata_props if p.key == MICRO_BATCHES_KEY}
        assert marks == {"2"}  # every replica's segment computes 2 micro-batches
        for step in range(2):
            plan(X[step * GLOBAL:(step + 1) * GLOBAL], LABELS[step * GLOBAL:(step + 1) * GLOBAL])
        _check_weights(plan.variables, expected)
    with pytest.raises(gd.PlanError, match="does not divide into 2"):
        loaded.replan(gd.MirroredStrategy([f"cpu:{i}" for i in range(16)]))
