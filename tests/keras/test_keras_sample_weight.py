"""gd.keras sample weights: ``sample_weight``, ``class_weight``, ``(x, y, w)`` datasets, ``weighted_metrics``.

The oracles are written here in numpy from Keras' definitions: a batch's loss
is ``sum(w_i * loss_i) / batch size`` (``SUM_OVER_BATCH_SIZE``: the number of
examples, not the sum of the weights), the epoch's ``loss`` log is
``sum(w_i * loss_i) / examples``, a weighted metric is
``sum(w_i * value_i) / sum(w_i)`` and plain metrics ignore the weights.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits

keras = gd.keras


def _strategy(name: str) -> gd.Strategy:
    if name == "one":
        return gd.OneDeviceStrategy("cpu:0")
    if name == "mirrored":
        return gd.MirroredStrategy(["cpu:0", "cpu:1"])
    return gd.CentralStorageStrategy(["cpu:0", "cpu:1"])


def _linear_model(strategy: gd.Strategy, inputs: int, lr: float, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(inputs,))])
        model.compile(optimizer=gd.optimizers.SGD(lr), loss="mse", metrics=["mae"], weighted_metrics=["mae"])
    return model


def _classifier(strategy: gd.Strategy, seed: int = 0, lr: float = 0.01, **compile_args) -> keras.Model:
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.Adam(lr), metrics=["accuracy"], weighted_metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **compile_args)
    return model


def _regression_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3 + 0.1 * rng.standard_normal((samples, 1))).astype(np.float32)
    w = rng.uniform(0.0, 3.0, samples).astype(np.float32)
    return x, y, w


def _assert_weights_close(got: list[np.ndarray], want: list[np.ndarray], what: str, rtol: float = 1e-5,
                          atol: float = 1e-6) -> None:
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{what}: weight {index}")


# ------------------------------------------------------------------ numpy oracles
def _weighted_linear_reference(x: np.ndarray, y: np.ndarray, sw: np.ndarray, w: np.ndarray, b: np.ndarray,
                               lr: float, batch: int, epochs: int) -> dict[str, object]:
    """SGD on Dense(1) + MSE with per-example weights, in float64, batches in order."""
    w, b = w.astype(np.float64), b.astype(np.float64)
    logs: dict[str, list[float]] = {"loss": [], "mae": [], "weighted_mae": []}
    for _ in range(epochs):
        weighted_sq = abs_sum = weighted_abs = weight_sum = 0.0
        for start in range(0, len(x), batch):
            xb = x[start:start + batch].astype(np.float64)
            yb = y[start:start + batch].astype(np.float64)
            sb = sw[start:start + batch].astype(np.float64)[:, None]
            err = xb @ w + b - yb                                   # (n, 1); loss_i = err_i ** 2
            weighted_sq += float((sb * err ** 2).sum())
            abs_sum += float(np.abs(err).sum())
            weighted_abs += float((sb * np.abs(err)).sum())
            weight_sum += float(sb.sum())
            # d/dw of sum(s_i * err_i ** 2) / n, n = the batch's examples (not the weights' sum)
            w = w - lr * 2 * xb.T @ (sb * err) / len(xb)
            b = b - lr * 2 * (sb * err).sum(axis=0) / len(xb)
        logs["loss"].append(weighted_sq / len(x))
        logs["mae"].append(abs_sum / len(x))
        logs["weighted_mae"].append(weighted_abs / weight_sum)
    return {"logs": logs, "w": w, "b": b}


@pytest.mark.parametrize("name", ["one", "mirrored", "central"])
def test_weighted_fit_equals_numpy_sgd_with_partial_last_batch(name: str) -> None:
    x, y, sw = _regression_data(53)   # 5 batches of 10 + a partial batch of 3 (split 2 + 1 on 2 replicas)
    model = _linear_model(_strategy(name), 3, 0.05)
    w0, b0 = (v.numpy() for v in model.trainable_variables)
    history = model.fit(x, y, sample_weight=sw, batch_size=10, epochs=3, shuffle=False, verbose=0)
    expected = _weighted_linear_reference(x, y, sw, w0, b0, 0.05, 10, 3)
    for key in ("loss", "mae", "weighted_mae"):
        np.testing.assert_allclose(history.history[key], expected["logs"][key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), expected["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.trainable_variables[1].numpy(), expected["b"], rtol=1e-5, atol=1e-6)


def test_weighted_cross_entropy_step_equals_numpy_gradient_negative_weight_included() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    labels = np.array([0, 2, 1, 1, 0, 2])
    sw = np.array([1.0, 0.5, 2.0, 0.0, -0.5, 4.0], np.float32)  # negatives allowed, as in Keras; sum 7 != 6 examples
    keras.utils.set_random_seed(2)
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(3, input_shape=(4,))])
        model.compile(optimizer=gd.optimizers.SGD(0.3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kernel, bias = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    history = model.fit(x, labels, sample_weight=sw, batch_size=6, epochs=1, shuffle=False, verbose=0)

    logits = x.astype(np.float64) @ kernel + bias
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    one_hot = np.eye(3)[labels]
    per_example = -np.log((probabilities * one_hot).sum(axis=1))
    assert history.history["loss"][0] == pytest.approx((sw * per_example).sum() / 6, rel=1e-5)
    d_logits = (probabilities - one_hot) * sw[:, None] / 6          # d(sum(w * ce) / 6) / d logits
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), kernel - 0.3 * x.T @ d_logits,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.trainable_variables[1].numpy(), bias - 0.3 * d_logits.sum(axis=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["one", "mirrored"])
def test_weighted_evaluate_and_validation_equal_numpy(name: str) -> None:
    data = digits()
    x, y = data.x_test, data.y_test                          # 360 = 5 x 64 + 40: a partial last batch
    sw = np.random.default_rng(3).uniform(0.0, 2.0, len(x)).astype(np.float32)
    model = _classifier(_strategy(name), seed=3)
    results = model.evaluate(x, y, sample_weight=sw, batch_size=64, verbose=0, return_dict=True)
    kernel, bias, out_kernel, out_bias = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    logits = np.maximum(x @ kernel + bias, 0) @ out_kernel + out_bias
    shifted = logits - logits.max(axis=1, keepdims=True)
    per_example = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(x)), y]
    correct = np.argmax(logits, axis=1) == y
    assert results.keys() == {"loss", "accuracy", "weighted_accuracy"}
    assert results["loss"] == pytest.approx((sw * per_example).sum() / len(x), rel=1e-5)
    assert results["accuracy"] == pytest.approx(correct.mean(), abs=1e-12)
    assert results["weighted_accuracy"] == pytest.approx((sw * correct).sum() / sw.sum(), rel=1e-6)
    assert model.evaluate(x, y, batch_size=64, verbose=0)[0] == pytest.approx(per_example.mean(), rel=1e-5)

    history = model.fit(data.x_train[:100], data.y_train[:100], batch_size=32, epochs=1, verbose=0,
                        validation_data=(x, y, sw))
    after = model.evaluate(x, y, sample_weight=sw, batch_size=32, verbose=0, return_dict=True)
    for key in ("loss", "accuracy", "weighted_accuracy"):
        assert history.history[f"val_{key}"][0] == pytest.approx(after[key], rel=1e-6), key


def test_eager_loss_and_metric_sample_weight() -> None:
    y_true = np.array([[1.0], [2.0], [0.0], [4.0]])
    y_pred = np.array([[1.5], [1.0], [0.0], [1.0]])
    sw = np.array([2.0, 1.0, 5.0, 0.0])
    squared = np.array([0.25, 1.0, 0.0, 9.0])
    assert keras.losses.MeanSquaredError()(y_true, y_pred, sample_weight=sw) == pytest.approx((sw * squared).sum() / 4)
    none = keras.losses.MeanSquaredError(reduction=keras.losses.Reduction.NONE)
    np.testing.assert_allclose(none(y_true, y_pred, sample_weight=sw), sw * squared)
    metric = keras.metrics.MeanSquaredError()
    metric.update_state(y_true, y_pred, sample_weight=sw)
    assert metric.result() == pytest.approx((sw * squared).sum() / sw.sum())
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state(np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]]),
                          sample_weight=np.array([1.0, 3.0, 1.0]))
    assert accuracy.result() == pytest.approx(2.0 / 5.0)
    mean = keras.metrics.Mean()
    mean.update_state(np.array([1.0, 3.0]), sample_weight=np.array([3.0, 1.0]))
    assert mean.result() == pytest.approx(6.0 / 4.0)


# ------------------------------------------------------------- equivalences
def test_all_ones_weights_equal_no_weights_under_mirrored() -> None:
    x, y, _ = _regression_data(37)
    results = []
    for weights in (None, np.ones(len(x), np.float32)):
        model = _linear_model(_strategy("mirrored"), 3, 0.05)
        history = model.fit(x, y, sample_weight=weights, batch_size=8, epochs=2, shuffle=False, verbose=0)
        results.append((model.get_weights(), history.history))
    (plain_weights, plain_history), (ones_weights, ones_history) = results
    _assert_weights_close(ones_weights, plain_weights, "all-ones", rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ones_history["loss"], plain_history["loss"], rtol=1e-6)
    np.testing.assert_allclose(ones_history["weighted_mae"], plain_history["mae"], rtol=1e-6)


@pytest.mark.parametrize("name", ["one", "mirrored"])
def test_zero_weights_on_half_the_batch_equal_the_other_half_at_half_the_learning_rate(name: str) -> None:
    # Every global batch of 8 has 4 examples of weight 0, so its loss is sum(kept losses) / 8: the mean loss of
    # the 4 kept examples times 4/8. Plain SGD on the kept half alone (batches of 4) with half the learning rate
    # therefore takes the same steps; 36 rows end in a partial batch of 4 (2 kept, the same 1/2 ratio).
    x, y, _ = _regression_data(36, seed=4)
    keep = np.arange(len(x)) % 2 == 0
    sw = keep.astype(np.float32)
    weighted = _linear_model(_strategy(name), 3, 0.1)
    history = weighted.fit(x, y, sample_weight=sw, batch_size=8, epochs=3, shuffle=False, verbose=0)
    half = _linear_model(_strategy(name), 3, 0.05)
    half_history = half.fit(x[keep], y[keep], batch_size=4, epochs=3, shuffle=False, verbose=0)
    _assert_weights_close(weighted.get_weights(), half.get_weights(), "zero weights")
    # The loss log divides by all 36 examples, the kept-only run by its 18; weighted metrics by the weights' sum.
    np.testing.assert_allclose(history.history["loss"], np.array(half_history.history["loss"]) / 2, rtol=1e-5)
    np.testing.assert_allclose(history.history["weighted_mae"], half_history.history["mae"], rtol=1e-5)
    assert weighted.evaluate(x, y, sample_weight=sw, verbose=0)[0] == pytest.approx(
        half.evaluate(x[keep], y[keep], verbose=0)[0] / 2, rel=1e-5)


def test_dataset_of_weighted_batches_equals_arrays_with_sample_weight() -> None:
    x, y, sw = _regression_data(30)
    dataset = gd.data.Dataset.from_tensor_slices((x, y, sw)).batch(7)   # 4 x 7 + 2
    by_dataset = _linear_model(_strategy("mirrored"), 3, 0.05)
    dataset_history = by_dataset.fit(dataset, epochs=2, verbose=0)
    by_arrays = _linear_model(_strategy("mirrored"), 3, 0.05)
    arrays_history = by_arrays.fit(x, y, sample_weight=sw, batch_size=7, epochs=2, shuffle=False, verbose=0)
    _assert_weights_close(by_dataset.get_weights(), by_arrays.get_weights(), "dataset")
    np.testing.assert_allclose(dataset_history.history["loss"], arrays_history.history["loss"], rtol=1e-6)
    assert by_dataset.evaluate(dataset, verbose=0) == pytest.approx(
        by_arrays.evaluate(x, y, sample_weight=sw, batch_size=7, verbose=0), rel=1e-6)


def test_class_weight_equals_the_equivalent_sample_weight() -> None:
    data = digits()
    x, y = data.x_train[:150], data.y_train[:150]
    class_weight = {0: 2.0, 3: 0.25, 7: 4.0, 9: 0.0}     # classes left out weigh 1
    table = np.array([2.0, 1, 1, 0.25, 1, 1, 1, 4.0, 1, 0.0], np.float32)
    sw = np.random.default_rng(5).uniform(0.5, 1.5, len(x)).astype(np.float32)
    runs = {"class_weight": {"class_weight": class_weight},
            "sample_weight": {"sample_weight": table[y]},
            "both": {"class_weight": class_weight, "sample_weight": sw},
            "product": {"sample_weight": table[y] * sw}}
    results = {}
    for key, weighting in runs.items():
        model = _classifier(_strategy("one"), seed=5)
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, **weighting)
        results[key] = (model.get_weights(), history.history)
    for got, want in (("class_weight", "sample_weight"), ("both", "product")):
        _assert_weights_close(results[got][0], results[want][0], got)
        for log in ("loss", "weighted_accuracy"):
            np.testing.assert_allclose(results[got][1][log], results[want][1][log], rtol=1e-6, err_msg=log)


def test_class_weight_with_one_hot_binary_and_dataset_targets() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((20, 4)).astype(np.float32)
    labels = rng.integers(0, 3, 20)
    one_hot = np.eye(3, dtype=np.float32)[labels]
    table = np.array([0.5, 2.0, 1.5], np.float32)

    def fit(strategy: str, targets: np.ndarray, units: int, loss: object, **kwargs) -> list[np.ndarray]:
        keras.utils.set_random_seed(6)
        with _strategy(strategy).scope():
            model = keras.Sequential([keras.layers.Dense(units, input_shape=(4,))])
            model.compile(optimizer=gd.optimizers.SGD(0.1), loss=loss)
        model.fit(x, targets, batch_size=6, epochs=2, shuffle=False, verbose=0, **kwargs)
        return model.get_weights()

    # One-hot rows are read as their arg-max class, as Keras does.
    _assert_weights_close(fit("one", one_hot, 3, "mse", class_weight={0: 0.5, 1: 2.0, 2: 1.5}),
                          fit("one", one_hot, 3, "mse", sample_weight=table[labels]), "one-hot")
    binary = (labels == 1).astype(np.float32)
    _assert_weights_close(
        fit("mirrored", binary, 1, keras.losses.BinaryCrossentropy(from_logits=True), class_weight={1: 3.0}),
        fit("mirrored", binary, 1, keras.losses.BinaryCrossentropy(from_logits=True),
            sample_weight=np.where(binary == 1, 3.0, 1.0)), "binary")

    keras.utils.set_random_seed(6)
    with _strategy("mirrored").scope():
        model = keras.Sequential([keras.layers.Dense(3, input_shape=(4,))])
        model.compile(optimizer=gd.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(gd.data.Dataset.from_tensor_slices((x, labels)).batch(6), epochs=2, verbose=0,
              class_weight={0: 0.5, 1: 2.0, 2: 1.5})
    expected = fit("mirrored", labels, 3, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   sample_weight=table[labels])
    _assert_weights_close(model.get_weights(), expected, "dataset")


@pytest.mark.parametrize("name", ["mirrored", "central"])
def test_weighted_fit_under_mirrored_and_central_storage_equals_one_device(name: str) -> None:
    data = digits()
    x, y = data.x_train[:300], data.y_train[:300]   # 300 = 4 x 64 + 44: a partial last batch
    sw = np.random.default_rng(7).uniform(0.0, 2.0, len(x)).astype(np.float32)
    val_sw = np.random.default_rng(8).uniform(0.0, 2.0, len(data.x_test)).astype(np.float32)
    results = {}
    for key in ("one", name):
        model = _classifier(_strategy(key), seed=7)
        history = model.fit(x, y, sample_weight=sw, class_weight={1: 2.0, 8: 0.5}, batch_size=64, epochs=3,
                            validation_data=(data.x_test, data.y_test, val_sw), verbose=0)
        results[key] = (model.get_weights(), history.history)
    _assert_weights_close(results[name][0], results["one"][0], name, rtol=1e-4, atol=1e-5)
    history, reference = results[name][1], results["one"][1]
    assert history.keys() == {"loss", "accuracy", "weighted_accuracy", "val_loss", "val_accuracy",
                              "val_weighted_accuracy"}
    for key in history:
        np.testing.assert_allclose(history[key], reference[key], rtol=1e-4, atol=1e-6, err_msg=key)
    assert reference["loss"][-1] < reference["loss"][0]


def test_weighted_metrics_survive_save_and_load(tmp_path) -> None:
    model = _classifier(_strategy("one"))
    model.fit(digits().x_train[:64], digits().y_train[:64], batch_size=32, verbose=0)
    model.save(tmp_path / "model")
    with gd.OneDeviceStrategy("cpu:0").scope():
        reloaded = keras.load_model(tmp_path / "model")
    assert reloaded.metrics_names == ["loss", "accuracy", "weighted_accuracy"]
    data = digits()
    sw = np.linspace(0.0, 1.0, 50, dtype=np.float32)
    np.testing.assert_allclose(reloaded.evaluate(data.x_test[:50], data.y_test[:50], sample_weight=sw, verbose=0),
                               model.evaluate(data.x_test[:50], data.y_test[:50], sample_weight=sw, verbose=0),
                               rtol=1e-6)


# -------------------------------------------------------------------- errors
def _small_classifier() -> keras.Model:
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(3, input_shape=(4,))])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


_X, _Y = np.zeros((10, 4), np.float32), np.arange(10) % 3


@pytest.mark.parametrize("weights, match", [
    (np.ones(9), r"has 9 weights but there are 10 examples"),
    (np.ones((10, 2)), r"shape \(10,\) or \(10, 1\), got shape \(10, 2\)"),
    (np.ones((2, 5)), r"got shape \(2, 5\)"),
    (np.ones(()), r"got shape \(\)"),
    (np.where(np.arange(10) == 4, np.nan, 1.0), r"must be finite, got nan at example 4"),
    (np.where(np.arange(10) == 2, -np.inf, 1.0), r"must be finite, got -inf at example 2"),
    (np.array(["a"] * 10), r"weights must be numbers"),
])
def test_bad_sample_weight(weights, match) -> None:
    model = _small_classifier()
    with pytest.raises(gd.InvalidArgumentError, match=r"fit: sample_weight: .*" + match):
        model.fit(_X, _Y, sample_weight=weights, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match=r"evaluate: sample_weight: .*" + match):
        model.evaluate(_X, _Y, sample_weight=weights, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match=r"fit: validation_data: sample_weight: .*" + match):
        model.fit(_X, _Y, validation_data=(_X, _Y, weights), verbose=0)


def test_column_weights_and_negative_weights_are_accepted() -> None:
    model = _small_classifier()
    column = model.evaluate(_X, _Y, sample_weight=np.full((10, 1), 2.0), verbose=0)
    assert column == pytest.approx(2 * model.evaluate(_X, _Y, verbose=0), rel=1e-6)
    assert model.evaluate(_X, _Y, sample_weight=-np.ones(10), verbose=0) == pytest.approx(-column / 2, rel=1e-6)


@pytest.mark.parametrize("class_weight, match", [
    ({0: 1.0, 5: 2.0}, r"class_weight has class ids \[5\] but the model outputs 3 classes"),
    ({-1: 1.0}, r"class ids must be >= 0, got -1"),
    ({"cat": 1.0}, r"keys must be integer class ids, got 'cat'"),
    ({1.5: 1.0}, r"keys must be integer class ids"),
    ({0: float("nan")}, r"the weight of class 0 must be finite"),
    ({0: "heavy"}, r"the weight of class 0 must be a number"),
    ([1.0, 2.0], r"class_weight must be a dict"),
    ({}, r"class_weight is an empty dict"),
])
def test_bad_class_weight(class_weight, match) -> None:
    with pytest.raises(gd.InvalidArgumentError, match=match):
        _small_classifier().fit(_X, _Y, class_weight=class_weight, verbose=0)


def test_class_weight_needs_class_labels() -> None:
    with gd.OneDeviceStrategy("cpu:0").scope():
        regression = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
        regression.compile(optimizer="sgd", loss="mse")
    with pytest.raises(gd.InvalidArgumentError, match="class_weight needs integer class labels, got fractional"):
        regression.fit(_X, np.linspace(0, 1, 10), class_weight={0: 1.0}, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="class_weight needs class ids >= 0"):
        regression.fit(_X, -np.ones(10), class_weight={0: 1.0}, verbose=0)
    with gd.OneDeviceStrategy("cpu:0").scope():
        images = keras.Sequential([keras.layers.Dense(2, input_shape=(4,))])
        images.compile(optimizer="sgd", loss="mse")
    with pytest.raises(gd.InvalidArgumentError, match=r"class_weight needs class labels of shape"):
        images.fit(_X, np.zeros((10, 2, 2)), class_weight={0: 1.0}, verbose=0)


def test_sample_weight_with_a_dataset_and_bad_weighted_batches() -> None:
    model = _small_classifier()
    dataset = gd.data.Dataset.from_tensor_slices((_X, _Y)).batch(5)
    with pytest.raises(gd.InvalidArgumentError, match="sample_weight must not be given when x is a dataset"):
        model.fit(dataset, sample_weight=np.ones(10), verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="evaluate: sample_weight must not be given"):
        model.evaluate(dataset, sample_weight=np.ones(10), verbose=0)
    nan_later = gd.data.Dataset.from_tensor_slices((_X, _Y, np.where(np.arange(10) == 7, np.nan, 1.0))).batch(5)
    with pytest.raises(gd.InvalidArgumentError, match=r"fit: batch 1: sample_weight: .*finite, got nan at example 2"):
        model.fit(nan_later, verbose=0)
    short = gd.data.Dataset.from_tensors((_X, _Y, np.ones(9))).repeat(2)
    with pytest.raises(gd.InvalidArgumentError, match=r"batch 0: sample_weight: has 9 weights but there are 10"):
        model.evaluate(short, verbose=0)
    quadruples = gd.data.Dataset.from_tensors((_X, _Y, np.ones(10), np.ones(10)))
    with pytest.raises(gd.InvalidArgumentError, match=r"\(x, y, sample_weight\) triple"):
        model.fit(quadruples, verbose=0)


def test_bad_validation_tuple_and_metric_in_both_lists() -> None:
    model = _small_classifier()
    with pytest.raises(gd.InvalidArgumentError, match=r"\(x_val, y_val, val_sample_weight\).*tuple of 4"):
        model.fit(_X, _Y, validation_data=(_X, _Y, np.ones(10), np.ones(10)), verbose=0)
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    with pytest.raises(gd.InvalidArgumentError, match="same metric object is in both"):
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=[accuracy],
                      weighted_metrics=[accuracy])
    with pytest.raises(gd.InvalidArgumentError, match="weighted_metrics must be a list"):
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", weighted_metrics="accuracy")
