"""gd.keras CategoricalCrossentropy, Huber, CategoricalAccuracy and BinaryAccuracy: numpy oracles, what
"accuracy" means for each loss, training under Mirrored == OneDevice, saved configs, errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd

keras = gd.keras
RNG = np.random.default_rng(11)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("from_logits,smoothing", [(True, 0.0), (False, 0.0), (True, 0.2)])
def test_categorical_crossentropy_matches_numpy(from_logits: bool, smoothing: float) -> None:
    logits = RNG.standard_normal((6, 4)).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[RNG.integers(0, 4, 6)]
    loss = keras.losses.CategoricalCrossentropy(from_logits=from_logits, label_smoothing=smoothing)
    prediction = logits if from_logits else np.exp(_log_softmax(logits))
    target = y * (1 - smoothing) + smoothing / 4
    want = -(target * _log_softmax(logits.astype(np.float64))).sum(-1).mean()
    np.testing.assert_allclose(loss(y, prediction), want, rtol=1e-5)
    traced = gd.OneDeviceStrategy("cpu:0").run(lambda a, b: loss(a, b), args=(y, prediction))
    np.testing.assert_allclose(traced, want, rtol=1e-5)


def test_huber_matches_numpy() -> None:
    y, p = RNG.standard_normal((5, 3)).astype(np.float32) * 2, RNG.standard_normal((5, 3)).astype(np.float32) * 2
    error = np.abs(p - y).astype(np.float64)
    delta = 0.7
    want = np.where(error <= delta, 0.5 * error**2, delta * (error - 0.5 * delta)).mean(-1).mean()
    np.testing.assert_allclose(keras.losses.Huber(delta)(y, p), want, rtol=1e-5)
    assert isinstance(keras.losses.get("huber"), keras.losses.Huber)


def test_accuracy_follows_the_loss() -> None:
    get = keras.metrics.get
    assert type(get("accuracy", keras.losses.CategoricalCrossentropy())) is keras.metrics.CategoricalAccuracy
    assert get("accuracy", keras.losses.BinaryCrossentropy()).threshold == 0.5
    assert get("accuracy", keras.losses.BinaryCrossentropy(from_logits=True)).threshold == 0.0


def test_categorical_and_binary_accuracy_match_numpy() -> None:
    logits = RNG.standard_normal((8, 5)).astype(np.float32)
    y = np.eye(5, dtype=np.float32)[RNG.integers(0, 5, 8)]
    metric = keras.metrics.CategoricalAccuracy()
    metric.update_state(y, logits)
    np.testing.assert_allclose(metric.result(), np.mean(logits.argmax(1) == y.argmax(1)), rtol=1e-6)
    scores = RNG.standard_normal((8, 2)).astype(np.float32)
    labels = RNG.integers(0, 2, (8, 2)).astype(np.float32)
    binary = keras.metrics.BinaryAccuracy(threshold=0.0)
    binary.update_state(labels, scores)
    np.testing.assert_allclose(binary.result(), np.mean((scores > 0) == (labels > 0.5)), rtol=1e-6)


def test_one_hot_training_under_mirrored_equals_one_device_and_saves(tmp_path) -> None:
    from graphdist.models.datasets import digits

    data = digits()
    y = np.eye(10, dtype=np.float32)[data.y_train[:200]]
    results = []
    for strategy in (gd.OneDeviceStrategy("cpu:0"), gd.MirroredStrategy(["cpu:0", "cpu:1"])):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                      keras.layers.Dense(10)])
            model.compile(optimizer="adam", metrics=["accuracy"],
                          loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1))
        history = model.fit(data.x_train[:200], y, batch_size=32, epochs=3, shuffle=False, verbose=0)
        results.append((model.get_weights(), history.history))
    (one_w, one_h), (mir_w, mir_h) = results
    for got, want in zip(mir_w, one_w):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mir_h["accuracy"], one_h["accuracy"], atol=1e-6)
    assert one_h["loss"][-1] < one_h["loss"][0]
    model.save(tmp_path / "m")
    loaded = keras.load_model(tmp_path / "m")
    assert isinstance(loaded.loss, keras.losses.CategoricalCrossentropy) and loaded.loss.label_smoothing == 0.1
    assert type(loaded.compiled_metrics[0]) is keras.metrics.CategoricalAccuracy


def test_errors() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="label_smoothing"):
        keras.losses.CategoricalCrossentropy(label_smoothing=1.5)
    with pytest.raises(gd.InvalidArgumentError, match="delta"):
        keras.losses.Huber(0)
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(3, input_shape=(2,))])
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    with pytest.raises(gd.InvalidArgumentError, match="use sparse_categorical_crossentropy"):
        model.fit(np.zeros((4, 2), np.float32), np.array([0, 1, 2, 0]), verbose=0)
