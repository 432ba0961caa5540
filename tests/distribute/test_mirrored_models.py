"""Mirrored training of the ConvNet and the transformer block equals one device,
and the guide's custom training loop (Dense(1) + binary cross-entropy) runs."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.convnet import ConvNet
from graphdist.models.transformer import TransformerBlock

BATCH = 16
STEPS = 3


def _train(strategy, make_model, data) -> list[np.ndarray]:
    x_all, y_all = data
    with strategy.scope():
        model = make_model()
        optimizer = gd.optimizers.SGD(0.05, momentum=0.9)
    step = model.make_train_step(optimizer, BATCH)
    dataset = gd.data.Dataset.from_tensor_slices((x_all[: BATCH * STEPS], y_all[: BATCH * STEPS])).batch(BATCH)
    for x, y in strategy.experimental_distribute_dataset(dataset):
        strategy.run(step, args=(x, y))
    return [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("model_name", ["convnet", "transformer"])
def test_model_training_equals_one_device(model_name: str, replicas: int) -> None:
    make_model = {"convnet": lambda: ConvNet(seed=0), "transformer": lambda: TransformerBlock(seed=0)}[model_name]
    data = {"convnet": ConvNet.example_data, "transformer": TransformerBlock.example_data}[model_name](n=64)
    expected = _train(gd.OneDeviceStrategy("cpu:0"), make_model, data)
    got = _train(gd.MirroredStrategy([f"cpu:{i}" for i in range(replicas)]), make_model, data)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def _guide_loop(strategy, global_batch_size: int, steps: int = 10) -> list[float]:
    """The distributed-training guide's custom loop, with a Dense(1) written out."""
    with strategy.scope():
        kernel = gd.Variable(np.full((1, 1), 0.5, np.float32), name="dense/kernel")
        bias = gd.Variable(np.zeros(1, np.float32), name="dense/bias")
        optimizer = gd.optimizers.SGD()

    dataset = gd.data.Dataset.from_tensors((np.array([1.0], np.float32), np.array([1.0], np.float32)))
    dataset = dataset.repeat(100).batch(global_batch_size)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    def compute_loss(labels, logits):
        # BinaryCrossentropy(from_logits=True, reduction=NONE): per-example mean over the last axis
        per_example_loss = np.mean(np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits))),
                                   axis=-1)
        return gd.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)

    def train_step(inputs):
        features, labels = inputs
        with gd.GradientTape() as tape:
            predictions = features @ kernel + bias
            loss = compute_loss(labels, predictions)
        gradients = tape.gradient(loss, [kernel, bias])
        optimizer.apply_gradients(zip(gradients, [kernel, bias]))
        return loss

    @gd.function
    def distributed_train_step(dist_inputs):
        per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
        return strategy.reduce(gd.ReduceOp.SUM, per_replica_losses, axis=None)

    iterator = iter(dist_dataset)
    return [float(distributed_train_step(next(iterator))) for _ in range(steps)]


def test_guide_custom_training_loop() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    batch_size_per_replica = 5
    mirrored = _guide_loop(strategy, batch_size_per_replica * strategy.num_replicas_in_sync)
    assert all(b < a for a, b in zip(mirrored, mirrored[1:])), mirrored  # the loss falls every step
    # the loss is a mean over the global batch: one device with the same global batch gives the same curve
    single = _guide_loop(gd.OneDeviceStrategy("cpu:0"), 10)
    np.testing.assert_allclose(mirrored, single, rtol=1e-5)
