"""LowerDeterministicReductionsPass: collectives as LowerCollectivesPass / LowerSingleReaderAllReducesPass /
InsertCrossWorkerCollectivesPass leave them vs the hand-built expected graph (tree algorithms, the chained
``Sum`` as a pairwise tree of ``Add``); what stays (MAX, integers, pairs of Sum inputs), a second run changes
nothing, the tree's bits on the reference backend and in the local communicator, and the refusal."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.backends import default_cache, get_backend
from graphdist.errors import GraphError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, assert_structural_equal, to_onnx, verify
from graphdist.ir.comm_ops import SUMMED_GROUP, SUMMED_REPLICAS
from graphdist.passes.base import PassContext
from graphdist.passes.lower_deterministic_reductions import LowerDeterministicReductionsPass
from graphdist.runtime.comm import local
from graphdist.runtime.devices import parse_device
from tests.passes.pass_checks import replica_op as _op

SHAPE = (5, 3)
META = ("replica", SUMMED_GROUP)
RNG = np.random.default_rng(2)


def _graph(lowered: bool) -> Graph:
    """Four replicas: a float SUM all-reduce (ring), a MAX one and an integer SUM one (ring), a float MEAN
    all-reduce across workers (auto), and a gradient summed on its one reader (``Sum`` of 4, and of 2)."""
    graph = Graph("reductions")
    g = [graph.add_input(f"g{r}", np.float32, SHAPE) for r in range(4)]
    n = [graph.add_input(f"n{r}", np.int64, SHAPE) for r in range(4)]
    outputs = []
    tree = "hierarchical_copy" if lowered else "ring"
    for reduce_op, values, algorithm in [("SUM", g, tree), ("MAX", g, "ring"), ("SUM", n, "ring")]:
        attrs = {"reduce_op": reduce_op, "group_key": f"{reduce_op}{values[0].dtype}", "group_size": 4,
                 "algorithm": algorithm}
        outputs += [_op(graph, "AllReduce", [values[r]], attrs, replica=r, domain=GRAPHDIST_DOMAIN,
                        side_effect=True) for r in range(4)]
    outputs.append(_op(graph, "CrossWorkerAllReduce", [g[0]], {"reduce_op": "MEAN", "num_workers": 2,
                                                                "algorithm": "tree" if lowered else "auto"},
                       domain=GRAPHDIST_DOMAIN, side_effect=True))
    summed = {SUMMED_GROUP: "s", SUMMED_REPLICAS: 4}
    if lowered:
        left = _op(graph, "Add", [g[0], g[1]], replica=1, **summed)
        right = _op(graph, "Add", [g[2], g[3]], replica=1, **summed)
        outputs.append(_op(graph, "Add", [left, right], replica=1, **summed))
    else:
        outputs.append(_op(graph, "Sum", g, replica=1, **summed))
    outputs.append(_op(graph, "Sum", g[:2], replica=1, **{SUMMED_GROUP: "pair", SUMMED_REPLICAS: 2}))
    graph.outputs = outputs
    return graph


def _lower(graph: Graph) -> Graph:
    result = LowerDeterministicReductionsPass()(graph, PassContext(devices=tuple(f"cpu:{r}" for r in range(4))))
    assert result.modified
    verify(result.graph)
    snapshot = result.graph.copy()
    again = LowerDeterministicReductionsPass()(result.graph, PassContext())
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, meta_keys=META)
    return result.graph


def test_float_sums_become_pairwise_trees_and_the_rest_stays() -> None:
    graph = _lower(_graph(lowered=False))
    assert_structural_equal(graph, _graph(lowered=True), meta_keys=META)
    assert "root" not in next(n for n in graph.nodes if n.op_type == "AllReduce").attrs


def test_the_lowered_sum_is_the_trees_bits() -> None:
    feeds = {f"g{r}": (RNG.standard_normal(SHAPE) * 10.0 ** RNG.integers(-3, 4, SHAPE)).astype(np.float32)
             for r in range(4)}
    graph = _lower(_graph(lowered=False))
    graph.outputs = [graph.outputs[-2]]
    graph.set_nodes([n for n in graph.nodes if n.op_type == "Add"], safe=False)
    graph.inputs = [v for v in graph.inputs if v.name.startswith("g")]
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    (got,) = exe.run(feeds)
    want = (feeds["g0"] + feeds["g1"]) + (feeds["g2"] + feeds["g3"])
    assert got.tobytes() == want.tobytes()
    # The local communicator's hierarchical_copy is the same tree, for any thread count and buffer size
    # (8 MiB buffers are cut into blocks and split between the threads).
    big = [RNG.standard_normal(2 << 20).astype(np.float32) for _ in range(4)]
    previous = local.settings()["threads"]
    try:
        for threads in (1, 2):
            local.configure(threads=threads)
            for buffers, expected in [([feeds[f"g{r}"] for r in range(4)], want),
                                      (big, (big[0] + big[1]) + (big[2] + big[3]))]:
                (reduced, *_) = local.all_reduce(buffers, "SUM", "hierarchical_copy")
                assert reduced.tobytes() == expected.tobytes()
    finally:
        local.configure(threads=previous)


def test_nothing_to_lower_is_unchanged() -> None:
    graph = Graph("nothing")
    x = graph.add_input("x", np.float32, SHAPE)
    graph.outputs = [_op(graph, "AllReduce", [x], {"reduce_op": "MAX", "group_key": "m", "group_size": 2,
                                                   "algorithm": "ring"}, domain=GRAPHDIST_DOMAIN)]
    assert not LowerDeterministicReductionsPass()(graph, PassContext()).modified


def test_a_reduce_scatter_is_refused() -> None:
    graph = Graph("zero1")
    x = graph.add_input("x", np.float32, (12,))
    graph.outputs = [_op(graph, "CrossWorkerReduceScatter", [x], {"reduce_op": "SUM", "num_workers": 2},
                         domain=GRAPHDIST_DOMAIN)]
    with pytest.raises(NotImplementedError, match="ZeRO-1"):
        LowerDeterministicReductionsPass()(graph, PassContext())


def test_ensures_names_what_is_not_a_tree() -> None:
    with pytest.raises(GraphError, match="AllReduce .* still sums with algorithm 'ring'"):
        LowerDeterministicReductionsPass().ensures(_graph(lowered=False))
    graph = Graph("chain")
    g = [graph.add_input(f"g{r}", np.float32, SHAPE) for r in range(3)]
    graph.outputs = [_op(graph, "Sum", g, **{SUMMED_GROUP: "s", SUMMED_REPLICAS: 3})]
    with pytest.raises(GraphError, match="Sum .* still adds 3 replicas in a chain"):
        LowerDeterministicReductionsPass().ensures(graph)
