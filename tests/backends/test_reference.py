"""Tests for the onnx.reference backend and its agreement with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference.op_run import OpRun

from graphdist import stats
from graphdist.backends import get_backend
from graphdist.backends.ort import OrtBackend
from graphdist.backends.reference import ReferenceBackend
from graphdist.errors import BackendError
from graphdist.runtime.devices import Device

RNG = np.random.default_rng(1)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def mlp_model() -> onnx.ModelProto:
    """relu(x @ W + B), float32, weights as initializers."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["m"]),
            helper.make_node("Add", ["m", "B"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def relu_f64_model() -> onnx.ModelProto:
    """relu(a) + a * a in float64 (elementwise only, so a wrong dtype would
    not be caught by any op)."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("Mul", ["a", "a"], ["sq"]),
            helper.make_node("Add", ["r", "sq"], ["y"]),
        ],
        "relu64",
        [helper.make_tensor_value_info("a", TensorProto.DOUBLE, [3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


class Twice(OpRun):
    """A stand-in for a graphdist-domain op: y = 2 * x."""

    op_domain = "graphdist"

    def _run(self, x):
        return (x * 2,)


def custom_op_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["y"], domain="graphdist")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 18),
            helper.make_opsetid("graphdist", 1),
        ],
    )


def test_registered() -> None:
    assert isinstance(get_backend("reference"), ReferenceBackend)
    assert get_backend("REFERENCE").name == "reference"


def test_version_and_target() -> None:
    backend = ReferenceBackend()
    assert backend.version == f"onnx-{onnx.__version__}"
    assert backend.target(Device("cpu", 3)) == "host"
    assert backend.target(Device("tpu", 0)) == "host"


def test_mlp_matches_numpy() -> None:
    exe = ReferenceBackend().compile(mlp_model(), Device("cpu", 0))
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    (y,) = exe.run({"x": x})
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y, np.maximum(x @ W + B, 0), rtol=1e-5, atol=1e-6)
    assert exe.input_names == ["x"] and exe.output_names == ["y"]


def test_float64_matches_numpy_and_keeps_dtype() -> None:
    exe = ReferenceBackend().compile(relu_f64_model(), Device("tpu", 1))
    a = np.array([-1.5, 0.0, 2.25])
    (y,) = exe.run({"a": a})
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, np.maximum(a, 0) + a * a)


def test_agrees_with_ort() -> None:
    model = mlp_model()
    x = RNG.standard_normal((8, 4)).astype(np.float32)
    ref = ReferenceBackend().compile(model, Device("cpu", 0)).run({"x": x})[0]
    ort = OrtBackend().compile(model, Device("cpu", 0)).run({"x": x})[0]
    np.testing.assert_allclose(ref, ort, rtol=1e-5, atol=1e-6)


def test_each_compile_counts() -> None:
    before = stats.snapshot()
    ReferenceBackend().compile(mlp_model(), Device("cpu", 0))
    ReferenceBackend().compile(mlp_model(), Device("cpu", 0))
    assert stats.delta(before)["compiles"] == 2


def test_wrong_dtype_is_rejected() -> None:
    exe = ReferenceBackend().compile(relu_f64_model(), Device("cpu", 0))
    with pytest.raises(
        BackendError, match="feed 'a' has dtype float32, expected float64"
    ):
        exe.run({"a": np.ones(3, dtype=np.float32)})


def test_missing_feed_is_rejected() -> None:
    exe = ReferenceBackend().compile(mlp_model(), Device("cpu", 0))
    with pytest.raises(
        BackendError, match=r"'mlp'.*missing feed\(s\) 'x'.*Feeds given: z"
    ):
        exe.run({"z": np.ones((1, 4), dtype=np.float32)})


def test_evaluator_failure_is_wrapped() -> None:
    exe = ReferenceBackend().compile(mlp_model(), Device("cpu", 0))
    with pytest.raises(BackendError, match=r"'mlp'.*x: float32\[2, 2\]") as info:
        exe.run({"x": np.ones((2, 2), dtype=np.float32)})
    assert info.value.__cause__ is not None


def test_unknown_op_is_wrapped() -> None:
    with pytest.raises(BackendError, match="'custom'.*custom_ops"):
        ReferenceBackend().compile(custom_op_model(), Device("cpu", 0))


def test_custom_ops_hook() -> None:
    exe = ReferenceBackend(custom_ops=[Twice]).compile(
        custom_op_model(), Device("cpu", 0)
    )
    x = np.array([1.5, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(exe.run({"x": x})[0], 2 * x)
