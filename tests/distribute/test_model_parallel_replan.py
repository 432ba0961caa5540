"""A step traced under one mesh re-planned onto another and onto MirroredStrategy, and a checkpoint moved
between meshes, train on like one device (issue 27's "replan (1, 2) -> (2, 2) -> Mirrored(2)" and "a
checkpoint moved between meshes"): an MLP on scikit-learn's digits with the Megatron layout, Adam, global
batches of 16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

import graphdist as gd
from tests.distribute.digits_training import DigitsTrainer, assert_same_state

BATCH = 16
STEPS = 4
SIZES = [64, 32, 10]


def _digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return (x[:BATCH * STEPS] / 16).astype(np.float32), y[:BATCH * STEPS].astype(np.int64)


X, Y = _digits()


def _mesh_strategy(shape: tuple[int, int]) -> gd.Strategy:
    mesh = gd.experimental.DeviceMesh(shape, ("batch", "model"), [f"cpu:{i}" for i in range(shape[0] * shape[1])])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["dense_0/kernel"] = (None, "model")
    layout_map["dense_0/bias"] = ("model",)
    layout_map["dense_1/kernel"] = ("model", None)
    return gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")


def _trainer(strategy: gd.Strategy) -> DigitsTrainer:
    return DigitsTrainer(strategy, SIZES, BATCH, X, Y)


@pytest.fixture(scope="module")
def one_device() -> tuple[list[float], list[np.ndarray]]:
    trainer = _trainer(gd.OneDeviceStrategy("cpu:0"))
    losses = [trainer.step(i) for i in range(STEPS)]
    return losses, trainer.state()


def test_replan_from_mesh_1x2_to_2x2_to_mirrored_trains_on_like_one_device(one_device) -> None:
    want_losses, want_state = one_device
    first = _trainer(_mesh_strategy((1, 2)))
    # One batch group: a distributed dataset's elements are plain arrays, as in TensorFlow; per-replica values
    # (gd.PerReplica of one) make a step whose batch a re-plan splits over more replicas.
    batch = [gd.PerReplica([part]) for part in first.batch(0)]
    losses = [float(first.train(*batch))]
    concrete = first.train.get_concrete_function(*batch)
    on_2x2 = concrete.replan(_mesh_strategy((2, 2)))  # the variables' values move with the step
    losses.append(float(on_2x2(X[BATCH:2 * BATCH], Y[BATCH:2 * BATCH])))  # a global batch, split in two
    rewritten = on_2x2.graph("rewritten")
    assert "segment(s) on cpu:0, cpu:1, cpu:2, cpu:3" in on_2x2.plan.summary()
    assert any(n.op_type == "AllReduce" and n.attrs["group_key"].startswith("layout") for n in rewritten.nodes)
    mirrored = on_2x2.replan(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    assert not any(n.attrs.get("group_key", "").startswith("layout") for n in mirrored.graph("rewritten").nodes)
    losses += [float(mirrored(X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH])) for i in (2, 3)]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert_same_state(list(mirrored.variables.values()), want_state)


def test_a_checkpoint_moves_from_mesh_1x2_to_mesh_2x2_and_to_one_device(one_device, tmp_path: Path) -> None:
    want_losses, want_state = one_device
    first = _trainer(_mesh_strategy((1, 2)))
    losses = [first.step(i) for i in range(2)]
    path = gd.train.Checkpoint(model=first.model, optimizer=first.optimizer).save(tmp_path / "mesh_1x2.npz")
    second = _trainer(_mesh_strategy((2, 2)))
    gd.train.Checkpoint(model=second.model, optimizer=second.optimizer).restore(path)
    losses.append(second.step(2))
    assert any(v.worker_shard is not None for v in second.model.trainable_variables)  # stored in blocks again
    path = gd.train.Checkpoint(model=second.model, optimizer=second.optimizer).save(tmp_path / "mesh_2x2.npz")
    last = _trainer(gd.OneDeviceStrategy("cpu:0"))
    gd.train.Checkpoint(model=last.model, optimizer=last.optimizer).restore(path)
    losses.append(last.step(3))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert_same_state(last.state(), want_state)


def test_replan_onto_fsdp_layouts_shards_the_stored_weights_and_trains_on_like_one_device(one_device) -> None:
    # The re-planned step makes no variables for the strategy to see: its FSDP weights are matched by name.
    want_losses, want_state = one_device
    first = _trainer(gd.OneDeviceStrategy("cpu:0"))
    batch = [gd.PerReplica([part]) for part in first.batch(0)]  # a batch the re-plan splits over the replicas
    losses = [float(first.train(*batch))]
    concrete = first.train.get_concrete_function(*batch)
    mesh = gd.experimental.DeviceMesh((2,), ("batch",), ["cpu:0", "cpu:1"])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["kernel"] = ("batch", None)
    layout_map["bias"] = ("batch",)
    fsdp = concrete.replan(gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch"))
    gathers = {n.attrs["group_key"] for n in fsdp.graph("rewritten").nodes if n.op_type == "AllGather"}
    assert {key.split(".")[1] for key in gathers} == {f"mlp/dense_{i}/{kind}" for i in range(2)
                                                      for kind in ("kernel", "bias")}
    losses += [float(fsdp(X[i * BATCH:(i + 1) * BATCH], Y[i * BATCH:(i + 1) * BATCH])) for i in range(1, STEPS)]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert_same_state(list(fsdp.variables.values()), want_state)
