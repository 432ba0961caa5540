"""FSDP / ZeRO-3 (``PipelineConfig.shard_parameters``, ``ShardParametersPass``) trains exactly like one device:
an MLP on scikit-learn's digits with every weight sharded over 2 and 4 logical CPU devices, 5 Adam steps on
the same global batches as OneDeviceStrategy; each device stores ~1/N of the parameter and optimizer-state
bytes (the plan's count and the variables' storage agree); a checkpoint saves whole values and moves between
FSDP and OneDevice; an exported or re-planned plan (variables stored whole) trains on like the step.

The layout strategy will fill ``shard_parameters`` from a layout map; until it does, these tests turn FSDP on
through a MirroredStrategy whose pipeline configuration names the variables (:class:`_FSDPStrategy`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.pipeline import PipelineConfig
from graphdist.models.datasets import digits
from graphdist.passes.shard_optimizer_state import state_bytes_per_replica
from graphdist.passes.shard_parameters import parameter_bytes_per_replica
from tests.distribute.digits_training import DigitsTrainer

SIZES = (64, 32, 10)
BATCH = 32  # global batch: 16 or 8 rows per replica
STEPS = 5
DATA = digits()
WEIGHTS = tuple(f"mlp/dense_{i}/{kind}" for i in range(len(SIZES) - 1) for kind in ("kernel", "bias"))


class _FSDPStrategy(gd.MirroredStrategy):
    """MirroredStrategy whose pipeline stores ``names`` sharded (the configuration a layout map will give)."""

    def __init__(self, devices: list[str], names: tuple[str, ...] = WEIGHTS,
                 cross_device_ops: gd.CrossDeviceOps | None = None) -> None:
        super().__init__(devices, cross_device_ops)
        self._names = names

    def pipeline_config(self) -> PipelineConfig:
        return super().pipeline_config().replace(shard_parameters=self._names)


def _strategy(replicas: int) -> gd.Strategy:
    if replicas == 1:
        return gd.OneDeviceStrategy("cpu:0")
    return _FSDPStrategy([f"cpu:{i}" for i in range(replicas)])


def _trainer(strategy: gd.Strategy) -> DigitsTrainer:
    """The MLP with Adam under ``strategy``; ``step(i)`` trains on global batch ``i`` of the digits."""
    return DigitsTrainer(strategy, SIZES, BATCH)


def _trained(replicas: int, steps: int = STEPS) -> tuple[DigitsTrainer, list[float]]:
    trainer = _trainer(_strategy(replicas))
    return trainer, [trainer.step(i) for i in range(steps)]


def _assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def one_device() -> tuple[DigitsTrainer, list[float]]:
    return _trained(1)


@pytest.mark.parametrize("replicas", [2, 4])
def test_five_adam_steps_with_every_weight_sharded_equal_one_device(replicas: int, one_device) -> None:
    single, single_losses = one_device
    sharded, losses = _trained(replicas)
    np.testing.assert_allclose(losses, single_losses, rtol=1e-5)
    _assert_close(sharded.state(), single.state())
    assert losses[-1] < losses[0]  # it trains
    rewritten = sharded.rewritten()
    # Every weight is read through a gather of its parts (the second kernel's backward readers gather again;
    # the first kernel's backward reader would compute the gradient of the input, which nobody reads); its
    # gradient is reduce-scattered, and nothing all-gathers the new weights.
    gathers = {n.attrs["group_key"] for n in rewritten.find_nodes("AllGather", gd.ir.GRAPHDIST_DOMAIN)}
    assert gathers == {f"fsdp.{name}.forward" for name in WEIGHTS} | {"fsdp.mlp/dense_1/kernel.backward"}
    assert len(rewritten.find_nodes("AllGather", gd.ir.GRAPHDIST_DOMAIN)) == 5 * replicas
    assert len(rewritten.find_nodes("ReduceScatter", gd.ir.GRAPHDIST_DOMAIN)) == 4 * replicas
    assert not {name for name in WEIGHTS} & {v.name for v in rewritten.inputs}  # no whole weight is fed


def _stored_bytes_per_device(trainer: DigitsTrainer, replicas: int) -> list[int]:
    """Bytes of parameters and optimizer state each device's replica is fed, from the variables' storage."""
    totals = [0] * replicas
    for variable in (*trainer.model.trainable_variables, *trainer.optimizer.variables()):
        stored = variable.stored_value()
        for r in range(replicas):
            totals[r] += stored[r].nbytes if isinstance(stored, tuple) else stored.nbytes
    return totals


@pytest.mark.parametrize("replicas", [2, 4])
def test_each_device_holds_its_share_of_parameters_and_optimizer_state(replicas: int, one_device) -> None:
    single, _ = one_device
    sharded, _ = _trained(replicas, steps=1)
    whole = parameter_bytes_per_replica(single.rewritten()) + state_bytes_per_replica(single.rewritten())
    graph = sharded.rewritten()
    share = parameter_bytes_per_replica(graph) + state_bytes_per_replica(graph)
    sizes = [SIZES[0] * SIZES[1], SIZES[1], SIZES[1] * SIZES[2], SIZES[2]]
    assert whole == 3 * 4 * sum(sizes) + 8  # weights, Adam's m and v (float32), its iterations (int64)
    assert share == 3 * 4 * sum(-(-n // replicas) for n in sizes) + 8  # 10 bias elements over 4: shards of 3
    assert _stored_bytes_per_device(sharded, replicas) == [share] * replicas
    assert share / whole == pytest.approx(1 / replicas, rel=0.01)
    for variable in sharded.model.trainable_variables:
        assert len(variable.stored_value()) == replicas and variable.worker_shard is not None
    assert f"sharded 1/{replicas} on each of" in sharded.train.get_concrete_function(*sharded.batch(0)).plan.summary()


def test_checkpoints_hold_whole_values_and_move_between_fsdp_and_one_device(tmp_path: Path) -> None:
    want, _ = _trained(2)
    first, _ = _trained(2, steps=2)
    path = gd.train.Checkpoint(model=first.model, optimizer=first.optimizer).save(tmp_path / "fsdp2.npz")
    single = _trainer(_strategy(1))
    gd.train.Checkpoint(model=single.model, optimizer=single.optimizer).restore(path)
    # The checkpoint holds the whole values (the slots are restored when the first step creates them).
    _assert_close([v.numpy() for v in single.model.trainable_variables],
                  [v.numpy() for v in first.model.trainable_variables])
    single.step(2)
    path = gd.train.Checkpoint(model=single.model, optimizer=single.optimizer).save(tmp_path / "one.npz")
    back = _trainer(_strategy(4))
    gd.train.Checkpoint(model=back.model, optimizer=back.optimizer).restore(path)
    back.step(3)
    back.step(4)
    _assert_close(back.state(), want.state())


def test_an_exported_or_replanned_plan_stores_the_weights_whole_and_trains_on_alike(tmp_path: Path) -> None:
    trainer, _ = _trained(2, steps=2)
    concrete = trainer.train.get_concrete_function(*trainer.batch(0))
    loaded = gd.load_plan(concrete.export(tmp_path / "plan"))
    replanned = concrete.replan(_strategy(2))
    assert "sharded 1/2 on each of" in loaded.summary()
    for plan in (loaded, replanned):  # sliced from the whole variables, gathered before use
        keys = {n.attrs["group_key"] for n in plan.graph("rewritten").find_nodes("AllGather", gd.ir.GRAPHDIST_DOMAIN)}
        assert {f"fsdp.{name}.forward" for name in WEIGHTS} <= keys
    for step in (2, 3):
        want = trainer.train(*trainer.batch(step))
        rows = slice(step * BATCH, (step + 1) * BATCH)
        for other in (loaded, replanned):
            np.testing.assert_allclose(other(DATA.x_train[rows], DATA.y_train[rows]), want, rtol=1e-6)


def test_some_weights_sharded_the_others_mirrored_with_zero1_slots(one_device) -> None:
    """Only the kernels are FSDP; the biases stay mirrored, their Adam slots sharded by ZeRO-1 (which runs
    after ShardParametersPass and finds only the biases' gradients left to shard)."""
    single, single_losses = one_device
    kernels = ("mlp/dense_0/kernel", "mlp/dense_1/kernel")
    strategy = _FSDPStrategy(["cpu:0", "cpu:1"], kernels, gd.NcclAllReduce(shard_optimizer_state=True))
    mixed = _trainer(strategy)
    losses = [mixed.step(i) for i in range(STEPS)]
    np.testing.assert_allclose(losses, single_losses, rtol=1e-5)
    _assert_close(mixed.state(), single.state())
    layouts = mixed.rewritten().meta.sharded_state
    parameters = {uid.split("#")[0] for uid, layout in layouts.items() if layout.get("parameter")}
    assert parameters == set(kernels)
    assert len(layouts) == 2 + 8  # the kernels, and the m and v of every weight
    biases = [v for v in mixed.model.trainable_variables if v.name.endswith("bias:0")]
    assert all(v.worker_shard is None for v in biases)  # stored whole, all-gathered after their update


def test_an_evaluation_step_reads_the_sharded_weights_through_gathers(one_device) -> None:
    """A forward-only step under the FSDP strategy feeds the parts and gathers them; its logits are one
    device's; a step of another strategy reads the weights whole (joined from their parts, in one process)."""
    single, _ = one_device
    sharded, _ = _trained(2)
    x = DATA.x_test[:BATCH]

    @gd.function
    def logits(batch):
        return sharded.strategy.gather(sharded.strategy.run(sharded.model.forward, args=(batch,)), axis=0)

    dataset = gd.data.Dataset.from_tensors(x)
    got = logits(next(iter(sharded.strategy.experimental_distribute_dataset(dataset))))
    want = gd.function(single.model.forward)(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    graph = logits.get_concrete_function(next(iter(sharded.strategy.experimental_distribute_dataset(dataset))))
    inputs = {v.name for v in graph.graph("rewritten").inputs}
    assert {f"{name}/part{r}" for name in WEIGHTS for r in range(2)} <= inputs
    np.testing.assert_allclose(gd.function(sharded.model.forward)(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("option", ["packs", "hierarchical_copy", "reduce_to_one", "accumulate_steps"])
def test_fsdp_with_other_gradient_options_equals_one_device(option: str, one_device) -> None:
    """Gradient packs, other all-reduce algorithms (for the values left all-reduced) and micro-batches."""
    single, _ = one_device
    ops = {"packs": gd.NcclAllReduce(num_packs=2), "hierarchical_copy": gd.HierarchicalCopyAllReduce(),
           "reduce_to_one": gd.ReductionToOneDevice()}.get(option)
    trainer = _trainer(_FSDPStrategy(["cpu:0", "cpu:1"], WEIGHTS, ops))
    if option == "accumulate_steps":
        replica_step = trainer.model.make_train_step(trainer.optimizer, BATCH)
        strategy = trainer.strategy
        trainer.train = gd.function(lambda x, y: strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)),
                                                                 axis=None), accumulate_steps=2)
    for i in range(STEPS):
        trainer.step(i)
    _assert_close(trainer.state(), single.state())
    assert all(v.worker_shard is not None for v in trainer.model.trainable_variables)


def test_the_configuration_field_names_variables_and_fills_its_slot() -> None:
    from graphdist.compile.pipeline import build_pipeline, deterministic_config

    config = PipelineConfig(devices=("cpu:0", "cpu:1"), shard_parameters=["b:0", "a", "b"])
    assert config.shard_parameters == ("a", "b")  # gd.Variable.name works too; sorted, unique
    assert "shard_parameters: ShardParametersPass(['a', 'b'])" in build_pipeline(config).describe()
    assert "shard_parameters" not in build_pipeline(PipelineConfig(devices=("cpu:0", "cpu:1"))).describe()
    with pytest.raises(gd.errors.InvalidArgumentError, match="got the string 'a'"):
        PipelineConfig(shard_parameters="a")
    with pytest.raises(NotImplementedError, match="sharded parameters \\(FSDP\\)"):
        deterministic_config(config, 4)
