"""gd.keras.models.from_onnx: Keras training of an ONNX graph under strategies, save and load.

Oracles: ONNX Runtime on the trained model written back (accuracy on the
held-out digits), the one-device run (Mirrored fit gives the same weights),
and the model before saving (a loaded model predicts and trains like it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphdist as gd
from graphdist.models.datasets import digits


def mlp_onnx(sizes=(64, 64, 10), seed: int = 0, opset: int = 18, dropout: float | None = None) -> onnx.ModelProto:
    """An MLP (Gemm + Relu, logits out) built with onnx.helper, Glorot-uniform weights, zero biases."""
    rng = np.random.default_rng(seed)
    nodes, inits, current = [], [], "pixels"
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        limit = np.sqrt(6 / (fan_in + fan_out))
        inits += [numpy_helper.from_array(rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32),
                                          f"dense{index}/kernel"),
                  numpy_helper.from_array(np.zeros(fan_out, np.float32), f"dense{index}/bias")]
        out = "logits" if index == len(sizes) - 2 else f"h{index}"
        nodes.append(helper.make_node("Gemm", [current, f"dense{index}/kernel", f"dense{index}/bias"],
                                      [out if out == "logits" else f"pre{index}"]))
        if out != "logits":
            nodes.append(helper.make_node("Relu", [f"pre{index}"], [out]))
            if dropout is not None:
                inits.append(numpy_helper.from_array(np.float32(dropout), f"ratio{index}"))
                nodes.append(helper.make_node("Dropout", [out, f"ratio{index}"], [f"{out}_dropped"]))
                out = f"{out}_dropped"
        current = out
    graph = helper.make_graph(nodes, "digits_mlp",
                              [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", sizes[0]])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", sizes[-1]])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def ort_logits(model: onnx.ModelProto | str, x: np.ndarray) -> np.ndarray:
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def compiled(model: gd.keras.Model) -> gd.keras.Model:
    model.compile(optimizer=gd.optimizers.Adam(0.01),
                  loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def test_digits_fit_under_mirrored_reaches_90_percent(tmp_path: Path) -> None:
    data = digits()
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = compiled(gd.keras.models.from_onnx(mlp_onnx()))
    assert model.distribute_strategy is strategy
    assert all(isinstance(v, gd.MirroredVariable) for v in model.trainable_variables)
    assert [v.name for v in model.trainable_variables][:2] == ["dense0/kernel:0", "dense0/bias:0"]
    history = model.fit(data.x_train, data.y_train, epochs=15, batch_size=64, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    loss, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=64, verbose=0)
    # Independent check: the trained weights written back to ONNX, run by ONNX Runtime.
    path = model.onnx.save(tmp_path / "digits.onnx")
    ort_accuracy = float((ort_logits(str(path), data.x_test).argmax(axis=1) == data.y_test).mean())
    assert ort_accuracy >= 0.90, ort_accuracy
    assert abs(accuracy - ort_accuracy) < 1e-6
    np.testing.assert_allclose(model.predict(data.x_test, batch_size=64), ort_logits(str(path), data.x_test),
                               rtol=1e-4, atol=1e-4)


def _fit(strategy: gd.Strategy, x: np.ndarray, y: np.ndarray) -> gd.keras.Model:
    with strategy.scope():
        model = compiled(gd.keras.models.from_onnx(mlp_onnx(sizes=(64, 16, 10))))
    model.fit(x, y, epochs=2, batch_size=32, shuffle=False, verbose=0)
    return model


def test_fit_under_mirrored_equals_one_device() -> None:
    data = digits()
    x, y = data.x_train[:256], data.y_train[:256]
    one = _fit(gd.OneDeviceStrategy("cpu:0"), x, y)
    two = _fit(gd.MirroredStrategy(["cpu:0", "cpu:1"]), x, y)
    initial = [numpy_helper.to_array(t) for t in mlp_onnx(sizes=(64, 16, 10)).graph.initializer]
    assert max(np.abs(w - i).max() for w, i in zip(one.get_weights(), initial)) > 1e-2
    for a, b in zip(one.get_weights(), two.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_save_and_load_model_round_trip_under_another_strategy(tmp_path: Path) -> None:
    data = digits()
    x, y = data.x_train[:256], data.y_train[:256]
    model = _fit(gd.MirroredStrategy(["cpu:0", "cpu:1"]), x, y)
    directory = model.save(tmp_path / "saved")
    assert (Path(directory) / "model.onnx").is_file()
    with gd.OneDeviceStrategy("cpu:0").scope():
        loaded = gd.keras.load_model(directory)
    assert type(loaded).__name__ == "OnnxKerasModel"
    np.testing.assert_allclose(loaded.predict(data.x_test), model.predict(data.x_test), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ort_logits(str(Path(directory) / "model.onnx"), data.x_test),
                               model.predict(data.x_test), rtol=1e-4, atol=1e-4)
    plan = gd.load_plan(str(Path(directory) / "serving"))  # the exported predict step runs without the model
    np.testing.assert_allclose(plan(data.x_test[:32]), model.predict(data.x_test[:32]), rtol=1e-5, atol=1e-5)
    # Both continue training alike (the optimizer's state was saved too).
    model.fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
    loaded.fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_trainable_false_keeps_the_weights() -> None:
    data = digits()
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = compiled(gd.keras.models.from_onnx(mlp_onnx(sizes=(64, 10)), trainable=False))
    before = model.get_weights()
    assert model.trainable_variables == [] and len(before) == 2
    model.fit(data.x_train[:64], data.y_train[:64], epochs=1, batch_size=32, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_dropout_runs_in_training_form_during_fit_only() -> None:
    data = digits()
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = compiled(gd.keras.models.from_onnx(mlp_onnx(dropout=0.5)))
    x = data.x_test[:32]
    np.testing.assert_allclose(model.predict(x), ort_logits(mlp_onnx(dropout=0.5), x), rtol=1e-5, atol=1e-5)
    history = model.fit(data.x_train, data.y_train, epochs=3, batch_size=64, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    np.testing.assert_allclose(model.predict(x), model.predict(x))  # inference: deterministic


def test_two_inputs_as_list_or_dict() -> None:
    nodes = [helper.make_node("Concat", ["a", "b"], ["ab"], axis=1), helper.make_node("Gemm", ["ab", "w"], ["y"])]
    w = numpy_helper.from_array(np.eye(4, 2, dtype=np.float32), "w")
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 2]),
                                             helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])], initializer=[w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model = gd.keras.models.from_onnx(proto)
    a, b = np.float32([[1, 2]]), np.float32([[3, 4]])
    np.testing.assert_array_equal(model([a, b]), [[1, 2]])
    np.testing.assert_array_equal(model({"b": b, "a": a}), [[1, 2]])
    np.testing.assert_array_equal(model.predict([a, b]), [[1, 2]])
    with pytest.raises(gd.InvalidArgumentError, match="takes 2 inputs.*a, b"):
        model(a)


def test_load_errors_are_graphdist_errors(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(mlp_onnx().SerializeToString()[:100])
    with pytest.raises(gd.GraphError, match="broken.onnx"):
        gd.keras.models.from_onnx(path)
