"""Lowering to ONNX and importing from ONNX.

Lowered models pass ``onnx.checker`` with ``full_check`` and load in ONNX
Runtime; ``to_onnx -> from_onnx`` keeps structure and numerics; import turns
``Constant`` nodes into initializers, keeps the model's opset and names what it
cannot import.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphdist as gd
from graphdist.errors import GraphError
from graphdist.ir import GRAPHDIST_DOMAIN, OPSET, Graph, from_onnx, to_onnx, verify
from graphdist.ir.onnx_io import ORT_IR_VERSION
from graphdist.trace.inline import inline_graph

RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 5)).astype(np.float32)
W = RNG.standard_normal((5, 3)).astype(np.float32)
IDS = np.array([0, 3, 1], np.int64)


def step(x, ids):
    h = np.tanh(x @ W) + 0.5
    picked = h[ids]
    return {"sum": picked.sum(axis=-1, keepdims=True), "t": np.transpose(h)[::-1, 1:], "mask": x > 0}


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def feeds_for(graph: Graph, *arrays: np.ndarray) -> dict[str, np.ndarray]:
    return {v.name: a for v, a in zip(graph.inputs, arrays)}


def test_traced_graph_lowers_checks_and_runs_in_ort() -> None:
    graph = gd.trace(step, X, IDS)
    model = to_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == ORT_IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    assert model.graph.name == graph.name and model.producer_name == "graphdist"
    assert [i.name for i in model.graph.input] == [v.name for v in graph.inputs]
    assert {t.name for t in model.graph.initializer} == set(graph.initializers)
    outputs = gd.nest.unflatten(graph.meta.output_tree, run_ort(model, feeds_for(graph, X, IDS)))
    expected = step(X, IDS)
    for key in expected:
        np.testing.assert_allclose(outputs[key], expected[key], rtol=1e-5)
        assert outputs[key].dtype == expected[key].dtype


def test_value_info_covers_intermediates() -> None:
    graph = gd.trace(step, X, IDS)
    model = to_onnx(graph)
    declared = {vi.name for vi in model.graph.value_info}
    intermediates = {v.name for n in graph.nodes for v in n.outputs} - {v.name for v in graph.outputs}
    assert declared == intermediates


def test_symbolic_dimensions_are_dim_params() -> None:
    graph = gd.trace(lambda x: np.tanh(x).sum(axis=1), gd.TensorSpec((None, 5), np.float32))
    model = to_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param == graph.inputs[0].shape[0]
    out = run_ort(model, {graph.inputs[0].name: X})[0]
    np.testing.assert_allclose(out, np.tanh(X).sum(axis=1), rtol=1e-5)


def test_graphdist_domain_declares_its_opset() -> None:
    graph = Graph("collective")
    x = graph.add_input("x", np.float32, (2, 3))
    reduced = graph.add_node("AllReduce", [x], {"reduce_op": "SUM", "group_size": 1}, domain=GRAPHDIST_DOMAIN)
    gathered = graph.add_node("AllGather", [reduced.outputs[0]], {"axis": 1, "group_size": 2},
                              domain=GRAPHDIST_DOMAIN)
    relu = graph.add_node("Relu", [gathered.outputs[0]])
    reduced.device, reduced.replica = "cpu:0", 0
    graph.outputs = relu.outputs
    verify(graph)
    model = to_onnx(graph, doc="two collectives")
    onnx.checker.check_model(model, full_check=True)
    assert {(o.domain, o.version) for o in model.opset_import} == {("", OPSET), ("graphdist", 1)}
    node = model.graph.node[0]
    assert (node.domain, node.op_type) == ("graphdist", "AllReduce")
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {"group_size": 1, "reduce_op": b"SUM"}
    assert {p.key: p.value for p in node.metadata_props} == {"device": "cpu:0", "replica": "0"}
    assert model.doc_string == "two collectives"

    back = from_onnx(model)
    assert [n.qualified_op for n in back.nodes] == ["graphdist.AllReduce", "graphdist.AllGather", "Relu"]
    assert back.nodes[0].attrs == {"reduce_op": "SUM", "group_size": 1}
    assert back.outputs[0].shape == (2, 6)
    verify(back)


def test_round_trip_preserves_structure_and_numerics() -> None:
    graph = gd.trace(step, X, IDS)
    model = to_onnx(graph)
    back = from_onnx(model)
    verify(back)
    assert [(n.name, n.qualified_op) for n in back.nodes] == [(n.name, n.qualified_op) for n in graph.nodes]
    for ours, theirs in zip(graph.nodes, back.nodes):
        assert [None if v is None else v.name for v in ours.inputs] == [
            None if v is None else v.name for v in theirs.inputs
        ]
        assert [(v.name, v.dtype, v.shape) for v in ours.outputs] == [
            (v.name, v.dtype, v.shape) for v in theirs.outputs
        ]
        assert set(ours.attrs) == set(theirs.attrs)
        for key, value in ours.attrs.items():
            assert np.array_equal(np.asarray(value), np.asarray(theirs.attrs[key])), key
    assert [(v.name, v.dtype, v.shape) for v in back.inputs] == [(v.name, v.dtype, v.shape) for v in graph.inputs]
    assert [v.name for v in back.outputs] == [v.name for v in graph.outputs]
    for name, value in graph.initializers.items():
        np.testing.assert_array_equal(back.initializers[name].const_value, value.const_value)
    again = to_onnx(back)
    onnx.checker.check_model(again, full_check=True)
    for got, want in zip(run_ort(again, feeds_for(back, X, IDS)), run_ort(model, feeds_for(graph, X, IDS))):
        np.testing.assert_array_equal(got, want)
    # Names stay reserved: new nodes in the imported graph do not collide.
    extra = back.add_node("Relu", [back.inputs[0]], name=back.nodes[0].name)
    assert extra.name != back.nodes[0].name and extra.outputs[0].name not in {v.name for v in graph.values()}
    verify(back)


def helper_model(opset: int = OPSET) -> onnx.ModelProto:
    """y = relu(x * c + b) with c from a Constant (value form) and b from value_floats."""
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full((3,), 2.0, np.float32))),
        helper.make_node("Constant", [], ["b"], value_floats=[0.5, -1.0, 0.0]),
        helper.make_node("Constant", [], ["shape"], value_ints=[3, 2]),
        helper.make_node("Mul", ["x", "c"], ["m"], name="scale"),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "handmade",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ORT_IR_VERSION
    return model


def test_from_onnx_with_constant_nodes() -> None:
    model = helper_model()
    onnx.checker.check_model(model, full_check=True)
    graph = from_onnx(model)
    verify(graph)
    assert set(graph.initializers) == {"c", "b", "shape"}
    assert graph.initializers["b"].dtype == np.float32 and graph.initializers["shape"].dtype == np.int64
    np.testing.assert_array_equal(graph.initializers["shape"].const_value, [3, 2])
    assert [n.op_type for n in graph.nodes] == ["Mul", "Add", "Relu", "Reshape"]
    assert graph.nodes[0].name == "scale" and graph.outputs[0].shape == (3, 2)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    expected = np.maximum(x * 2.0 + np.array([0.5, -1.0, 0.0], np.float32), 0).reshape(3, 2)
    np.testing.assert_allclose(run_ort(to_onnx(graph), {"x": x})[0], expected, rtol=1e-6)


def test_from_onnx_imports_older_opsets_as_written() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
            helper.make_node("ReduceMean", ["u"], ["m"], axes=[2], keepdims=0),
            helper.make_node("Split", ["m"], ["s0", "s1"], axis=1, split=[1, 2]),
        ],
        "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("s0", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("s1", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    imported = from_onnx(model)
    verify(imported)
    assert [v.shape for v in imported.outputs] == [(1, 1), (1, 2)]
    lowered = to_onnx(imported)
    onnx.checker.check_model(lowered, full_check=True)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    s0, s1 = run_ort(lowered, {"x": x})
    mean = x.mean(axis=1)[None]
    # Means of standard-normal rows can be near zero, where ORT's summation order (which depends on the
    # host CPU's vector width) and numpy's differ by more than rtol: an absolute floor at float32 ulps of 1.
    np.testing.assert_allclose(s0, mean[:, :1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s1, mean[:, 1:], rtol=1e-6, atol=1e-6)


def test_from_onnx_path(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(helper_model(), str(path))
    assert [n.op_type for n in from_onnx(str(path)).nodes] == ["Mul", "Add", "Relu", "Reshape"]


def test_from_onnx_op_of_an_unknown_domain_names_it() -> None:
    graph = helper.make_graph(
        [helper.make_node("FusedGelu", ["x"], ["y"], name="fused", domain="com.example")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(GraphError, match=r"node 'fused' \(FusedGelu\).*no ONNX schema in domain 'com.example'"):
        from_onnx(model)


def test_from_onnx_if_reads_outer_values_through_explicit_captures() -> None:
    def branch(name: str, op: str) -> onnx.GraphProto:
        node = helper.make_node(op, ["x", "x"], [f"{name}_out"])  # x: a value of the enclosing graph
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT,
                                                                                  [2])])

    node = helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=branch("then", "Add"),
                            else_branch=branch("else", "Mul"))
    relu = helper.make_node("Relu", ["x0"], ["x"])
    graph = helper.make_graph([relu, node], "branchy", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                                                        helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = ORT_IR_VERSION
    imported = from_onnx(model)
    (if_node,) = imported.find_nodes("If")
    assert [v.name for v in if_node.inputs] == ["cond", "x"]  # the captured outer value is an explicit input
    x = np.array([-1.0, 3.0], np.float32)
    from graphdist.compile.graph_runner import GraphRunner

    runner = GraphRunner(imported)
    for cond in (True, False):
        (got,) = runner(np.array(cond), x)
        np.testing.assert_array_equal(got, run_ort(model, {"cond": np.array(cond), "x0": x})[0])
    # inlined into a trace the captured value gets a new name: lowering renames the subgraph's reference
    traced = gd.trace(lambda c, a: inline_graph(imported, [c, np.maximum(a, 0.5)])[0], np.array(True), x)
    lowered = to_onnx(traced)
    onnx.checker.check_model(lowered, full_check=True)
    assert run_ort(lowered, feeds_for(traced, np.array(True), x))[0].tolist() == [1.0, 6.0]


def test_from_onnx_rejects_unknown_rank_inputs() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "norank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(GraphError, match="'x' has an unknown rank"):
        from_onnx(model)


def test_unsupported_constant_form() -> None:
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.0], np.float32), "values"),
                                       numpy_helper.from_array(np.array([0], np.int64), "indices"), [3])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["s"], name="label", sparse_value=sparse)], "sparse", [],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(GraphError, match=r"node 'label' \(Constant\).*sparse_value"):
        from_onnx(model)


def test_attribute_lowering() -> None:
    graph = Graph("attrs")
    x = graph.add_input("x", np.float32, ())
    same = graph.add_node("Transpose", [x], {"perm": []})
    cast = graph.add_node("Cast", [same.outputs[0]], {"to": np.int64(TensorProto.DOUBLE)})
    graph.outputs = cast.outputs
    model = to_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    attrs = {a.name: a for node in model.graph.node for a in node.attribute}
    assert attrs["perm"].type == onnx.AttributeProto.INTS and list(attrs["perm"].ints) == []
    assert attrs["to"].i == TensorProto.DOUBLE
    assert run_ort(model, {"x": np.array(1.5, np.float32)})[0].dtype == np.float64


def test_from_onnx_file_errors(tmp_path) -> None:
    import graphdist as gd
    from graphdist.ir import from_onnx

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage\x00\x01")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(gd.GraphError, match="not a readable ONNX model"):
        from_onnx(str(bad))
    with pytest.raises(gd.GraphError, match="holds no ONNX graph"):
        from_onnx(empty)
    with pytest.raises(gd.GraphError, match="does not exist"):
        from_onnx(str(tmp_path / "missing.onnx"))
