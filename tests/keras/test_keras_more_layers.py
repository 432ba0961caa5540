"""gd.keras pooling, Reshape and Softmax layers: numpy oracles (eager and compiled), training under
Mirrored == OneDevice, configs through save/load, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd

keras = gd.keras
L = keras.layers
RNG = np.random.default_rng(3)


def _compiled(layer, x: np.ndarray) -> np.ndarray:
    return gd.OneDeviceStrategy("cpu:0").run(lambda v: layer(v), args=(x,))


def _avg_pool_numpy(x: np.ndarray, k: int, s: int, same: bool) -> np.ndarray:
    """Average of each window's pixels inside the image (TensorFlow's SAME padding splits extra pixels
    towards the end)."""
    n, h, w, c = x.shape
    out_h, out_w = ((-(-h // s), -(-w // s)) if same else ((h - k) // s + 1, (w - k) // s + 1))
    pad_h = max((out_h - 1) * s + k - h, 0) // 2 if same else 0
    pad_w = max((out_w - 1) * s + k - w, 0) // 2 if same else 0
    out = np.zeros((n, out_h, out_w, c), np.float64)
    for i in range(out_h):
        for j in range(out_w):
            rows = slice(max(i * s - pad_h, 0), min(i * s - pad_h + k, h))
            cols = slice(max(j * s - pad_w, 0), min(j * s - pad_w + k, w))
            out[:, i, j, :] = x[:, rows, cols, :].mean(axis=(1, 2))
    return out


@pytest.mark.parametrize("k,s,padding", [(2, 2, "valid"), (3, 2, "same"), (3, 1, "valid"), (2, 1, "same")])
def test_average_pooling_matches_numpy(k: int, s: int, padding: str) -> None:
    x = RNG.standard_normal((2, 7, 6, 3)).astype(np.float32)
    layer = L.AveragePooling2D(k, strides=s, padding=padding)
    want = _avg_pool_numpy(x.astype(np.float64), k, s, padding == "same")
    np.testing.assert_allclose(layer(x), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_compiled(layer, x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer,reduce", [(L.GlobalAveragePooling2D, np.mean), (L.GlobalMaxPooling2D, np.max)])
def test_global_pooling_matches_numpy(layer, reduce) -> None:
    x = RNG.standard_normal((3, 4, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(_compiled(layer(), x), reduce(x, axis=(1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer(keepdims=True)(x), reduce(x, axis=(1, 2))[:, None, None, :], rtol=1e-5)


def test_reshape_and_softmax_match_numpy() -> None:
    x = RNG.standard_normal((4, 6, 2)).astype(np.float32)
    np.testing.assert_array_equal(_compiled(L.Reshape((3, -1)), x), x.reshape(4, 3, 4))
    logits = RNG.standard_normal((5, 7)).astype(np.float32)
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(_compiled(L.Softmax(), logits), expected, rtol=1e-5, atol=1e-7)
    columns = np.exp(logits) / np.exp(logits).sum(0, keepdims=True)
    np.testing.assert_allclose(L.Softmax(axis=0)(logits), columns, rtol=1e-5, atol=1e-7)


def _model() -> keras.Model:
    return keras.Sequential([
        L.Reshape((8, 8, 1), input_shape=(64,)),
        L.Conv2D(4, 3, padding="same", activation="relu"),
        L.AveragePooling2D(2),
        L.Conv2D(6, 3, padding="same"),
        L.GlobalMaxPooling2D(),
        L.Dense(10),
        L.Softmax()])


def test_new_layers_train_under_mirrored_like_one_device_and_round_trip(tmp_path) -> None:
    from graphdist.models.datasets import digits

    data = digits()
    weights = []
    for strategy in (gd.OneDeviceStrategy("cpu:0"), gd.MirroredStrategy(["cpu:0", "cpu:1"])):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = _model()
            model.compile(optimizer=gd.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
        history = model.fit(data.x_train[:256], data.y_train[:256], batch_size=32, epochs=2, shuffle=False,
                            verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0]
        weights.append(model.get_weights())
    for got, want in zip(*weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    model.save(tmp_path / "m")
    loaded = keras.load_model(tmp_path / "m")
    assert [type(layer).__name__ for layer in loaded.layers] == [type(layer).__name__ for layer in model.layers]
    np.testing.assert_allclose(loaded.predict(data.x_test[:20], verbose=0), model.predict(data.x_test[:20], verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_argument_errors() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="at most one -1"):
        L.Reshape((-1, -1))
    with pytest.raises(gd.InvalidArgumentError, match="cannot reshape examples of shape"):
        L.Reshape((5,))(np.zeros((2, 6), np.float32))
    with pytest.raises(gd.InvalidArgumentError, match="expects NHWC images"):
        L.GlobalAveragePooling2D()(np.zeros((2, 6), np.float32))
    with pytest.raises(gd.InvalidArgumentError, match="AveragePooling2D"):
        L.AveragePooling2D(2, padding="full")
