"""PartitionPass: before vs hand-built expected structure and segments, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend). Overlap and cross-worker numbering: test_partition_overlap.py,
test_partition_cross_worker_order.py."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import InvalidArgumentError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Node
from graphdist.passes.base import PassContext
from graphdist.passes.partition import PartitionPass
from tests.passes.pass_checks import check_pass

TWO = PassContext(devices=("cpu:0", "cpu:1"))


def _place(node: Node, device: str, segment: str | None) -> Node:
    node.device = device
    if segment is not None:
        node.meta["segment"] = segment
    return node


def _one_device(partitioned: bool) -> Graph:
    graph = Graph("expected" if partitioned else "one_device")
    x = graph.add_input("x", np.float32, (3,))
    neg = _place(graph.add_node("Neg", [x]), "cpu:0", "cpu0" if partitioned else None)
    graph.outputs = list(_place(graph.add_node("Exp", neg.outputs), "cpu:0", "cpu0" if partitioned else None).outputs)
    return graph


def _two_devices(partitioned: bool) -> Graph:
    """``n = Neg(x)`` on cpu:0 read by ``Abs`` and ``Exp`` on cpu:1 (partitioned: through one ``Transfer``)."""
    graph = Graph("expected" if partitioned else "two_devices")
    x = graph.add_input("x", np.float32, (3,))
    neg = _place(graph.add_node("Neg", [x]), "cpu:0", "cpu0.p0" if partitioned else None).outputs[0]
    read = neg
    if partitioned:
        read = _place(graph.add_node("Transfer", [neg], domain=GRAPHDIST_DOMAIN), "cpu:1", None).outputs[0]
    after = "cpu1.p1" if partitioned else None  # one communication step (the transfer) before it
    abs_ = _place(graph.add_node("Abs", [read]), "cpu:1", after).outputs[0]
    exp = _place(graph.add_node("Exp", [read]), "cpu:1", after).outputs[0]
    graph.outputs = [abs_, exp, neg]
    return graph


def _collective(partitioned: bool) -> Graph:
    """``AllReduce(Neg(x))`` then ``Exp`` on one device: the collective cuts it into phases 0 and 1."""
    graph = Graph("expected" if partitioned else "collective")
    x = graph.add_input("x", np.float32, (3,))
    neg = _place(graph.add_node("Neg", [x]), "cpu:0", "cpu0.p0" if partitioned else None).outputs[0]
    total = _place(graph.add_node("AllReduce", [neg], {"reduce_op": "SUM", "group_size": 1, "group_key": "k"},
                                  domain=GRAPHDIST_DOMAIN), "cpu:0", None).outputs[0]
    graph.outputs = list(_place(graph.add_node("Exp", [total]), "cpu:0",
                                "cpu0.p1" if partitioned else None).outputs)
    return graph


@pytest.mark.parametrize("build", [_one_device, _two_devices, _collective])
def test_segments_and_transfers(build) -> None:
    graph = check_pass(PartitionPass(overlap=False), build(False), modified=True, expected=build(True), ctx=TWO,
                       placement=True, meta_keys=("segment",))
    assert graph.stage == "partitioned"


def test_one_transfer_per_value_and_device() -> None:
    graph = check_pass(PartitionPass(overlap=False), _two_devices(False), modified=True, ctx=TWO)
    (transfer,) = graph.find_nodes("Transfer", GRAPHDIST_DOMAIN)
    assert transfer.device == "cpu:1" and len(transfer.outputs[0].uses) == 2


@pytest.mark.parametrize("build", [_one_device, _two_devices, _collective])
def test_partitioned_graph_is_unchanged(build) -> None:
    check_pass(PartitionPass(overlap=False), build(True), modified=False, expected=build(True), ctx=TWO,
               placement=True, meta_keys=("segment",))


def test_overlap_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgumentError, match="overlap must be True, False or None, got 'yes'"):
        PartitionPass(overlap="yes")
