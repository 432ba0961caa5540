"""docs/coming-from-tf.md, "Names that differ, one by one": every row is run here and behaves as it says."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd

DOC = Path(__file__).resolve().parents[2] / "docs" / "coming-from-tf.md"
SECTION = "## Names that differ, one by one"


def _rows() -> list[str]:
    text = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [re.match(r"\| (.+?) \|", line).group(1) for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| TensorFlow name")]


def _mirrored() -> gd.MirroredStrategy:
    return gd.MirroredStrategy(["cpu:0", "cpu:1"])


def check_cluster_coordinator(tmp_path: Path) -> None:
    for spelling in (gd.distribute.coordinator, gd.distribute.experimental.coordinator,
                     gd.distribute.coordinator.experimental):
        with pytest.raises(NotImplementedError, match="graphdist launch --workers N --ps M"):
            spelling.ClusterCoordinator(None)


def check_remote_value(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="ClusterCoordinator"):
        gd.distribute.experimental.coordinator.RemoteValue()


def check_element_spec(tmp_path: Path) -> None:
    dataset = gd.data.Dataset.from_tensor_slices((np.ones((8, 3), np.float32), np.arange(8))).batch(4)
    features, labels = _mirrored().experimental_distribute_dataset(dataset).element_spec
    assert isinstance(features, gd.PerReplica) and len(features.values) == 2
    assert features.values[0] == gd.TensorSpec((None, 3), np.float32)
    assert labels.values[1] == gd.TensorSpec((None,), np.int64)
    one = gd.OneDeviceStrategy("cpu:0").experimental_distribute_dataset(dataset).element_spec
    assert one == (gd.TensorSpec((None, 3), np.float32), gd.TensorSpec((None,), np.int64))


def check_restore_status(tmp_path: Path) -> None:
    kernel, bias = gd.Variable(np.ones(3, np.float32)), gd.Variable(np.zeros(2, np.float32))
    path = gd.train.Checkpoint(kernel=kernel, bias=bias).save(tmp_path / "both.ckpt")
    kernel.assign(np.zeros(3, np.float32))
    status = gd.train.Checkpoint(kernel=kernel).restore(path)
    np.testing.assert_array_equal(kernel.numpy(), np.ones(3, np.float32))  # assigned at restore
    assert status.expect_partial() is status and status.assert_existing_objects_matched() is status
    with pytest.raises(gd.CheckpointError, match="bias"):
        status.assert_consumed()
    gd.train.Checkpoint(kernel=kernel, bias=bias).restore(path).assert_consumed()
    other = gd.Variable(np.zeros(1, np.float32))
    with pytest.raises(gd.CheckpointError, match="no value for"):
        gd.train.Checkpoint(kernel=kernel, other=other).restore(path)


def check_checkpoint_manager(tmp_path: Path) -> None:
    assert not hasattr(gd.train, "CheckpointManager")


def check_optimizer_outside_scope(tmp_path: Path) -> None:
    optimizer = gd.optimizers.SGD(0.1)
    strategy = _mirrored()
    with strategy.scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(1)])
        model.build((None, 3))
        with pytest.raises(gd.InvalidArgumentError, match="optimizer's variable"):
            model.compile(optimizer=optimizer, loss="mse")


def check_random_generator(tmp_path: Path) -> None:
    generator = gd.random.Generator.from_seed(5)
    step = gd.function(lambda: generator.normal((4,)))
    assert not np.allclose(step(), step())
    for name in ("from_non_deterministic_state", "uniform", "reset_from_seed", "skip"):
        assert hasattr(gd.random.Generator, name)
    for name in ("truncated_normal", "binomial", "split"):
        assert not hasattr(gd.random.Generator, name)


def check_np_random_in_trace(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    noisy = gd.function(lambda x: x + np.random.uniform(size=3).astype(np.float32))
    with caplog.at_level(logging.WARNING, logger="graphdist"):
        first, second = noisy(np.zeros(3, np.float32)), noisy(np.zeros(3, np.float32))
    np.testing.assert_array_equal(first, second)
    assert any("np.random was called" in r.getMessage() for r in caplog.records)


def check_list_args(tmp_path: Path) -> None:
    result = gd.OneDeviceStrategy("cpu:0").run(lambda x: x * 2, args=([1.0, 2.0],))
    assert result.dtype == np.float64 and result.tolist() == [2.0, 4.0]


def check_input_signature(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="input_signature"):
        gd.function(lambda x: x, input_signature=[gd.TensorSpec((None,))])


def check_variable_synchronization(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="synchronization"):
        gd.Variable(1.0, synchronization="ON_READ")


def check_no_device_scope(tmp_path: Path) -> None:
    assert not hasattr(gd, "device")


def check_variable_float32(tmp_path: Path) -> None:
    assert gd.Variable(1.0).dtype == np.float32


def check_numpy_promotion(tmp_path: Path) -> None:
    step = gd.function(lambda x: x * np.float64(2))
    assert step(np.ones(2, np.float32)).dtype == np.float64


def check_no_autograph(tmp_path: Path) -> None:
    step = gd.function(lambda x: x if x.sum() > 0 else -x)
    with pytest.raises(gd.TracingError, match="np.where"):
        step(np.ones(2, np.float32))


def check_list_physical_devices(tmp_path: Path) -> None:
    with pytest.raises(gd.InvalidArgumentError, match="'CPU', 'GPU', 'TPU'"):
        gd.config.list_physical_devices("gpus")
    assert gd.config.list_physical_devices("TPU") == []


def check_tpu_run_outside_function(tmp_path: Path) -> None:
    strategy = gd.TPUStrategy(gd.cluster_resolver.TPUClusterResolver(tpu="local[2]"))
    with pytest.raises(gd.PlanError, match="inside a gd.function"):
        strategy.run(lambda x: x, args=(np.ones(2, np.float32),))


def check_soft_placement(tmp_path: Path) -> None:
    if gd.config.list_physical_devices("GPU"):
        pytest.skip("this row is about a machine without GPUs")
    assert gd.MirroredStrategy(["GPU:0", "GPU:1"]).extended.worker_devices == ("cpu:0", "cpu:1")
    gd.config.set_soft_device_placement(False)
    try:
        with pytest.raises(gd.DeviceError, match="cuda:0"):
            gd.MirroredStrategy(["GPU:0", "GPU:1"])
    finally:
        gd.config.set_soft_device_placement(True)


def check_device_strings(tmp_path: Path) -> None:
    strategy = gd.MirroredStrategy(["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1"])
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1")
    if not gd.config.list_physical_devices("GPU"):
        assert gd.OneDeviceStrategy("/gpu:0").extended.worker_devices == ("cpu:0",)  # soft placement of cuda:0


CHECKS: dict[str, Callable[..., None]] = {
    "`tf.distribute.coordinator.ClusterCoordinator`": check_cluster_coordinator,
    "`tf.distribute.experimental.coordinator.RemoteValue`": check_remote_value,
    "`DistributedDataset.element_spec`": check_element_spec,
    "`tf.train.Checkpoint.restore`": check_restore_status,
    "`tf.train.CheckpointManager`": check_checkpoint_manager,
    "`Model.compile(optimizer=...)` with an optimizer made outside `strategy.scope()`": check_optimizer_outside_scope,
    "`tf.random.Generator`": check_random_generator,
    "`np.random` inside `tf.function`": check_np_random_in_trace,
    "a Python list in `strategy.run(args=...)`": check_list_args,
    "`tf.function(input_signature=...)`": check_input_signature,
    "`tf.Variable(synchronization=..., aggregation=...)`": check_variable_synchronization,
    "`tf.device(...)`": check_no_device_scope,
    "`tf.Variable(1.0)`": check_variable_float32,
    "`float32_tensor * np.float64(2)` in a traced step": check_numpy_promotion,
    "`if tensor:` in a `tf.function`": check_no_autograph,
    "`tf.config.list_physical_devices(\"gpus\")`": check_list_physical_devices,
    "`TPUStrategy.run` outside a `tf.function`": check_tpu_run_outside_function,
    "`MirroredStrategy([\"GPU:0\", \"GPU:1\"])` without GPUs": check_soft_placement,
    "device strings `\"/gpu:0\"`, `\"/job:localhost/replica:0/task:0/device:CPU:1\"`": check_device_strings,
}


def test_every_row_has_a_check() -> None:
    rows = _rows()
    assert rows, f"{SECTION!r} not found in {DOC}"
    assert sorted(rows) == sorted(CHECKS), "rows and checks differ: add a check for each new row"


@pytest.mark.parametrize("row", list(CHECKS))
def test_row_behaves_as_documented(row: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    check = CHECKS[row]
    if "caplog" in check.__code__.co_varnames[:check.__code__.co_argcount]:
        check(tmp_path, request.getfixturevalue("caplog"))
    else:
        check(tmp_path)
