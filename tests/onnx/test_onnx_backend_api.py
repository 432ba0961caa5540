"""graphdist.onnx.backend's API: prepare/run_model/run_node/supports_device, input forms and errors.

Expected values are numpy's (or ONNX's generated test data); ONNX's own suite runs in test_backend_node.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphdist.onnx.backend as backend
from graphdist.errors import DeviceError, GraphError, InvalidArgumentError
from graphdist.runtime.devices import num_gpus


def _matmul_add(opset: int = 17) -> onnx.ModelProto:
    """y = x @ w + b with w an initializer; x [2, 3], b [4] inputs."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "matmul_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


X = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
B = np.array([0.5, -1, 2, 0], np.float32)
W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10


@pytest.mark.parametrize("name", ["ort", "tvm", "reference"])
def test_prepare_and_run_on_each_backend(name: str) -> None:
    rep = backend.prepare(_matmul_add(), "CPU", backend=name)
    assert (rep.backend, rep.device) == (name, "cpu:0")
    assert rep.input_names == ["x", "b"] and rep.output_names == ["y"]
    (y,) = rep.run([X, B])
    np.testing.assert_allclose(y, X @ W + B, rtol=1e-6)
    assert y.dtype == np.float32


def test_inputs_as_list_tuple_or_dict_and_outputs_by_name() -> None:
    rep = backend.prepare(_matmul_add())
    expected = X @ W + B
    for inputs in ([X, B], (X, B), {"b": B, "x": X}):
        outputs = rep.run(inputs)
        assert isinstance(outputs, tuple) and len(outputs) == 1
        np.testing.assert_allclose(outputs[0], expected, rtol=1e-6)
        np.testing.assert_allclose(outputs["y"], expected, rtol=1e-6)
    np.testing.assert_allclose(backend.run_model(_matmul_add(), {"x": X, "b": B})[0], expected, rtol=1e-6)


def test_one_input_model_takes_a_bare_array_and_ir3_initializer_inputs_are_constants() -> None:
    # An IR-3 style model lists its initializer as a graph input too: it stays a constant, not an input.
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("k", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                              initializer=[onnx.numpy_helper.from_array(np.float32([1, 2, 3]), "k")])
    rep = backend.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert rep.input_names == ["x"]
    x = np.float32([4, 5, 6])
    np.testing.assert_array_equal(rep.run(x)[0], x * [1, 2, 3])
    with pytest.raises(InvalidArgumentError, match=r"'k'.*initializers"):
        rep.run({"x": x, "k": x})


def test_prepare_from_bytes_and_path(tmp_path) -> None:
    model = _matmul_add()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for source in (model.SerializeToString(), str(path), path):
        np.testing.assert_allclose(backend.prepare(source).run([X, B])[0], X @ W + B, rtol=1e-6)


def test_run_node_builds_a_model_from_the_node() -> None:
    a = np.array([[1, -2], [3, 4]], np.float32)
    b = np.array([10, 20], np.float32)
    (out,) = backend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [a, b])
    np.testing.assert_array_equal(out, a + b)
    (out,) = backend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), {"b": b, "a": a}, backend="tvm")
    np.testing.assert_array_equal(out, a + b)
    # Optional inputs left out by empty names; outputs_info gives the output types.
    x = np.array([-3, 0.5, 7], np.float32)
    (out,) = backend.run_node(helper.make_node("Clip", ["x", "", "hi"], ["y"]), [x, np.float32(1)],
                              outputs_info=[(np.float32, (3,))])
    np.testing.assert_array_equal(out, np.minimum(x, 1))
    # opset_version picks the op's form: Clip-6 takes min/max as attributes.
    (out,) = backend.run_node(helper.make_node("Clip", ["x"], ["y"], min=0.0, max=1.0), [x], opset_version=6)
    np.testing.assert_array_equal(out, np.clip(x, 0, 1))


def test_run_node_on_an_onnx_node_test_case() -> None:
    # ONNX's own case for Relu, through run_node (the node and data as ONNX generated them).
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        case = next(c for c in load_model_tests(kind="node") if c.name == "test_relu")
    (inputs, expected), = case.data_sets
    got = backend.run_node(case.model.graph.node[0], inputs)
    np.testing.assert_allclose(got[0], expected[0], rtol=case.rtol, atol=case.atol)


def test_run_node_errors() -> None:
    x = np.ones(3, np.float32)
    with pytest.raises(InvalidArgumentError, match=r"node Add has 2 input\(s\) \(a, b\); got 1"):
        backend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [x])
    with pytest.raises(InvalidArgumentError, match=r"node Add: input\(s\) 'b' missing"):
        backend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), {"a": x})
    with pytest.raises(GraphError, match="node NoSuchOp: no ONNX domain 'ai.onnx' defines it"):
        backend.run_node(helper.make_node("NoSuchOp", ["a"], ["c"]), [x])
    with pytest.raises(GraphError, match="node If: ONNX's shape inference rejects it"):
        backend.run_node(helper.make_node("If", ["c"], ["o"]), [np.array(True)])


def test_input_errors_name_the_input() -> None:
    rep = backend.prepare(_matmul_add())
    with pytest.raises(InvalidArgumentError, match=r"model 'matmul_add' \(ops: Add, MatMul\) takes 2 input\(s\) "
                                                   r"\(x, b\); got 1"):
        rep.run([X])
    with pytest.raises(InvalidArgumentError, match=r"input\(s\) 'b' missing"):
        rep.run({"x": X})
    with pytest.raises(InvalidArgumentError, match=r"no input\(s\) 'z'"):
        rep.run({"x": X, "b": B, "z": B})
    with pytest.raises(InvalidArgumentError, match="input 'b' of model 'matmul_add'.*expected float32 values, "
                                                   "got float64"):
        rep.run([X, B.astype(np.float64)])
    with pytest.raises(InvalidArgumentError, match=r"input 'x' .*expected shape \[2, 3\], got \[3, 2\]"):
        rep.run([X.T.copy(), B])
    with pytest.raises(InvalidArgumentError, match="pass a list or a dict"):
        rep.run(X)
    with pytest.raises(InvalidArgumentError, match="takes no options"):
        rep.run([X, B], log_severity_level=1)


def test_prepare_errors() -> None:
    with pytest.raises(InvalidArgumentError, match=r"backend 'onnxruntime' is not a graphdist backend"):
        backend.prepare(_matmul_add(), backend="onnxruntime")
    with pytest.raises(InvalidArgumentError, match="unknown keyword"):
        backend.prepare(_matmul_add(), threads=2)
    with pytest.raises(InvalidArgumentError, match="device 'TPU' is not an ONNX device"):
        backend.prepare(_matmul_add(), "TPU")
    with pytest.raises(InvalidArgumentError, match="backend 'reference' runs on the host only"):
        backend.prepare(_matmul_add(), "CUDA", backend="reference")
    with pytest.raises(GraphError, match="ONNX file '/no/such.onnx' does not exist"):
        backend.prepare("/no/such.onnx")
    with pytest.raises(GraphError, match="not a serialized ONNX model"):
        backend.prepare(b"\xff\xff not protobuf")
    with pytest.raises(InvalidArgumentError, match="model must be an onnx.ModelProto"):
        backend.prepare(42)
    broken = _matmul_add()
    broken.graph.node[1].input[1] = "nowhere"
    with pytest.raises(GraphError, match=r"model 'matmul_add' \(ops: Add, MatMul\) is not a valid ONNX model"):
        backend.prepare(broken)


def test_unsupported_values_are_graph_errors_naming_the_value() -> None:
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("SequenceLength", ["s"], ["n"])], "seq_len", [seq],
                              [helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(GraphError, match="'s' is a sequence"):
        backend.prepare(model).run([[np.ones(2, np.float32)]])


def test_devices() -> None:
    assert backend.supports_device("CPU") and backend.supports_device("cpu")
    assert backend.supports_device("CUDA") == (num_gpus() > 0)
    assert not backend.supports_device("TPU") and not backend.supports_device("CUDA:x")
    assert backend.is_compatible(_matmul_add(), "CPU")
    if num_gpus() == 0:
        with pytest.raises(DeviceError, match="device 'CUDA' is not available: this machine has 0 GPU"):
            backend.prepare(_matmul_add(), "CUDA")


def test_using_sets_the_default_backend() -> None:
    tvm_backend = backend.GraphdistBackend.using("tvm")
    assert issubclass(tvm_backend, backend.GraphdistBackend)
    assert tvm_backend.prepare(_matmul_add()).backend == "tvm"
    assert tvm_backend.prepare(_matmul_add(), backend="reference").backend == "reference"
    assert backend.GraphdistBackend.prepare(_matmul_add()).backend == "ort"
    with pytest.raises(InvalidArgumentError, match="'cuda' is not a graphdist backend"):
        backend.GraphdistBackend.using("cuda")
