"""The nine zoo architectures of the onnx wheel, with random weights, through gd.onnx.load.

Oracle: plain ONNX Runtime on the same model (graphdist.models.onnx_zoo makes the
weights with numpy and onnx only): under MirroredStrategy(cpu:0, cpu:1) each
replica's output equals ORT's on that replica's slice of the batch. One
training step of SqueezeNet under Mirrored(2) equals one under OneDevice.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import graphdist as gd
from graphdist.models.onnx_zoo import ZOO, input_name, zoo_model

PER_REPLICA = 2


def _images(batch: int, seed: int = 0) -> np.ndarray:
    """Normal noise, image i scaled by (i + 1) / 2: deep random nets map similar inputs to near-equal outputs."""
    x = np.random.default_rng(seed).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    return x * ((np.arange(batch, dtype=np.float32) + 1) / 2)[:, None, None, None]


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_under_mirrored_equals_onnxruntime(name: str) -> None:
    proto = zoo_model(name)
    x = _images(2 * PER_REPLICA)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = [session.run(None, {input_name(proto): x[r * PER_REPLICA:(r + 1) * PER_REPLICA]})[0]
                for r in range(2)]
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.onnx.load(proto)
    assert model.input_names == [input_name(proto)]
    assert all(isinstance(v, gd.MirroredVariable) for v in model.variables) and model.variables
    result = strategy.run(model, args=(gd.PerReplica([x[:PER_REPLICA], x[PER_REPLICA:]]),))
    for replica, (got, want) in enumerate(zip(result.values, expected)):
        assert got.shape == want.shape, (replica, got.shape, want.shape)
        # Outputs are O(1); one near zero keeps only an absolute error of the order of float32's rounding over
        # a deep network (the graph may fuse or order ops unlike ORT's session), hence the 1e-5 floor.
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5, err_msg=f"{name} replica {replica}")
    # The random weights make a real classifier: not the zoo's uniform answer, different per image.
    images = np.concatenate(expected).reshape(2 * PER_REPLICA, -1)
    for first, second in zip(images[:-1], images[1:]):
        assert np.abs(first - second).max() > 1e-2 * np.abs(images).max()


def test_zoo_models_differ_from_each_other() -> None:
    x = _images(1)
    outputs = {}
    for name in ("resnet50", "squeezenet", "shufflenet"):
        proto = zoo_model(name)
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        outputs[name] = session.run(None, {input_name(proto): x})[0].reshape(-1)
    assert not np.allclose(outputs["resnet50"], outputs["squeezenet"], rtol=1e-2)
    assert not np.allclose(outputs["resnet50"], outputs["shufflenet"], rtol=1e-2)


def _squeezenet_step(strategy: gd.Strategy, x: np.ndarray, labels: np.ndarray, split: bool):
    proto = zoo_model("squeezenet")
    with strategy.scope():
        model = gd.onnx.load(proto)
        optimizer = gd.optimizers.SGD(0.05)
    batch = len(x)

    @gd.function
    def train_step(x, labels):
        def replica_step(x, labels):
            with gd.GradientTape() as tape:
                probs = model(x)  # (n, 1000, 1, 1) softmax; Dropout in inference form (training=False)
                probs = probs.reshape(probs.shape[0], 1000)
                onehot = (np.arange(1000) == labels[:, None]).astype(np.float32)
                per_example = -np.log((probs * onehot).sum(axis=1) + np.float32(1e-7))
                loss = gd.nn.compute_average_loss(per_example, global_batch_size=batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    if split:
        half = batch // 2
        args = (gd.PerReplica([x[:half], x[half:]]), gd.PerReplica([labels[:half], labels[half:]]))
    else:
        args = (x, labels)
    loss = train_step(*args)
    return float(loss), [v.numpy() for v in model.variables]


def test_squeezenet_training_step_mirrored_equals_one_device() -> None:
    x = _images(4, seed=1)
    labels = np.random.default_rng(2).integers(0, 1000, 4)
    initial = [np.asarray(v.numpy()) for v in gd.onnx.load(zoo_model("squeezenet")).variables]
    loss_one, weights_one = _squeezenet_step(gd.OneDeviceStrategy("cpu:0"), x, labels, split=False)
    loss_two, weights_two = _squeezenet_step(gd.MirroredStrategy(["cpu:0", "cpu:1"]), x, labels, split=True)
    np.testing.assert_allclose(loss_two, loss_one, rtol=1e-5)
    assert max(np.abs(a - b).max() for a, b in zip(weights_one, initial)) > 1e-3  # the step moved the weights
    for a, b in zip(weights_one, weights_two):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
