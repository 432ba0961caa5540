"""Weights written as ``Constant`` nodes become variables; BatchNormalization statistics stay frozen; a
gradient through an op without a rule names the op, the model's own opset and the node.

The models here are built with onnx.helper in the way Paddle2ONNX writes them (every weight a
``Constant`` node, a Conv bias as ``Add(conv, Reshape(Constant))``); the real Paddle2ONNX files are
in ``test_paddle_models.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import graphdist as gd
from tests.onnx.test_model import make_model, tensor

RNG = np.random.default_rng(11)


def _constant(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def paddle_style(opset: int = 11) -> onnx.ModelProto:
    """Conv(+Reshape/Add bias) -> BatchNormalization -> Relu -> GlobalAveragePool -> Flatten -> MatMul(+Add bias),
    every weight a Constant node (the same weights on every call).
    """
    rng = np.random.default_rng(3)
    arrays = {"conv_w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
              "conv_b": rng.standard_normal(4).astype(np.float32) * 0.1,
              "bn_scale": rng.uniform(0.5, 1.5, 4).astype(np.float32), "bn_bias": rng.standard_normal(4).astype(
                  np.float32) * 0.1, "bn_mean": rng.standard_normal(4).astype(np.float32) * 0.1,
              "bn_var": rng.uniform(0.5, 1.5, 4).astype(np.float32),
              "fc_w": rng.standard_normal((4, 2)).astype(np.float32), "fc_b": np.float32([0.1, -0.1])}
    nodes = [_constant(n, a) for n, a in arrays.items()]
    nodes += [_constant("bias_shape", np.array([1, -1, 1, 1], np.int64)),
              helper.make_node("Conv", ["x", "conv_w"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
              helper.make_node("Reshape", ["conv_b", "bias_shape"], ["conv_b4"]),
              helper.make_node("Add", ["conv", "conv_b4"], ["conv_biased"]),
              helper.make_node("BatchNormalization", ["conv_biased", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                               ["bn"], epsilon=1e-5),
              helper.make_node("Relu", ["bn"], ["relu"]),
              helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
              helper.make_node("Flatten", ["pool"], ["flat"]),
              helper.make_node("MatMul", ["flat", "fc_w"], ["fc"], name="fc"),
              helper.make_node("Add", ["fc", "fc_b"], ["logits"])]
    return make_model(nodes, [tensor("x", ["N", 3, 6, 6])], [tensor("logits", ["N", 2])], opset=opset)


def test_constant_weights_become_variables_statistics_frozen(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="graphdist.onnx.model"):
        model = gd.onnx.load(paddle_style())
    assert "promoted 8 Constant node(s) to variables (6 weights, 2 running statistics)" in caplog.text
    assert model.promoted_constants == ["conv_w", "conv_b", "bn_scale", "bn_bias", "fc_w", "fc_b", "bn_mean",
                                        "bn_var"]
    assert sorted(v.name for v in model.trainable_variables) == sorted(
        f"{n}:0" for n in ["conv_w", "conv_b", "bn_scale", "bn_bias", "fc_w", "fc_b"])
    assert sorted(v.name for v in model.variables if not v.trainable) == ["bn_mean:0", "bn_var:0"]
    x = RNG.standard_normal((3, 3, 6, 6)).astype(np.float32)
    (expected,) = ort.InferenceSession(paddle_style().SerializeToString(),
                                       providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(model(x), expected, rtol=1e-5, atol=1e-5)
    kept = gd.onnx.load(paddle_style(), promote_constants=False)
    assert kept.variables == [] and kept.promoted_constants == []
    assert gd.onnx.load(paddle_style(), trainable=False).variables == []


def _sgd_step(model: gd.onnx.OnnxModel, x: np.ndarray) -> float:
    optimizer = gd.optimizers.SGD(0.1)

    @gd.function
    def step(x):
        with gd.GradientTape() as tape:
            loss = (model(x, training=True) ** 2).mean()
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return float(step(x))


def test_batch_norm_statistics_frozen_by_default_update_on_request(tmp_path: Path) -> None:
    x = RNG.standard_normal((4, 3, 6, 6)).astype(np.float32) * 2 + 1
    frozen = gd.onnx.load(paddle_style())
    statistics = [v.numpy() for v in frozen.variables if not v.trainable]
    np.testing.assert_allclose(frozen(x, training=True), frozen(x), rtol=1e-6)  # the inference form
    assert np.isfinite(_sgd_step(frozen, x))
    for variable, before in zip([v for v in frozen.variables if not v.trainable], statistics):
        np.testing.assert_array_equal(variable.numpy(), before)
    updated = gd.onnx.load(paddle_style(), batch_norm="update")
    assert not np.allclose(updated(x, training=True), updated(x), rtol=1e-3)  # batch statistics
    assert np.isfinite(_sgd_step(updated, x))
    moved = [v.numpy() for v in updated.variables if not v.trainable]
    assert all(not np.allclose(a, b) for a, b in zip(moved, statistics))
    with pytest.raises(gd.InvalidArgumentError, match="batch_norm must be one of 'frozen', 'update', got 'keras'"):
        gd.onnx.load(paddle_style(), batch_norm="keras")
    # save: promoted weights as initializers, the trained values; plain ONNX Runtime runs it
    path = frozen.save(tmp_path / "trained.onnx")
    saved = onnx.load(path)
    assert {t.name for t in saved.graph.initializer} == set(frozen.promoted_constants)
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, frozen(x), rtol=1e-5, atol=1e-5)


def test_gradient_through_op_without_rule_names_op_model_opset_and_node() -> None:
    """An opset-12 model whose LpNormalization (no gradient rule) the loss reaches: the error names the op,
    opset 12 (the model's, not the trace's 18) and the node.
    """
    scale = numpy_helper.from_array(RNG.uniform(0.5, 1.5, (4, 1, 1)).astype(np.float32), "scale")
    nodes = [helper.make_node("Mul", ["x", "scale"], ["scaled"]),
             helper.make_node("LpNormalization", ["scaled"], ["y"], axis=1, name="unit_norm")]
    model = gd.onnx.load(make_model(nodes, [tensor("x", [1, 4, 2, 2])], [tensor("y", [1, 4, 2, 2])], [scale],
                                    opset=12, name="sr"))

    @gd.function
    def grads(x):
        with gd.GradientTape() as tape:
            loss = model(x).sum()
        return tape.gradient(loss, model.trainable_variables)

    with pytest.raises(gd.TracingError, match=r"cannot differentiate through LpNormalization \(node 'unit_norm' of "
                                              r"model 'sr' \(opset 12\), at [^)]*\): the op has no gradient rule at "
                                              r"opset 12 \(traced at 18\)"):
        grads(RNG.standard_normal((1, 4, 2, 2)).astype(np.float32))
