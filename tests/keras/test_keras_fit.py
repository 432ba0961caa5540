"""gd.keras fit/evaluate/predict: the seeds' snippets, Mirrored/CentralStorage == OneDevice, numpy oracles."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits

keras = gd.keras


def _strategies() -> dict[str, gd.Strategy]:
    return {"one": gd.OneDeviceStrategy("cpu:0"), "mirrored": gd.MirroredStrategy(["cpu:0", "cpu:1"]),
            "central": gd.CentralStorageStrategy(["cpu:0", "cpu:1"])}


# ------------------------------------------------------------------------- the seeds
def test_seed_snippet_dataset_and_numpy_under_mirrored(capsys) -> None:
    mirrored_strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with mirrored_strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(1,))])
    model.compile(loss="mse", optimizer="sgd")
    assert isinstance(model.variables[0], gd.MirroredVariable)
    dataset = gd.data.Dataset.from_tensors(([1.], [1.])).repeat(100).batch(10)
    history = model.fit(dataset, epochs=2)
    assert isinstance(history, keras.History) and history is model.history
    losses = history.history["loss"]
    assert len(losses) == 2 and losses[1] < losses[0]
    evaluated = model.evaluate(dataset)
    assert isinstance(evaluated, float) and evaluated < losses[1]

    inputs, targets = np.ones((100, 1)), np.ones((100, 1))
    history = model.fit(inputs, targets, epochs=2, batch_size=10)
    assert history.history["loss"][1] < history.history["loss"][0] < evaluated
    out = capsys.readouterr().out
    assert "Epoch 1/2 - 10 steps" in out and "samples/s" in out and "loss:" in out


def test_fit_splits_each_global_batch_across_replicas() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(1,))])
    model.compile(loss="mse", optimizer="sgd")
    model.fit(np.ones((30, 1)), np.ones((30, 1)), batch_size=10, epochs=1, verbose=0)
    plan = model.train_plan()
    assert {segment.device for segment in plan.segments} == {"cpu:0", "cpu:1"}
    rewritten = model._engine.train_concrete_function().graph("rewritten")
    # each gradient combined across the replicas: summed on the replica that updates the variable
    sums = [node for node in rewritten.nodes if node.op_type == "Sum"]
    assert len(sums) >= 2 and all(len(node.inputs) == 2 for node in sums)


# ---------------------------------------------------------------- numpy oracles
def _linear_reference(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: np.ndarray, lr: float, batch: int,
                      epochs: int) -> tuple[list[float], list[float], np.ndarray, np.ndarray]:
    """SGD on a Dense(1) with MSE in float64: (epoch losses, epoch MAEs, w, b)."""
    w, b = w.astype(np.float64), b.astype(np.float64)
    losses, maes = [], []
    for _ in range(epochs):
        total = abs_total = 0.0
        for start in range(0, len(x), batch):
            xb, yb = x[start:start + batch].astype(np.float64), y[start:start + batch].astype(np.float64)
            err = xb @ w + b - yb
            total += float((err ** 2).sum())
            abs_total += float(np.abs(err).sum())
            w = w - lr * 2 * xb.T @ err / len(xb)
            b = b - lr * 2 * err.sum(axis=0) / len(xb)
        losses.append(total / len(x))
        maes.append(abs_total / len(x))
    return losses, maes, w, b


@pytest.mark.parametrize("name", ["one", "mirrored", "central"])
def test_fit_metrics_and_weights_equal_numpy_with_partial_last_batch(name: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((53, 3)).astype(np.float32)   # 53 = 5 batches of 10 + a partial batch of 3
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3).astype(np.float32)
    strategy = _strategies()[name]
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
        model.compile(optimizer=gd.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    w0, b0 = (v.numpy() for v in model.trainable_variables)
    history = model.fit(x, y, batch_size=10, epochs=3, shuffle=False, verbose=0)
    losses, maes, w, b = _linear_reference(x, y, w0, b0, 0.05, 10, 3)
    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-5)
    np.testing.assert_allclose(history.history["mae"], maes, rtol=1e-5)
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.trainable_variables[1].numpy(), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["one", "mirrored"])
def test_evaluate_equals_numpy_over_all_examples(name: str) -> None:
    data = digits()
    strategy = _strategies()[name]
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(10, input_shape=(64,))])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    loss, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=64, verbose=0)  # 360 = 5 x 64 + 40
    w, b = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    logits = data.x_test @ w + b
    shifted = logits - logits.max(axis=1, keepdims=True)
    per_example = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(logits)), data.y_test]
    assert loss == pytest.approx(per_example.mean(), rel=1e-5)
    assert accuracy == pytest.approx(np.mean(np.argmax(logits, axis=1) == data.y_test), abs=1e-12)
    assert model.evaluate(data.x_test, data.y_test, verbose=0, return_dict=True)["accuracy"] == pytest.approx(accuracy)


# ------------------------------------------------------- strategies train alike
def _digits_model(strategy: gd.Strategy, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(32, activation="relu", input_shape=(64,)),
                                  keras.layers.LayerNormalization(),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def test_mirrored_and_central_storage_fit_equal_one_device() -> None:
    data = digits()
    x, y = data.x_train[:300], data.y_train[:300]   # 300 = 4 x 64 + 44: a partial last batch
    results = {}
    for name, strategy in _strategies().items():
        model = _digits_model(strategy)
        history = model.fit(x, y, batch_size=64, epochs=3, validation_data=(data.x_test, data.y_test), verbose=0)
        results[name] = (model.get_weights(), history.history, model.predict(data.x_test, batch_size=50))
    reference_weights, reference_history, reference_predictions = results["one"]
    for name in ("mirrored", "central"):
        weights, history, predictions = results[name]
        for got, want in zip(weights, reference_weights):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
        assert history.keys() == {"loss", "accuracy", "val_loss", "val_accuracy"}
        for key in history:
            np.testing.assert_allclose(history[key], reference_history[key], rtol=1e-4, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(predictions, reference_predictions, rtol=1e-4, atol=1e-5)
    assert reference_history["val_accuracy"][-1] > 0.7 > reference_history["val_accuracy"][0] - 0.2


def test_synchronized_batch_norm_under_mirrored_equals_one_device() -> None:
    data = digits(images=True)
    x, y = data.x_train[:96], data.y_train[:96]
    results = []
    for strategy in (gd.OneDeviceStrategy("cpu:0"), gd.MirroredStrategy(["cpu:0", "cpu:1"])):
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = keras.Sequential([
                keras.layers.Conv2D(4, 3, padding="same", input_shape=(8, 8, 1)),
                keras.layers.BatchNormalization(synchronized=True),
                keras.layers.ReLU(),
                keras.layers.MaxPool2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(10)])
            model.compile(optimizer=gd.optimizers.SGD(0.1), metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        results.append((model.get_weights(), history.history["loss"]))
    (one_weights, one_loss), (mirrored_weights, mirrored_loss) = results
    np.testing.assert_allclose(mirrored_loss, one_loss, rtol=1e-4)
    assert len(one_weights) == 8  # conv kernel+bias, gamma, beta, dense kernel+bias, moving mean+variance
    for got, want in zip(mirrored_weights, one_weights):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


def test_unsynchronized_batch_norm_keeps_mirrored_copies_equal_and_trains() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32) * 3 + 1
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(4, input_shape=(4,)), keras.layers.BatchNormalization(),
                                  keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0)
    moving_mean = model.layers[1].moving_mean
    assert isinstance(moving_mean, gd.MirroredVariable)
    assert np.all(np.isfinite(moving_mean.numpy())) and np.any(moving_mean.numpy() != 0)


# ------------------------------------------------------------------ predict
@pytest.mark.parametrize("name", ["one", "mirrored"])
def test_predict_returns_every_example_in_input_order(name: str) -> None:
    strategy = _strategies()[name]
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(3, activation="tanh", input_shape=(2,)), keras.layers.Dense(2)])
    x = np.random.default_rng(0).standard_normal((11, 2)).astype(np.float32)
    out = model.predict(x, batch_size=4)   # 4 + 4 + 3; the last batch's second replica gets 1 row
    assert out.shape == (11, 2)
    np.testing.assert_allclose(out, np.asarray(model(x)), rtol=1e-5, atol=1e-6)
    one = model.predict(x[:1], batch_size=4)   # a batch of one: the second replica gets nothing
    # Another batch size is another compiled program: its matmul kernel may round outputs near zero differently.
    np.testing.assert_allclose(one, out[:1], rtol=1e-6, atol=1e-6)


def test_dataset_input_of_unknown_length_and_steps_per_epoch() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(1,))])
    model.compile(loss="mse", optimizer="sgd")
    infinite = gd.data.Dataset.from_tensors((np.ones(1), np.ones(1))).repeat().batch(8)
    history = model.fit(infinite, epochs=3, steps_per_epoch=4, verbose=0)
    assert len(history.history["loss"]) == 3
    filtered = gd.data.Dataset.range(40).map(lambda i: (np.full(1, 1.0), np.full(1, 1.0))).filter(
        lambda x, y: True).batch(8)
    assert model.evaluate(filtered, verbose=0) < history.history["loss"][0]


def _line_model(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(2,))])
    model.compile(loss="mse", optimizer=gd.optimizers.SGD(0.01))
    return model


def test_steps_per_epoch_starts_at_the_first_batch_and_carries_on_across_epochs() -> None:
    """Building the model looks at the first batch without taking it: a repeated dataset with one
    step per epoch trains on batches 0, 1, 2, 3 in order, like the arrays in one unshuffled epoch.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 2)).astype(np.float32)
    y = (x @ np.array([[2.0], [-1.0]], np.float32) + 0.5).astype(np.float32)
    expected = _line_model()
    expected.fit(x, y, batch_size=2, shuffle=False, epochs=1, verbose=0)
    stepped = _line_model()
    stepped.fit(gd.data.Dataset.from_tensor_slices((x, y)).batch(2).repeat(), steps_per_epoch=1, epochs=4,
                verbose=0)
    for got, want in zip(stepped.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_evaluate_with_steps_reads_the_first_batches() -> None:
    model = _line_model()
    x = np.array([[1, 0], [0, 1], [5, 5], [6, 6]], np.float32)
    y = np.zeros((4, 1), np.float32)
    first_batch = float(np.mean(model.predict(x[:2], verbose=0) ** 2))
    repeated = gd.data.Dataset.from_tensor_slices((x, y)).batch(2).repeat()
    np.testing.assert_allclose(model.evaluate(repeated, steps=1, verbose=0), first_batch, rtol=1e-6)


@pytest.mark.parametrize("name", ["mirrored", "central"])
def test_global_batches_smaller_than_the_replica_count_leave_a_replica_empty(name: str) -> None:
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    weights = {}
    for key in ("one", name):
        keras.utils.set_random_seed(0)
        with _strategies()[key].scope():
            model = keras.Sequential([keras.layers.Dense(2, activation="tanh", input_shape=(3,)),
                                      keras.layers.Dense(1)])
            model.compile(optimizer=gd.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
        model.fit(x, y, batch_size=1, epochs=2, shuffle=False, verbose=0)   # every step: one row, one idle replica
        weights[key] = model.get_weights()
    for got, want in zip(weights[name], weights["one"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fit_under_tpu_strategy_equals_one_device() -> None:
    if not hasattr(gd, "TPUStrategy"):
        pytest.skip("TPUStrategy is not part of this build yet")
    strategy = gd.TPUStrategy(gd.cluster_resolver.TPUClusterResolver(tpu="local[2]"))
    x = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    results = []
    for current in (gd.OneDeviceStrategy("cpu:0"), strategy):
        keras.utils.set_random_seed(0)
        with current.scope():
            model = keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                                      keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        results.append((model.get_weights(), history.history["loss"], model.predict(x)))
    (one_weights, one_loss, one_out), (tpu_weights, tpu_loss, tpu_out) = results
    np.testing.assert_allclose(tpu_loss, one_loss, rtol=1e-5)
    for got, want in zip(tpu_weights, one_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tpu_out, one_out, rtol=1e-5, atol=1e-6)
