"""FSDP through the layout API: a weight whose layout names the batch axis of ModelParallelStrategy's mesh is
stored in one shard per replica, gathered before use, its gradient reduce-scattered and its Adam state kept in
shards (``ShardParametersPass``), and the step trains like OneDeviceStrategy on the same global batches
(an MLP on scikit-learn's digits, 5 Adam steps)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.passes.shard_optimizer_state import state_bytes_per_replica
from graphdist.passes.shard_parameters import parameter_bytes_per_replica
from tests.distribute.digits_training import DigitsTrainer

SIZES = (64, 32, 10)
STEPS = 5
KERNELS = tuple(f"mlp/dense_{i}/kernel" for i in range(len(SIZES) - 1))
BIASES = tuple(f"mlp/dense_{i}/bias" for i in range(len(SIZES) - 1))


def _fsdp(devices: int) -> gd.Strategy:
    """Every weight sharded over the batch axis of a mesh (devices,)."""
    mesh = gd.experimental.DeviceMesh((devices,), ("batch",), [f"cpu:{i}" for i in range(devices)])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["kernel"] = ("batch", None)
    layout_map["bias"] = ("batch",)
    return gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")


def _train(strategy: gd.Strategy, steps: int = STEPS) -> tuple[list[float], list[np.ndarray], gd.Graph, object]:
    trainer = DigitsTrainer(strategy, SIZES)
    losses = [trainer.step(i) for i in range(steps)]
    return losses, trainer.state(), trainer.rewritten(), trainer.model


@pytest.fixture(scope="module")
def one_device() -> tuple:
    return _train(gd.OneDeviceStrategy("cpu:0"))


@pytest.mark.parametrize("devices", [2, 4])
def test_weights_split_over_the_batch_axis_train_like_one_device(devices: int, one_device) -> None:
    want_losses, want_state, single_graph, _ = one_device
    losses, state, graph, model = _train(_fsdp(devices))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for got, want in zip(state, want_state):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]
    # Stored in shards, gathered before use, gradients reduce-scattered: ShardParametersPass's form.
    assert graph.find_nodes("AllGather", gd.ir.GRAPHDIST_DOMAIN)
    assert len(graph.find_nodes("ReduceScatter", gd.ir.GRAPHDIST_DOMAIN)) == 4 * devices
    assert not {*KERNELS, *BIASES} & {v.name for v in graph.inputs}  # no whole weight is fed
    for variable in model.trainable_variables:
        assert len(variable.stored_value()) == devices
    whole = parameter_bytes_per_replica(single_graph) + state_bytes_per_replica(single_graph)
    share = parameter_bytes_per_replica(graph) + state_bytes_per_replica(graph)
    assert share / whole == pytest.approx(1 / devices, rel=0.02)


def test_kernels_split_over_model_and_biases_over_batch_train_like_one_device(one_device) -> None:
    want_losses, want_state, _, _ = one_device
    mesh = gd.experimental.DeviceMesh((2, 2), ("batch", "model"), [f"cpu:{i}" for i in range(4)])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["dense_0/kernel"] = (None, "model")
    layout_map["dense_1/kernel"] = ("model", None)
    layout_map["bias"] = ("batch",)
    strategy = gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")
    losses, state, graph, model = _train(strategy)
    assert strategy.pipeline_config().shard_parameters == BIASES  # the kernels go to the layout passes
    assert graph.find_nodes("ReduceScatter", gd.ir.GRAPHDIST_DOMAIN)
    # A bias is whole on both model devices of a replica: one gather and one reduce-scatter per replica, on its
    # first device (the other reads it), not one per device.
    fsdp = [n for n in graph.nodes if n.op_type in ("AllGather", "ReduceScatter")
            and not n.attrs["group_key"].startswith("layout")]  # the layout passes' own are per device
    assert fsdp and {n.device for n in fsdp} == {"cpu:0", "cpu:2"}  # the replicas' first devices
    for variable in model.trainable_variables:  # kernels: one block per model position; biases: one shard
        assert len(variable.stored_value()) == 2  # per batch position
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for got, want in zip(state, want_state):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_one_weight_over_the_batch_and_a_model_axis_is_refused() -> None:
    mesh = gd.experimental.DeviceMesh((2, 2), ("batch", "model"), [f"cpu:{i}" for i in range(4)])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["kernel"] = ("batch", "model")
    strategy = gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")
    with pytest.raises(NotImplementedError, match="not combined on one variable"), strategy.scope():
        gd.Variable(np.zeros((4, 6), np.float32), name="kernel")


def test_a_batch_axis_split_need_not_divide_the_dimension() -> None:
    # FSDP pads the flattened weight into equal shards, so 5 rows over 2 devices is fine.
    mesh = gd.experimental.DeviceMesh((2,), ("batch",), ["cpu:0", "cpu:1"])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["kernel"] = ("batch", None)
    strategy = gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")
    with strategy.scope():
        kernel = gd.Variable(np.ones((5, 3), np.float32), name="kernel")
    assert strategy.variable_layout(kernel) == ("batch", None)
    assert strategy.pipeline_config().shard_parameters == ("kernel",)


def _most_gathered_bytes_alive(monkeypatch: pytest.MonkeyPatch, limit: bool) -> tuple[int, dict[str, int]]:
    """Trains a 3-layer MLP with FSDP on mesh (4,) for two steps; returns the most bytes of gathered weights
    alive at once on one device during the second step, and the gathered bytes of each layer's forward gather
    (``benchmarks.bench_fsdp.gathered_bytes``, which the benchmark reports too).
    """
    from benchmarks.bench_fsdp import gathered_bytes
    from graphdist.passes.base import PassResult
    from graphdist.passes.limit_parameter_gathers import LimitParameterGathersPass

    if not limit:  # what the plan did before the pass: every gather free to run at the step's start
        monkeypatch.setattr(LimitParameterGathersPass, "call", lambda self, graph, ctx: PassResult(graph, False))
    trainer = DigitsTrainer(_fsdp(4), (64, 48, 48, 10))
    trainer.step(0)
    measured = gathered_bytes(trainer.train, trainer.batch(1))
    monkeypatch.undo()
    return measured


def test_a_device_holds_one_layers_gathered_weights_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    limited, layers = _most_gathered_bytes_alive(monkeypatch, limit=True)
    unlimited, _ = _most_gathered_bytes_alive(monkeypatch, limit=False)
    assert sorted(layers) == ["mlp/dense_0", "mlp/dense_1", "mlp/dense_2"]
    assert limited == max(layers.values())  # the biggest layer's kernel and bias (its padded gather)
    assert unlimited >= sum(layers.values())  # without the order every forward gather ran at the start
