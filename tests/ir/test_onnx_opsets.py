"""ONNX models at their own opset: generic OpDefs, folding, binding shape inputs, inlining across opsets.

Oracles: ONNX Runtime running the same model, and ``onnx.reference``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphdist as gd
from graphdist.compile.graph_runner import GraphRunner
from graphdist.errors import GraphError, TracingError
from graphdist.ir import OPSET, from_onnx, to_onnx
from graphdist.ir.fold import fold_node
from graphdist.ir.graph import Graph
from graphdist.ir.onnx_io import MAX_OPSET
from graphdist.ir.value_operands import static_input_names, static_inputs
from graphdist.trace.inline import inline_graph

RNG = np.random.default_rng(11)


def model_of(nodes, inputs, outputs, opset: int, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def tensor(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def run_ort(model: onnx.ModelProto, *arrays: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, arrays)))


def gelu_layer_norm_model(opset: int = 21) -> onnx.ModelProto:
    """Gemm -> LayerNormalization -> Gelu (Gelu exists from opset 20)."""
    w = numpy_helper.from_array(RNG.standard_normal((5, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, 4).astype(np.float32), "scale")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "scale"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Gelu", ["n"], ["y"], approximate="tanh")]
    return model_of(nodes, [tensor("x", TensorProto.FLOAT, ["batch", 5])], [tensor("y", TensorProto.FLOAT, None)],
                    opset, [w, b, scale])


# ---------------------------------------------------------------- import at the model's opset
@pytest.mark.parametrize("opset", [20, 21, MAX_OPSET])
def test_models_keep_their_opset_and_run_like_ort(opset: int) -> None:
    model = gelu_layer_norm_model(opset)
    graph = from_onnx(model)
    assert graph.opset == opset
    assert [n.op_type for n in graph.nodes] == ["Gemm", "LayerNormalization", "Gelu"]
    lowered = to_onnx(graph)
    assert {o.domain: o.version for o in lowered.opset_import}[""] == opset
    onnx.checker.check_model(lowered, full_check=True)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    (got,) = GraphRunner(model)(x)
    np.testing.assert_allclose(got, run_ort(model, x)[0], rtol=1e-5, atol=1e-6)


def test_opset_newer_than_ort_is_refused_with_the_limit() -> None:
    model = gelu_layer_norm_model(MAX_OPSET + 1)
    with pytest.raises(GraphError, match=f"opset {MAX_OPSET + 1} of ai.onnx.*runs opsets up to {MAX_OPSET}"):
        from_onnx(model)


def test_older_opsets_import_as_written() -> None:
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),  # axes attribute: opset < 13
             helper.make_node("Softmax", ["u"], ["y"], axis=1)]  # coerced to 2-D: opset < 13
    model = model_of(nodes, [tensor("x", TensorProto.FLOAT, [3, 4])], [tensor("y", TensorProto.FLOAT, None)], 11)
    graph = from_onnx(model)
    assert graph.opset == 11 and graph.nodes[0].attrs["axes"] == [0]
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    (got,) = GraphRunner(model)(x)
    np.testing.assert_allclose(got, run_ort(model, x)[0], rtol=1e-6)


def test_sequence_values_are_refused_naming_the_value() -> None:
    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)]
    model = model_of(nodes, [tensor("x", TensorProto.FLOAT, [2])], [tensor("y", TensorProto.FLOAT, [4])], 18)
    with pytest.raises(GraphError, match="output 'seq' of a SequenceConstruct node is a sequence value.*tensor"):
        from_onnx(model)


# ---------------------------------------------------------------- folding computed shapes
def test_computed_shapes_fold_at_import() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["rows"], axis=0),
             helper.make_node("Concat", ["rows", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    model = model_of(nodes, [tensor("x", TensorProto.FLOAT, [2, 3, 4])], [tensor("y", TensorProto.FLOAT, None)],
                     18, inits)
    graph = from_onnx(model)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    assert graph.outputs[0].shape == (2, 12)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(GraphRunner(model)(x)[0], run_ort(model, x)[0])


def test_symbolic_shapes_stay_computed_at_import_and_fold_when_inlined() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    model = model_of(nodes, [tensor("x", TensorProto.FLOAT, ["n", 3])], [tensor("y", TensorProto.FLOAT, None)], 18)
    graph = from_onnx(model)
    assert [n.op_type for n in graph.nodes] == ["Shape", "Reshape"]
    traced = gd.trace(lambda x: inline_graph(graph, [x])[0], np.zeros((5, 3), np.float32))
    assert [n.op_type for n in traced.nodes] == ["Reshape"]


def test_fold_node_cases() -> None:
    g = Graph("g")
    x = g.add_input("x", np.float32, (2, 3, 4))
    (shape,) = fold_node("Shape", "", {"start": 1, "end": -1}, [x], 1, g.opset_imports)
    np.testing.assert_array_equal(shape, [3])
    assert fold_node("Relu", "", {}, [x], 1, g.opset_imports) is None  # not a constant
    c = g.add_initializer("c", np.array([1.0, -2.0], np.float32))
    np.testing.assert_array_equal(fold_node("Relu", "", {}, [c], 1, g.opset_imports)[0], [1.0, 0.0])
    assert fold_node("RandomUniformLike", "", {}, [c], 1, g.opset_imports) is None  # random: never folded
    big = g.add_initializer("big", np.zeros(1 << 17, np.float32))
    assert fold_node("Relu", "", {}, [big], 1, g.opset_imports) is None  # weight-sized: left to run


# ---------------------------------------------------------------- shape-deciding inputs
def reshape_by_input_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    return model_of(nodes, [tensor("x", TensorProto.FLOAT, [2, 6]), tensor("shape", TensorProto.INT64, [2])],
                    [tensor("y", TensorProto.FLOAT, None)], 18)


def test_shape_inputs_are_found_and_bound_per_value() -> None:
    model = reshape_by_input_model()
    assert static_input_names(model) == ["shape"]
    runner = GraphRunner(model)
    assert runner.static == [1]
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    for target in ([3, 4], [12, 1], [3, 4]):
        (got,) = runner(x, np.array(target, np.int64))
        np.testing.assert_array_equal(got, run_ort(model, x, np.array(target, np.int64))[0])
    assert len(runner._functions) == 2  # [3, 4] twice: one compiled function


def test_shape_only_uses_do_not_make_an_input_static() -> None:
    nodes = [helper.make_node("Shape", ["y"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"])]
    model = model_of(nodes, [tensor("x", TensorProto.FLOAT, [6]), tensor("y", TensorProto.FLOAT, [2, 3])],
                     [tensor("r", TensorProto.FLOAT, None)], 18)
    assert static_input_names(model) == []
    graph = Graph("g")
    a = graph.add_input("a", np.int64, (2,))
    b = graph.add_input("b", np.float32, (2, 3))
    c = graph.add_node("Add", [a, a]).outputs[0]
    graph.outputs = [graph.add_node("Reshape", [b, c], output_types=[(np.float32, ("r0", "r1"))]).outputs[0]]
    assert static_inputs(graph) == [0]


# ---------------------------------------------------------------- inlining into traced code
def test_newer_model_raises_the_trace_opset_and_mixes_with_numpy_ops() -> None:
    model = gelu_layer_norm_model(21)
    graph = from_onnx(model)

    @gd.function
    def step(x):
        return np.tanh(inline_graph(graph, [x])[0]).sum(axis=-1)

    x = RNG.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(step(x), np.tanh(run_ort(model, x)[0]).sum(axis=-1), rtol=1e-5)
    traced = step.get_concrete_function(x).graph("traced")
    assert traced.opset == 21 and {"Gelu", "Tanh", "ReduceSum"} <= {n.op_type for n in traced.nodes}


def test_older_model_is_converted_up_only_when_an_op_changed_form() -> None:
    same = model_of([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", TensorProto.FLOAT, [2, 3])],
                    [tensor("y", TensorProto.FLOAT, [2, 3])], 14)
    changed = model_of([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)],
                       [tensor("x", TensorProto.FLOAT, [2, 3])], [tensor("y", TensorProto.FLOAT, [2])], 13)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for model, converted in ((same, False), (changed, True)):
        graph = from_onnx(model)
        traced = gd.trace(lambda a, g=graph: inline_graph(g, [a])[0] * 2.0, x)
        assert traced.opset == OPSET
        assert bool(graph.meta.converted) == converted
        (got,) = GraphRunner(traced)(x)
        np.testing.assert_allclose(got, run_ort(model, x)[0] * 2.0, rtol=1e-6)


def test_own_opset_needs_an_empty_trace() -> None:
    graph = from_onnx(gelu_layer_norm_model(21))
    with pytest.raises(TracingError, match="own_opset=True.*needs an empty trace"):
        gd.trace(lambda x: inline_graph(graph, [np.tanh(x)], own_opset=True)[0],
                 np.zeros((2, 5), np.float32))
