"""Control-flow subgraphs: the ops they hold, and If/Loop output types from their subgraphs' declared types."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from graphdist.ir.subgraphs import control_flow_types, subgraph_ops

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def branch(name: str, shape, elem: int = FLOAT, nodes=()) -> onnx.AttributeProto:
    graph = helper.make_graph(list(nodes) or [helper.make_node("Identity", ["x"], [f"{name}_out"])], name, [],
                              [helper.make_tensor_value_info(f"{name}_out", elem, shape)])
    return helper.make_attribute(name, graph)


def dims(type_proto: onnx.TypeProto | None):
    if type_proto is None:
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in type_proto.tensor_type.shape.dim]


def test_if_types_merge_the_branches_dimension_by_dimension() -> None:
    attrs = {"then_branch": branch("then_branch", [2, 3]), "else_branch": branch("else_branch", [2, 5])}
    (merged,) = control_flow_types("If", attrs, [None], None, 1)
    assert merged.tensor_type.elem_type == FLOAT and dims(merged) == [2, None]
    same = {"then_branch": branch("then_branch", [2, 3]), "else_branch": branch("else_branch", [2, 3])}
    assert dims(control_flow_types("If", same, [None], None, 1)[0]) == [2, 3]


def test_if_types_are_unknown_when_the_branches_differ_in_rank_or_type() -> None:
    ranks = {"then_branch": branch("then_branch", [2]), "else_branch": branch("else_branch", [2, 1])}
    types = {"then_branch": branch("then_branch", [2]), "else_branch": branch("else_branch", [2], INT64)}
    assert control_flow_types("If", ranks, [None], None, 1) == [None]
    assert control_flow_types("If", types, [None], None, 1) == [None]


def test_loop_types_keep_carried_inputs_and_stack_scan_outputs() -> None:
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Identity", ["x"], ["x_out"]),
         helper.make_node("Identity", ["x"], ["scan"])], "body",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in (("i", INT64, []), ("c", BOOL, []),
                                                                 ("x", FLOAT, ["N", 3]))],
        [helper.make_tensor_value_info("c_out", BOOL, []), helper.make_tensor_value_info("x_out", FLOAT, ["N", 3]),
         helper.make_tensor_value_info("scan", FLOAT, ["N", 3])])
    attrs = {"body": helper.make_attribute("body", body)}
    given = helper.make_tensor_type_proto(FLOAT, [2, 3])
    carried, scan = control_flow_types("Loop", attrs, [None, None, given], 4, 2)
    assert dims(carried) == [None, 3]  # the body's [N, 3]: the rows may change from one iteration to the next
    assert dims(scan) == [4, "N", 3]
    assert dims(control_flow_types("Loop", attrs, [None, None, given], None, 2)[1]) == [None, "N", 3]
    other = helper.make_tensor_type_proto(FLOAT, [2, 4])  # the body declares 3 columns: not this value's type
    assert control_flow_types("Loop", attrs, [None, None, other], 4, 2)[0] is None


def test_subgraph_ops_reach_nested_subgraphs() -> None:
    inner = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["m"], axes=[1])], "inner", [],
                              [helper.make_tensor_value_info("m", FLOAT, None)])
    nested_if = helper.make_node("If", ["c"], ["m"], then_branch=inner, else_branch=inner)
    outer = branch("then_branch", None, nodes=[nested_if])
    assert subgraph_ops([{"then_branch": outer}]) == {("If", ""), ("ReduceMean", "")}
