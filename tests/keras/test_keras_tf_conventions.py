"""Keras habits: ``summary()`` has an output-shape column, floating inputs run in the layers' dtype (float64
data in a float32 model runs in float32), and ``fit(validation_split=...)`` holds out the arrays' last rows.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd

L = gd.keras.layers


# --------------------------------------------------------------------- summary
def test_summary_shows_each_layers_output_shape() -> None:
    model = gd.keras.Sequential([L.Conv2D(4, 3, input_shape=(8, 8, 1)), L.Flatten(), L.Dense(2)])
    lines = model.summary(print_fn=None).splitlines()
    assert lines[1].split() == ["Layer", "(type)", "Output", "Shape", "Param", "#"]
    rows = {line.split()[0]: line for line in lines[2:5]}
    conv, flatten, dense = (model.layers[i].name for i in range(3))
    assert "(None, 6, 6, 4)" in rows[conv] and rows[conv].rstrip().endswith(" 40")
    assert "(None, 144)" in rows[flatten] and "(None, 2)" in rows[dense] and rows[dense].rstrip().endswith(" 290")

    class TwoDense(gd.keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = L.Dense(5)
            self.out = L.Dense(1)

        def call(self, x, training=False):
            return self.out(self.hidden(x))

    subclassed = TwoDense()
    unbuilt = subclassed.summary(print_fn=None).splitlines()[2:4]
    assert all(row.split()[2] == "?" for row in unbuilt), unbuilt  # no shapes before the model is built
    subclassed(np.ones((3, 7), np.float32))
    text = subclassed.summary(print_fn=None)
    assert "(None, 5)" in text and "(None, 1)" in text and "?" not in text
    assert type(subclassed.hidden).call is L.Dense.call and "call" not in vars(subclassed.hidden)  # restored


# ------------------------------------------------------------------ input dtype
def test_float64_inputs_run_in_the_layers_float32() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.keras.Sequential([L.Dense(3, input_shape=(4,), activation="relu"), L.Dense(2)])
    x64 = np.random.default_rng(0).standard_normal((4, 4))
    eager = model(x64)
    assert eager.dtype == np.float32
    np.testing.assert_array_equal(eager, model(x64.astype(np.float32)))
    traced = strategy.run(lambda x: model(x), args=(x64,))
    assert all(v.dtype == np.float32 for v in traced.values)
    # ORT's matmul (per replica) vs numpy's (BLAS kernel chosen for the CPU): outputs near zero differ by ulps of
    # the O(1) terms, more than rtol allows.
    np.testing.assert_allclose(traced.values[0], eager, rtol=1e-6, atol=1e-6)

    float64_layer = L.Dense(2, dtype="float64")
    assert float64_layer(x64).dtype == np.float64 and float64_layer(x64.astype(np.float32)).dtype == np.float64
    tokens = np.array([[1, 2], [3, 0]], np.int64)
    embedded = L.Embedding(4, 3)(tokens)  # integer ids are not cast
    assert embedded.dtype == np.float32 and embedded.shape == (2, 2, 3)


# ------------------------------------------------------------- validation_split
def _twin_models() -> tuple[gd.keras.Model, gd.keras.Model]:
    models = []
    for _ in range(2):
        model = gd.keras.Sequential([L.Dense(3, input_shape=(4,))])
        model.compile(loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="sgd",
                      metrics=["accuracy"])
        models.append(model)
    models[1].set_weights(models[0].get_weights())
    return models[0], models[1]


def test_validation_split_holds_out_the_last_rows() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((20, 4)).astype(np.float32), rng.integers(0, 3, 20)
    weights = rng.uniform(0.5, 2.0, 20).astype(np.float32)
    split, explicit = _twin_models()
    got = split.fit(x, y, sample_weight=weights, batch_size=4, epochs=2, validation_split=0.25, shuffle=False,
                    verbose=0).history
    want = explicit.fit(x[:15], y[:15], sample_weight=weights[:15], batch_size=4, epochs=2, shuffle=False, verbose=0,
                        validation_data=(x[15:], y[15:], weights[15:])).history
    assert set(got) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for name, values in want.items():
        np.testing.assert_allclose(got[name], values, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(split.get_weights()[0], explicit.get_weights()[0], rtol=1e-6)


def test_validation_split_errors_and_precedence() -> None:
    model, _ = _twin_models()
    x, y = np.ones((10, 4), np.float32), np.zeros(10, np.int64)
    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(gd.InvalidArgumentError, match=r"validation_split must be a fraction in \[0, 1\)"):
            model.fit(x, y, validation_split=bad, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="leaves 0 for training and 1 for validation"):
        model.fit(x[:1], y[:1], validation_split=0.5, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="leaves 10 for training and 0 for validation"):
        model.fit(x, y, validation_split=1e-17, verbose=0)  # floor(10 * (1 - 1e-17)) = 10
    dataset = gd.data.Dataset.from_tensor_slices((x, y)).batch(5)
    with pytest.raises(gd.InvalidArgumentError, match="validation_split works with arrays only.*dataset.take"):
        model.fit(dataset, validation_split=0.2, verbose=0)
    with pytest.raises(gd.InvalidArgumentError, match="lengths \\[9, 10\\]"):
        model.fit(x, y[:9], validation_split=0.2, verbose=0)
    # validation_data wins over validation_split, as in Keras: 10 training rows, 2 validation rows given.
    history = model.fit(x, y, batch_size=10, validation_split=0.5, validation_data=(x[:2], y[:2]), verbose=0)
    assert "val_loss" in history.history
