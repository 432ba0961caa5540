"""ZeRO-1 (``gd.NcclAllReduce(shard_optimizer_state=True)``) trains exactly like the unsharded strategy:
weights and Adam moments after 5 steps under Mirrored(2) and Mirrored(4) (a bias of 3 elements over 4
replicas is padded); each replica holds 1/N of the optimizer slots in the plan; checkpoints taken under
ZeRO restore into a plain OneDevice optimizer and back, and training resumes exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.mlp import MLP
from graphdist.passes.shard_optimizer_state import state_bytes_per_replica

SIZES = (6, 8, 3)
BATCH = 16
RNG = np.random.default_rng(3)
X = RNG.standard_normal((5, BATCH, SIZES[0])).astype(np.float32)
LABELS = RNG.integers(0, SIZES[-1], (5, BATCH))


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


def _strategy(replicas: int, zero: bool) -> gd.Strategy:
    if replicas == 1:
        return gd.OneDeviceStrategy("cpu:0")
    return gd.MirroredStrategy(_devices(replicas), cross_device_ops=gd.NcclAllReduce(shard_optimizer_state=zero))


class _Trainer:
    """An MLP with Adam under ``strategy``; ``step(i)`` trains on batch ``i``."""

    def __init__(self, strategy: gd.Strategy) -> None:
        self.strategy = strategy
        with strategy.scope():
            self.model = MLP(SIZES, seed=0, trainable=True)
            self.optimizer = gd.optimizers.Adam(0.05)
        replica_step = self.model.make_train_step(self.optimizer, BATCH)

        @gd.function
        def train(x, labels):
            return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

        self.train = train

    def batch(self, i: int) -> tuple:
        dataset = gd.data.Dataset.from_tensors((X[i], LABELS[i]))
        return next(iter(self.strategy.experimental_distribute_dataset(dataset)))

    def step(self, i: int) -> None:
        self.train(*self.batch(i))

    def state(self) -> list[np.ndarray]:
        return [v.numpy() for v in (*self.model.trainable_variables, *self.optimizer.variables())]


def _trained(strategy: gd.Strategy, steps: int = 5) -> _Trainer:
    trainer = _Trainer(strategy)
    for i in range(steps):
        trainer.step(i)
    return trainer


def _assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("replicas", [2, 4])
def test_five_adam_steps_equal_unsharded(replicas: int) -> None:
    plain = _trained(_strategy(replicas, zero=False))
    sharded = _trained(_strategy(replicas, zero=True))
    _assert_close(sharded.state(), plain.state())
    rewritten = sharded.train.get_concrete_function(*sharded.batch(0)).graph("rewritten")
    assert len(rewritten.find_nodes("ReduceScatter", gd.ir.GRAPHDIST_DOMAIN)) == 4 * replicas   # 4 variables
    assert len(rewritten.find_nodes("AllGather", gd.ir.GRAPHDIST_DOMAIN)) == 4 * replicas


@pytest.mark.parametrize("replicas", [2, 4])
def test_each_replica_holds_its_share_of_the_slots(replicas: int) -> None:
    plain, sharded = (_Trainer(_strategy(replicas, zero)) for zero in (False, True))
    plans = [t.train.get_concrete_function(*t.batch(0)).plan for t in (plain, sharded)]
    sizes = [SIZES[0] * SIZES[1], SIZES[1], SIZES[1] * SIZES[2], SIZES[2]]
    counter = 8  # Adam/iterations (int64), kept whole
    assert state_bytes_per_replica(plans[0].graph) == counter + sum(2 * 4 * n for n in sizes)
    shards = [-(-n // replicas) for n in sizes]  # 3 elements over 4 replicas: padded to one each
    assert state_bytes_per_replica(plans[1].graph) == counter + sum(2 * 4 * k for k in shards)
    assert f"sharded 1/{replicas} on each of" in plans[1].summary()
    assert "sharded" not in plans[0].summary()


def test_checkpoint_moves_between_zero_and_one_device(tmp_path: Path) -> None:
    want = _trained(_strategy(2, zero=True)).state()
    first = _trained(_strategy(2, zero=True), steps=2)
    path = gd.train.Checkpoint(model=first.model, optimizer=first.optimizer).save(tmp_path / "zero2.npz")
    single = _Trainer(_strategy(1, zero=False))
    gd.train.Checkpoint(model=single.model, optimizer=single.optimizer).restore(path)
    single.step(2)
    path = gd.train.Checkpoint(model=single.model, optimizer=single.optimizer).save(tmp_path / "one.npz")
    back = _Trainer(_strategy(4, zero=True))
    gd.train.Checkpoint(model=back.model, optimizer=back.optimizer).restore(path)
    back.step(3)
    back.step(4)
    _assert_close(back.state(), want)


def test_in_one_process_each_slot_is_stored_in_per_replica_parts() -> None:
    """Each Adam slot is stored as one part per replica: the plan feeds replica r its part and takes its new
    part back (no slice of the slot, no concatenation); numpy() and the summary show the whole variable."""
    trainer = _trained(_strategy(2, zero=True), steps=2)
    concrete = trainer.train.get_concrete_function(*trainer.batch(0))
    slots = [v for v in trainer.optimizer.variables() if v.ndim]
    assert slots and all(v._worker_shard is not None and len(v._value) == 2 for v in slots)
    kernel_m = next(v for v in slots if v.shape == (SIZES[0], SIZES[1]))
    assert [p.shape for p in kernel_m._value] == [(SIZES[0] * SIZES[1] // 2,)] * 2
    inputs = set(concrete.plan.input_names)
    rewritten = concrete.graph("rewritten")
    layout = rewritten.meta.sharded_state[kernel_m.uid]
    assert set(layout["parts"]) <= inputs and len(layout["parts"]) == 2
    written = {name for name, _ in rewritten.meta.variable_updates}
    assert not any(n.outputs[0].name in written for n in rewritten.find_nodes("Concat"))  # no joined write-back
    assert "in 2 parts" in concrete.plan.summary()
    _assert_close(trainer.state(), _trained(_strategy(2, zero=False), steps=2).state())


def test_a_step_stored_in_parts_exports_and_replans_with_whole_variables(tmp_path: Path) -> None:
    """A plan directory holds each variable whole: the export builds the step with its slots stored whole;
    the loaded plan and a re-planned one train on exactly like the step."""
    trainer = _trained(_strategy(2, zero=True), steps=2)
    concrete = trainer.train.get_concrete_function(*trainer.batch(0))
    loaded = gd.load_plan(concrete.export(tmp_path / "plan"))
    replanned = concrete.replan(_strategy(2, zero=True))
    assert "sharded 1/2 on each of" in loaded.summary()
    for step in (2, 3):
        want = trainer.train(*trainer.batch(step))
        for other in (loaded, replanned):
            np.testing.assert_allclose(other(X[step], LABELS[step]), want, rtol=1e-6)
    values = loaded.variables
    for name, variable in concrete._variable_feeds:  # the slots come back whole, equal to the step's
        np.testing.assert_allclose(values[name], variable.numpy(), rtol=1e-5, atol=1e-7)


def test_shard_optimizer_state_must_be_a_bool() -> None:
    with pytest.raises(gd.errors.InvalidArgumentError, match="shard_optimizer_state must be True or False"):
        gd.NcclAllReduce(shard_optimizer_state="yes")
    assert "shard_optimizer_state=True" in repr(gd.NcclAllReduce(shard_optimizer_state=True))


def test_multi_worker_zero1_with_one_worker_shards_over_its_devices() -> None:
    """One worker (no cluster): MultiWorkerMirroredStrategy(shard_optimizer_state=True) shards like Mirrored."""
    plain = _trained(_strategy(2, zero=False))
    sharded = _trained(gd.MultiWorkerMirroredStrategy(devices=_devices(2), shard_optimizer_state=True))
    _assert_close(sharded.state(), plain.state())
    plan = sharded.train.get_concrete_function(*sharded.batch(0)).plan
    assert "sharded 1/2 on each of" in plan.summary()
