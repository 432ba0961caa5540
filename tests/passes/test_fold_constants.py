"""FoldConstantsPass: before vs hand-built expected structure, honest ``modified``, a second
run changes nothing, numerics before == after (reference backend)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import default_cache, get_backend
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal, to_onnx, verify
from graphdist.ir.ops import onnx_dtype
from graphdist.passes.base import PassContext
from graphdist.passes.fold_constants import MAX_ELEMENTS, FoldConstantsPass
from graphdist.passes.replicate import ReplicatePass
from graphdist.runtime.devices import parse_device

RNG = np.random.default_rng(2)
FLOAT = onnx_dtype(np.float32)


def _run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run({v.name: feeds[v.name] for v in graph.inputs})


def _feeds(graph: Graph) -> dict[str, np.ndarray]:
    return {v.name: (RNG.standard_normal(v.shape) * 10).astype(v.dtype) for v in graph.inputs}


def _out(graph: Graph, op_type: str, inputs: list[Value], attrs: dict | None = None, **meta) -> Value:
    node = graph.add_node(op_type, inputs, attrs)
    node.replica = meta.pop("replica", None)
    node.meta.update(meta)
    return node.outputs[0]


def _fold(graph: Graph, expect_modified: bool) -> Graph:
    """Runs the pass: ``modified`` as expected, verified, numerics unchanged, a second run changes nothing."""
    feeds = _feeds(graph)
    before = _run(graph, feeds)
    result = FoldConstantsPass()(graph, PassContext())
    assert result.modified is expect_modified
    verify(result.graph)
    for got, want in zip(_run(result.graph, feeds), before, strict=True):
        np.testing.assert_array_equal(got, want)
    snapshot = result.graph.copy()
    again = FoldConstantsPass()(result.graph, PassContext())
    assert not again.modified
    assert_structural_equal(again.graph, snapshot)
    return result.graph


def _add_to_input(constant: np.ndarray, op_type: str | None = None, inputs: tuple = (), attrs: dict | None = None):
    """``x + op(inputs)`` (or ``x + constant`` when ``op_type`` is None), ``x`` shaped like ``constant``."""
    graph = Graph("fold")
    x = graph.add_input("x", constant.dtype, constant.shape)
    if op_type is None:
        operand = graph.add_initializer("expected", constant)
    else:
        operand = _out(graph, op_type, [graph.add_initializer(f"c{i}", c) for i, c in enumerate(inputs)], attrs)
    graph.outputs = [_out(graph, "Add", [x, operand])]
    return graph


@pytest.mark.parametrize(("op_type", "inputs", "attrs", "value"), [
    ("Cast", [np.float32(-2.75)], {"to": onnx_dtype(np.int32)}, np.int32(-2)),  # truncates toward zero
    ("Cast", [np.int64(3)], {"to": FLOAT}, np.float32(3.0)),
    ("Identity", [np.array([1.5, -2.0], np.float32)], None, np.array([1.5, -2.0], np.float32)),
    ("Neg", [np.array([2.5, 0.0], np.float32)], None, np.array([-2.5, -0.0], np.float32)),
    ("Add", [np.int32(7), np.int32(-3)], None, np.int32(4)),
    ("Sub", [np.float32(1.0), np.float32(0.25)], None, np.float32(0.75)),
    ("Mul", [np.int64(6), np.int64(7)], None, np.int64(42)),
    ("Mul", [np.array([[1.0], [2.0]], np.float32), np.array([10.0, 20.0, 30.0], np.float32)], None,
     np.array([[10.0, 20.0, 30.0], [20.0, 40.0, 60.0]], np.float32)),  # broadcast
    ("Div", [np.float32(1.0), np.float32(8.0)], None, np.float32(0.125)),
    ("Div", [np.float16(1.0), np.float16(3.0)], None, np.float16(0.33325195)),  # rounded in float16
])
def test_op_of_constants_becomes_its_value(op_type, inputs, attrs, value) -> None:
    value = np.asarray(value)
    graph = _fold(_add_to_input(value, op_type, inputs, attrs), expect_modified=True)
    assert_structural_equal(graph, _add_to_input(value))
    assert [n.op_type for n in graph.nodes] == ["Add"]


def test_integer_div_is_left_alone() -> None:
    """ONNX integer Div truncates (-7 / 2 = -3) where numpy floors (-4): not folded."""
    graph = _add_to_input(np.asarray(np.int32(0)), "Div", (np.int32(-7), np.int32(2)))
    expected = graph.copy()
    assert_structural_equal(_fold(graph, expect_modified=False), expected)


def _average_loss_graph(fold: bool) -> Graph:
    """``sum(x) / (Cast(replicas) * batch)`` as ``compute_average_loss`` traces it (folded: ``/ 8``)."""
    graph = Graph("average")
    x = graph.add_input("x", np.float32, (4,))
    total = _out(graph, "ReduceSum", [x], {"keepdims": 0})
    if fold:
        denominator = graph.add_initializer("eight", np.float32(8.0))
    else:
        replicas = _out(graph, "Cast", [graph.add_initializer("replicas", np.int32(2))], {"to": FLOAT})
        denominator = _out(graph, "Mul", [replicas, graph.add_initializer("batch", np.float32(4.0))])
    graph.outputs = [_out(graph, "Div", [total, denominator])]
    return graph


def test_chain_folds_in_one_run() -> None:
    graph = _fold(_average_loss_graph(fold=False), expect_modified=True)
    assert_structural_equal(graph, _average_loss_graph(fold=True))
    x = np.array([1.0, 2.0, 3.0, 10.0], np.float32)
    np.testing.assert_allclose(_run(graph, {"x": x})[0], 16.0 / 8.0)


def test_traced_average_loss_after_replication() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(x):
        losses = strategy.run(gd.nn.compute_average_loss, args=(x,))
        return losses, strategy.reduce("SUM", losses, axis=None)

    x = gd.PerReplica((np.arange(4, dtype=np.float32), np.full(4, 5.0, np.float32)))
    traced = step.get_concrete_function(x).graph("traced").copy()
    graph = _fold(ReplicatePass(2)(traced, PassContext()).graph, expect_modified=True)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, (4,)) for r in range(2)]
    eight = expected.add_initializer("eight", np.float32(8.0))  # 2 replicas * 4 rows
    sums = [_out(expected, "ReduceSum", [xs[r]], {"keepdims": 0}, replica=r) for r in range(2)]
    losses = [_out(expected, "Div", [sums[r], eight], replica=r) for r in range(2)]
    total = expected.add_node("CrossReplicaReduce", losses, {"reduce_op": "SUM", "group_key": "k"},
                              domain=GRAPHDIST_DOMAIN).outputs[0]
    expected.outputs = [*losses, total]
    assert_structural_equal(graph, expected, placement=True, meta_keys=("replica",))
    loss0, loss1, summed = _run(graph, {"arg0_r0": x.values[0], "arg0_r1": x.values[1]})
    assert (float(loss0), float(loss1), float(summed)) == (0.75, 2.5, 3.25)  # 6 / 8, 20 / 8, their sum


@pytest.mark.parametrize("size", [MAX_ELEMENTS, MAX_ELEMENTS + 1])
def test_only_small_outputs_are_folded(size: int) -> None:
    constant = np.arange(size, dtype=np.float32)
    graph = _add_to_input(-constant, "Neg", (constant,))
    expected = _add_to_input(-constant) if size <= MAX_ELEMENTS else graph.copy()
    assert_structural_equal(_fold(graph, expect_modified=size <= MAX_ELEMENTS), expected)


def test_side_effect_node_is_left_alone() -> None:
    graph = _add_to_input(np.asarray(np.float32(0)), "Neg", (np.float32(2.0),))
    graph.nodes[0].meta["side_effect"] = True
    expected = graph.copy()
    assert_structural_equal(_fold(graph, expect_modified=False), expected)


def test_graph_output_stays_produced_by_a_node() -> None:
    """``Neg(Cast(3))`` is a graph output: the Cast folds, the Neg stays (reading ``3.0``)."""
    graph = Graph("output")
    cast = _out(graph, "Cast", [graph.add_initializer("three", np.int32(3))], {"to": FLOAT})
    graph.outputs = [_out(graph, "Neg", [cast]), _out(graph, "Identity", [graph.add_initializer("k", np.float32(1))])]
    graph = _fold(graph, expect_modified=True)

    expected = Graph("expected")
    expected.outputs = [_out(expected, "Neg", [expected.add_initializer("three", np.float32(3.0))]),
                        _out(expected, "Identity", [expected.add_initializer("k", np.float32(1))])]
    assert_structural_equal(graph, expected)
    assert all(out.producer is not None for out in graph.outputs)
    assert [float(v) for v in _run(graph, {})] == [-3.0, 1.0]


def test_nothing_to_fold_is_unchanged() -> None:
    """Non-constant inputs and graphdist-domain ops are not folded."""
    graph = Graph("plain")
    x = graph.add_input("x", np.float32, (3,))
    y = _out(graph, "Mul", [x, graph.add_initializer("two", np.float32(2.0))])
    count = graph.add_node("NumReplicas", [], domain=GRAPHDIST_DOMAIN).outputs[0]
    graph.outputs = [y, _out(graph, "Cast", [count], {"to": FLOAT})]
    expected = graph.copy()
    assert_structural_equal(_fold(graph, expect_modified=False), expected)
