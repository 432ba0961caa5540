"""PropagateLayoutsPass: the layouts each rule gives (hand-derived), the structure unchanged, honest ``modified``,
a second run changes nothing, numerics unchanged (the pass only annotates)."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import GraphError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.ir.layouts import INPUT_LAYOUTS_KEY, LAYOUT_KEY, RESHARDS_KEY, Layout, MeshSpec
from graphdist.ir.placement import VariableSpec
from graphdist.ir.placement_ops import SHARDING_CONSTRAINT
from graphdist.passes.base import PassContext
from graphdist.passes.propagate_layouts import PropagateLayoutsPass
from tests.passes.pass_checks import check_pass

MESH = MeshSpec.build(("batch", "model"), (1, 2), ["cpu:0", "cpu:1"], "batch")
M = frozenset({"model"})


def _variable(graph: Graph, name: str, shape: tuple[int, ...]) -> Value:
    value = graph.add_input(name, np.float32, shape)
    graph.meta.variables.append((name, VariableSpec(f"{name}#1", name, "<f4", shape)))
    return value


def _node(graph: Graph, op: str, inputs: list, attrs: dict | None = None, domain: str = "") -> Value:
    node = graph.add_node(op, inputs, attrs, domain=domain)
    node.replica = 0
    return node.outputs[0]


def _mlp() -> tuple[Graph, dict[str, Value]]:
    """``relu(x @ w1 + b1) @ w2`` (the Megatron block), then a softmax."""
    graph = Graph("mlp")
    x = graph.add_input("x", np.float32, (4, 8))
    w1, b1, w2 = _variable(graph, "w1", (8, 6)), _variable(graph, "b1", (6,)), _variable(graph, "w2", (6, 4))
    h = _node(graph, "MatMul", [x, w1])
    biased = _node(graph, "Add", [h, b1])
    relu = _node(graph, "Relu", [biased])
    out = _node(graph, "MatMul", [relu, w2])
    soft = _node(graph, "Softmax", [out], {"axis": -1})
    graph.outputs = [soft]
    return graph, {"h": h, "biased": biased, "relu": relu, "out": out, "soft": soft}


LAYOUTS = {"w1#1": (None, "model"), "b1#1": ("model",), "w2#1": ("model", None)}


def _expected_copy() -> Graph:
    return _mlp()[0]


def test_megatron_block_column_then_row_split_is_partial() -> None:
    graph, values = _mlp()
    graph = check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True, expected=_expected_copy())
    assert graph.meta.mesh == MESH
    assert values["h"].meta[LAYOUT_KEY] == Layout((None, "model"))
    assert values["biased"].meta[LAYOUT_KEY] == Layout((None, "model"))
    assert values["relu"].meta[LAYOUT_KEY] == Layout((None, "model"))
    assert values["out"].meta[LAYOUT_KEY] == Layout((None, None), M)  # contracting dim split: a pending sum
    softmax = values["soft"].producer
    assert softmax.meta[INPUT_LAYOUTS_KEY] == [Layout((None, None))]  # reads it summed
    assert softmax.meta[RESHARDS_KEY] == [0]
    assert values["out"].producer.meta[RESHARDS_KEY] == []  # relu and w2 already split along k


def test_a_replicated_operand_is_sliced_to_the_split_contracting_dimension() -> None:
    graph = Graph("contract")
    a = graph.add_input("a", np.float32, (3, 6))
    w = _variable(graph, "w2", (6, 4))
    graph.outputs = [_node(graph, "MatMul", [a, w])]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    matmul = graph.nodes[0]
    assert matmul.meta[INPUT_LAYOUTS_KEY] == [Layout((None, "model")), Layout(("model", None))]
    assert matmul.meta[RESHARDS_KEY] == [0]
    assert graph.outputs[0].meta[LAYOUT_KEY] == Layout((None, None), M)


def test_linear_ops_keep_a_partial_sum_and_others_reduce_it() -> None:
    graph = Graph("partial")
    a = graph.add_input("a", np.float32, (3, 6))
    w = _variable(graph, "w2", (6, 4))
    product = _node(graph, "MatMul", [a, w])
    scaled = _node(graph, "Mul", [product, graph.add_initializer("two", np.float32(2))])
    summed = _node(graph, "ReduceSum", [scaled, graph.add_initializer("axes", np.array([1], np.int64))],
                   {"keepdims": 0})
    exp = _node(graph, "Exp", [summed])
    graph.outputs = [exp]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    assert scaled.meta[LAYOUT_KEY] == Layout((None, None), M)
    assert summed.meta[LAYOUT_KEY] == Layout((None,), M)
    assert exp.producer.meta[INPUT_LAYOUTS_KEY] == [Layout((None,))]
    assert exp.meta[LAYOUT_KEY] == Layout((None,))


def test_reduce_sum_over_a_split_dimension_is_partial_reduce_max_gathers() -> None:
    graph = Graph("reductions")
    w = _variable(graph, "w1", (8, 6))
    axes = graph.add_initializer("axes", np.array([1], np.int64))
    total = _node(graph, "ReduceSum", [w, axes], {"keepdims": 1})
    largest = _node(graph, "ReduceMax", [w, axes], {"keepdims": 1})
    graph.outputs = [total, largest]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    assert total.meta[LAYOUT_KEY] == Layout((None, None), M)
    assert largest.producer.meta[INPUT_LAYOUTS_KEY][0] == Layout((None, None))
    assert largest.producer.meta[RESHARDS_KEY] == [0]


def test_transpose_reshape_and_broadcasting_follow_their_dimensions() -> None:
    graph = Graph("shapes")
    w = _variable(graph, "w1", (8, 6))
    transposed = _node(graph, "Transpose", [w], {"perm": [1, 0]})
    reshaped = _node(graph, "Reshape", [transposed, graph.add_initializer("shape", np.array([1, 6, 8], np.int64))])
    row = _variable(graph, "b1", (6,))
    added = _node(graph, "Add", [w, row])  # b1 broadcast along the rows, split like w1's columns
    merged = _node(graph, "Reshape", [w, graph.add_initializer("flat", np.array([48], np.int64))])
    heads = _node(graph, "Reshape", [w, graph.add_initializer("heads", np.array([8, 2, 3], np.int64))])
    joined = _node(graph, "Reshape", [heads, graph.add_initializer("join", np.array([8, 6], np.int64))])
    graph.outputs = [reshaped, added, merged, joined]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    assert transposed.meta[LAYOUT_KEY] == Layout(("model", None))
    assert reshaped.meta[LAYOUT_KEY] == Layout((None, "model", None))
    assert added.meta[LAYOUT_KEY] == Layout((None, "model"))
    assert added.producer.meta[RESHARDS_KEY] == []
    assert merged.meta[LAYOUT_KEY] == Layout((None,))  # the split dimension is not the outer one: read whole
    assert merged.producer.meta[RESHARDS_KEY] == [0]
    assert heads.meta[LAYOUT_KEY] == Layout((None, "model", None))  # 6 columns cut into 2 heads of 3
    assert joined.meta[LAYOUT_KEY] == Layout((None, "model"))  # and merged back


def test_sharding_constraint_pins_its_output() -> None:
    graph = Graph("constraint")
    x = graph.add_input("x", np.float32, (4, 6))
    pinned = _node(graph, SHARDING_CONSTRAINT, [x], {"layout": ["", "model"]}, GRAPHDIST_DOMAIN)
    graph.outputs = [_node(graph, "Relu", [pinned])]
    check_pass(PropagateLayoutsPass(MESH), graph, modified=True)
    assert pinned.producer.meta[INPUT_LAYOUTS_KEY] == [Layout((None, "model"))]
    assert pinned.producer.meta[RESHARDS_KEY] == [0]
    assert graph.outputs[0].meta[LAYOUT_KEY] == Layout((None, "model"))


def test_op_without_a_rule_reads_replicated_inputs() -> None:
    graph = Graph("fallback")
    w = _variable(graph, "w1", (8, 6))
    graph.outputs = [_node(graph, "CumSum", [w, graph.add_initializer("axis", np.array(1, np.int64))])]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    assert graph.nodes[0].meta[INPUT_LAYOUTS_KEY][0] == Layout((None, None))
    assert graph.outputs[0].meta[LAYOUT_KEY] == Layout((None, None))


def test_axes_of_size_one_split_nothing() -> None:
    mesh = MeshSpec.build(("batch", "model"), (2, 1), ["cpu:0", "cpu:1"], "batch")
    graph, values = _mlp()
    check_pass(PropagateLayoutsPass(mesh, LAYOUTS), graph, modified=True)
    assert all(v.meta[LAYOUT_KEY].is_replicated for v in values.values())


def test_weight_split_over_the_batch_axis_is_fsdp_not_built_here() -> None:
    mesh = MeshSpec.build(("batch", "model"), (2, 1), ["cpu:0", "cpu:1"], "batch")
    with pytest.raises(NotImplementedError, match="FSDP"):
        PropagateLayoutsPass(mesh, {"w1#1": ("batch", None)})(_mlp()[0], PassContext())


def test_variables_without_a_uid_entry_match_patterns_by_name() -> None:
    graph, values = _mlp()
    patterns = [("w1", (None, "model")), ("b1", ("model",)), ("w2", ("model", None))]
    check_pass(PropagateLayoutsPass(MESH, patterns=patterns), graph, modified=True)
    assert values["out"].meta[LAYOUT_KEY] == Layout((None, None), M)
    with pytest.raises(GraphError, match=r"'w2': dimension 1 \(size 4\) is not divisible by mesh axis 'model'"):
        three = MeshSpec.build(("model",), (3,), ["cpu:0", "cpu:1", "cpu:2"], None)
        PropagateLayoutsPass(three, patterns=[("w2", (None, "model"))])(_mlp()[0], PassContext())


def test_gather_and_concat_read_their_axis_whole() -> None:
    graph = Graph("gather")
    table = _variable(graph, "w1", (8, 6))
    ids = graph.add_input("ids", np.int64, (3,))
    rows = _node(graph, "Gather", [table, ids], {"axis": 0})
    joined = _node(graph, "Concat", [rows, rows], {"axis": 1})
    graph.outputs = [rows, joined]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True, feeds={
        "w1": np.arange(48, dtype=np.float32).reshape(8, 6), "ids": np.array([0, 7, 2])})
    assert rows.meta[LAYOUT_KEY] == Layout((None, "model"))
    assert joined.producer.meta[INPUT_LAYOUTS_KEY] == [Layout((None, None))] * 2


def test_partial_plus_a_whole_value_stays_partial_and_is_summed_before_a_reshape() -> None:
    graph = Graph("residual")
    a = graph.add_input("a", np.float32, (3, 6))
    w = _variable(graph, "w2", (6, 4))
    bias = graph.add_input("bias", np.float32, (4,))
    partial = _node(graph, "MatMul", [a, w])
    biased = _node(graph, "Add", [partial, bias])
    flat = _node(graph, "Reshape", [biased, graph.add_initializer("flat", np.array([12], np.int64))])
    graph.outputs = [_node(graph, "Exp", [flat]), _node(graph, "Tanh", [biased])]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    add = biased.producer
    assert add.meta["add_once"] == [1] and add.meta[INPUT_LAYOUTS_KEY][1] == Layout((None,))
    # Exp needs the sum after the reshape: it is taken before it, once, for the Tanh too.
    assert biased.meta[LAYOUT_KEY] == Layout((None, None), M)
    assert flat.producer.meta[INPUT_LAYOUTS_KEY][0] == Layout((None, None))
    assert flat.meta[LAYOUT_KEY] == Layout((None,))
    assert graph.outputs[1].producer.meta[INPUT_LAYOUTS_KEY] == [Layout((None, None))]


def test_gemm_and_conv_follow_their_operands_and_add_the_bias_once() -> None:
    graph = Graph("gemm_conv")
    a = graph.add_input("a", np.float32, (3, 6))
    w = _variable(graph, "w", (4, 6))  # Gemm transB=1: (N, K), K split
    c = graph.add_input("c", np.float32, (4,))
    product = _node(graph, "Gemm", [a, w, c], {"transB": 1})
    image = graph.add_input("image", np.float32, (2, 6, 5, 5))
    kernel = _variable(graph, "k", (4, 6, 3, 3))  # (O, C, kh, kw), O split
    conv = _node(graph, "Conv", [image, kernel], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    graph.outputs = [product, conv]
    check_pass(PropagateLayoutsPass(MESH, {"w#1": (None, "model"), "k#1": ("model", None, None, None)}), graph,
               modified=True)
    gemm = product.producer
    assert gemm.meta[INPUT_LAYOUTS_KEY] == [Layout((None, "model")), Layout((None, "model")), Layout((None,))]
    assert gemm.meta["add_once"] == [2] and product.meta[LAYOUT_KEY] == Layout((None, None), M)
    assert conv.meta[LAYOUT_KEY] == Layout((None, "model", None, None))
    assert conv.producer.meta[RESHARDS_KEY] == [] and "add_once" not in conv.producer.meta


def test_a_pinned_split_is_pulled_back_into_the_producers_of_a_whole_value() -> None:
    """Backward: ``constraint(relu(x @ w), (-, model))`` with everything whole computes the MatMul and the Relu
    on column blocks (w sliced), so the constraint reshards nothing; a value another reader reads whole stays
    whole."""
    graph = Graph("pull")
    x = graph.add_input("x", np.float32, (4, 8))
    w = graph.add_input("w", np.float32, (8, 6))
    product = _node(graph, "MatMul", [x, w])
    relu = _node(graph, "Relu", [product])
    pinned = _node(graph, SHARDING_CONSTRAINT, [relu], {"layout": ["", "model"]}, GRAPHDIST_DOMAIN)
    other = _node(graph, "Exp", [x])
    graph.outputs = [_node(graph, "Tanh", [pinned]), _node(graph, SHARDING_CONSTRAINT, [other],
                                                           {"layout": ["", "model"]}, GRAPHDIST_DOMAIN), other]
    check_pass(PropagateLayoutsPass(MESH), graph, modified=True)
    split = Layout((None, "model"))
    assert product.producer.meta[INPUT_LAYOUTS_KEY] == [Layout((None, None)), split]
    assert product.meta[LAYOUT_KEY] == relu.meta[LAYOUT_KEY] == pinned.meta[LAYOUT_KEY] == split
    assert pinned.producer.meta[RESHARDS_KEY] == [] and relu.producer.meta[RESHARDS_KEY] == []
    assert other.meta[LAYOUT_KEY] == Layout((None, None))  # a graph output: computed whole, sliced for the pin


def _grouped_conv(groups: int, channels: int = 4) -> tuple[Graph, Value]:
    """``conv(image, k, bias)`` with ``groups`` groups; ``k`` (O, C/groups, 3, 3) split by output channels."""
    graph = Graph("grouped")
    image = graph.add_input("image", np.float32, (2, channels, 5, 5))
    kernel = _variable(graph, "k", (channels, channels // groups, 3, 3))
    bias = _variable(graph, "kb", (channels,))
    conv = _node(graph, "Conv", [image, kernel, bias], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                                        "group": groups})
    graph.outputs = [conv]
    return graph, conv


GROUPED = {"k#1": ("model", None, None, None), "kb#1": ("model",)}


@pytest.mark.parametrize("groups", [2, 4])  # 4: depthwise (one channel per group)
def test_grouped_conv_aligned_with_the_axis_splits_whole_groups_without_a_sum(groups: int) -> None:
    graph, conv = _grouped_conv(groups)
    check_pass(PropagateLayoutsPass(MESH, GROUPED), graph, modified=True, expected=_grouped_conv(groups)[0])
    split = Layout((None, "model", None, None))
    assert conv.producer.meta[INPUT_LAYOUTS_KEY] == [split, Layout(("model", None, None, None)), Layout(("model",))]
    assert conv.producer.meta[RESHARDS_KEY] == [0]  # the whole image is sliced by channels, kernel and bias match
    assert conv.meta[LAYOUT_KEY] == split and "add_once" not in conv.producer.meta


def test_grouped_conv_reads_a_split_input_and_slices_its_whole_kernel() -> None:
    graph = Graph("depthwise")
    image = _variable(graph, "image", (2, 4, 5, 5))
    kernel = graph.add_input("k", np.float32, (4, 1, 3, 3))
    conv = _node(graph, "Conv", [image, kernel], {"kernel_shape": [3, 3], "group": 4})
    graph.outputs = [conv]
    check_pass(PropagateLayoutsPass(MESH, {"image#1": (None, "model", None, None)}), graph, modified=True)
    assert conv.producer.meta[INPUT_LAYOUTS_KEY][1] == Layout(("model", None, None, None))
    assert conv.producer.meta[RESHARDS_KEY] == [1]
    assert conv.meta[LAYOUT_KEY] == Layout((None, "model", None, None))


def test_grouped_conv_whose_groups_the_axis_does_not_divide_reads_whole_inputs() -> None:
    graph, conv = _grouped_conv(3, channels=6)
    check_pass(PropagateLayoutsPass(MESH, GROUPED), graph, modified=True)
    assert conv.producer.meta[INPUT_LAYOUTS_KEY] == [Layout((None,) * 4), Layout((None,) * 4), Layout((None,))]
    assert conv.producer.meta[RESHARDS_KEY] == [1, 2] and conv.meta[LAYOUT_KEY] == Layout((None,) * 4)


def _slices() -> tuple[Graph, dict[str, Value]]:
    """Slices of ``w1`` (8, 6), split by columns: rows, columns, all of both (steps 1, open ends), reversed rows."""
    graph = Graph("slices")
    w = _variable(graph, "w1", (8, 6))

    def cut(starts: list[int], ends: list[int], axes: list[int], steps: list[int] | None = None) -> Value:
        bounds = [graph.add_initializer(name, np.array(v, np.int64)) for name, v in
                  (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps or [1] * len(axes)))]
        return _node(graph, "Slice", [w, *bounds])

    values = {"rows": cut([2], [6], [0]), "cols": cut([1], [5], [1]),
              "full": cut([0, -6], [8, 2**62], [0, 1]), "reversed": cut([-1], [-2**62], [0], [-1])}
    graph.outputs = list(values.values())
    return graph, values


def test_slice_keeps_the_split_of_dimensions_it_takes_whole_and_reads_cut_ones_whole() -> None:
    graph, values = _slices()
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True, expected=_slices()[0])
    split = Layout((None, "model"))
    assert values["rows"].meta[LAYOUT_KEY] == values["full"].meta[LAYOUT_KEY] == split
    assert values["rows"].producer.meta[RESHARDS_KEY] == values["full"].producer.meta[RESHARDS_KEY] == []
    assert values["cols"].producer.meta[INPUT_LAYOUTS_KEY][0] == Layout((None, None))
    assert values["cols"].producer.meta[RESHARDS_KEY] == [0] and values["cols"].meta[LAYOUT_KEY] == Layout((None,) * 2)
    assert values["reversed"].meta[LAYOUT_KEY] == split  # the rows reversed, the columns untouched


def test_slice_of_a_partial_sum_stays_partial() -> None:
    graph = Graph("partial_slice")
    a = graph.add_input("a", np.float32, (3, 6))
    w = _variable(graph, "w2", (6, 4))
    bounds = [graph.add_initializer(n, np.array(v, np.int64)) for n, v in (("s", [1]), ("e", [3]), ("x", [1]))]
    cut = _node(graph, "Slice", [_node(graph, "MatMul", [a, w]), *bounds])
    graph.outputs = [_node(graph, "Exp", [cut])]
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    assert cut.meta[LAYOUT_KEY] == Layout((None, None), M)  # summed after the slice: fewer bytes
    assert cut.producer.meta[RESHARDS_KEY] == [] and graph.outputs[0].producer.meta[RESHARDS_KEY] == [0]


def _pads(fill: float = 0.0) -> tuple[Graph, dict[str, Value]]:
    """``w1`` (8, 6) split by columns padded along its rows, along its columns; a partial product padded."""
    graph = Graph("pads")
    w = _variable(graph, "w1", (8, 6))
    a = graph.add_input("a", np.float32, (3, 6))
    w2 = _variable(graph, "w2", (6, 4))

    def pad(value: Value, amounts: list[int]) -> Value:
        return _node(graph, "Pad", [value, graph.add_initializer("pads", np.array(amounts, np.int64)),
                                    graph.add_initializer("fill", np.float32(fill))], {"mode": "constant"})

    values = {"rows": pad(w, [1, 0, 2, 0]), "cols": pad(w, [0, 1, 0, 0]),
              "partial": pad(_node(graph, "MatMul", [a, w2]), [1, 0, 0, 0])}
    values["exp"] = _node(graph, "Exp", [values["partial"]])
    graph.outputs = [values["rows"], values["cols"], values["exp"]]
    return graph, values


def test_pad_keeps_the_split_of_dimensions_it_does_not_pad_and_a_partial_sum_of_zeros() -> None:
    graph, values = _pads()
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True, expected=_pads()[0])
    assert values["rows"].meta[LAYOUT_KEY] == Layout((None, "model")) and not values["rows"].producer.meta[RESHARDS_KEY]
    assert values["cols"].producer.meta[INPUT_LAYOUTS_KEY][0] == Layout((None, None))
    assert values["cols"].meta[LAYOUT_KEY] == Layout((None, None))
    assert values["partial"].meta[LAYOUT_KEY] == Layout((None, None), M)


def test_pad_with_a_non_zero_fill_sums_a_partial_input_first() -> None:
    graph, values = _pads(fill=1.0)
    check_pass(PropagateLayoutsPass(MESH, LAYOUTS), graph, modified=True)
    assert values["partial"].producer.meta[INPUT_LAYOUTS_KEY][0] == Layout((None, None))  # each summand padded
    assert values["partial"].meta[LAYOUT_KEY] == Layout((None, None))                   # with 1 would add n
