"""The OpDef registry and its shape/dtype rules.

Each rule is checked on hand-picked cases, on its errors, and against ONNX's
own shape inference (``onnx.shape_inference`` in strict mode) so the IR and
the lowered model agree on every output type.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graphdist.errors import GraphError
from graphdist.ir import Graph, OpDef, get_opdef, register_op, registered_ops, to_onnx
from graphdist.ir import ops as ir_ops
from graphdist.ir.ops import broadcast_shapes, has_opdef, normalize_axis, numpy_dtype, onnx_dtype


def build(op_type: str, inputs: list, attrs: dict | None = None, **kwargs):
    """A graph with one ``op_type`` node. ``inputs``: ``(dtype, shape)`` for graph
    inputs, numpy arrays for initializers, ``None`` for omitted inputs.
    """
    graph = Graph(op_type.lower())
    values = []
    for index, spec in enumerate(inputs):
        if spec is None:
            values.append(None)
        elif isinstance(spec, np.ndarray):
            values.append(graph.add_initializer(f"c{index}", spec))
        else:
            values.append(graph.add_input(f"x{index}", *spec))
    node = graph.add_node(op_type, values, attrs, **kwargs)
    graph.outputs = list(node.outputs)
    return graph, node


def types(node) -> list[tuple[str, tuple]]:
    return [(v.dtype.name, v.shape) for v in node.outputs]


def onnx_types(graph: Graph) -> list[tuple[str, tuple]]:
    model = to_onnx(graph)
    for output in model.graph.output:  # let ONNX infer the outputs itself
        output.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    result = []
    for output in inferred.graph.output:
        tensor = output.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim)
        result.append((numpy_dtype(tensor.elem_type).name, dims))
    return result


F32 = np.float32
I64 = np.int64

RULES = [
    ("Add", [(F32, (3, 1)), (F32, (1, 4))], None, [("float32", (3, 4))]),
    ("Mul", [(F32, (4,)), (F32, (2, 3, 4))], None, [("float32", (2, 3, 4))]),
    ("Less", [(I64, (2, 3)), (I64, ())], None, [("bool", (2, 3))]),
    ("And", [(np.bool_, (2,)), (np.bool_, (3, 1))], None, [("bool", (3, 2))]),
    ("Pow", [(F32, (2, 3)), (I64, ())], None, [("float32", (2, 3))]),
    ("Where", [(np.bool_, (2, 1)), (F32, (3,)), (F32, ())], None, [("float32", (2, 3))]),
    ("Exp", [(F32, (5,))], None, [("float32", (5,))]),
    ("IsNaN", [(F32, (2, 2))], None, [("bool", (2, 2))]),
    ("MatMul", [(F32, (4,)), (F32, (4,))], None, [("float32", ())]),
    ("MatMul", [(F32, (3, 4)), (F32, (4,))], None, [("float32", (3,))]),
    ("MatMul", [(F32, (4,)), (F32, (4, 5))], None, [("float32", (5,))]),
    ("MatMul", [(F32, (2, 1, 3, 4)), (F32, (5, 4, 2))], None, [("float32", (2, 5, 3, 2))]),
    ("Reshape", [(F32, (2, 3, 4)), np.array([4, -1], I64)], None, [("float32", (4, 6))]),
    ("Reshape", [(F32, (2, 3, 4)), np.array([0, -1], I64)], None, [("float32", (2, 12))]),
    ("Reshape", [(F32, (0, 3)), np.array([3, 0], I64)], {"allowzero": 1}, [("float32", (3, 0))]),
    ("ReduceSum", [(F32, (2, 3, 4)), np.array([1, -1], I64)], {"keepdims": 1}, [("float32", (2, 1, 1))]),
    ("ReduceSum", [(F32, (2, 3, 4)), np.array([0], I64)], {"keepdims": 0}, [("float32", (3, 4))]),
    ("ReduceMean", [(F32, (2, 3))], {"keepdims": 0}, [("float32", ())]),
    ("ReduceMax", [(F32, (2, 3))], {"keepdims": 1}, [("float32", (1, 1))]),
    ("ReduceSum", [(F32, (2, 3)), np.array([], I64)], {"keepdims": 0, "noop_with_empty_axes": 1},
     [("float32", (2, 3))]),
    ("ArgMax", [(F32, (2, 3, 4))], {"axis": -1, "keepdims": 0}, [("int64", (2, 3))]),
    ("ArgMin", [(F32, (2, 3, 4))], {"axis": 1, "keepdims": 1}, [("int64", (2, 1, 4))]),
    ("Transpose", [(F32, (2, 3, 4))], {"perm": [2, 0, 1]}, [("float32", (4, 2, 3))]),
    ("Transpose", [(F32, (2, 3, 4))], None, [("float32", (4, 3, 2))]),
    ("Unsqueeze", [(F32, (2, 3)), np.array([0, -1], I64)], None, [("float32", (1, 2, 3, 1))]),
    ("Squeeze", [(F32, (1, 3, 1)), np.array([-1], I64)], None, [("float32", (1, 3))]),
    ("Squeeze", [(F32, (1, 3, 1))], None, [("float32", (3,))]),
    ("Concat", [(F32, (2, 3)), (F32, (2, 5))], {"axis": -1}, [("float32", (2, 8))]),
    ("Split", [(F32, (2, 6)), np.array([1, 2, 3], I64)], {"axis": 1},
     [("float32", (2, 1)), ("float32", (2, 2)), ("float32", (2, 3))]),
    ("Split", [(F32, (6, 2))], {"axis": 0, "num_outputs": 3}, [("float32", (2, 2))] * 3),
    ("Split", [(F32, (7, 2))], {"axis": 0, "num_outputs": 3}, [("float32", (3, 2))] * 2 + [("float32", (1, 2))]),
    ("Slice", [(F32, (10, 4)), np.array([1], I64), np.array([8], I64), np.array([0], I64), np.array([3], I64)],
     None, [("float32", (3, 4))]),
    ("Slice", [(F32, (10, 4)), np.array([-1], I64), np.array([np.iinfo(np.int64).min], I64),
               np.array([0], I64), np.array([-2], I64)], None, [("float32", (5, 4))]),
    ("Slice", [(F32, (10, 4)), np.array([3, 0], I64), np.array([0, 2], I64)], None, [("float32", (0, 2))]),
    ("Gather", [(F32, (10, 3)), (I64, (2, 4))], {"axis": 0}, [("float32", (2, 4, 3))]),
    ("Gather", [(F32, (10, 3)), (np.int32, ())], {"axis": -1}, [("float32", (10,))]),
    ("Cast", [(F32, (2,))], {"to": onnx.TensorProto.INT32}, [("int32", (2,))]),
    ("Expand", [(F32, (3, 1)), np.array([2, 1, 4], I64)], None, [("float32", (2, 3, 4))]),
    ("Clip", [(F32, (3,)), np.array(0.0, F32), None], None, [("float32", (3,))]),
    ("Softmax", [(F32, (2, 3))], {"axis": -1}, [("float32", (2, 3))]),
    ("Mod", [(I64, (3,)), (I64, (3,))], {"fmod": 0}, [("int64", (3,))]),
]


@pytest.mark.parametrize(("op_type", "inputs", "attrs", "expected"), RULES,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_shape_rule_matches_onnx_inference(op_type, inputs, attrs, expected) -> None:
    graph, node = build(op_type, inputs, attrs)
    assert types(node) == expected
    assert onnx_types(graph) == expected


@pytest.mark.parametrize(
    ("op_type", "inputs", "attrs", "pattern"),
    [
        ("Add", [(F32, (3,)), (F32, (4,))], None, r"shapes \(3,\) and \(4,\) cannot be broadcast"),
        ("Add", [(F32, (3,)), (I64, (3,))], None, r"one dtype.*float32\[3\], int64\[3\].*Cast"),
        ("MatMul", [(F32, (3, 4)), (F32, (5, 2))], None, r"inner dimensions differ.*float32\[3,4\] @ float32\[5,2\]"),
        ("MatMul", [(F32, ()), (F32, (2,))], None, r"rank >= 1"),
        ("Reshape", [(F32, (2, 3)), np.array([4, -1], I64)], None, r"cannot reshape float32\[2,3\] into \(4, -1\)"),
        ("Reshape", [(F32, (2, 3)), np.array([-1, -1], I64)], None, r"at most one dimension may be -1"),
        ("Reshape", [(F32, (2, 3)), (I64, (2,))], None, r"shape operand must be a constant"),
        ("ReduceSum", [(F32, (2, 3)), np.array([2], I64)], None, r"axis 2 is out of range for a tensor of rank 2"),
        ("Transpose", [(F32, (2, 3))], {"perm": [0, 0]}, r"not a permutation"),
        ("Squeeze", [(F32, (2, 1)), np.array([0], I64)], None, r"axis 0 of float32\[2,1\] has size 2"),
        ("Concat", [(F32, (2, 3)), (F32, (3, 3))], {"axis": 1}, r"differ outside axis 1"),
        ("Concat", [(F32, (2, 3)), (F32, (3,))], {"axis": 0}, r"different ranks"),
        ("Split", [(F32, (2,))], {"axis": 0, "num_outputs": 3}, r"cannot be split into 3 non-empty parts"),
        ("Split", [(F32, (5,)), np.array([2, 2], I64)], {"axis": 0}, r"sizes \[2, 2\] do not add up to 5"),
        ("Slice", [(F32, (5,)), np.array([0], I64), np.array([5], I64), np.array([0], I64), np.array([0], I64)],
         None, r"step of axis 0 must not be 0"),
        ("Gather", [(F32, (5,)), (F32, (2,))], {"axis": 0}, r"indices must be int32 or int64"),
        ("Gather", [(F32, (5,)), (I64, (2,))], {"axis": 1}, r"Gather axis 1 is out of range"),
        ("Where", [(F32, (2,)), (F32, (2,)), (F32, (2,))], None, r"condition must be bool"),
        ("Relu", [], None, r"input 0 is missing"),
    ],
    ids=lambda v: v if isinstance(v, str) and v[:1].isupper() else None,
)
def test_shape_rule_errors(op_type, inputs, attrs, pattern) -> None:
    with pytest.raises(GraphError, match=pattern):
        build(op_type, inputs, attrs)


def test_symbolic_dimensions_propagate() -> None:
    _, node = build("MatMul", [(F32, ("batch", 4)), (F32, (4, 3))])
    assert node.outputs[0].shape == ("batch", 3)
    _, node = build("Add", [(F32, ("batch", 1)), (F32, (1, 3))])
    assert node.outputs[0].shape == ("batch", 3)
    _, node = build("Reshape", [(F32, ("batch", 3, 4)), np.array([0, -1], I64)])
    assert node.outputs[0].shape == ("batch", 12)
    _, node = build("Concat", [(F32, ("n", 2)), (F32, ("m", 2))], {"axis": 0})
    assert node.outputs[0].shape == ("n+m", 2)
    with pytest.raises(GraphError, match="symbolic"):
        build("Reshape", [(F32, ("batch", 4)), np.array([-1], I64)])


def test_broadcast_shapes() -> None:
    assert broadcast_shapes((3, 1), (1, 4)) == (3, 4)
    assert broadcast_shapes((4,), (2, 3, 4), ()) == (2, 3, 4)
    assert broadcast_shapes() == ()
    assert broadcast_shapes(("b", 1), (1, 5)) == ("b", 5)
    assert broadcast_shapes(("b", 3), (7, 3)) == (7, 3)
    with pytest.raises(GraphError, match=r"shapes \(2, 3\) and \(3, 2\) cannot be broadcast together"):
        broadcast_shapes((2, 3), (3, 2))
    with pytest.raises(GraphError):
        broadcast_shapes((3,), (1,), (4,))


def test_normalize_axis() -> None:
    assert normalize_axis(-1, 3) == 2 and normalize_axis(0, 1) == 0 and normalize_axis(2, 3) == 2
    with pytest.raises(GraphError, match="axis 3 is out of range for a tensor of rank 3; valid axes are -3..2"):
        normalize_axis(3, 3)
    with pytest.raises(GraphError, match="axis -4"):
        normalize_axis(-4, 3)
    with pytest.raises(GraphError, match="scalar has no axes"):
        normalize_axis(0, 0)


def test_registry_lookup_error_lists_supported_ops() -> None:
    with pytest.raises(GraphError, match="op Einsum is not supported by graphdist") as info:
        get_opdef("Einsum")
    message = str(info.value)
    for name in ("Add", "MatMul", "Reshape", "Gather"):
        assert name in message
    assert "AllReduce" not in message  # other domain
    with pytest.raises(GraphError, match=r"graphdist\.Nope.*AllGather, AllReduce"):
        get_opdef("Nope", "graphdist")
    with pytest.raises(GraphError, match="op Frobnicate is not an op graphdist knows: no ONNX schema"):
        build("Frobnicate", [(F32, (2,))])


def test_ops_without_a_hand_written_opdef_get_onnx_shape_inference() -> None:
    _, node = build("Einsum", [(F32, (2, 3)), (F32, (3, 4))], {"equation": "ij,jk->ik"})
    assert types(node) == [("float32", (2, 4))]
    assert "generic" in get_opdef("Einsum", "", 18).doc and get_opdef("Einsum", "", 18).gradient is None
    _, node = build("NonZero", [(F32, (2, 3))])  # a data-dependent size: a symbolic dimension
    assert node.outputs[0].shape[0] == 2 and isinstance(node.outputs[0].shape[1], str)
    _, node = build("Tile", [(F32, (2, 3)), np.array([2, 1], np.int64)])  # small constants are data
    assert types(node) == [("float32", (4, 3))]
    with pytest.raises(GraphError, match=r"Einsum \(einsum\): .*Rank of input 0 \(2\) does not match"):
        build("Einsum", [(F32, (2, 3))], {"equation": "ijk->i"})


def test_hand_written_opdefs_apply_from_their_since_opset() -> None:
    assert get_opdef("Softmax", "", 13) is get_opdef("Softmax")  # the per-axis form
    assert get_opdef("Softmax", "", 11) is not get_opdef("Softmax")  # coerced to 2-D before 13: generic
    assert get_opdef("Relu", "", 6) is get_opdef("Relu")
    assert get_opdef("ReduceMean", "", 17) is not get_opdef("ReduceMean")  # axes attribute before 18
    with pytest.raises(GraphError, match="Upsample was removed from 'ai.onnx' at opset 10"):
        get_opdef("Upsample", "", 18)
    with pytest.raises(GraphError, match="Gelu does not exist at opset 18"):
        get_opdef("Gelu", "", 18)


def test_registry_contents() -> None:
    ops = registered_ops()
    assert ("", "MatMul") in ops and ("graphdist", "AllReduce") in ops
    assert has_opdef("Relu") and not has_opdef("Relu", "graphdist")
    for domain, op_type in ops:
        opdef = get_opdef(op_type, domain)
        assert opdef.op_type == op_type and opdef.domain == domain and callable(opdef.infer)
        if domain == "graphdist":
            assert opdef.reference is not None, f"graphdist.{op_type} needs a reference implementation"


def test_register_custom_op() -> None:
    def infer(node, _):
        return [(node.inputs[0].dtype, (2, *node.inputs[0].shape))]

    opdef = register_op(OpDef("Twice", "test.domain", infer, reference=lambda x: (np.stack([x, x]),)))
    try:
        _, node = build("Twice", [(F32, (3,))], domain="test.domain")
        assert types(node) == [("float32", (2, 3))]
        assert get_opdef("Twice", "test.domain") is opdef
    finally:
        ir_ops._REGISTRY.pop(("test.domain", "Twice"))
    assert not has_opdef("Twice", "test.domain")


def test_graphdist_ops() -> None:
    _, node = build("AllGather", [(F32, (2, 3))], {"axis": 1, "group_size": 4}, domain="graphdist")
    assert types(node) == [("float32", (2, 12))]
    _, node = build("ReplicaId", [], domain="graphdist")
    assert types(node) == [("int32", ())]
    _, node = build("AllReduce", [(F32, ("b", 3))], {"reduce_op": "MEAN", "group_size": 2}, domain="graphdist")
    assert types(node) == [("float32", ("b", 3))]

    a, b = np.array([1.0, 4.0], F32), np.array([3.0, 2.0], F32)
    all_reduce = get_opdef("AllReduce", "graphdist").reference
    for op, want in [("SUM", [4, 6]), ("MEAN", [2, 3]), ("MAX", [3, 4]), ("MIN", [1, 2])]:
        outs = all_reduce(a, b, reduce_op=op)
        assert len(outs) == 2 and all(o.dtype == F32 for o in outs)
        np.testing.assert_array_equal(outs[0], want)
        assert outs[0] is not outs[1]
    gathered = get_opdef("AllGather", "graphdist").reference(a[None], b[None], axis=0)
    np.testing.assert_array_equal(gathered[1], [[1, 4], [3, 2]])


def test_dtype_conversions_round_trip() -> None:
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.bool_, np.float16, np.uint8):
        assert numpy_dtype(onnx_dtype(dtype)) == np.dtype(dtype)
    assert onnx_dtype(np.float32) == onnx.TensorProto.FLOAT
