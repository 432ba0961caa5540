"""Optimizer slots are matched to their variables by the object graph (the layer path), not by generated names:
a model rebuilt after another layer was built (so its layers are named otherwise) resumes with its Adam
moments on every path (Checkpoint.restore, load_model; BackupAndRestore in tests/keras), and a slot that
matches nothing is an error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits

keras = gd.keras


def _model() -> keras.Model:
    keras.utils.set_random_seed(7)
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    digit = digits()
    return digit.x_train[:96], digit.y_train[:96]


def _fit(model: keras.Model, data: tuple[np.ndarray, np.ndarray], epochs: int) -> None:
    model.fit(*data, batch_size=32, epochs=epochs, shuffle=False, verbose=0)


@pytest.fixture(scope="module")
def uninterrupted(data) -> list[np.ndarray]:
    keras.backend.clear_session()
    model = _model()
    _fit(model, data, 2)
    return model.get_weights()


def _half_trained(data) -> keras.Model:
    keras.backend.clear_session()
    model = _model()
    _fit(model, data, 1)
    return model


def _rebuilt_after_another_layer(reference: keras.Model) -> keras.Model:
    keras.layers.Dense(3)   # takes the next generated name: the rebuilt layers are named otherwise
    model = _model()
    assert [v.name for v in model.trainable_variables] != [v.name for v in reference.trainable_variables]
    return model


def _assert_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_checkpoint_restore_into_a_rebuilt_model_resumes_exactly(data, uninterrupted, tmp_path: Path) -> None:
    first = _half_trained(data)
    path = gd.train.Checkpoint(model=first, optimizer=first.optimizer).save(tmp_path / "mid.npz")
    rebuilt = _rebuilt_after_another_layer(first)
    gd.train.Checkpoint(model=rebuilt, optimizer=rebuilt.optimizer).restore(path)
    _fit(rebuilt, data, 1)
    _assert_equal(rebuilt.get_weights(), uninterrupted)


def test_load_model_after_another_layer_resumes_exactly(data, uninterrupted, tmp_path: Path) -> None:
    first = _half_trained(data)
    first.save(tmp_path / "mid")
    keras.layers.Dense(3)   # (model.json keeps the layers' names; the slots are matched by layer path anyway)
    loaded = keras.load_model(tmp_path / "mid")
    _fit(loaded, data, 1)
    _assert_equal(loaded.get_weights(), uninterrupted)


def test_slots_of_variables_the_checkpoint_does_not_track_are_an_error(data, tmp_path: Path) -> None:
    first = _half_trained(data)
    path = gd.train.Checkpoint(model=first, optimizer=first.optimizer).save(tmp_path / "mid.npz")
    rebuilt = _model()
    before = rebuilt.get_weights()
    with pytest.raises(gd.CheckpointError, match=r"optimizer state .* belongs to model/layer0/kernel, which this "
                                                  r"Checkpoint does not track"):
        gd.train.Checkpoint(optimizer=rebuilt.optimizer).restore(path)
    _assert_equal(rebuilt.get_weights(), before)   # nothing assigned
    assert int(rebuilt.optimizer.iterations.numpy()) == 0
