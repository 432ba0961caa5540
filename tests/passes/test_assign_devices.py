"""AssignDevicesPass: before vs hand-built expected placement, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend), and a replica without a device refused."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import GraphError
from graphdist.ir import Graph
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext
from tests.passes.pass_checks import check_pass

TWO = PassContext(devices=("cpu:0", "cpu:1"))


def _graph(name: str, placements: list[tuple[str | None, int | None]]) -> Graph:
    """``Neg(x)`` per replica (meta replica 0, 1), then their sum in cross-replica context, then a node
    placed by an earlier pass on ``cpu:2``; ``placements`` gives each node's ``(device, replica)``."""
    graph = Graph(name)
    x = graph.add_input("x", np.float32, (3,))
    negs = []
    for replica in (0, 1):
        node = graph.add_node("Neg", [x])
        node.replica = replica
        negs.append(node.outputs[0])
    total = graph.add_node("Add", negs).outputs[0]
    placed = graph.add_node("Abs", [total])
    placed.device = "cpu:2"
    graph.outputs = list(placed.outputs)
    for node, (device, replica) in zip(graph.nodes, placements):
        if device is not None:
            node.device, node.replica = device, replica
    return graph


def test_each_node_goes_to_its_replica_device() -> None:
    graph = _graph("unplaced", [(None, None)] * 4)
    expected = _graph("expected", [("cpu:0", 0), ("cpu:1", 1), ("cpu:0", None), ("cpu:2", None)])
    graph = check_pass(AssignDevicesPass(), graph, modified=True, expected=expected, ctx=TWO, placement=True)
    assert graph.stage == "rewritten"


def test_placed_graph_is_unchanged() -> None:
    placements = [("cpu:1", 0), ("cpu:0", 1), ("cpu:1", None), ("cpu:2", None)]  # placed by someone else: kept
    check_pass(AssignDevicesPass(), _graph("placed", placements), modified=False,
               expected=_graph("expected", placements), ctx=TWO, placement=True)


def test_replica_without_a_device_is_refused() -> None:
    with pytest.raises(GraphError, match=r"replica 1 but only 1 device\(s\).*PassContext\(devices=\.\.\.\)"):
        AssignDevicesPass()(_graph("two_replicas", [(None, None)] * 4), PassContext(devices=("cpu:0",)))
