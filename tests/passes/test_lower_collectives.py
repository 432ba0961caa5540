"""LowerCollectivesPass: before vs hand-built expected structure, honest ``modified``, a second run changes
nothing, numerics unchanged (reference backend), mismatched groups refused."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.compile.pipeline import PipelineConfig, build_pipeline
from graphdist.errors import GraphError, InvalidArgumentError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph
from graphdist.passes.base import PassContext
from graphdist.passes.lower_collectives import LowerCollectivesPass
from tests.passes.pass_checks import check_pass

TWO = PassContext(devices=("cpu:0", "cpu:1"))


def _single(lowered: bool) -> Graph:
    """``AllReduce(x * 2) + AllGather(x)[:3]``, each a group of one (``lowered``: the collectives gone)."""
    graph = Graph("expected" if lowered else "single")
    x = graph.add_input("x", np.float32, (3,))
    doubled = graph.add_node("Mul", [x, graph.add_initializer("two", np.float32(2.0))]).outputs[0]
    gathered = x
    if not lowered:
        doubled = graph.add_node("AllReduce", [doubled], {"reduce_op": "SUM", "group_size": 1, "group_key": "a"},
                                 domain=GRAPHDIST_DOMAIN).outputs[0]
        gathered = graph.add_node("AllGather", [x], {"axis": 0, "group_size": 1, "group_key": "g"},
                                  domain=GRAPHDIST_DOMAIN).outputs[0]
    graph.outputs = list(graph.add_node("Add", [doubled, gathered]).outputs)
    return graph


def _wide(attrs: dict | None, shapes: tuple = ((2,), (2,))) -> Graph:
    """An all-reduce group of two participants (one per replica), with ``attrs`` added to its nodes."""
    graph = Graph("wide")
    outputs = []
    for replica, shape in enumerate(shapes):
        x = graph.add_input(f"x{replica}", np.float32, shape)
        node = graph.add_node("AllReduce", [x], {"reduce_op": "SUM", "group_size": 2, "group_key": "k",
                                                 **(attrs or {})}, domain=GRAPHDIST_DOMAIN)
        node.replica = replica
        outputs.append(node.outputs[0])
    graph.outputs = outputs
    return graph


def test_groups_of_one_are_the_identity() -> None:
    check_pass(LowerCollectivesPass(), _single(False), modified=True, expected=_single(True))


@pytest.mark.parametrize(("attrs", "stamped"), [
    (None, {"algorithm": "ring"}),
    ({"algorithm": "hierarchical_copy"}, {"algorithm": "hierarchical_copy"}),
    ({"algorithm": "reduce_to_one", "reduce_to_device": "cpu:1"}, {"algorithm": "reduce_to_one", "root": 1}),
    ({"algorithm": "reduce_to_one", "reduce_to_device": "gpu:7"}, {"algorithm": "reduce_to_one", "root": 0}),
])
def test_wide_groups_carry_the_algorithm(attrs, stamped) -> None:
    check_pass(LowerCollectivesPass(attrs), _wide(None), modified=True, expected=_wide(stamped), ctx=TWO)


def test_annotated_groups_are_unchanged() -> None:
    check_pass(LowerCollectivesPass(), _wide({"algorithm": "ring"}), modified=False,
               expected=_wide({"algorithm": "ring"}), ctx=TWO)


def test_group_of_different_shapes_is_refused() -> None:
    with pytest.raises(GraphError, match=r"all-reduce k gets values of different shapes.*replica 1: float32\[3\]"):
        LowerCollectivesPass()(_wide(None, shapes=((2,), (3,))), TWO)


def test_the_algorithm_comes_from_the_registry_and_is_checked_when_built() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown algorithm 'nccl'; use one of ring, hierarchical_copy, "
                                                   "reduce_to_one"):
        LowerCollectivesPass({"algorithm": "nccl"})
    with pytest.raises(InvalidArgumentError, match="'auto' does not run between logical devices"):
        LowerCollectivesPass({"algorithm": "auto"})


def test_a_pipeline_with_an_unknown_algorithm_fails_when_it_is_built() -> None:
    config = PipelineConfig(devices=("cpu:0", "cpu:1"), collective_attrs={"algorithm": "butterfly"})
    with pytest.raises(InvalidArgumentError, match="unknown algorithm 'butterfly'"):
        build_pipeline(config)
    config = PipelineConfig(devices=("cpu:0",), multi_worker={"num_workers": 2, "algorithm": "hierarchical_copy"})
    with pytest.raises(InvalidArgumentError, match="InsertCrossWorkerCollectivesPass: algorithm 'hierarchical_copy' "
                                                   "does not run between worker processes"):
        build_pipeline(config)
