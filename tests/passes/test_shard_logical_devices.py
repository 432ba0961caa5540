"""ShardLogicalDevicesPass: before vs hand-built expected structure and placement, honest ``modified``, a second
run changes nothing, numerics unchanged (reference backend: the tiles reassembled equal the unsplit value)."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.placement_ops import SPLIT_TO_LOGICAL_DEVICES
from graphdist.passes.shard_logical_devices import ShardLogicalDevicesPass
from tests.passes.pass_checks import check_pass

CORES = [["tpu:0", "tpu:1", "tpu:2", "tpu:3"]]  # one replica, four logical devices


def _split(graph: Graph, value: Value, parts: list[int]) -> Value:
    node = graph.add_node(SPLIT_TO_LOGICAL_DEVICES, [value], {"partition_dimensions": parts}, domain=GRAPHDIST_DOMAIN)
    node.replica = 0
    return node.outputs[0]


def _on(node: Node, device: str) -> Value:
    node.device, node.replica = device, 0
    node.replica = 0
    return node.outputs[0]


def _ints(graph: Graph, values: list[int]) -> Value:
    return graph.add_initializer("axes", np.array(values, np.int64))


def _relu_rows(sharded: bool) -> Graph:
    """``Relu(split(x, [2, 1]))`` as the graph output (sharded: two row tiles, concatenated back)."""
    graph = Graph("expected" if sharded else "rows")
    x = graph.add_input("x", np.float32, (4, 2))
    relu = graph.add_node("Relu", [x if sharded else _split(graph, x, [2, 1])])
    graph.outputs = list(relu.outputs)
    if sharded:  # the unsplit Relu stays, read by nothing (EliminateDeadNodesPass, later in the pipeline)
        tiles = [_on(graph.add_node("Slice", [x, _ints(graph, [start]), _ints(graph, [start + 2]), _ints(graph, [0])]),
                     "tpu:0") for start in (0, 2)]  # cut on the replica's first logical device
        relus = [_on(graph.add_node("Relu", [tile]), device) for tile, device in zip(tiles, ("tpu:0", "tpu:1"))]
        graph.outputs = [_on(graph.add_node("Concat", relus, {"axis": 0}), "tpu:0")]
    return graph


def test_elementwise_reader_runs_tile_by_tile() -> None:
    graph = check_pass(ShardLogicalDevicesPass(CORES), _relu_rows(False), modified=True,
                       expected=_relu_rows(True), placement=True, meta_keys=("replica",))
    assert not graph.find_nodes(SPLIT_TO_LOGICAL_DEVICES, GRAPHDIST_DOMAIN)


def test_matmul_of_split_rows_then_a_reader_that_cannot_be_tiled() -> None:
    """``ReduceSum(split(x, [4, 1]) @ w)``: the MatMul runs on four row tiles, the ReduceSum reads them joined."""
    graph = Graph("matmul")
    x = graph.add_input("x", np.float32, (8, 3))
    w = graph.add_initializer("w", np.arange(6, dtype=np.float32).reshape(3, 2))
    product = graph.add_node("MatMul", [_split(graph, x, [4, 1]), w]).outputs[0]
    graph.outputs = list(graph.add_node("ReduceSum", [product], {"keepdims": 0}).outputs)
    graph = check_pass(ShardLogicalDevicesPass(CORES), graph, modified=True)
    tiles = [n for n in graph.nodes if n.op_type == "MatMul" and n.device is not None]
    assert [n.device for n in tiles] == CORES[0]
    assert [tuple(n.outputs[0].shape) for n in tiles] == [(2, 2)] * 4
    (reduce,) = graph.find_nodes("ReduceSum")
    assert reduce.inputs[0].producer.op_type == "Concat" and reduce.inputs[0].producer.device == "tpu:0"


def test_one_tile_only_removes_the_annotation() -> None:
    def build(annotated: bool) -> Graph:
        graph = Graph("one_tile")
        x = graph.add_input("x", np.float32, (4, 2))
        graph.outputs = list(graph.add_node("Exp", [_split(graph, x, [1, 1]) if annotated else x]).outputs)
        return graph

    check_pass(ShardLogicalDevicesPass(CORES), build(True), modified=True, expected=build(False))


def test_no_annotations_is_unchanged() -> None:
    graph = _relu_rows(True)
    check_pass(ShardLogicalDevicesPass(CORES), graph, modified=False, expected=_relu_rows(True), placement=True)


def test_indivisible_shape_is_refused() -> None:
    graph = Graph("indivisible")
    x = graph.add_input("x", np.float32, (3, 2))
    graph.outputs = list(graph.add_node("Exp", [_split(graph, x, [2, 1])]).outputs)
    with pytest.raises(ValueError, match=r"%x \(float32\[3,2\]\) cannot be split into \[2, 1\] equal tiles"):
        ShardLogicalDevicesPass(CORES)(graph)
