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
from graphdist.models.mlp import MLP

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


class _Trainer:
    """The MLP and Adam made in ``strategy``'s scope; ``step(i)`` trains on global batch ``i``."""

    def __init__(self, strategy: gd.Strategy) -> None:
        self.strategy = strategy
        with strategy.scope():
            self.model = MLP(SIZES, trainable=True, seed=0)
            self.optimizer = gd.optimizers.Adam(0.01)
        replica_step = self.model.make_train_step(self.optimizer, global_batch_size=BATCH)

        @gd.function
        def train(xb: object, yb: object) -> np.ndarray:
            return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

        self.train = train

    def batch(self, i: int) -> tuple:
        rows = slice(i * BATCH, (i + 1) * BATCH)
        dataset = gd.data.Dataset.from_tensors((X[rows], Y[rows]))
        return next(iter(self.strategy.experimental_distribute_dataset(dataset)))

    def step(self, i: int) -> float:
        return float(self.train(*self.batch(i)))

    def state(self) -> list[np.ndarray]:
        return [v.numpy() for v in (*self.model.trainable_variables, *self.optimizer.variables())]


@pytest.fixture(scope="module")
def one_device() -> tuple[list[float], list[np.ndarray]]:
    trainer = _Trainer(gd.OneDeviceStrategy("cpu:0"))
    losses = [trainer.step(i) for i in range(STEPS)]
    return losses, trainer.state()


def _assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_replan_from_mesh_1x2_to_2x2_to_mirrored_trains_on_like_one_device(one_device) -> None:
    want_losses, want_state = one_device
    first = _Trainer(_mesh_strategy((1, 2)))
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
    _assert_close(list(mirrored.variables.values()), want_state)


def test_a_checkpoint_moves_from_mesh_1x2_to_mesh_2x2_and_to_one_device(one_device, tmp_path: Path) -> None:
    want_losses, want_state = one_device
    first = _Trainer(_mesh_strategy((1, 2)))
    losses = [first.step(i) for i in range(2)]
    path = gd.train.Checkpoint(model=first.model, optimizer=first.optimizer).save(tmp_path / "mesh_1x2.npz")
    second = _Trainer(_mesh_strategy((2, 2)))
    gd.train.Checkpoint(model=second.model, optimizer=second.optimizer).restore(path)
    losses.append(second.step(2))
    assert any(v.worker_shard is not None for v in second.model.trainable_variables)  # stored in blocks again
    path = gd.train.Checkpoint(model=second.model, optimizer=second.optimizer).save(tmp_path / "mesh_2x2.npz")
    last = _Trainer(gd.OneDeviceStrategy("cpu:0"))
    gd.train.Checkpoint(model=last.model, optimizer=last.optimizer).restore(path)
    losses.append(last.step(3))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    _assert_close(last.state(), want_state)
