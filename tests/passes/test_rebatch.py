"""RebatchPass: a BEFORE graph (hand-built or traced) given another per-replica batch size equals the
EXPECTED graph (built or traced at that size), ``modified`` is honest, a second run changes nothing, and
the re-batched step computes what numpy computes at the new size.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import default_cache, get_backend
from graphdist.compile.build import compile_traced
from graphdist.ir import Graph, assert_structural_equal, structural_diff, to_onnx, verify
from graphdist.ir.batch import BatchDim, affine
from graphdist.ir.placement import PlacementSpec, VariablePlacement
from graphdist.models.mlp import MLP
from graphdist.passes.rebatch import RebatchPass
from graphdist.runtime.devices import parse_device

RNG = np.random.default_rng(5)
TWO = ["cpu:0", "cpu:1"]


def _rebatch(graph: Graph, batch: int, modified: bool = True) -> Graph:
    """Runs the pass: ``modified`` as expected, verified, a second run changes nothing."""
    result = RebatchPass(batch)(graph)
    assert result.modified is modified
    verify(result.graph)
    snapshot = result.graph.copy()
    again = RebatchPass(batch)(result.graph)
    assert not again.modified
    assert_structural_equal(again.graph, snapshot)
    return result.graph


def _run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run({v.name: feeds[v.name] for v in graph.inputs})


def _const(graph: Graph, array, provenance=None):
    value = graph.add_initializer("c", np.asarray(array))
    if provenance is not None:
        value.meta["batch"] = provenance
    return value


def _hand(batch: int, record: bool = True) -> Graph:
    """``x[B, 6] -> reshape (2B, -1) -> column sums / (2B - 1) * scale`` (``scale`` a per-replica scalar);
    ``record``: the constants carry their provenance (as the tracer leaves them).
    """
    graph = Graph("hand")
    x = graph.add_input("x", np.float32, (BatchDim(batch) if record else batch, 6))
    scale = graph.add_input("scale", np.float32, ())
    target = _const(graph, np.array([2 * batch, -1], np.int64), [(2, 0), None] if record else None)
    (rows,) = graph.add_node("Reshape", [x, target]).outputs
    (sums,) = graph.add_node("ReduceSum", [rows, _const(graph, np.array([0]))], {"keepdims": 0}).outputs
    divisor = _const(graph, np.float32(2 * batch - 1), [(2, -1)] if record else None)
    (mean,) = graph.add_node("Div", [sums, divisor]).outputs
    graph.outputs = [graph.add_node("Mul", [mean, scale]).outputs[0]]
    graph.meta.batch = batch
    graph.meta.per_replica_inputs = {"x": None, "scale": None}
    return graph


def _traced(replica_fn, *components):
    strategy = gd.MirroredStrategy(TWO)

    @gd.function
    def step(x):
        return strategy.run(replica_fn, args=(x,))

    return step.get_concrete_function(gd.PerReplica(components)).graph("traced")


# ------------------------------------------------------------ hand-built graphs
def test_size_already_in_place_is_unchanged() -> None:
    graph = _hand(4)
    snapshot = graph.copy()
    assert_structural_equal(_rebatch(graph, 4, modified=False), snapshot)
    np.testing.assert_array_equal(graph.initializers["c"].const_value, [8, -1])


@pytest.mark.parametrize("batch", [8, 3, 1])
def test_hand_built_graph_gets_the_new_batch(batch: int) -> None:
    before = _hand(4)
    after = _rebatch(before.copy(), batch)
    assert_structural_equal(after, _hand(batch, record=False))
    x, scale = after.inputs
    assert x.shape == (batch, 6) and affine(x.shape[0]) == (1, 0) and scale.shape == ()  # rank 0: unchanged
    assert after.meta.batch == batch
    np.testing.assert_array_equal(before.initializers["c"].const_value, [8, -1])  # the copy's constants are new
    data = RNG.standard_normal((batch, 6)).astype(np.float32)
    (got,) = _run(after, {"x": data, "scale": np.float32(3.0)})
    want = data.reshape(2 * batch, 3).sum(axis=0) / (2 * batch - 1) * 3.0
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_there_and_back_again() -> None:
    assert_structural_equal(_rebatch(_rebatch(_hand(4), 6), 4), _hand(4))


def test_rejected_shape_names_the_node_and_where_it_was_traced() -> None:
    graph = Graph("frozen")
    x = graph.add_input("x", np.float32, (BatchDim(4), 3, 2))
    node = graph.add_node("Reshape", [x, _const(graph, np.array([4, 6], np.int64))])  # no provenance
    node.meta["source"] = "model.py:12"
    graph.outputs = node.outputs
    graph.meta.batch = 4
    graph.meta.per_replica_inputs = {"x": None}
    with pytest.raises(gd.GraphError, match=r"per-replica batch 8 to node reshape \(Reshape, traced at "
                                            r"model\.py:12\).*float32\[8,3,2\]"):
        RebatchPass(8)(graph)


def test_output_dtype_change_is_refused() -> None:
    graph = _hand(4)
    graph.outputs[0].dtype = np.dtype(np.float64)  # disagrees with what Mul's rule gives
    with pytest.raises(gd.GraphError, match="node mul .*would become float32 instead of float64"):
        RebatchPass(8)(graph)


def test_graphs_without_one_batch_size_are_refused() -> None:
    uneven = _hand(4)
    uneven.meta.replica_variants = {"v1": [0], "v2": [1]}
    with pytest.raises(gd.GraphError, match="no single per-replica batch size.*uneven per-replica shapes"):
        RebatchPass(8)(uneven)
    unbatched = _hand(4)
    unbatched.meta.batch = None
    with pytest.raises(gd.GraphError, match="no single per-replica batch size.*without per-replica inputs"):
        RebatchPass(8)(unbatched)
    with pytest.raises(gd.GraphError, match="positive batch size"):
        RebatchPass(0)


# ------------------------------------------------------------ traced steps
def test_traced_uneven_or_unbatched_steps_are_refused() -> None:
    data = np.ones((8, 3), np.float32)
    uneven = _traced(np.sum, data[:5], data[5:])
    assert uneven.meta.batch is None and uneven.meta.replica_variants
    with pytest.raises(gd.GraphError, match="uneven per-replica shapes"):
        RebatchPass(4)(uneven)
    scalar = _traced(lambda s: s * 2.0, np.float32(1.0), np.float32(2.0))
    with pytest.raises(gd.GraphError, match="without per-replica inputs"):
        RebatchPass(4)(scalar)


def test_traced_frozen_reshape_is_refused_naming_this_file() -> None:
    halves = np.split(np.ones((8, 3, 2), np.float32), 2)
    graph = _traced(lambda x: x.reshape(int(x.shape[0]), 6), *halves)
    with pytest.raises(gd.GraphError, match=r"node reshape \(Reshape, traced at test_rebatch\.py:\d+\)"):
        RebatchPass(8)(graph)
    # (int(B), -1) still type-checks at 8 rows ([4, 12]): the pass trusts the record, and only tracing again
    # at that size (what the exporter's check does) shows the difference.
    frozen = _rebatch(_traced(lambda x: x.reshape(int(x.shape[0]), -1), *halves), 8)
    assert frozen.find_nodes("Reshape")[0].outputs[0].shape == (4, 12)
    at_eight = _traced(lambda x: x.reshape(x.shape[0], -1), *np.split(np.ones((16, 3, 2), np.float32), 2))
    assert "constant" in (structural_diff(frozen, at_eight) or "")  # [4, -1] vs [8, -1]


def _mlp_step(per_replica: int, global_batch_size: int | None) -> gd.ConcreteFunction:
    """The MLP SGD training step under Mirrored(2), traced for ``per_replica`` rows per replica."""
    strategy = gd.MirroredStrategy(TWO)
    with strategy.scope():
        model = MLP((6, 5, 3), seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    replica_step = model.make_train_step(optimizer, global_batch_size)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    x, labels = np.zeros((2 * per_replica, 6), np.float32), np.zeros(2 * per_replica, np.int64)
    return train.get_concrete_function(gd.PerReplica(tuple(np.split(x, 2))),
                                       gd.PerReplica(tuple(np.split(labels, 2))))


@pytest.mark.parametrize("global_batch_size", [16, None], ids=["fixed", "counted"])
def test_mlp_step_rebatched_equals_the_step_traced_at_that_size(global_batch_size) -> None:
    traced = _mlp_step(8, global_batch_size).graph("traced")
    recorded = [v.meta["batch"] for v in traced.initializers.values() if v.meta.get("batch")]
    assert recorded == ([] if global_batch_size else [[(1, 0)]])  # None: the loss divides by B * replicas
    assert_structural_equal(_rebatch(traced.copy(), 4), _mlp_step(4, global_batch_size).graph("traced"))


def _numpy_sgd(weights: list[np.ndarray], x: np.ndarray, labels: np.ndarray, lr: float):
    """Loss and weights after one SGD step of the mean cross-entropy, by hand."""
    w0, b0, w1, b1 = weights
    pre = x @ w0 + b0
    hidden = np.maximum(pre, 0)
    logits = hidden @ w1 + b1
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    onehot = np.eye(3)[labels]
    loss = -np.sum(onehot * np.log(probs)) / len(x)
    dlogits = (probs - onehot) / len(x)
    dhidden = dlogits @ w1.T * (pre > 0)
    grads = [x.T @ dhidden, dhidden.sum(0), hidden.T @ dlogits, dlogits.sum(0)]
    return loss, [w - lr * g for w, g in zip(weights, grads)]


@pytest.mark.parametrize("global_batch_size", [16, None], ids=["fixed", "counted"])
def test_mlp_step_rebatched_for_one_device_trains_like_numpy(global_batch_size) -> None:
    concrete = _mlp_step(8, global_batch_size)  # 2 replicas of 8 rows
    graph = _rebatch(concrete.graph("traced").copy(), 16)  # 1 replica of the 16
    variables = graph.meta.variables
    placement = PlacementSpec({spec.uid: VariablePlacement("local", ("cpu:0",)) for _, spec in variables})
    graphs, plan, resolved = compile_traced(graph, concrete.interface.for_replicas(1),
                                            gd.OneDeviceStrategy("cpu:0").pipeline(), placement, None)
    weights = MLP((6, 5, 3), seed=0).trainable_variables
    x, labels = RNG.standard_normal((16, 6)).astype(np.float32), RNG.integers(0, 3, 16)
    feeds = dict(zip(resolved.input_names, (x, labels)))
    feeds.update({name: value for (name, _), value in zip(variables, [*weights, np.array(0, np.int64)])})
    rewritten = graphs["rewritten"]
    results = dict(zip([v.name for v in rewritten.outputs], plan.run(feeds), strict=True))
    loss, updated = _numpy_sgd([w.astype(np.float64) for w in weights], x.astype(np.float64), labels, 0.1)
    np.testing.assert_allclose(results[rewritten.outputs[0].name], loss, rtol=1e-5)
    new_values = {uid: results[name] for name, uid in rewritten.meta.variable_updates}
    for (_, spec), want in zip(variables, [*updated, 1]):
        np.testing.assert_allclose(new_values[spec.uid], want, rtol=1e-5, atol=1e-6, err_msg=spec.name)


@pytest.mark.parametrize("module", ["graphdist.models.convnet", "graphdist.models.transformer"])
def test_model_step_rebatched_equals_the_step_traced_at_that_size(module: str) -> None:
    import importlib

    make_step = importlib.import_module(module).make_step

    def traced(batch: int) -> Graph:
        step, args = make_step(gd.MirroredStrategy(TWO), batch=batch)
        return step.get_concrete_function(*args).graph("traced")

    before = traced(16)  # 8 rows per replica
    assert before.meta.batch == 8 and any(v.meta.get("batch") for v in before.initializers.values())
    assert_structural_equal(_rebatch(before.copy(), 16), traced(32))



# ------------------------------------------------------------ gathers over the replicas
def _gathering(per_replica: int, replicas: int):
    """A step that gathers each replica's rows (``strategy.gather``) for ``replicas`` replicas."""
    strategy = gd.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])

    @gd.function
    def step(x):
        return strategy.gather(strategy.run(lambda a: np.tanh(a) * 2.0, args=(x,)), axis=0)

    data = np.ones((per_replica * replicas, 3), np.float32)
    return step.get_concrete_function(gd.PerReplica(tuple(np.split(data, replicas)))).graph("traced")


def test_gathers_follow_the_replica_count_on_the_same_global_batch() -> None:
    before = _gathering(4, 2)  # 2 replicas of 4 rows, gathered: 8 rows
    (gather,) = before.find_nodes("CrossReplicaGather", "graphdist")
    assert gather.attrs["num_replicas"] == 2 and before.outputs[0].shape[0] == 8
    result = RebatchPass(2, replicas=4)(before.copy())
    assert result.modified
    verify(result.graph)
    assert_structural_equal(result.graph, _gathering(2, 4))  # traced directly for 4 replicas of 2 rows
    again = RebatchPass(2, replicas=4)(result.graph)
    assert not again.modified


def test_replica_count_alone_changes_gathers_of_unbatched_steps() -> None:
    strategy = gd.MirroredStrategy(TWO)

    @gd.function
    def step():
        return strategy.gather(strategy.run(lambda: gd.get_replica_context().replica_id_in_sync_group * 1.0
                                            + np.zeros((1,), np.float32)), axis=0)

    traced = step.get_concrete_function().graph("traced")
    assert traced.meta.batch is None and traced.outputs[0].shape == (2,)
    result = RebatchPass(None, replicas=3)(traced)
    assert result.modified and result.graph.outputs[0].shape == (3,)
    with pytest.raises(gd.GraphError, match="without per-replica inputs"):
        RebatchPass(4, replicas=3)(result.graph)
