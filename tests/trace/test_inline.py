"""Inlining an existing graph (an imported ONNX model) into traced code, and the
data-parallel inference step built on it."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.inference import make_inference_step
from graphdist.ir import from_onnx, to_onnx
from graphdist.models.mlp import MLP
from graphdist.trace.inline import example_batch, graph_function, inline_graph


@pytest.fixture(scope="module")
def model() -> MLP:
    return MLP((6, 5, 3), seed=1)


@pytest.fixture(scope="module")
def imported(model: MLP) -> gd.Graph:
    """The MLP traced for batch 8, lowered to ONNX and imported back."""
    return from_onnx(to_onnx(gd.trace(model.forward, np.ones((8, 6), np.float32))))


def test_inlined_graph_computes_the_model(model: MLP, imported: gd.Graph) -> None:
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    traced = gd.trace(lambda a: inline_graph(imported, [a])[0] * 2, x)
    assert [n.op_type for n in traced.nodes] == ["MatMul", "Add", "Max", "MatMul", "Add", "Mul"]
    result = gd.function(graph_function(imported))(x)
    np.testing.assert_allclose(result, model.reference_forward(x), rtol=1e-5, atol=1e-6)


def test_batch_axis_lets_the_batch_differ(model: MLP, imported: gd.Graph) -> None:
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    fn = graph_function(imported, batch_axis=0)
    graph = gd.trace(fn, x)
    assert graph.outputs[0].type_str() == "float32[3,3]"  # output types re-inferred for the new batch
    np.testing.assert_allclose(gd.function(fn)(x), model.reference_forward(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(gd.TracingError, match="dimension 0 must be 8"):
        gd.trace(graph_function(imported), x)


def test_numpy_arguments_become_constants(imported: gd.Graph) -> None:
    graph = gd.trace(lambda: inline_graph(imported, [np.ones((8, 6), np.float32)])[0])
    assert not graph.inputs and graph.outputs[0].type_str() == "float32[8,3]"


def test_several_outputs() -> None:
    source = gd.trace(lambda x: (x + 1, x * 3), np.ones(4, np.float32))
    fn = graph_function(source)
    assert fn.__name__ == "lambda"
    first, second = gd.function(fn)(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(first, [1, 2, 3, 4])
    np.testing.assert_array_equal(second, [0, 3, 6, 9])


@pytest.mark.parametrize(("args", "message"), [
    ([], r"takes 1 input\(s\) \(%arg0: float32\[8,6\]\), got 0"),
    ([np.ones((8, 6), np.float64)], "got a float64 value; cast it with .astype"),
    ([np.ones((8, 6, 1), np.float32)], "rank 3"),
    ([np.ones((8, 5), np.float32)], "dimension 1 must be 6"),
])
def test_argument_errors(imported: gd.Graph, args: list, message: str) -> None:
    with pytest.raises(gd.TracingError, match=message):
        gd.trace(lambda: inline_graph(imported, args, batch_axis=0)[0])


def test_outside_a_trace(imported: gd.Graph) -> None:
    with pytest.raises(gd.TracingError, match="must be called while tracing"):
        graph_function(imported)(np.ones((8, 6), np.float32))


def test_graphdist_nodes_are_refused() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=gd.NcclAllReduce())  # keeps the AllReduce

    @gd.function
    def step(x):
        return strategy.reduce("SUM", strategy.run(lambda v: v * 2, args=(x,)), axis=None)

    rewritten = step.get_concrete_function(np.ones(4, np.float32)).graph("rewritten")
    with pytest.raises(gd.TracingError, match="graphdist.AllReduce"):
        gd.trace(graph_function(rewritten), np.ones(4, np.float32))


@pytest.mark.parametrize("strategy", [
    gd.OneDeviceStrategy("cpu:0"),
    gd.MirroredStrategy(["cpu:0", "cpu:1"]),
    gd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
], ids=["one_device", "mirrored", "central_storage"])
def test_inference_step_splits_the_batch(model: MLP, imported: gd.Graph, strategy: gd.Strategy) -> None:
    step, example = make_inference_step(imported, strategy, batch=8)
    replicas = strategy.num_replicas_in_sync
    # Per-replica values for one replica too: the plan knows its arguments are the batch (it re-plans to N).
    assert all(isinstance(a, gd.PerReplica) and [v.shape for v in a.values] == [(8 // replicas, 6)] * replicas
               for a in example)
    x = np.concatenate(example[0].values)
    np.testing.assert_allclose(step(*example), model.reference_forward(x), rtol=1e-5, atol=1e-6)
    concrete = step.get_concrete_function(*example)
    # traced once, as one replica; the pipeline makes the replicas
    assert len(concrete.graph("traced").find_nodes("MatMul")) == 2
    assert len(concrete.graph("rewritten").find_nodes("MatMul")) == 2 * replicas
    assert [c.op for c in concrete.plan.comms] == (["AllGather"] if replicas > 1 else [])


def test_inference_step_batch_defaults_and_errors(imported: gd.Graph) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    _, example = make_inference_step(imported, strategy)  # 8 does not divide by 3: 8 per replica
    assert [v.shape for v in example[0].values] == [(8, 6)] * 3
    with pytest.raises(gd.InvalidArgumentError, match="multiple of the number of replicas"):
        make_inference_step(imported, strategy, batch=10)


def test_example_batch() -> None:
    graph = gd.Graph("g")
    graph.add_input("ids", np.int64, ("batch", "length"))
    graph.add_input("x", np.float32, ("batch", 4))
    ids, x = example_batch(graph, 5)
    assert ids.shape == (5, 1) and ids.dtype == np.int64 and not ids.any()
    assert x.shape == (5, 4) and x.dtype == np.float32
    graph.add_input("scale", np.float32, ())
    with pytest.raises(gd.InvalidArgumentError, match="scalar"):
        example_batch(graph, 5)
