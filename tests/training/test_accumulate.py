"""Gradient accumulation (``gd.function(step, accumulate_steps=k)``): k micro-batches of a batch make the
update of the whole batch in one step (MLP with Adam, one device and Mirrored(2); the transformer block,
whose graph reshapes by the batch size; a plain step without ``strategy.run``), the rewritten graph holds
the micro-batches, and bad uses get clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.mlp import MLP
from graphdist.models.transformer import TransformerBlock

RNG = np.random.default_rng(17)
X = RNG.standard_normal((3, 256, 16)).astype(np.float32)
LABELS = RNG.integers(0, 5, (3, 256))


def _strategy(replicas: int) -> gd.Strategy:
    return gd.OneDeviceStrategy("cpu:0") if replicas == 1 else gd.MirroredStrategy(
        [f"cpu:{i}" for i in range(replicas)])


def _train(model_fn, data, replicas: int, steps: int) -> tuple[list[float], list[np.ndarray], gd.Function]:
    """Three Adam steps of ``model_fn()`` on ``data`` (global batches) with ``accumulate_steps=steps``."""
    strategy = _strategy(replicas)
    with strategy.scope():
        model = model_fn()
        optimizer = gd.optimizers.Adam(0.01)
    replica_step = model.make_train_step(optimizer)  # compute_average_loss: scaled by the global batch

    @gd.function(accumulate_steps=steps)
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    losses = []
    for x, labels in zip(*data):
        batch = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))))
        losses.append(float(train(*batch)))
    return losses, [v.numpy() for v in model.trainable_variables], train


@pytest.mark.parametrize("replicas", [1, 2])
def test_four_micro_batches_of_64_make_the_update_of_one_batch_of_256(replicas: int) -> None:
    mlp = lambda: MLP((16, 32, 5), seed=0, trainable=True)  # noqa: E731
    losses, weights, _ = _train(mlp, (X, LABELS), replicas, 1)
    accumulated, accumulated_weights, train = _train(mlp, (X, LABELS), replicas, 4)
    np.testing.assert_allclose(accumulated, losses, rtol=1e-5)
    for got, want in zip(accumulated_weights, weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the rewritten graph: 4 micro-batches of 256 / replicas / 4 rows on every replica
    rewritten = train.get_concrete_function(*next(iter(_strategy(replicas).experimental_distribute_dataset(
        gd.data.Dataset.from_tensors((X[0], LABELS[0])))))).graph("rewritten")
    micro = {n.meta.get("micro") for n in rewritten.nodes if n.op_type == "MatMul"}
    assert micro == {0, 1, 2, 3}
    slices = [n for n in rewritten.nodes if n.op_type == "Slice" and n.outputs[0].shape[:1] == (64 // replicas,)]
    assert len(slices) == 2 * 4 * replicas  # x and labels, per micro-batch and replica
    assert rewritten.meta.accumulate_steps == 4


def test_transformer_block_accumulates_like_its_whole_batch() -> None:
    tokens, labels = TransformerBlock.example_data(n=48, seed=1)
    data = (tokens.reshape(3, 16, -1), labels.reshape(3, 16))
    _, weights, _ = _train(lambda: TransformerBlock(seed=0), data, 1, 1)
    _, accumulated, _ = _train(lambda: TransformerBlock(seed=0), data, 1, 2)
    for got, want in zip(accumulated, weights):
        # atol: the key projection's bias gets a gradient of rounding noise only (softmax ignores it),
        # which Adam's normalisation turns into steps of ~1e-6 in either direction
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_plain_step_accumulates_its_array_arguments() -> None:
    """No strategy.run: with one replica the step's array arguments are its batch."""
    def run(steps: int) -> np.ndarray:
        w = gd.Variable(np.linspace(-1, 1, 16 * 5, dtype=np.float32).reshape(16, 5))
        optimizer = gd.optimizers.SGD(0.1)

        @gd.function(accumulate_steps=steps)
        def train(x, labels):
            with gd.GradientTape() as tape:
                loss = gd.nn.compute_average_loss(gd.nn.sparse_softmax_cross_entropy(labels, x @ w))
            optimizer.apply_gradients([(tape.gradient(loss, w), w)])
            return loss

        train(X[0], LABELS[0])
        return w.numpy()

    np.testing.assert_allclose(run(8), run(1), rtol=1e-5, atol=1e-7)


def test_accumulate_steps_must_divide_the_batch() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = MLP((16, 8, 5), seed=0, trainable=True)
    step = model.make_train_step(gd.optimizers.SGD(0.1))
    train = gd.function(lambda x, y: strategy.run(step, args=(x, y)), accumulate_steps=3)
    with pytest.raises(gd.GraphdistError, match="accumulate_steps=3 cannot cut a per-replica batch of 256 rows"):
        train(X[0], LABELS[0])


def test_a_partial_last_batch_over_replicas_is_refused_with_the_fix() -> None:
    strategy = _strategy(2)
    with strategy.scope():
        model = MLP((16, 8, 5), seed=0, trainable=True)
    step = model.make_train_step(gd.optimizers.SGD(0.1))
    train = gd.function(lambda x, y: strategy.run(step, args=(x, y)), accumulate_steps=2)
    dataset = gd.data.Dataset.from_tensors((X[0][:7], LABELS[0][:7]))  # 4 + 3 rows
    with pytest.raises(gd.GraphdistError, match="drop_remainder=True"):
        train(*next(iter(strategy.experimental_distribute_dataset(dataset))))


def test_a_step_that_reads_num_replicas_in_sync_is_refused() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    w = gd.Variable(np.ones((16, 5), np.float32))

    def replica(x):
        with gd.GradientTape() as tape:
            loss = (x @ w).sum() / gd.get_replica_context().num_replicas_in_sync
        gd.optimizers.SGD(0.1).apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    train = gd.function(lambda x: strategy.run(replica, args=(x,)), accumulate_steps=2)
    with pytest.raises(gd.TracingError, match="read num_replicas_in_sync"):
        train(X[0])


@pytest.mark.parametrize("bad", [0, -2, 2.0, "4", True])
def test_accumulate_steps_must_be_a_positive_int(bad) -> None:
    with pytest.raises(gd.GraphdistError, match="accumulate_steps must be a positive int"):
        gd.function(lambda x: x, accumulate_steps=bad)
    with pytest.raises(ValueError, match="accumulate_steps must be a positive int"):
        gd.function(accumulate_steps=bad)


@pytest.mark.parametrize("cross_device_ops", [
    gd.NcclAllReduce(shard_optimizer_state=True), gd.NcclAllReduce(num_packs=2),
    gd.ReductionToOneDevice()], ids=["zero1", "buckets", "reduce_to_one"])
def test_accumulation_composes_with_zero1_and_bucketing(cross_device_ops) -> None:
    """The micro-batches are made before the replicas: the passes after them see an ordinary step."""
    mlp = lambda: MLP((16, 8, 5), seed=0, trainable=True)  # noqa: E731
    data = (X[:, :64], LABELS[:, :64])
    _, weights, _ = _train(mlp, data, 2, 1)
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=cross_device_ops)
    with strategy.scope():
        model = mlp()
        optimizer = gd.optimizers.Adam(0.01)
    replica_step = model.make_train_step(optimizer)
    train = gd.function(lambda x, y: strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None),
                        accumulate_steps=4)
    for x, labels in zip(*data):
        batch = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))))
        train(*batch)
    for got, want in zip([v.numpy() for v in model.trainable_variables], weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ops = {n.op_type for n in train.get_concrete_function(*batch).graph("rewritten").nodes}
    if cross_device_ops.shard_optimizer_state:
        assert "ReduceScatter" in ops  # the accumulated gradients are still sharded


def test_micro_batched_segments_run_without_onnx_runtimes_memory_pattern() -> None:
    """A segment of several micro-batches says so in its model's metadata, and its ONNX Runtime session
    frees each micro-batch's tensors (no memory pattern, which would hold them all); others keep it."""
    from graphdist.runtime.tasks import MICRO_BATCHES_KEY

    _, _, accumulated = _train(lambda: MLP((16, 8, 5), seed=0, trainable=True), (X[:1], LABELS[:1]), 1, 4)
    _, _, whole = _train(lambda: MLP((16, 8, 5), seed=0, trainable=True), (X[:1], LABELS[:1]), 1, 1)
    for train, micro in ((accumulated, "4"), (whole, None)):
        plan = train.get_concrete_function(X[0], LABELS[0]).plan
        (segment,) = plan.segments
        assert {p.key: p.value for p in segment.model.metadata_props}.get(MICRO_BATCHES_KEY) == micro
        (executable,) = plan._scheduler._executables
        assert executable.session.get_session_options().enable_mem_pattern is (micro is None)
