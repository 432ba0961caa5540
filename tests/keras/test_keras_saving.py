"""gd.keras model.save / load_model: checkpoint + plan directories, across strategies, training resumes."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits

keras = gd.keras


def _trained(strategy: gd.Strategy) -> keras.Model:
    keras.utils.set_random_seed(0)
    data = digits(images=True)
    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 1)),
            keras.layers.BatchNormalization(),
            keras.layers.MaxPool2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data.x_train[:256], data.y_train[:256], batch_size=64, epochs=1, verbose=0)
    return model


def test_save_and_load_under_another_strategy(tmp_path) -> None:
    data = digits(images=True)
    model = _trained(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    path = model.save(tmp_path / "digits")
    names = sorted(p.name for p in (tmp_path / "digits").iterdir())
    assert names == ["graphdist-manifest.json", "graphdist-signature.json", "model.json", "serving", "variables.npz"]
    config = json.loads((tmp_path / "digits" / "model.json").read_text())
    assert config["class_name"] == "Sequential" and config["compile"]["optimizer"]["class_name"] == "Adam"
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())   # no staging left behind

    with gd.OneDeviceStrategy("cpu:0").scope():
        loaded = keras.load_model(path)
    assert isinstance(loaded.distribute_strategy, gd.OneDeviceStrategy)
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(loaded.predict(data.x_test), model.predict(data.x_test), rtol=1e-5, atol=1e-6)
    assert loaded.evaluate(data.x_test, data.y_test, verbose=0) == pytest.approx(
        model.evaluate(data.x_test, data.y_test, verbose=0), rel=1e-5)


def test_loaded_model_continues_training_like_the_original(tmp_path) -> None:
    data = digits(images=True)
    model = _trained(gd.OneDeviceStrategy("cpu:0"))
    model.save(tmp_path / "m")
    loaded = keras.load_model(tmp_path / "m")
    assert int(loaded.optimizer.iterations.numpy()) == 4
    x, y = data.x_train[256:384], data.y_train[256:384]
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)   # Adam's moments were restored too


def test_exported_serving_plan_runs_without_the_model(tmp_path) -> None:
    data = digits(images=True)
    model = _trained(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    model.save(tmp_path / "m")
    plan = gd.load_plan(tmp_path / "m" / "serving")
    batch = data.x_test[:32]
    np.testing.assert_allclose(plan(batch), model.predict(batch), rtol=1e-5, atol=1e-6)


def test_subclassed_model_saves_and_needs_its_class_to_load(tmp_path) -> None:
    class Small(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.head = keras.layers.Dense(2)

        def call(self, x, training=False):
            return self.head(self.hidden(x))

    with gd.OneDeviceStrategy("cpu:0").scope():
        model = Small()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), epochs=1, verbose=0)
    assert [layer.name for layer in model.layers][0].startswith("dense") and len(model.trainable_variables) == 4
    model.save(tmp_path / "small")
    with pytest.raises(gd.InvalidArgumentError, match="custom_objects"):
        keras.load_model(tmp_path / "small")
    loaded = keras.load_model(tmp_path / "small", custom_objects={"Small": Small})
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-6)


def test_load_model_errors(tmp_path) -> None:
    with pytest.raises(gd.CheckpointError, match="not a saved model"):
        keras.load_model(tmp_path)
    (tmp_path / "model.json").write_text(json.dumps({"format": "graphdist-keras-model", "version": 99}))
    with pytest.raises(gd.CheckpointError, match="version 99"):
        keras.load_model(tmp_path)
    with gd.OneDeviceStrategy("cpu:0").scope():
        unbuilt = keras.Sequential([keras.layers.Dense(1)])
    with pytest.raises(gd.InvalidArgumentError, match="not built"):
        unbuilt.save(tmp_path / "x")


def test_save_replaces_an_earlier_save_but_not_other_directories(tmp_path) -> None:
    data = digits(images=True)
    model = _trained(gd.OneDeviceStrategy("cpu:0"))
    model.save(tmp_path / "m")
    model.fit(data.x_train[:64], data.y_train[:64], batch_size=64, epochs=1, verbose=0)
    model.save(tmp_path / "m")  # Keras' default overwrite=True: the newer weights replace the older ones
    np.testing.assert_array_equal(keras.load_model(tmp_path / "m").predict(data.x_test[:32], verbose=0),
                                  model.predict(data.x_test[:32], verbose=0))
    with pytest.raises(gd.InvalidArgumentError, match="overwrite=True"):
        model.save(tmp_path / "m", overwrite=False)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(gd.PlanError, match="not a directory graphdist wrote"):
        model.save(tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


def _functional(two_inputs: bool = False) -> keras.Model:
    """A skip connection, a layer called twice (shared weights), Add and Concatenate."""
    left = keras.Input(shape=(6,))
    right = keras.Input(shape=(6,)) if two_inputs else left
    shared = keras.layers.Dense(8, activation="relu")
    merged = keras.layers.Add()([shared(left), shared(right)])
    skip = keras.layers.Dense(8)(left)
    features = keras.layers.Concatenate()([merged, skip])
    outputs = keras.layers.Dense(3)(keras.layers.LayerNormalization()(features))
    return keras.Model(inputs=[left, right] if two_inputs else left, outputs=outputs)


def test_functional_model_saves_its_graph_and_loads_without_its_code(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 6)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    keras.utils.set_random_seed(0)
    with gd.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        model = _functional()
        model.compile(optimizer=gd.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / "functional")
    config = json.loads((tmp_path / "functional" / "model.json").read_text())["config"]
    assert [node["layer"] for node in config["nodes"]].count(0) == 2  # the shared Dense is one layer...
    assert len(config["layers"]) == 6 and len(config["nodes"]) == 7    # ...called twice (7 calls, 6 layers)
    with gd.OneDeviceStrategy("cpu:0").scope():
        loaded = keras.load_model(tmp_path / "functional")
    assert len(loaded.trainable_variables) == len(model.trainable_variables)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    # The optimizer state came along: one more epoch on each gives the same weights.
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_functional_model_with_two_inputs_round_trips(tmp_path) -> None:
    keras.utils.set_random_seed(1)
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = _functional(two_inputs=True)
    a, b = (np.random.default_rng(i).standard_normal((5, 6)).astype(np.float32) for i in (1, 2))
    model.save(tmp_path / "two")
    loaded = keras.load_model(tmp_path / "two")
    np.testing.assert_allclose(loaded.predict([a, b], verbose=0), model.predict([a, b], verbose=0), rtol=1e-6)
    assert not np.allclose(loaded.predict([a, b], verbose=0), loaded.predict([b, a], verbose=0))  # order kept


def test_functional_model_with_a_custom_layer_is_refused_when_saved(tmp_path) -> None:
    class Twice(keras.layers.Layer):
        def call(self, inputs, training=False):
            return inputs * 2

    inputs = keras.Input(shape=(4,))
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Model(inputs=inputs, outputs=keras.layers.Dense(2)(Twice()(inputs)))
    with pytest.raises(gd.InvalidArgumentError, match="unknown layer class 'Twice'"):
        model.save(tmp_path / "custom")
    assert not (tmp_path / "custom").exists()


@pytest.mark.parametrize("optimizer", ["rmsprop", "adagrad", "adamw"])
def test_every_optimizer_saves_its_config_and_state(tmp_path, optimizer: str) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 4)).astype(np.float32), rng.standard_normal((32, 2)).astype(np.float32)
    keras.utils.set_random_seed(0)
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(2, input_shape=(4,))])
        model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / optimizer)
    loaded = keras.load_model(tmp_path / optimizer)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # slots restored: same next epoch
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _reseal(directory) -> None:
    """Rewrites the manifest's checksums and drops the signature (which would name the forgery)."""
    manifest = json.loads((directory / "graphdist-manifest.json").read_text())
    manifest["files"] = {rel: hashlib.sha256((directory / rel).read_bytes()).hexdigest() for rel in manifest["files"]}
    (directory / "graphdist-manifest.json").write_text(json.dumps(manifest))
    (directory / "graphdist-signature.json").unlink(missing_ok=True)


def test_unknown_optimizer_in_a_saved_model_is_a_checkpoint_error(tmp_path) -> None:
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    model.compile(optimizer="rmsprop", loss="mse")
    model.save(tmp_path / "m")
    config_file = tmp_path / "m" / "model.json"
    config = json.loads(config_file.read_text())
    config["compile"]["optimizer"]["class_name"] = "Lion"
    config_file.write_text(json.dumps(config))
    with pytest.raises(gd.CheckpointError, match=r"model\.json fails its SHA-256 checksum"):
        keras.load_model(tmp_path / "m")
    _reseal(tmp_path / "m")  # as if the manifest had been rewritten too: the schema check still answers
    with pytest.raises(gd.CheckpointError, match=r"model\.json: unknown optimizer class 'Lion'"):
        keras.load_model(tmp_path / "m")
    assert keras.load_model(tmp_path / "m", compile=False).optimizer is None  # the weights still load
