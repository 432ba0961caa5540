"""Op determinism (``gd.config.experimental.enable_op_determinism()``): one global batch, the same bits.

The oracle is ``OneDeviceStrategy``: with determinism on, 20 Adam steps of the MLP, the ConvNet and the
transformer block end with bitwise identical losses and weights under ``MirroredStrategy`` with 2 and 4
replicas and ``CentralStorageStrategy`` with 2 (here), ``MultiWorkerMirroredStrategy`` with 2 workers of 1
and of 2 devices (the slow tests at the end), for 1 and 2 ORT intra-op threads, with gradient accumulation,
after ``replan``, and from run to run in fresh processes. With determinism off the same comparison is only
equal to float tolerance; :func:`test_default_matches_only_to_float_tolerance` measures by how much.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile import plan as plan_module
from graphdist.errors import GraphError, InvalidArgumentError
from graphdist.runtime import devices as devices_module
from tests.distribute import mpi_jobs
from tests.distribute.determinism_common import (
    GLOBAL_BATCH,
    MODELS,
    data,
    digest,
    make_model,
    max_difference,
    per_replica,
    train,
)

STRATEGIES = {
    "mirrored2": lambda: gd.MirroredStrategy(["cpu:0", "cpu:1"]),
    "mirrored4": lambda: gd.MirroredStrategy([f"cpu:{i}" for i in range(4)]),
    "central2": lambda: gd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
}


@pytest.fixture
def deterministic():
    gd.config.experimental.enable_op_determinism()
    yield
    gd.config.experimental.disable_op_determinism()


def _assert_same_bits(got: tuple[list[float], list[np.ndarray]], expected: tuple[list[float], list[np.ndarray]],
                      what: str) -> None:
    losses, weights = got
    assert losses == expected[0], f"{what}: losses differ: {losses} vs {expected[0]}"
    for index, (a, b) in enumerate(zip(weights, expected[1])):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), f"{what}: weight {index} differs by up to {np.max(np.abs(a - b)):.3g}"


@pytest.fixture(scope="module")
def one_device_reference() -> dict[str, tuple[list[float], list[np.ndarray]]]:
    """The oracle per model: 20 deterministic steps on one device (default threads)."""
    gd.config.experimental.enable_op_determinism()
    try:
        return {name: train(gd.OneDeviceStrategy("cpu:0"), name) for name in MODELS}
    finally:
        gd.config.experimental.disable_op_determinism()


@pytest.mark.parametrize("model", MODELS)
def test_same_bits_under_every_in_process_strategy(deterministic, one_device_reference, model: str) -> None:
    for label, make in STRATEGIES.items():
        _assert_same_bits(train(make(), model), one_device_reference[model], f"{model} {label}")


@pytest.mark.parametrize("model", MODELS)
def test_one_chunk_per_replica_gives_the_same_bits(deterministic, one_device_reference, model: str) -> None:
    # Mirrored(8) on the 8 chunks: each replica's batch is one chunk, nothing is sliced, and its sums over the
    # batch must still take the form each chunk's sum has on one device (ChunkBatchReductionsPass).
    strategy = gd.MirroredStrategy([f"cpu:{i}" for i in range(8)])
    _assert_same_bits(train(strategy, model), one_device_reference[model], f"{model} mirrored8")


@pytest.mark.parametrize("cross_device_ops", [
    lambda: gd.NcclAllReduce(), lambda: gd.NcclAllReduce(num_packs=2), lambda: gd.HierarchicalCopyAllReduce(),
    lambda: gd.ReductionToOneDevice(reduce_to_device="cpu:3")], ids=["ring", "ring_packs", "hierarchical", "to_one"])
def test_any_cross_device_ops_gives_the_same_bits(deterministic, one_device_reference, cross_device_ops) -> None:
    strategy = gd.MirroredStrategy([f"cpu:{i}" for i in range(4)], cross_device_ops=cross_device_ops())
    _assert_same_bits(train(strategy, "mlp"), one_device_reference["mlp"], f"mlp mirrored4 {strategy!r}")


@pytest.mark.parametrize("model", MODELS)
def test_same_bits_for_one_and_two_intra_op_threads(deterministic, one_device_reference, monkeypatch,
                                                    model: str) -> None:
    for threads in (1, 2):
        monkeypatch.setattr(plan_module, "thread_budget", lambda devices, threads=threads: threads)
        for label, make in [("one_device", lambda: gd.OneDeviceStrategy("cpu:0")), *STRATEGIES.items()]:
            _assert_same_bits(train(make(), model), one_device_reference[model],
                              f"{model} {label} with {threads} intra-op thread(s)")


def test_same_bits_on_a_host_with_many_cores(deterministic, one_device_reference, monkeypatch) -> None:
    # On a 16-core host one device gets 16 ORT intra-op threads, Mirrored(2) 8 per replica; past 4 threads
    # ORT's SGEMM splits a matmul's sum between threads, so the ConvNet's bits followed the host's cores.
    # Deterministic plans keep to the checked thread counts (Plan.compile), loaded and re-planned ones too.
    monkeypatch.setattr(devices_module, "host_cores", lambda: 16)
    for label, make in [("one_device", lambda: gd.OneDeviceStrategy("cpu:0")), ("mirrored2", STRATEGIES["mirrored2"])]:
        _assert_same_bits(train(make(), "convnet"), one_device_reference["convnet"], f"convnet {label} on 16 cores")


@pytest.mark.parametrize("model", MODELS)
def test_gradient_accumulation_gives_the_same_bits(deterministic, one_device_reference, model: str) -> None:
    _assert_same_bits(train(gd.OneDeviceStrategy("cpu:0"), model, accumulate_steps=4), one_device_reference[model],
                      f"{model} one device, 4 micro-batches")
    _assert_same_bits(train(STRATEGIES["mirrored2"](), model, accumulate_steps=2), one_device_reference[model],
                      f"{model} mirrored2, 2 micro-batches")


def test_tvm_backend_gives_the_same_bits(deterministic) -> None:
    # Its kernels are not ORT's (the bits differ from ORT's by float rounding), but they too give the same
    # bits for the same rows at one shape.
    expected = train(gd.OneDeviceStrategy("cpu:0"), "mlp", backend="tvm")
    for label in ("mirrored2", "mirrored4"):
        _assert_same_bits(train(STRATEGIES[label](), "mlp", backend="tvm"), expected, f"mlp {label} on tvm")


@pytest.mark.parametrize("model", MODELS)
def test_replanned_plan_gives_the_same_bits(deterministic, one_device_reference, tmp_path, model: str) -> None:
    strategy = STRATEGIES["mirrored2"]()
    with strategy.scope():
        network = make_model(model)
        optimizer = gd.optimizers.Adam(1e-2)
    replica_step = network.make_train_step(optimizer, GLOBAL_BATCH)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    x_all, y_all = data(model)
    first = (per_replica(strategy, x_all[:GLOBAL_BATCH]), per_replica(strategy, y_all[:GLOBAL_BATCH]))
    directory = step.get_concrete_function(*first).export(tmp_path / "plan")
    gd.config.experimental.disable_op_determinism()  # the plan keeps it
    for label, target in [("one_device", gd.OneDeviceStrategy("cpu:0")), ("mirrored4", STRATEGIES["mirrored4"]())]:
        plan = gd.load_plan(directory).replan(target)
        losses = [float(plan(x_all[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH], y_all[i * GLOBAL_BATCH:(i + 1) *
                                                                                    GLOBAL_BATCH]))
                  for i in range(len(x_all) // GLOBAL_BATCH)]
        weights = [plan.variables[v._name] for v in network.trainable_variables]
        _assert_same_bits((losses, weights), one_device_reference[model], f"{model} replanned for {label}")


def test_run_to_run_in_fresh_processes(deterministic, one_device_reference, tmp_path) -> None:
    digests = []
    for run, strategy in enumerate(["mirrored2", "mirrored2", "one_device"]):
        out = tmp_path / f"run{run}"
        out.mkdir()
        job = subprocess.run([sys.executable, "tests/distribute/determinism_worker.py", "--model", "transformer",
                              "--strategy", strategy, "--out", str(out)], cwd=mpi_jobs.REPO, env=mpi_jobs.env(),
                             capture_output=True, text=True, timeout=mpi_jobs.HARD_TIMEOUT, check=False)
        assert job.returncode == 0, job.stdout + job.stderr
        digests.append(str(np.load(out / "rank0.npz")["digest"]))
    assert digests == [digest(*one_device_reference["transformer"])] * 3


@pytest.mark.parametrize("model", MODELS)
def test_default_matches_only_to_float_tolerance(model: str) -> None:
    """Determinism off: the same configurations agree to float tolerance; the differences are printed."""
    reference = train(gd.OneDeviceStrategy("cpu:0"), model)
    for label, make in STRATEGIES.items():
        losses, weights = train(make(), model)
        difference = max_difference(weights, reference[1])
        print(f"determinism off: {model} {label}: max |weight difference| {difference:.3g}, losses "
              f"{'equal' if losses == reference[0] else 'differ'}")
        np.testing.assert_allclose(losses, reference[0], rtol=1e-4)
        assert difference < 1e-3


def _keras_fit(strategy: gd.Strategy, examples: int, metrics: tuple = ()) -> tuple[list[float], list[np.ndarray]]:
    gd.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                     gd.keras.layers.Dense(3)])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=list(metrics))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((examples, 8)).astype(np.float32), rng.integers(0, 3, examples)
    history = model.fit(x, y, epochs=2, batch_size=32, shuffle=False, verbose=0)
    return history.history["loss"], [v.numpy() for v in model.trainable_variables]


def test_keras_fit_gives_the_same_bits(deterministic) -> None:
    expected = _keras_fit(gd.OneDeviceStrategy("cpu:0"), 128)
    for label in ("mirrored2", "mirrored4"):
        _assert_same_bits(_keras_fit(STRATEGIES[label](), 128), expected, f"keras fit under {label}")
    # A partial last batch (100 = 3 x 32 + 4) does not cut into 8 chunks: said at once.
    with pytest.raises(GraphError, match="global batch of 4 rows does not cut into 8 equal chunks"):
        _keras_fit(gd.OneDeviceStrategy("cpu:0"), 100)
    # Keras' accuracy metric freezes the batch size into the step's graph: refused, naming op determinism.
    with pytest.raises(gd.TracingError, match=r"op determinism \(8 chunks of the global batch, 8 per replica\) "
                                              "runs the step on micro-batches of 4 rows"):
        _keras_fit(gd.OneDeviceStrategy("cpu:0"), 128, metrics=("accuracy",))


# ------------------------------------------------------------------ refusals and the rule
def test_chunks_must_be_a_power_of_two() -> None:
    with pytest.raises(InvalidArgumentError, match="power of two"):
        gd.config.experimental.enable_op_determinism(chunks=6)
    assert not gd.config.experimental.is_op_determinism_enabled()


def test_replica_count_outside_the_rule_is_refused(deterministic) -> None:
    with pytest.raises(GraphError, match="3 replicas in sync"):
        train(gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]), "mlp", steps=1)


def test_global_batch_not_divisible_by_the_chunks_is_refused(deterministic) -> None:
    strategy = STRATEGIES["mirrored2"]()
    with strategy.scope():
        network = make_model("mlp")
        optimizer = gd.optimizers.Adam(1e-2)
    replica_step = network.make_train_step(optimizer, 12)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    x, y = data("mlp", 1)
    with pytest.raises(GraphError, match="global batch of 12 rows does not cut into 8 equal chunks"):
        step(per_replica(strategy, x[:12]), per_replica(strategy, y[:12]))


def test_accumulation_that_does_not_divide_the_chunks_is_refused(deterministic) -> None:
    with pytest.raises(GraphError, match="accumulate_steps=8 does not divide the 4 chunks"):
        train(STRATEGIES["mirrored2"](), "mlp", steps=1, accumulate_steps=8)


def test_asynchronous_and_sharded_configurations_are_refused() -> None:
    from graphdist.compile.pipeline import PipelineConfig, deterministic_config

    config = PipelineConfig(devices=("cpu:0", "cpu:1"), strategy="ParameterServerStrategy", parameter_servers=True)
    with pytest.raises(NotImplementedError, match="asynchronously"):
        deterministic_config(config, 8)
    with pytest.raises(NotImplementedError, match="ZeRO-1"):
        deterministic_config(PipelineConfig(devices=("cpu:0", "cpu:1"), shard_optimizer_state=True), 8)
    with pytest.raises(NotImplementedError, match="TPU-like cores"):
        deterministic_config(PipelineConfig(devices=("tpu:0", "tpu:1"), strategy="TPUStrategy",
                                            logical_cores=(("tpu:0",), ("tpu:1",))), 8)
    assert deterministic_config(PipelineConfig(devices=("cpu:0", "cpu:1")), 8).accumulate_steps == 4


# ------------------------------------------------------------------ several processes
@pytest.fixture(scope="module")
def default_reference() -> dict[str, tuple[list[float], list[np.ndarray]]]:
    """20 default (not deterministic) steps on one device per model."""
    return {name: train(gd.OneDeviceStrategy("cpu:0"), name) for name in MODELS}


def _two_workers(tmp_path, model: str, devices: int, deterministic: bool) -> list:
    worker = ["tests/distribute/determinism_worker.py", "--model", model, "--strategy", "multi_worker",
              "--devices", str(devices), "--deterministic", str(int(deterministic)), "--out", str(tmp_path)]
    if devices == 1:
        job = mpi_jobs.mpiexec(2, *worker, timeout=300, GRAPHDIST_COLLECTIVE_TIMEOUT="120")
    else:
        job = mpi_jobs.launch("--workers", "2", "--devices-per-worker", "2", "--timeout", "120", "--",
                              sys.executable, *worker, timeout=300)
    assert job.returncode == 0, job.stdout + job.stderr
    return [np.load(tmp_path / f"rank{rank}.npz") for rank in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("model", MODELS)
def test_two_workers_give_the_same_bits(one_device_reference, tmp_path, model: str, devices: int) -> None:
    for rank, result in enumerate(_two_workers(tmp_path, model, devices, deterministic=True)):
        weights = [result[f"var{i}"] for i in range(len(one_device_reference[model][1]))]
        _assert_same_bits((result["losses"].tolist(), weights), one_device_reference[model],
                          f"{model} on 2 workers x {devices} device(s), rank {rank}")


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("model", MODELS)
def test_two_workers_by_default_match_only_to_float_tolerance(default_reference, tmp_path, model: str,
                                                              devices: int) -> None:
    result = _two_workers(tmp_path, model, devices, deterministic=False)[0]
    losses, weights = default_reference[model]
    difference = max_difference([result[f"var{i}"] for i in range(len(weights))], weights)
    print(f"determinism off: {model} 2 workers x {devices}: max |weight difference| {difference:.3g}, losses "
          f"{'equal' if result['losses'].tolist() == losses else 'differ'}")
    np.testing.assert_allclose(result["losses"], losses, rtol=1e-4)
    assert difference < 1e-3


def test_pass_diffs_show_the_determinism_passes(deterministic) -> None:
    from graphdist.compile.diff import strategy_pass_diffs
    from graphdist.ir import assert_structural_equal

    strategy = STRATEGIES["mirrored4"]()
    with strategy.scope():
        network = make_model("mlp")
        optimizer = gd.optimizers.Adam(1e-2)
    replica_step = network.make_train_step(optimizer, GLOBAL_BATCH)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    x, y = data("mlp", 1)
    concrete = step.get_concrete_function(per_replica(strategy, x), per_replica(strategy, y))
    diffs = strategy_pass_diffs(concrete)
    modified = {p.name for p in diffs.passes if p.modified}
    assert {"ChunkBatchReductionsPass", "LowerDeterministicReductionsPass"} <= modified
    assert_structural_equal(diffs.final, concrete.graph("partitioned"))


def test_steps_without_a_strategy_are_not_cut(deterministic) -> None:
    # A step that uses no strategy distributes nothing: its arrays are not a batch to cut, any shape runs.
    variable = gd.Variable(np.zeros(3, np.float32))

    @gd.function
    def double(x):
        return x * 2

    @gd.function
    def add(x):
        variable.assign_add(x)
        return x

    assert double(np.ones(5, np.float32)).tolist() == [2.0] * 5
    add(np.ones(3, np.float32))
    assert variable.numpy().tolist() == [1.0] * 3
    # Under a strategy, a one-replica step's arrays are its batch (as a distributed dataset yields it).
    strategy = gd.OneDeviceStrategy("cpu:0")

    @gd.function
    def total(x):
        return strategy.run(lambda rows: rows.sum(), args=(x,))

    assert float(total(np.arange(8, dtype=np.float32))) == 28.0
    assert total.get_concrete_function(np.arange(8, dtype=np.float32)).config.deterministic_chunks == 8
    with pytest.raises(GraphError, match="global batch of 6 rows does not cut into 8 equal chunks"):
        total(np.arange(6, dtype=np.float32))
