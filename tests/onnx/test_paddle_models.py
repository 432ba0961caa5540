"""PaddleOCR's models as Paddle2ONNX wrote them (weights in ``Constant`` nodes) train under Mirrored(2).

Models: ``ppocr_cls`` (text-direction classifier, MobileNetV3, opset 11) and ``ppocr_det`` (DBNet
detector with ``Resize`` and ``ConvTranspose``, opset 12), from the ``rapidocr_onnxruntime`` 1.4.4
wheel (Apache-2.0, https://github.com/RapidAI/RapidOCR), fetched by :mod:`tests.real_models`. The
files are used as shipped: nothing edits them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphdist as gd
from tests.real_models import model_path

RNG = np.random.default_rng(23)
DEVICES = ["cpu:0", "cpu:1"]


def _load(name: str, strategy: gd.Strategy, **kwargs):
    with strategy.scope():
        return gd.onnx.load(model_path(name), **kwargs)


def test_ppocr_cls_loads_its_constant_weights_as_variables() -> None:
    model = _load("ppocr_cls", gd.OneDeviceStrategy("cpu:0"))
    # 53 Conv weights + 18 Conv biases (Reshape -> Add) + 35 BatchNormalization scale/bias pairs + MatMul
    # weight and bias; 35 running mean/variance pairs frozen.
    assert len(model.trainable_variables) == 53 + 18 + 2 * 35 + 2
    assert len(model.variables) == len(model.trainable_variables) + 2 * 35
    assert len(model.promoted_constants) == len(model.variables)
    frozen = {v.name for v in model.variables if not v.trainable}
    assert all(name.endswith(("_mean:0", "_variance:0")) for name in frozen)
    kept = gd.onnx.load(model_path("ppocr_cls"), promote_constants=False)
    assert kept.variables == [] and kept.promoted_constants == []
    x = RNG.standard_normal((2, 3, 48, 192)).astype(np.float32)
    np.testing.assert_allclose(model(x), kept(x), rtol=1e-5, atol=1e-6)  # promotion changes nothing computed


def _train(strategy: gd.Strategy, x: np.ndarray, labels: np.ndarray, steps: int, name: str = "ppocr_cls",
           optimizer: str = "sgd", **load: Any) -> tuple[list[float], gd.onnx.OnnxModel]:
    model = _load(name, strategy, **load)
    with strategy.scope():
        opt = gd.optimizers.SGD(0.05) if optimizer == "sgd" else gd.optimizers.Adam(1e-3)
    batch = len(x)

    @gd.function
    def train_step(x, labels):
        def replica_step(x, labels):
            with gd.GradientTape() as tape:
                out = model(x, training=True)
                if name == "ppocr_cls":  # (n, 2) probabilities: cross-entropy
                    onehot = (np.arange(2) == labels[:, None]).astype(np.float32)
                    per_example = -np.log((out * onehot).sum(axis=1) + np.float32(1e-7))
                else:  # (n, 1, h, w) text probability map: binary cross-entropy against a target map
                    eps = np.float32(1e-6)
                    bce = -(labels * np.log(out + eps) + (1 - labels) * np.log(1 - out + eps))
                    per_example = bce.mean(axis=(1, 2, 3))
                loss = gd.nn.compute_average_loss(per_example, global_batch_size=batch)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    if len(strategy.extended.worker_devices) > 1:
        half = batch // 2
        args = (gd.PerReplica([x[:half], x[half:]]), gd.PerReplica([labels[:half], labels[half:]]))
    else:
        args = (x, labels)
    return [float(train_step(*args)) for _ in range(steps)], model


def _assert_same_training(one: tuple[list[float], gd.onnx.OnnxModel], two: tuple[list[float], gd.onnx.OnnxModel],
                          initial: list[np.ndarray]) -> None:
    (losses_one, model_one), (losses_two, model_two) = one, two
    assert np.all(np.isfinite(losses_one)), losses_one
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-4)
    moved = max(float(np.abs(v.numpy() - w).max()) for v, w in zip(model_one.variables, initial))
    assert moved > 1e-4  # the steps moved the weights
    for a, b in zip(model_one.variables, model_two.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-3, atol=1e-5, err_msg=a.name)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_ppocr_cls_trains_under_mirrored_like_one_device(optimizer: str, tmp_path: Path) -> None:
    x = RNG.standard_normal((4, 3, 48, 192)).astype(np.float32)
    labels = np.array([0, 1, 1, 0])
    initial = [v.numpy() for v in _load("ppocr_cls", gd.OneDeviceStrategy("cpu:0")).variables]
    one = _train(gd.OneDeviceStrategy("cpu:0"), x, labels, steps=3, optimizer=optimizer)
    two = _train(gd.MirroredStrategy(DEVICES), x, labels, steps=3, optimizer=optimizer)
    _assert_same_training(one, two, initial)
    # Frozen BatchNormalization statistics (the default): training=True did not move them.
    for variable, start in zip(two[1].variables, initial):
        if not variable.trainable:
            np.testing.assert_array_equal(variable.numpy(), start)
    if optimizer == "sgd":
        _assert_saved_model_runs_on_onnxruntime(two[1], x, tmp_path / "cls.onnx")


def _assert_saved_model_runs_on_onnxruntime(model: gd.onnx.OnnxModel, x: np.ndarray, path: Path) -> None:
    model.save(path)
    saved = onnx.load(str(path))
    assert not any(n.op_type == "Constant" and n.output[0] in model.promoted_constants for n in saved.graph.node)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, model(x), rtol=1e-4, atol=1e-5)
    original = ort.InferenceSession(str(model_path("ppocr_cls")), providers=["CPUExecutionProvider"])
    assert not np.allclose(original.run(None, {"x": x})[0], got, rtol=1e-4, atol=1e-5)  # trained weights saved


def test_ppocr_cls_with_moving_batch_norm_statistics_stays_finite() -> None:
    """``batch_norm="update"`` (batch statistics, running ones moving as in Keras' fit): the running
    statistics are non-trainable variables, so no optimizer step drives a variance negative (the NaN
    at step 2 of weights moved to trainable initializers by hand).
    """
    x = RNG.standard_normal((4, 3, 48, 192)).astype(np.float32)
    initial = [v.numpy() for v in _load("ppocr_cls", gd.OneDeviceStrategy("cpu:0")).variables]
    losses, model = _train(gd.OneDeviceStrategy("cpu:0"), x, np.array([0, 1, 1, 0]), steps=3, batch_norm="update")
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    statistics = [(v, w) for v, w in zip(model.variables, initial) if not v.trainable]
    assert all(np.all(np.isfinite(v.numpy())) for v, _ in statistics)
    variances = [v.numpy() for v, _ in statistics if v.name.endswith("_variance:0")]
    assert len(variances) == 35 and all(np.all(a > 0) for a in variances)
    assert sum(not np.allclose(v.numpy(), w) for v, w in statistics) > len(statistics) // 2  # they moved


def test_ppocr_det_trains_one_step_under_mirrored_like_one_device() -> None:
    x = RNG.standard_normal((4, 3, 64, 64)).astype(np.float32)
    target = (RNG.random((4, 1, 64, 64)) > 0.5).astype(np.float32)
    initial = [v.numpy() for v in _load("ppocr_det", gd.OneDeviceStrategy("cpu:0")).variables]
    one = _train(gd.OneDeviceStrategy("cpu:0"), x, target, steps=1, name="ppocr_det")
    two = _train(gd.MirroredStrategy(DEVICES), x, target, steps=1, name="ppocr_det")
    _assert_same_training(one, two, initial)
