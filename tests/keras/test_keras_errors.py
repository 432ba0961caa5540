"""gd.keras: bad input gives clear graphdist errors, never a backend traceback."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd

keras = gd.keras


def _classifier(strategy: gd.Strategy | None = None) -> keras.Model:
    strategy = strategy or gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(3, input_shape=(4,))])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def test_fit_before_compile() -> None:
    with gd.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(1,))])
    with pytest.raises(keras.NotCompiledError, match="compile"):
        model.fit(np.ones((4, 1)), np.ones((4, 1)), verbose=0)
    with pytest.raises(gd.GraphdistError, match="compile"):
        model.evaluate(np.ones((4, 1)), np.ones((4, 1)), verbose=0)
    assert model.predict(np.ones((2, 1))).shape == (2, 1)  # predict needs no compile, as in Keras


def test_x_and_y_length_mismatch() -> None:
    model = _classifier()
    with pytest.raises(gd.InvalidArgumentError, match="x has 10 samples but y has 9"):
        model.fit(np.zeros((10, 4)), np.zeros(9, np.int64), verbose=0)
    bad = gd.data.Dataset.from_tensors((np.zeros((4, 4), np.float32), np.zeros(3, np.int64))).repeat(2)
    with pytest.raises(gd.InvalidArgumentError, match="different lengths"):
        model.fit(bad, verbose=0)


@pytest.mark.parametrize("labels, match", [
    (np.array([0, 1, 3, 2]), r"labels must be class indices in \[0, 3\).*from 0 to 3"),
    (np.array([0, -1, 1, 2]), r"from -1 to 2"),
    (np.array([0.5, 1, 1, 2]), "integer class labels"),
    (np.zeros((4, 3)), "one integer class label per example"),
])
def test_labels_out_of_range_for_the_loss(labels, match) -> None:
    model = _classifier(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    with pytest.raises(gd.InvalidArgumentError, match=match):
        model.fit(np.zeros((4, 4)), labels, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match=match):
        model.evaluate(np.zeros((4, 4)), labels, verbose=0)


def test_label_out_of_range_in_a_later_batch_of_a_dataset_names_the_batch() -> None:
    model = _classifier()
    labels = np.array([0, 1, 2, 0, 1, 5], np.int64)
    dataset = gd.data.Dataset.from_tensor_slices((np.zeros((6, 4), np.float32), labels)).batch(2)
    with pytest.raises(gd.InvalidArgumentError, match="batch 2"):
        model.fit(dataset, verbose=0)


def test_regression_targets_of_the_wrong_shape() -> None:
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(gd.InvalidArgumentError, match=r"each target has shape \(3,\) and each output \(2,\)"):
        model.fit(np.zeros((5, 3)), np.zeros((5, 3)), verbose=0)


def test_model_built_outside_the_scope_then_fit_inside_another_strategy() -> None:
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(1,))])   # no scope: default strategy
    model.compile(optimizer="sgd", loss="mse")
    with gd.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        with pytest.raises(gd.InvalidArgumentError, match="created under no strategy.*inside the scope of Mirrored"):
            model.fit(np.ones((4, 1)), np.ones((4, 1)), verbose=0)
    other = _classifier(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    with gd.CentralStorageStrategy(["cpu:0", "cpu:1"]).scope():
        with pytest.raises(gd.InvalidArgumentError, match="with strategy.scope"):
            other.fit(np.zeros((4, 4)), np.zeros(4, np.int64), verbose=0)
    history = model.fit(np.ones((4, 1)), np.ones((4, 1)), verbose=0)   # outside any scope: its own strategy
    assert len(history.history["loss"]) == 1


def test_layer_weights_from_another_strategy() -> None:
    mirrored = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with mirrored.scope():
        dense = keras.layers.Dense(1, input_shape=(1,))
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([dense])
        with pytest.raises(gd.InvalidArgumentError, match=r"variable dense.*/kernel:0 was created under Mirrored"):
            model.compile(optimizer="sgd", loss="mse")


def test_compile_arguments() -> None:
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(1,))])
    with pytest.raises(gd.InvalidArgumentError, match="unknown loss 'hinge'"):
        model.compile(optimizer="sgd", loss="hinge")
    with pytest.raises(gd.InvalidArgumentError, match="optimizer must be"):
        model.compile(optimizer="lion", loss="mse")
    with pytest.raises(gd.InvalidArgumentError, match="unknown metric"):
        model.compile(optimizer="sgd", loss="mse", metrics=["auc"])
    with pytest.raises(gd.InvalidArgumentError, match="loss is required"):
        model.compile(optimizer="sgd")


def test_dataset_with_y_or_batch_size_and_infinite_without_steps() -> None:
    model = _classifier()
    dataset = gd.data.Dataset.from_tensors((np.zeros((2, 4), np.float32), np.zeros(2, np.int64)))
    with pytest.raises(gd.InvalidArgumentError, match="y must not be given"):
        model.fit(dataset, np.zeros(2), verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="batch_size must not be given"):
        model.fit(dataset, batch_size=2, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="steps_per_epoch"):
        model.fit(dataset.repeat(), verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="not an .x, y. pair"):
        model.fit(dataset.map(lambda x, y: x), verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="batch_size must be a positive int"):
        model.fit(np.zeros((2, 4)), np.zeros(2, np.int64), batch_size=0, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="verbose"):
        model.fit(np.zeros((2, 4)), np.zeros(2, np.int64), verbose=3)


def test_wrong_input_width_is_a_clear_error() -> None:
    model = _classifier()
    with pytest.raises(gd.InvalidArgumentError, match=r"last axis has 4 values.*got shape \(1, 5\)"):
        model.fit(np.zeros((4, 5)), np.zeros(4, np.int64), verbose=0)
