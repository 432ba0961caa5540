"""gd.keras layers: eager numpy == traced (compiled) forward, weights through the strategy, configs."""

from __future__ import annotations

import io

import numpy as np
import pytest

import graphdist as gd

keras = gd.keras
L = keras.layers


def _compiled_forward(layer, x: np.ndarray, training: bool = False) -> np.ndarray:
    return gd.OneDeviceStrategy("cpu:0").run(lambda v: layer(v, training=training), args=(x,))


@pytest.mark.parametrize("layer, shape, dtype", [
    (lambda: L.Dense(5, activation="relu"), (6, 4), np.float32),
    (lambda: L.Dense(3, activation="softmax", use_bias=False), (2, 3, 4), np.float32),
    (lambda: L.Conv2D(3, (3, 2), strides=2, padding="same", activation="tanh"), (2, 7, 6, 2), np.float32),
    (lambda: L.MaxPool2D(2), (2, 6, 6, 3), np.float32),
    (lambda: L.Flatten(), (2, 3, 4, 5), np.float32),
    (lambda: L.LayerNormalization(), (4, 6), np.float32),
    (lambda: L.BatchNormalization(), (4, 3, 3, 2), np.float32),
    (lambda: L.Embedding(7, 3), (4, 5), np.int64),
    (lambda: L.ReLU(), (3, 4), np.float32),
    (lambda: L.Activation("sigmoid"), (3, 4), np.float32),
    (lambda: L.Dropout(0.5), (3, 4), np.float32),
])
def test_eager_and_compiled_forward_agree(layer, shape, dtype) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 7, shape).astype(dtype) if dtype == np.int64 else rng.standard_normal(shape).astype(dtype)
    instance = layer()
    eager = np.asarray(instance(x))
    np.testing.assert_allclose(_compiled_forward(instance, x), eager, rtol=1e-5, atol=1e-6)


def test_dense_and_conv_match_numpy() -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 5, 2)).astype(np.float32)
    conv = L.Conv2D(4, 3)
    out = np.asarray(conv(x))
    kernel, bias = conv.kernel.numpy(), conv.bias.numpy()
    expected = np.zeros((3, 3, 3, 4), np.float32)
    for i in range(3):
        for j in range(3):
            expected[:, i, j, :] = np.tensordot(x[:, i:i + 3, j:j + 3, :], kernel, axes=3) + bias
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    dense = L.Dense(2, input_shape=(4,))
    assert dense.built and dense.kernel.shape == (4, 2)


def test_dropout_only_while_training_and_batch_norm_statistics() -> None:
    x = np.ones((200, 50), np.float32)
    dropped = _compiled_forward(L.Dropout(0.5), x, training=True)
    assert 0.4 < np.mean(dropped == 0) < 0.6 and set(np.unique(dropped)) <= {0.0, 2.0}
    bn = L.BatchNormalization(momentum=0.5)
    data = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32) * 2 + 5
    normalised = _compiled_forward(bn, data, training=True)
    np.testing.assert_allclose(normalised.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.5 * data.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(), 0.5 + 0.5 * data.var(axis=0), rtol=1e-4)


def test_weights_are_created_through_the_strategy() -> None:
    central = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device="cpu:1")
    with central.scope():
        model = keras.Sequential([L.Dense(2, input_shape=(3,)), L.BatchNormalization()])
    assert all(v.device == "cpu:1" for v in model.variables)
    assert [v.trainable for v in model.variables] == [True, True, True, True, False, False]
    with gd.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        lazy = keras.Sequential([L.Dense(2)])
    assert lazy.variables == []
    lazy.predict(np.ones((4, 3)))   # built on first use, in the model's strategy
    assert all(isinstance(v, gd.MirroredVariable) for v in lazy.variables) and len(lazy.variables) == 2


def test_layer_argument_errors() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="units"):
        L.Dense(0)
    with pytest.raises(gd.InvalidArgumentError, match="unknown activation"):
        L.Dense(2, activation="swishy")
    with pytest.raises(gd.InvalidArgumentError, match="padding"):
        L.Conv2D(2, 3, padding="full")
    with pytest.raises(gd.InvalidArgumentError, match="rate"):
        L.Dropout(1.5)
    with pytest.raises(gd.InvalidArgumentError, match="NHWC"):
        L.Conv2D(2, 3)(np.ones((2, 5, 5), np.float32))


def test_model_in_a_custom_training_loop_as_in_the_seeds() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([L.Dense(1, input_shape=(1,))])
        optimizer = keras.optimizers.SGD()
    loss_object = keras.losses.BinaryCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)
    global_batch_size = 10

    def train_step(inputs):
        features, labels = inputs
        with gd.GradientTape() as tape:
            predictions = model(features, training=True)
            loss = gd.nn.compute_average_loss(loss_object(labels, predictions), global_batch_size=global_batch_size)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @gd.function
    def distributed_train_step(dist_inputs):
        per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
        return strategy.reduce(gd.ReduceOp.SUM, per_replica_losses, axis=None)

    dataset = gd.data.Dataset.from_tensors((np.ones(1, np.float32), np.ones(1, np.float32))).repeat(100).batch(
        global_batch_size)
    losses = [float(distributed_train_step(x)) for x in strategy.experimental_distribute_dataset(dataset)]
    assert len(losses) == 10 and all(b < a for a, b in zip(losses, losses[1:]))


def test_summary_and_metric_objects() -> None:
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([L.Dense(4, input_shape=(3,)), L.Dense(2)])
    text = model.summary(print_fn=None)
    assert "Total params: 26" in text and "Output shape: (None, 2)" in text
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state([1, 0, 2], [[0.1, 0.9, 0], [0.8, 0.1, 0.1], [0.3, 0.4, 0.3]])
    assert accuracy.result() == pytest.approx(2 / 3)
    mean = keras.metrics.Mean()
    mean.update_state([1.0, 2.0, 6.0])
    assert mean.result() == pytest.approx(3.0)
    mse = keras.losses.MeanSquaredError()
    assert float(mse(np.array([[1.0], [3.0]]), np.array([[2.0], [3.0]]))) == pytest.approx(0.5)


def test_progress_bar_on_a_terminal_and_lines_elsewhere(capsys) -> None:
    from rich.console import Console

    from graphdist.keras.progress import Progress

    buffer = io.StringIO()
    bar = Progress(1, console=Console(file=buffer, force_terminal=True, width=150))
    assert bar.mode == "bar"
    bar.begin("1/2", 3)
    with bar.compiling("the train step"):
        pass
    for step in range(1, 4):
        bar.update(step, step * 10, {"loss": 1.0 / step})
    bar.end(3, 30, {"loss": 0.3333, "accuracy": 0.5})
    bar.close()
    shown = buffer.getvalue()
    assert "Epoch 1/2" in shown and "3/3" in shown and "loss: 0.3333" in shown and "samples/s" in shown
    assert Progress("auto", console=Console(file=io.StringIO())).mode == "line"   # not a terminal
    assert Progress(0).mode == "off"
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([L.Dense(1, input_shape=(1,))])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((8, 1)), np.ones((8, 1)), epochs=1, verbose=0)
    assert capsys.readouterr().out == ""


def test_frozen_layers_keep_their_weights() -> None:
    with gd.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        model = keras.Sequential([L.Dense(4, input_shape=(3,)), L.Dense(1)])
    model.layers[0].trainable = False
    model.compile(optimizer="sgd", loss="mse")   # compile after changing trainable, as in Keras
    assert len(model.trainable_variables) == 2 and len(model.non_trainable_variables) == 2
    frozen = model.layers[0].kernel.numpy()
    head = model.layers[1].kernel.numpy()
    model.fit(np.ones((8, 3)), np.zeros((8, 1)), epochs=1, verbose=0)
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), frozen)
    assert not np.array_equal(model.layers[1].kernel.numpy(), head)


def test_functional_model_with_a_skip_connection_trains_alike_under_mirrored() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 6)).astype(np.float32)
    y = (x[:, :2].sum(axis=1) > 0).astype(np.int64)
    weights = []
    for strategy in (gd.OneDeviceStrategy("cpu:0"), gd.MirroredStrategy(["cpu:0", "cpu:1"])):
        keras.utils.set_random_seed(2)
        with strategy.scope():
            inputs = keras.Input(shape=(6,))
            hidden = L.Dense(8, activation="relu")(inputs)
            skip = L.Dense(8)(inputs)
            merged = L.Concatenate()([L.Add()([hidden, skip]), inputs])
            model = keras.Model(inputs=inputs, outputs=L.Dense(2)(merged))
        assert isinstance(model, keras.Model) and len(model.layers) == 5 and len(model.trainable_variables) == 6
        model.compile(optimizer="adam", metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        weights.append(model.get_weights())
        np.testing.assert_allclose(model.predict(x), np.asarray(model(x)), rtol=1e-5, atol=1e-6)
    for got, want in zip(*weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    with pytest.raises(gd.InvalidArgumentError, match="not in inputs"):
        keras.Model(inputs=keras.Input((3,)), outputs=L.Dense(1)(keras.Input((3,))))
