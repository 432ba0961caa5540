"""TensorFlow conventions kept by graphdist: ``python -m graphdist``, ``gd.config.list_physical_devices`` and
soft device placement (the seeds' ``MirroredStrategy(["GPU:0", "GPU:1"])`` examples on a machine without GPUs).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.runtime import devices

REPO = Path(__file__).resolve().parents[1]

needs_no_gpu = pytest.mark.skipif(gd.config.num_gpus() >= 2, reason="this machine has the GPUs the seeds name")


@pytest.fixture
def soft_placement_warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Soft placement on (the default) with its once-per-mapping memory cleared, warnings captured."""
    devices._warned_mappings.clear()
    caplog.set_level(logging.WARNING, logger="graphdist.runtime.devices")
    assert gd.config.get_soft_device_placement() is True
    yield caplog
    gd.config.set_soft_device_placement(True)


def _soft_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "soft device placement" in r.getMessage()]


# ------------------------------------------------------------ python -m graphdist
def test_python_m_graphdist_devices(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "graphdist", "devices"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "devices:" in result.stdout and "cpu:0" in result.stdout and "default backend:" in result.stdout
    usage = subprocess.run([sys.executable, "-m", "graphdist", "no-such-command"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert usage.returncode == 2 and "graphdist" in usage.stderr and "Traceback" not in usage.stderr


# ------------------------------------------------------ list_physical_devices
def test_list_physical_devices_names_and_types(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "num_gpus", lambda: 2)
    every = gd.config.list_physical_devices()
    assert [(d.name, d.device_type) for d in every] == [
        ("/physical_device:CPU:0", "CPU"), ("/physical_device:GPU:0", "GPU"), ("/physical_device:GPU:1", "GPU")]
    assert [d.name for d in gd.config.list_physical_devices("gpu")] == ["/physical_device:GPU:0",
                                                                       "/physical_device:GPU:1"]
    assert gd.config.list_physical_devices("CPU") == every[:1]
    assert gd.config.list_physical_devices("TPU") == []  # TPU-like cores are simulated, not hardware


def test_list_physical_devices_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "num_gpus", lambda: 0)
    # The seeds' test: `if tf.config.list_physical_devices('gpu'):`
    assert not gd.config.list_physical_devices("gpu")
    for bad in ("xpu", "gpus", 3):
        with pytest.raises(gd.InvalidArgumentError, match="device_type must be one of 'CPU', 'GPU', 'TPU'"):
            gd.config.list_physical_devices(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------ soft placement
@needs_no_gpu
def test_seed_examples_naming_gpus_run_on_logical_cpus(soft_placement_warnings: pytest.LogCaptureFixture) -> None:
    # strategy-api seed, experimental_distribute_dataset (tf. -> gd.)
    global_batch_size = 2
    strategy = gd.MirroredStrategy(devices=["GPU:0", "GPU:1"])
    dataset = gd.data.Dataset.range(4).batch(global_batch_size)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    @gd.function
    def replica_fn(input):  # noqa: A002 - the seed's code, unchanged
        return input * 2

    result = []
    for x in dist_dataset:
        result.append(strategy.run(replica_fn, args=(x,)))
    assert [[v.tolist() for v in r.values] for r in result] == [[[0], [2]], [[4], [6]]]

    # reduce seed
    strategy = gd.MirroredStrategy(["GPU:0", "GPU:1"])

    def step_fn():
        i = gd.get_replica_context().replica_id_in_sync_group
        return i

    per_replica_result = strategy.run(step_fn)
    assert strategy.reduce("SUM", per_replica_result, axis=None) == 1

    # run seed, ReplicaContext.all_reduce (lower-case "gpu")
    strategy = gd.MirroredStrategy(["gpu:0", "gpu:1"])

    @gd.function
    def run():
        def value_fn(value_context):
            return np.int32(value_context.replica_id_in_sync_group)

        distributed_values = strategy.experimental_distribute_values_from_function(value_fn)

        def replica_fn(input):  # noqa: A002 - the seed's code, unchanged
            return gd.get_replica_context().all_reduce("sum", input)

        return strategy.run(replica_fn, args=(distributed_values,))

    assert [int(v) for v in run().values] == [1, 1]
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1")

    # scope seed: variables mirrored on the two (logical) devices
    strategy = gd.MirroredStrategy(["GPU:0", "GPU:1"])
    with strategy.scope():
        mirrored_variable = gd.Variable(1.)
    assert "MirroredVariable" in repr(mirrored_variable) and len(mirrored_variable.values) == 2

    warnings = _soft_warnings(soft_placement_warnings)
    # Once per mapping, however many strategies make it; it names the mapping and how to turn it off.
    assert len(warnings) == 1, warnings
    assert "cuda:0 -> cpu:0, cuda:1 -> cpu:1" in warnings[0]
    assert "set_soft_device_placement(False)" in warnings[0]


@needs_no_gpu
def test_soft_placement_keeps_replicas_on_distinct_devices(soft_placement_warnings: pytest.LogCaptureFixture
                                                           ) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "GPU:0"])
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1")
    central = gd.CentralStorageStrategy(["GPU:0", "GPU:1"], parameter_device="GPU:0")
    assert central.parameter_device == "cpu:0" and central.extended.worker_devices == ("cpu:0", "cpu:1")
    assert gd.OneDeviceStrategy("/gpu:0").extended.worker_devices == ("cpu:0",)
    assert "cuda:0 -> cpu:1" in _soft_warnings(soft_placement_warnings)[0]


@needs_no_gpu
def test_soft_placement_off_fails_clearly(soft_placement_warnings: pytest.LogCaptureFixture) -> None:
    gd.config.set_soft_device_placement(False)
    assert gd.config.get_soft_device_placement() is False
    with pytest.raises(gd.DeviceError) as info:
        gd.MirroredStrategy(["GPU:0", "GPU:1"])
    message = str(info.value)
    assert "'cuda:0' is not available" in message and "'cpu:0'" in message
    assert "set_soft_device_placement(True)" in message
    with pytest.raises(gd.DeviceError, match="not available"):
        gd.CentralStorageStrategy(["cpu:0"], parameter_device="GPU:0")
    assert _soft_warnings(soft_placement_warnings) == []
    with pytest.raises(gd.DeviceError, match="must be True or False"):
        gd.config.set_soft_device_placement("yes")  # type: ignore[arg-type]
