"""LowerIndexChecksPass: before vs hand-built expected structure, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend: in range the same values, out of range the same error)."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import GraphdistError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.passes.base import PassContext
from graphdist.passes.lower_index_checks import LowerIndexChecksPass
from graphdist.passes.replicate import Replication
from tests.passes.pass_checks import check_pass, run_reference

CHECK = {"low": 0, "high": 5, "op": "take", "argument": "indices", "hint": "use indices below 5"}
OUT_OF_RANGE = r"take: indices must be in \[0, 5\) \(use indices below 5\); got values from 1 to 5"
TABLE = np.arange(10, dtype=np.float32).reshape(5, 2)


def _checked(dtype: type, read: bool, name: str = "checks") -> Graph:
    """``table[CheckIndices(i)]`` (``read``) or ``x * 2`` with a check nothing reads (class labels)."""
    graph = Graph(name)
    indices = graph.add_input("i", dtype, (3,))
    checked = graph.add_node("CheckIndices", [indices], dict(CHECK), domain=GRAPHDIST_DOMAIN)
    checked.meta["side_effect"] = True
    if read:
        graph.outputs = list(graph.add_node("Gather", [graph.add_initializer("table", TABLE), checked.outputs[0]],
                                            {"axis": 0}).outputs)
    else:
        graph.outputs = list(graph.add_node("Mul", [indices, graph.add_initializer("two", np.array(2, dtype))]).outputs)
    return graph


def _lowered(dtype: type, read: bool, replica: int = -1) -> Graph:
    """What the pass makes of :func:`_checked`, built by hand from the module docstring."""
    graph = Graph("expected")
    indices = graph.add_input("i", dtype, (3,))
    info = np.iinfo(dtype)

    def add(op: str, inputs: list[Value], attrs: dict | None = None, domain: str = "") -> Value:
        return graph.add_node(op, inputs, attrs, domain=domain).outputs[0]

    flat = add("Reshape", [indices, graph.add_initializer("flat", np.array([-1], np.int64))])
    low = add("ReduceMin", [add("Concat", [flat, graph.add_initializer("top", np.array([info.max], dtype))],
                                {"axis": 0})], {"keepdims": 1})
    high = add("ReduceMax", [add("Concat", [flat, graph.add_initializer("bottom", np.array([info.min], dtype))],
                                 {"axis": 0})], {"keepdims": 1})
    bounds = add("Concat", [low, high], {"axis": 0})
    if dtype != np.int64:
        bounds = add("Cast", [bounds], {"to": 7})
    add("AssertInRange", [bounds], {**CHECK, "replica": replica, "group_key": "assert"}, domain=GRAPHDIST_DOMAIN)
    if read:
        outside = add("Or", [add("Less", [indices, graph.add_initializer("lo", np.array(0, dtype))]),
                             add("GreaterOrEqual", [indices, graph.add_initializer("hi", np.array(5, dtype))])])
        masked = add("Where", [outside, graph.add_initializer("zero", np.array(0, dtype)), indices])
        graph.outputs = [add("Gather", [graph.add_initializer("table", TABLE), masked], {"axis": 0})]
    else:
        graph.outputs = [add("Mul", [indices, graph.add_initializer("two", np.array(2, dtype))])]
    return graph


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("read", [True, False])
def test_check_becomes_range_and_assertion(dtype: type, read: bool) -> None:
    feeds = {"i": np.array([4, 0, 2], dtype)}
    graph = check_pass(LowerIndexChecksPass(), _checked(dtype, read), modified=True, expected=_lowered(dtype, read),
                       feeds=feeds)
    assert not graph.find_nodes("CheckIndices", GRAPHDIST_DOMAIN)
    (assertion,) = graph.find_nodes("AssertInRange", GRAPHDIST_DOMAIN)
    assert assertion.meta.get("side_effect")  # kept by dead-node elimination although nothing reads it


@pytest.mark.parametrize("read", [True, False])
def test_out_of_range_raises_the_same_error_before_and_after(read: bool) -> None:
    feeds = {"i": np.array([1, 5, 2], np.int64)}
    graph = _checked(np.int64, read)
    with pytest.raises(GraphdistError, match=OUT_OF_RANGE):  # the reference backend names its segment too
        run_reference(graph, feeds)
    lowered = LowerIndexChecksPass()(graph, PassContext()).graph
    with pytest.raises(GraphdistError, match=OUT_OF_RANGE):
        run_reference(lowered, feeds)


def test_replica_copy_names_its_global_replica_and_keeps_its_placement() -> None:
    graph = _checked(np.int64, read=True)
    graph.meta.replication = Replication(2, 2, 4, {}, {}, {})  # this worker's replicas are 2 and 3 of 4
    for node in graph.nodes:
        node.device, node.replica = "cpu:1", 1
        node.replica = 1
    expected = _lowered(np.int64, read=True, replica=3)
    for node in expected.nodes:
        node.device, node.replica = "cpu:1", 1
        node.replica = 1
    check_pass(LowerIndexChecksPass(), graph, modified=True, expected=expected, placement=True,
               meta_keys=("replica",), feeds={"i": np.array([4, 0, 2], np.int64)})


def test_no_checks_is_unchanged() -> None:
    graph = Graph("plain")
    x = graph.add_input("x", np.float32, (3,))
    graph.outputs = list(graph.add_node("Neg", [x]).outputs)
    expected = graph.copy()
    check_pass(LowerIndexChecksPass(), graph, modified=False, expected=expected)
