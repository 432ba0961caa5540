"""AccumulateGradientsPass: hand-built before vs hand-built expected structure, honest ``modified``, a
second run changes nothing, the micro-batches compute what the whole batch computes (reference backend),
and the cases it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.backends import default_cache, get_backend
from graphdist.errors import GraphError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal, to_onnx, verify
from graphdist.ir.batch import BatchDim
from graphdist.passes.accumulate_gradients import AccumulateGradientsPass
from graphdist.passes.base import PassContext
from graphdist.runtime.devices import parse_device

RNG = np.random.default_rng(5)


def _op(graph: Graph, op_type: str, inputs: list[Value], attrs: dict | None = None, *, domain: str = "",
        micro: int | None = None, context: str | None = "replica") -> Value:
    node = graph.add_node(op_type, inputs, attrs, domain=domain)
    node.meta.update({k: v for k, v in {"context": context, "micro": micro}.items() if v is not None})
    return node.outputs[0]


def _before(reduce_op: str = "SUM") -> Graph:
    """One replica's step: ``y = x * w`` per example, ``loss = sum(y) / (replicas * B)`` (a loss scaled by
    the global batch), all-reduced; outputs the reduced loss and ``y``."""
    graph = Graph("step")
    x = graph.add_input("x", np.float32, (BatchDim(4), 3))
    w = graph.add_input("w", np.float32, (3,))
    batch = graph.add_initializer("batch", np.float32(4))
    batch.meta["batch"] = [(1, 0)]  # the constant is B: a micro-batch needs B / k
    replicas = _op(graph, "Cast", [_op(graph, "NumReplicas", [], domain=GRAPHDIST_DOMAIN)], {"to": 1})
    y = _op(graph, "Mul", [x, w])
    total = _op(graph, "ReduceSum", [y], {"keepdims": 0})
    loss = _op(graph, "Div", [total, _op(graph, "Mul", [replicas, batch])])
    reduced = _op(graph, "ReplicaAllReduce", [loss], {"reduce_op": reduce_op, "group_key": "g"},
                  domain=GRAPHDIST_DOMAIN)
    graph.outputs = [reduced, y]
    graph.meta.per_replica_inputs = {"x": None}
    graph.meta.per_replica_outputs = {1: None}
    graph.meta.batch = 4
    return graph


def _expected() -> Graph:
    """``_before`` with k = 2: slices of 2 rows, the computation per micro-batch, the losses added before the
    all-reduce, the replica count doubled, ``y`` put back together."""
    graph = Graph("expected")
    x = graph.add_input("x", np.float32, (4, 3))
    w = graph.add_input("w", np.float32, (3,))
    count = _op(graph, "NumReplicas", [], domain=GRAPHDIST_DOMAIN)
    doubled = _op(graph, "Mul", [count, graph.add_initializer("k", np.int32(2))])
    replicas = _op(graph, "Cast", [doubled], {"to": 1})
    axis = graph.add_initializer("axis", np.array([0], np.int64))
    micro_batch = graph.add_initializer("micro_batch", np.float32(2))
    ys, losses = [], []
    for m in range(2):  # one micro-batch after the other
        rows = _op(graph, "Slice", [x, graph.add_initializer("start", np.array([2 * m], np.int64)),
                                    graph.add_initializer("stop", np.array([2 * m + 2], np.int64)), axis])
        ys.append(_op(graph, "Mul", [rows, w], micro=m))
        total = _op(graph, "ReduceSum", [ys[m]], {"keepdims": 0}, micro=m)
        losses.append(_op(graph, "Div", [total, _op(graph, "Mul", [replicas, micro_batch], micro=m)], micro=m))
    reduced = _op(graph, "ReplicaAllReduce", [_op(graph, "Add", losses)], {"reduce_op": "SUM", "group_key": "g"},
                  domain=GRAPHDIST_DOMAIN)
    graph.outputs = [reduced, _op(graph, "Concat", ys, {"axis": 0})]
    return graph


def _accumulate(graph: Graph, steps: int) -> Graph:
    """Runs the pass: it must say it changed the graph, verify, and change nothing the second time."""
    result = AccumulateGradientsPass(steps)(graph, PassContext())
    assert result.modified
    verify(result.graph)
    snapshot = result.graph.copy()
    again = AccumulateGradientsPass(steps)(result.graph, PassContext())
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, meta_keys=("micro", "context"))
    return result.graph


def _run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run({v.name: feeds[v.name] for v in graph.inputs})


def test_micro_batches_replace_the_batch_and_meet_before_the_all_reduce() -> None:
    graph = _accumulate(_before(), 2)
    assert_structural_equal(graph, _expected(), meta_keys=("micro", "context"))
    assert graph.meta.accumulate_steps == 2
    assert [v.name for v in graph.inputs] == ["x", "w"]  # the step is called as before


def test_micro_batches_compute_what_the_whole_batch_computes() -> None:
    feeds = {"x": RNG.standard_normal((4, 3)).astype(np.float32), "w": RNG.standard_normal(3).astype(np.float32)}
    before = _run(_before(), feeds)
    after = _run(_accumulate(_before(), 2), feeds)
    # A sum of 12 standard-normal products (magnitude ~1) can be near zero, where two summation orders (micro
    # batches vs the whole batch; ORT's vs numpy's, which depend on the CPU) differ by more than rtol allows.
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(after[1], before[1])  # per-example values: the rows, in order
    np.testing.assert_allclose(before[0], (feeds["x"] * feeds["w"]).sum() / 4, rtol=1e-6, atol=1e-6)


def test_max_all_reduce_takes_the_micro_batches_maximum() -> None:
    graph = _accumulate(_before("MAX"), 2)
    reduce = next(n for n in graph.nodes if n.op_type == "ReplicaAllReduce")
    assert reduce.inputs[0].producer.op_type == "Max"
    feeds = {"x": RNG.standard_normal((4, 3)).astype(np.float32), "w": RNG.standard_normal(3).astype(np.float32)}
    halves = [(feeds["x"][2 * m:2 * m + 2] * feeds["w"]).sum() / 4 for m in range(2)]  # each micro loss: / (2 * 2)
    np.testing.assert_allclose(_run(graph, feeds)[0], max(halves), rtol=1e-6)


def test_one_micro_batch_changes_nothing() -> None:
    graph = _before()
    snapshot = graph.copy()
    result = AccumulateGradientsPass(1)(graph, PassContext())
    assert not result.modified
    assert_structural_equal(result.graph, snapshot)


def test_a_batch_that_does_not_divide_is_refused() -> None:
    with pytest.raises(GraphError, match="accumulate_steps=3 cannot cut a per-replica batch of 4 rows"):
        AccumulateGradientsPass(3)(_before(), PassContext())


def test_a_graph_without_a_batch_or_with_uneven_replicas_is_refused() -> None:
    graph = _before()
    graph.meta.batch = None
    with pytest.raises(GraphError, match="no batch input to cut into micro-batches"):
        AccumulateGradientsPass(2)(graph, PassContext())
    graph = _before()
    graph.meta.replica_variants = {"v1": [0], "v2": [1]}
    with pytest.raises(GraphError, match="drop_remainder=True"):
        AccumulateGradientsPass(2)(graph, PassContext())


def test_a_variable_assigned_from_the_micro_batches_is_not_supported() -> None:
    graph = _before()
    y = graph.outputs[1]
    mean = _op(graph, "ReduceMean", [y], {"keepdims": 0})
    _op(graph, "AssignVariable", [mean], {"variable": "moving"}, domain=GRAPHDIST_DOMAIN)
    with pytest.raises(NotImplementedError, match="assigns a variable from each micro-batch"):
        AccumulateGradientsPass(2)(graph, PassContext())


def test_bad_micro_batch_counts_are_refused() -> None:
    for steps in (0, -1, 1.5, True):
        with pytest.raises(GraphError, match="positive number of micro-batches"):
            AccumulateGradientsPass(steps)
