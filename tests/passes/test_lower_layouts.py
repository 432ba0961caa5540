"""LowerLayoutsPass: before (layouts from PropagateLayoutsPass) vs hand-built expected per-device programs,
honest ``modified``, a second run changes nothing, numerics unchanged where the reference backend can run the
result (no collective of several participants; the end-to-end tests in tests/distribute/test_model_parallel.py
run the collectives)."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.ir.layouts import INPUT_LAYOUTS_KEY, MeshSpec
from graphdist.ir.placement import VariableSpec
from graphdist.ir.placement_ops import SHARDING_CONSTRAINT
from graphdist.passes.base import PassContext
from graphdist.passes.lower_layouts import LowerLayoutsPass
from graphdist.passes.propagate_layouts import PropagateLayoutsPass
from graphdist.runtime.comm import algorithms
from tests.passes.pass_checks import check_pass

DEVICES = ["cpu:0", "cpu:1"]
MESH = MeshSpec.build(("batch", "model"), (1, 2), DEVICES, "batch")
LAYOUTS = {"w1#1": (None, "model"), "w2#1": ("model", None)}


def _variable(graph: Graph, name: str, shape: tuple[int, ...]) -> Value:
    value = graph.add_input(name, np.float32, shape)
    graph.meta.variables.append((name, VariableSpec(f"{name}#1", name, "<f4", shape)))
    return value


def _node(graph: Graph, op: str, inputs: list, attrs: dict | None = None, domain: str = "",
          device: str | None = None) -> Value:
    node = graph.add_node(op, inputs, attrs, domain=domain)
    node.replica, node.device = 0, device
    return node.outputs[0]


def _ints(graph: Graph, values: list[int]) -> Value:
    return graph.add_initializer("ints", np.array(values, np.int64))


def _propagated(graph: Graph, mesh: MeshSpec = MESH) -> Graph:
    return PropagateLayoutsPass(mesh, LAYOUTS)(graph, PassContext()).graph


def _blocks(graph: Graph, value: Value, axis: int, size: int) -> list[Value]:
    half = size // 2
    return [_node(graph, "Slice", [value, _ints(graph, [start]), _ints(graph, [start + half]), _ints(graph, [axis])],
                  device=device) for start, device in zip((0, half), DEVICES)]


def _column_split(lowered: bool) -> Graph:
    """``relu(x @ w1)`` with w1 split by columns; lowered: per-device blocks, joined on cpu:0 for the output."""
    graph = Graph("column")
    x = graph.add_input("x", np.float32, (4, 8))
    w1 = _variable(graph, "w1", (8, 6))
    if not lowered:
        graph.outputs = [_node(graph, "Relu", [_node(graph, "MatMul", [x, w1])])]
        return _propagated(graph)
    blocks = _blocks(graph, w1, 1, 6)
    products = [_node(graph, "MatMul", [x, block], device=d) for block, d in zip(blocks, DEVICES)]
    relus = [_node(graph, "Relu", [p], device=d) for p, d in zip(products, DEVICES)]
    graph.outputs = [_node(graph, "Concat", relus, {"axis": 1}, device="cpu:0")]
    return graph


def test_column_split_matmul_runs_on_blocks_and_joins_for_the_output() -> None:
    graph = check_pass(LowerLayoutsPass(), _column_split(False), modified=True, expected=_column_split(True),
                       placement=True)
    assert not any(INPUT_LAYOUTS_KEY in n.meta for n in graph.nodes)


def _megatron(lowered: bool) -> Graph:
    """``softmax(relu(x @ w1) @ w2)``: one all-reduce between the row-split product and the softmax."""
    graph = Graph("megatron")
    x = graph.add_input("x", np.float32, (4, 8))
    w1, w2 = _variable(graph, "w1", (8, 6)), _variable(graph, "w2", (6, 4))
    if not lowered:
        hidden = _node(graph, "Relu", [_node(graph, "MatMul", [x, w1])])
        graph.outputs = [_node(graph, "Softmax", [_node(graph, "MatMul", [hidden, w2])], {"axis": -1})]
        return _propagated(graph)
    cols = _blocks(graph, w1, 1, 6)
    hidden = [_node(graph, "MatMul", [x, c], device=d) for c, d in zip(cols, DEVICES)]
    hidden = [_node(graph, "Relu", [h], device=d) for h, d in zip(hidden, DEVICES)]
    rows = _blocks(graph, w2, 0, 6)
    partial = [_node(graph, "MatMul", [h, r], device=d) for h, r, d in zip(hidden, rows, DEVICES)]
    summed = [_node(graph, "AllReduce", [p], {"reduce_op": "SUM", "algorithm": "ring", "group_key": "g",
                                              "group_size": 2}, GRAPHDIST_DOMAIN, device=d)
              for p, d in zip(partial, DEVICES)]
    soft = [_node(graph, "Softmax", [s], {"axis": -1}, device=d) for s, d in zip(summed, DEVICES)]
    graph.outputs = [soft[0]]
    return graph


def test_megatron_block_has_one_all_reduce() -> None:
    graph = check_pass(LowerLayoutsPass(), _megatron(False), modified=True, expected=_megatron(True),
                       placement=True, numerics=False)
    (first, second) = [n for n in graph.nodes if n.op_type == "AllReduce"]
    assert first.attrs["group_key"] == second.attrs["group_key"]
    assert first.meta["bytes_per_device"] == 2 * 1 * 4 * 4 * 4 // 2  # 2 (n-1)/n of a 4x4 float32 block


def _scatter(lowered: bool) -> Graph:
    """A partial product pinned split by rows: a reduce-scatter, no all-reduce."""
    graph = Graph("scatter")
    a = graph.add_input("a", np.float32, (4, 6))
    w2 = _variable(graph, "w2", (6, 4))
    if not lowered:
        product = _node(graph, "MatMul", [a, w2])
        pinned = _node(graph, SHARDING_CONSTRAINT, [product], {"layout": ["model", ""]}, GRAPHDIST_DOMAIN)
        graph.outputs = [_node(graph, "Exp", [pinned])]
        return _propagated(graph)
    rows = _blocks(graph, w2, 0, 6)
    cols = _blocks(graph, a, 1, 6)
    partial = [_node(graph, "MatMul", [c, r], device=d) for c, r, d in zip(cols, rows, DEVICES)]
    flat = [_node(graph, "ReduceScatter", [p], {"reduce_op": "SUM", "shard": s, "group_key": "g", "group_size": 2},
                  GRAPHDIST_DOMAIN, device=d) for s, (p, d) in enumerate(zip(partial, DEVICES))]
    blocks = [_node(graph, "Reshape", [f, _ints(graph, [2, 4])], device=d) for f, d in zip(flat, DEVICES)]
    exps = [_node(graph, "Exp", [b], device=d) for b, d in zip(blocks, DEVICES)]
    graph.outputs = [_node(graph, "Concat", exps, {"axis": 0}, device="cpu:0")]
    return graph


def test_partial_value_wanted_split_is_reduce_scattered() -> None:
    _, expected = _scatter(False), _scatter(True)
    before = _scatter(False)
    # The slices of `a` are made when the MatMul reads it (before w2's, which are made first for the variable):
    # compare ops and devices rather than the order of the two independent slice pairs.
    graph = check_pass(LowerLayoutsPass(), before, modified=True, numerics=False)
    ops = [(n.op_type, n.device) for n in graph.nodes]
    assert ops.count(("ReduceScatter", "cpu:0")) == ops.count(("ReduceScatter", "cpu:1")) == 1
    assert not any(op == "AllReduce" for op, _ in ops)
    assert sorted(ops) == sorted((n.op_type, n.device) for n in expected.nodes)


def test_split_value_read_whole_is_all_gathered() -> None:
    graph = Graph("gather")
    x = graph.add_input("x", np.float32, (4, 8))
    w1 = _variable(graph, "w1", (8, 6))
    graph.outputs = [_node(graph, "Softmax", [_node(graph, "MatMul", [x, w1])], {"axis": -1})]
    graph = check_pass(LowerLayoutsPass(), _propagated(graph), modified=True, numerics=False)
    gathers = [n for n in graph.nodes if n.op_type == "AllGather"]
    assert [(n.device, n.attrs["axis"], n.attrs["group_size"]) for n in gathers] == [("cpu:0", 1, 2), ("cpu:1", 1, 2)]
    assert [tuple(n.outputs[0].shape) for n in gathers] == [(4, 6), (4, 6)]


def test_variable_update_is_joined_and_renamed() -> None:
    graph = Graph("update")
    w1 = _variable(graph, "w1", (8, 6))
    new = _node(graph, "Mul", [w1, graph.add_initializer("half", np.float32(0.5))])
    graph.outputs = [new]
    graph.meta.variable_updates = [(new.name, "w1#1")]
    graph = check_pass(LowerLayoutsPass(), _propagated(graph), modified=True)
    (joined,) = graph.outputs
    assert joined.producer.op_type == "Concat" and joined.producer.device == "cpu:0"
    assert graph.meta.variable_updates == [(joined.name, "w1#1")]


def test_one_device_per_replica_only_removes_constraints() -> None:
    mesh = MeshSpec.build(("batch", "model"), (2, 1), DEVICES, "batch")

    def build(constrained: bool) -> Graph:
        graph = Graph("one")
        x = graph.add_input("x", np.float32, (4, 6))
        if constrained:
            x = _node(graph, SHARDING_CONSTRAINT, [x], {"layout": ["", "model"]}, GRAPHDIST_DOMAIN)
        graph.outputs = [_node(graph, "Exp", [x])]
        return graph

    check_pass(LowerLayoutsPass(), _propagated(build(True), mesh), modified=True, expected=build(False))


def test_graph_without_layouts_is_unchanged() -> None:
    check_pass(LowerLayoutsPass(), _column_split(True), modified=False, expected=_column_split(True), placement=True)


def test_whole_value_added_to_a_partial_sum_is_added_on_the_first_device_only() -> None:
    graph = Graph("residual")
    a = graph.add_input("a", np.float32, (3, 6))
    w2 = _variable(graph, "w2", (6, 4))
    bias = graph.add_input("bias", np.float32, (4,))
    biased = _node(graph, "Add", [_node(graph, "MatMul", [a, w2]), bias])
    graph.outputs = [_node(graph, "Tanh", [biased])]
    graph = check_pass(LowerLayoutsPass(), _propagated(graph), modified=True, numerics=False)
    adds = [n for n in graph.nodes if n.op_type == "Add"]
    assert [n.device for n in adds] == ["cpu:0"]  # cpu:1 passes its summand on
    (first, second) = [n for n in graph.nodes if n.op_type == "AllReduce"]
    assert first.inputs[0] is adds[0].outputs[0] and second.inputs[0].producer.op_type == "MatMul"


def test_split_variable_stored_in_parts_reads_and_writes_its_blocks() -> None:
    graph = Graph("parts")
    w1 = _variable(graph, "w1", (8, 6))
    new = _node(graph, "Mul", [w1, graph.add_initializer("half", np.float32(0.5))])
    graph.outputs = [new]
    graph.meta.variable_updates = [(new.name, "w1#1")]
    graph = check_pass(LowerLayoutsPass(replica_parts=True), _propagated(graph), modified=True, numerics=False)
    assert [(v.name, tuple(v.shape)) for v in graph.inputs] == [("w1/part0", (8, 3)), ("w1/part1", (8, 3))]
    assert [(n.op_type, n.device) for n in graph.nodes] == [("Mul", "cpu:0"), ("Mul", "cpu:1")]
    assert [name for name, _ in graph.meta.variable_updates] == [v.name for v in graph.outputs]
    assert [v.producer.device for v in graph.outputs] == DEVICES
    state = graph.meta.sharded_state["w1#1"]
    assert state["parts"] == ["w1/part0", "w1/part1"] and state["shard"] == 24
    assert state["blocks"] == [[[0, 8], [0, 3]], [[0, 8], [3, 6]]]
    assert graph.meta.placement["w1#1"].kind == "sharded"


def _exchange(lowered: bool) -> Graph:
    """``exp(x @ w1)`` with w1 split by columns, the product pinned split by rows: one all-to-all moves the split
    (each device keeps its half of its rows, sends the other half), no gather."""
    graph = Graph("exchange")
    x = graph.add_input("x", np.float32, (4, 8))
    w1 = _variable(graph, "w1", (8, 6))
    if not lowered:
        product = _node(graph, "MatMul", [x, w1])
        pinned = _node(graph, SHARDING_CONSTRAINT, [product], {"layout": ["model", ""]}, GRAPHDIST_DOMAIN)
        graph.outputs = [_node(graph, "Exp", [pinned])]
        return _propagated(graph)
    cols = _blocks(graph, w1, 1, 6)
    products = [_node(graph, "MatMul", [x, c], device=d) for c, d in zip(cols, DEVICES)]
    rows = [_node(graph, "AllToAll", [p], {"split_axis": 0, "concat_axis": 1, "group_key": "g", "group_size": 2},
                  GRAPHDIST_DOMAIN, device=d) for p, d in zip(products, DEVICES)]
    exps = [_node(graph, "Exp", [r], device=d) for r, d in zip(rows, DEVICES)]
    graph.outputs = [_node(graph, "Concat", exps, {"axis": 0}, device="cpu:0")]
    return graph


def test_split_moved_to_another_dimension_is_one_all_to_all() -> None:
    graph = check_pass(LowerLayoutsPass(), _exchange(False), modified=True, expected=_exchange(True),
                       placement=True, numerics=False)
    (first, second) = [n for n in graph.nodes if n.op_type == "AllToAll"]
    assert first.attrs["group_key"] == second.attrs["group_key"]
    assert [tuple(n.outputs[0].shape) for n in (first, second)] == [(2, 6), (2, 6)]
    # (n-1)/n of the 4x3 float32 block; the all-gather it replaces would send (n-1) = all of it.
    assert first.meta["bytes_per_device"] == 4 * 3 * 4 // 2
    link = algorithms.MESH_LINK
    assert first.meta["predicted_seconds"] == pytest.approx(link.latency_s + 24 * link.seconds_per_byte)


def test_all_to_all_is_taken_only_where_the_cost_model_prices_it_lower() -> None:
    """On a link where bytes cost nothing, the all-to-all (one message) ties with the all-gather (one message):
    not cheaper, so the pass gathers and slices, as before the all-to-all existed."""
    free_bytes = algorithms.Link(latency_s=1e-6, seconds_per_byte=0.0, combine_seconds_per_byte=0.0)
    pass_ = LowerLayoutsPass(link=free_bytes)
    assert "link=" in repr(pass_) and repr(LowerLayoutsPass()) == "LowerLayoutsPass()"
    graph = check_pass(pass_, _exchange(False), modified=True, numerics=False)
    ops = [(n.op_type, n.device) for n in graph.nodes]
    assert not any(op == "AllToAll" for op, _ in ops)
    assert ops.count(("AllGather", "cpu:0")) == ops.count(("AllGather", "cpu:1")) == 1
    gathered = [n for n in graph.nodes if n.op_type == "AllGather"]
    assert [tuple(n.outputs[0].shape) for n in gathered] == [(4, 6), (4, 6)]
    assert all(user.op_type == "Slice" for n in gathered for user, _ in n.outputs[0].uses)



def _depthwise(lowered: bool) -> Graph:
    """A depthwise ``conv(image, k)`` (4 groups of one channel), ``k`` split by output channels: each device
    convolves its 2 channels with its 2 filters (``group`` 2), no collective; joined on cpu:0 for the output."""
    graph = Graph("depthwise")
    image = graph.add_input("image", np.float32, (2, 4, 5, 5))
    kernel = _variable(graph, "k", (4, 1, 3, 3))
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    if not lowered:
        graph.outputs = [_node(graph, "Conv", [image, kernel], {**attrs, "group": 4})]
        return PropagateLayoutsPass(MESH, {"k#1": ("model", None, None, None)})(graph, PassContext()).graph
    images, kernels = _blocks(graph, image, 1, 4), _blocks(graph, kernel, 0, 4)
    convs = [_node(graph, "Conv", [i, k], {**attrs, "group": 2}, device=d) for i, k, d in zip(images, kernels, DEVICES)]
    graph.outputs = [_node(graph, "Concat", convs, {"axis": 1}, device="cpu:0")]
    return graph


def test_grouped_conv_runs_whole_groups_per_device_with_its_local_group() -> None:
    check_pass(LowerLayoutsPass(), _depthwise(False), modified=True, expected=_depthwise(True), placement=True)


def _crop_and_pad(lowered: bool) -> Graph:
    """``pad(w1[2:6], rows)`` with w1 split by columns: each device slices and pads its column block as the
    whole would be (same bounds and amounts), no collective; joined on cpu:0 for the output."""
    graph = Graph("crop_pad")
    w1 = _variable(graph, "w1", (8, 6))
    blocks = _blocks(graph, w1, 1, 6) if lowered else [w1]
    devices = DEVICES if lowered else [None]
    cuts = [_node(graph, "Slice", [b, _ints(graph, [2]), _ints(graph, [6]), _ints(graph, [0])], device=d)
            for b, d in zip(blocks, devices)]
    padded = [_node(graph, "Pad", [c, _ints(graph, [1, 0, 1, 0])], {"mode": "edge"}, device=d)
              for c, d in zip(cuts, devices)]
    if not lowered:
        graph.outputs = padded
        return _propagated(graph)
    graph.outputs = [_node(graph, "Concat", padded, {"axis": 1}, device="cpu:0")]
    return graph


def test_slice_and_pad_of_untouched_split_dimensions_run_on_blocks() -> None:
    check_pass(LowerLayoutsPass(), _crop_and_pad(False), modified=True, expected=_crop_and_pad(True), placement=True)


def test_slice_of_a_split_dimension_gathers_it_first() -> None:
    graph = Graph("cut")
    w1 = _variable(graph, "w1", (8, 6))
    graph.outputs = [_node(graph, "Slice", [w1, _ints(graph, [1]), _ints(graph, [4]), _ints(graph, [1])])]
    graph = check_pass(LowerLayoutsPass(), _propagated(graph), modified=True, numerics=False)
    gathers = [n for n in graph.nodes if n.op_type == "AllGather"]
    assert [(n.device, n.attrs["axis"], tuple(n.outputs[0].shape)) for n in gathers] == [("cpu:0", 1, (8, 6)),
                                                                                      ("cpu:1", 1, (8, 6))]
    assert [tuple(n.outputs[0].shape) for n in graph.nodes if n.op_type == "Slice" and n.inputs[0].producer
            in gathers] == [(8, 3), (8, 3)]


def test_depthwise_conv_with_a_channel_multiplier_and_bias_computes_the_same_numbers() -> None:
    """4 groups, 2 filters each (8 output channels): device i holds groups 2i, 2i + 1 (input channels 2i, 2i + 1,
    output channels 4i .. 4i + 3, their bias); the reference backend runs both devices' programs."""
    graph = Graph("multiplier")
    image = graph.add_input("image", np.float32, (2, 4, 5, 5))
    kernel, bias = _variable(graph, "k", (8, 1, 3, 3)), _variable(graph, "kb", (8,))
    graph.outputs = [_node(graph, "Conv", [image, kernel, bias], {"kernel_shape": [3, 3], "group": 4})]
    propagated = PropagateLayoutsPass(MESH, {"k#1": ("model", None, None, None), "kb#1": ("model",)})(
        graph, PassContext()).graph
    lowered = check_pass(LowerLayoutsPass(), propagated, modified=True)
    convs = [n for n in lowered.nodes if n.op_type == "Conv"]
    assert [(n.device, n.attrs["group"], tuple(n.outputs[0].shape)) for n in convs] == [
        ("cpu:0", 2, (2, 4, 3, 3)), ("cpu:1", 2, (2, 4, 3, 3))]
    assert not any(n.domain == GRAPHDIST_DOMAIN for n in lowered.nodes)
