"""PlaceLogicalDevicesPass: before vs hand-built expected placement, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend), an out-of-range logical device refused."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.ir.placement_ops import LOGICAL_DEVICE
from graphdist.passes.place_logical_devices import PlaceLogicalDevicesPass
from tests.passes.pass_checks import check_pass

CORES = [["tpu:0", "tpu:1"], ["tpu:2", "tpu:3"]]  # cores[replica][logical device]


def _annotate(graph: Graph, value: Value, logical: int, replica: int) -> Value:
    node = graph.add_node(LOGICAL_DEVICE, [value], {"logical_device": logical}, domain=GRAPHDIST_DOMAIN)
    node.replica = replica
    return node.outputs[0]


def _computed(annotated: bool, first_device: str | None = None) -> Graph:
    """Per replica ``r``: ``Neg(annotate(x * 2, logical 1))``; ``first_device``: replica 0's Mul placed already."""
    graph = Graph("annotated" if annotated else "expected")
    x = graph.add_input("x", np.float32, (3,))
    two = graph.add_initializer("two", np.float32(2.0))
    outputs = []
    for replica in (0, 1):
        mul = graph.add_node("Mul", [x, two])
        mul.replica = replica
        if replica == 0 and first_device is not None:
            mul.device = first_device
        elif not annotated:  # the pass places the producer on the replica's logical device 1
            mul.device, mul.replica = CORES[replica][1], replica
        value = _annotate(graph, mul.outputs[0], 1, replica) if annotated else mul.outputs[0]
        neg = graph.add_node("Neg", [value])
        neg.replica = replica
        outputs.append(neg.outputs[0])
    graph.outputs = outputs
    return graph


def test_producer_moves_to_the_logical_device_of_its_replica() -> None:
    graph = check_pass(PlaceLogicalDevicesPass(CORES), _computed(True), modified=True, expected=_computed(False),
                       placement=True)
    assert not graph.find_nodes(LOGICAL_DEVICE, GRAPHDIST_DOMAIN)


def test_first_placement_wins() -> None:
    check_pass(PlaceLogicalDevicesPass(CORES), _computed(True, first_device="cpu:0"), modified=True,
               expected=_computed(False, first_device="cpu:0"), placement=True)


def test_input_annotation_becomes_an_identity_on_the_logical_device() -> None:
    def build(annotated: bool) -> Graph:
        graph = Graph("input")
        x = graph.add_input("x", np.float32, (3,))
        if annotated:
            moved = _annotate(graph, x, 0, 1)
        else:
            identity = graph.add_node("Identity", [x])
            identity.replica = 1
            identity.device, identity.replica = "tpu:2", 1
            moved = identity.outputs[0]
        graph.outputs = list(graph.add_node("Abs", [moved]).outputs)
        return graph

    check_pass(PlaceLogicalDevicesPass(CORES), build(True), modified=True, expected=build(False), placement=True,
               meta_keys=("replica",))


def test_no_annotations_is_unchanged() -> None:
    check_pass(PlaceLogicalDevicesPass(CORES), _computed(False), modified=False, expected=_computed(False),
               placement=True)


def test_logical_device_out_of_range_is_refused() -> None:
    graph = Graph("out_of_range")
    x = graph.add_input("x", np.float32, (3,))
    graph.outputs = [_annotate(graph, x, 2, 0)]
    with pytest.raises(ValueError, match=r"logical device 2 is not consistent with the device assignment \(2 logical"):
        PlaceLogicalDevicesPass(CORES)(graph)
