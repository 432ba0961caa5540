"""ReplicatePass: hand-built (or traced) before vs hand-built expected structure, honest
``modified``, a second run changes nothing, and each replica computes what the traced
one-replica graph computes on that replica's inputs (reference backend)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import default_cache, get_backend
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal, to_onnx, verify
from graphdist.passes.base import PassContext
from graphdist.passes.replicate import ReplicatePass, Replication
from graphdist.runtime.devices import parse_device

RNG = np.random.default_rng(11)
FLOAT = 1  # onnx.TensorProto.FLOAT


def _run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run({v.name: feeds[v.name] for v in graph.inputs})


def _op(graph: Graph, op_type: str, inputs: list[Value], attrs: dict | None = None, *, replica: int | None = None,
        context: str | None = None, variant: str | None = None, domain: str = "") -> Value:
    node = graph.add_node(op_type, inputs, attrs, domain=domain)
    node.replica = replica
    given = {"context": context, "variant": variant}
    node.meta.update({k: v for k, v in given.items() if v is not None})
    return node.outputs[0]


def _replicate(graph: Graph, replicas: int, **kwargs) -> Graph:
    """Runs the pass: it must say it changed the graph, verify, and change nothing the second time."""
    result = ReplicatePass(replicas, **kwargs)(graph, PassContext())
    assert result.modified
    verify(result.graph)
    snapshot = result.graph.copy()
    again = ReplicatePass(replicas, **kwargs)(result.graph, PassContext())
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, placement=True, meta_keys=("replica",))
    return result.graph


def _equal(actual: Graph, expected: Graph) -> None:
    assert_structural_equal(actual, expected, placement=True, meta_keys=("replica",))


def _mul_add_graph() -> Graph:
    """``y = x * w + 1`` in the replica (``x`` per replica, ``w`` shared); cross-replica code sums ``y``."""
    graph = Graph("mul_add")
    x, w = graph.add_input("x", np.float32, (2, 3)), graph.add_input("w", np.float32, (3,))
    one = graph.add_initializer("one", np.float32(1.0))
    y = _op(graph, "Add", [_op(graph, "Mul", [x, w], context="replica"), one], context="replica")
    total = _op(graph, "ReduceSum", [y], {"keepdims": 0})
    graph.outputs = [total, y]
    graph.meta.per_replica_inputs = {"x": None}
    graph.meta.per_replica_outputs = {1: None}
    return graph


def test_replica_nodes_and_inputs_are_copied_per_replica() -> None:
    graph = _mul_add_graph()
    traced, traced_nodes = graph.copy(), list(graph.nodes)
    graph = _replicate(graph, 2)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, (2, 3)) for r in range(2)]
    w, one = expected.add_input("w", np.float32, (3,)), expected.add_initializer("one", np.float32(1.0))
    muls = [_op(expected, "Mul", [xs[r], w], replica=r) for r in range(2)]
    adds = [_op(expected, "Add", [muls[r], one], replica=r) for r in range(2)]
    expected.outputs = [_op(expected, "ReduceSum", [adds[0]], {"keepdims": 0}), *adds]  # cross code: replica 0's
    _equal(graph, expected)
    # replica 0 keeps the traced nodes and names; replica 1 gets _r1 copies; inputs are all renamed
    assert [v.name for v in graph.inputs] == ["x_r0", "x_r1", "w"]
    assert [n.name for n in graph.nodes] == ["mul", "mul_r1", "add", "add_r1", "reducesum"]
    assert graph.nodes[0] is traced_nodes[0] and graph.nodes[2] is traced_nodes[1]

    feeds = {"x_r0": RNG.standard_normal((2, 3)).astype(np.float32),
             "x_r1": RNG.standard_normal((2, 3)).astype(np.float32), "w": RNG.standard_normal(3).astype(np.float32)}
    total, y0, y1 = _run(graph, feeds)
    for r, got in enumerate((y0, y1)):
        want_total, want_y = _run(traced, {"x": feeds[f"x_r{r}"], "w": feeds["w"]})
        np.testing.assert_array_equal(got, want_y)
        if r == 0:
            np.testing.assert_array_equal(total, want_total)
    np.testing.assert_allclose(y1, feeds["x_r1"] * feeds["w"] + 1.0, rtol=1e-6)


def test_replication_record_maps_inputs_and_outputs() -> None:
    graph = _replicate(_mul_add_graph(), 2, offset=2, replicas_in_sync=4)
    record = graph.meta.replication
    assert record == Replication(replicas=2, offset=2, replicas_in_sync=4, input_map={"x": {0: "x_r0", 1: "x_r1"}},
                                 output_map={0: 0}, replica_outputs={1: {0: 1, 1: 2}})
    assert graph.outputs[record.output_map[0]].producer.op_type == "ReduceSum"
    for replica, position in record.replica_outputs[1].items():
        producer = graph.outputs[position].producer
        assert (producer.op_type, producer.replica) == ("Add", replica)
        assert producer.inputs[0].producer.inputs[0].name == record.input_map["x"][replica]


def _variant_graph() -> Graph:
    """Traced for 3 replicas, the last one on a shorter batch: variants v1 = [0, 1] and v2 = [2]."""
    graph = Graph("variants")
    a, b = graph.add_input("a", np.float32, (2, 3)), graph.add_input("b", np.float32, (1, 3))
    sa = _op(graph, "ReduceSum", [a], {"keepdims": 0}, context="replica", variant="v1")
    sb = _op(graph, "ReduceSum", [b], {"keepdims": 0}, context="replica", variant="v2")
    graph.outputs = [sa, sb, _op(graph, "Neg", [sa])]  # Neg: cross-replica code reading a replica value
    graph.meta.per_replica_inputs = {"a": "v1", "b": "v2"}
    graph.meta.per_replica_outputs = {0: "v1", 1: "v2"}
    graph.meta.replica_variants = {"v1": [0, 1], "v2": [2]}
    return graph


def test_variants_copy_nodes_for_their_replicas_and_cross_code_reads_replica_zero() -> None:
    graph = _variant_graph()
    traced, traced_sb, traced_name = graph.copy(), graph.nodes[1], graph.nodes[1].name
    graph = _replicate(graph, 3)

    expected = Graph("expected")
    a0, a1 = (expected.add_input(f"a{r}", np.float32, (2, 3)) for r in range(2))
    b2 = expected.add_input("b2", np.float32, (1, 3))
    sa = [_op(expected, "ReduceSum", [a], {"keepdims": 0}, replica=r) for r, a in enumerate((a0, a1))]
    sb = _op(expected, "ReduceSum", [b2], {"keepdims": 0}, replica=2)
    expected.outputs = [*sa, sb, _op(expected, "Neg", [sa[0]])]
    _equal(graph, expected)
    assert graph.nodes[2] is traced_sb and traced_sb.name == traced_name  # replica 2 is v2's first: the traced node
    assert graph.meta.replication.input_map == {"a": {0: "a_r0", 1: "a_r1"}, "b": {2: "b_r2"}}
    assert graph.meta.replication.replica_outputs == {0: {0: 0, 1: 1}, 1: {2: 2}}
    assert graph.meta.replication.output_map == {2: 3}

    parts = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    parts.append(RNG.standard_normal((1, 3)).astype(np.float32))
    s0, s1, s2, neg = _run(graph, {"a_r0": parts[0], "a_r1": parts[1], "b_r2": parts[2]})
    for r, got in enumerate((s0, s1)):
        np.testing.assert_array_equal(got, _run(traced, {"a": parts[r], "b": parts[2]})[0])
    np.testing.assert_array_equal(s2, _run(traced, {"a": parts[0], "b": parts[2]})[1])
    np.testing.assert_array_equal(neg, -s0)


def test_traced_uneven_batch_is_replicated_per_variant() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    step = gd.function(lambda x: strategy.run(lambda v: np.sum(v * 2.0, axis=0), args=(x,)))
    parts = (RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((2, 3)).astype(np.float32),
             RNG.standard_normal((1, 3)).astype(np.float32))
    graph = _replicate(step.get_concrete_function(gd.PerReplica(parts)).graph("traced").copy(), 3)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, p.shape) for r, p in enumerate(parts)]
    two, axes = expected.add_initializer("two", np.float32(2.0)), expected.add_initializer("axes", np.array([0]))
    muls = [_op(expected, "Mul", [xs[r], two], replica=r) for r in range(2)]
    sums = [_op(expected, "ReduceSum", [muls[r], axes], {"keepdims": 0}, replica=r) for r in range(2)]
    mul2 = _op(expected, "Mul", [xs[2], two], replica=2)
    expected.outputs = [*sums, _op(expected, "ReduceSum", [mul2, axes], {"keepdims": 0}, replica=2)]
    _equal(graph, expected)
    for got, part in zip(_run(graph, dict(zip([v.name for v in graph.inputs], parts))), parts, strict=True):
        np.testing.assert_allclose(got, 2.0 * part.sum(axis=0), rtol=1e-6)


def test_variant_naming_replicas_not_made_is_an_error() -> None:
    made_two = r"uneven per-replica shapes for replicas \[0, 1, 2\].*v2: \[2\].*2 replica\(s\)"
    with pytest.raises(gd.GraphError, match=made_two):
        ReplicatePass(2)(_variant_graph(), PassContext())
    with pytest.raises(gd.GraphError, match="at least one replica"):
        ReplicatePass(0)


def test_variants_not_covering_every_replica_made_are_an_error() -> None:
    with pytest.raises(gd.GraphError, match="uneven per-replica shapes"):
        ReplicatePass(4)(_variant_graph(), PassContext())


def test_replica_id_and_num_replicas_become_constants_with_the_worker_offset() -> None:
    """Worker 1 of 2, two replicas each: its replicas are 2 and 3 of 4 in sync."""
    graph = Graph("ids")
    x = graph.add_input("x", np.float32, (3,))
    rid = _op(graph, "Cast", [_op(graph, "ReplicaId", [], domain=GRAPHDIST_DOMAIN, context="replica")], {"to": FLOAT},
              context="replica")
    count = _op(graph, "Cast", [_op(graph, "NumReplicas", [], domain=GRAPHDIST_DOMAIN, context="replica")],
                {"to": FLOAT}, context="replica")
    y = _op(graph, "Mul", [_op(graph, "Add", [x, rid], context="replica"), count], context="replica")
    cross_id = _op(graph, "Cast", [_op(graph, "ReplicaId", [], domain=GRAPHDIST_DOMAIN)], {"to": FLOAT})
    cross_count = _op(graph, "Cast", [_op(graph, "NumReplicas", [], domain=GRAPHDIST_DOMAIN)], {"to": FLOAT})
    graph.outputs = [y, cross_id, cross_count]
    graph.meta.per_replica_inputs = {"x": None}
    graph.meta.per_replica_outputs = {0: None}
    graph = _replicate(graph, 2, offset=2, replicas_in_sync=4)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, (3,)) for r in range(2)]
    ids = [expected.add_initializer(f"id{r}", np.int32(2 + r)) for r in range(2)]
    four = expected.add_initializer("four", np.int32(4))
    casts = [_op(expected, "Cast", [ids[r]], {"to": FLOAT}, replica=r) for r in range(2)]
    counts = [_op(expected, "Cast", [four], {"to": FLOAT}, replica=r) for r in range(2)]
    adds = [_op(expected, "Add", [xs[r], casts[r]], replica=r) for r in range(2)]
    muls = [_op(expected, "Mul", [adds[r], counts[r]], replica=r) for r in range(2)]
    expected.outputs = [*muls, _op(expected, "Cast", [ids[0]], {"to": FLOAT}), _op(expected, "Cast", [four],
                                                                                     {"to": FLOAT})]
    _equal(graph, expected)
    assert not graph.find_nodes("ReplicaId", GRAPHDIST_DOMAIN) and not graph.find_nodes("NumReplicas",
                                                                                         GRAPHDIST_DOMAIN)
    feeds = {"x_r0": np.array([1, 2, 3], np.float32), "x_r1": np.array([0, -1, 0.5], np.float32)}
    y0, y1, cross_id_value, cross_count_value = _run(graph, feeds)
    np.testing.assert_array_equal(y0, [12, 16, 20])  # (x + 2) * 4
    np.testing.assert_array_equal(y1, [12, 8, 14])  # (x + 3) * 4
    assert (float(cross_id_value), float(cross_count_value)) == (2.0, 4.0)  # cross-replica: the worker's offset


def test_traced_average_loss_and_replica_id_on_a_second_worker() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    def replica_fn(v):
        return gd.nn.compute_average_loss(v) + gd.get_replica_context().replica_id_in_sync_group.astype(np.float32)

    step = gd.function(lambda x: strategy.run(replica_fn, args=(x,)))
    x = gd.PerReplica((np.arange(4, dtype=np.float32), np.full(4, 5.0, np.float32)))
    graph = _replicate(step.get_concrete_function(x).graph("traced").copy(), 2, offset=2, replicas_in_sync=4)
    out0, out1 = _run(graph, {"arg0_r0": x.values[0], "arg0_r1": x.values[1]})
    assert float(out0) == pytest.approx(6 / 16 + 2)  # sum / (4 rows * 4 replicas in sync) + replica id 2
    assert float(out1) == pytest.approx(20 / 16 + 3)
    assert [int(v.const_value) for v in graph.initializers.values() if v.dtype == np.int32] == [4, 2, 3]


def _local_results_step() -> gd.ConcreteFunction:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(x):
        per_replica = strategy.run(lambda v: v + 10.0, args=(x,))
        first, second = strategy.experimental_local_results(per_replica)
        return per_replica, strategy.reduce("SUM", per_replica, axis=None), second - first

    return step.get_concrete_function(gd.PerReplica((np.zeros(2, np.float32), np.ones(2, np.float32))))


def test_read_replica_and_cross_replica_reduce_read_the_replicas_copies() -> None:
    graph = _replicate(_local_results_step().graph("traced").copy(), 2)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, (2,)) for r in range(2)]
    ten = expected.add_initializer("ten", np.float32(10.0))
    adds = [_op(expected, "Add", [xs[r], ten], replica=r) for r in range(2)]
    total = _op(expected, "CrossReplicaReduce", adds, {"reduce_op": "SUM", "group_key": "k"}, domain=GRAPHDIST_DOMAIN)
    expected.outputs = [*adds, total, _op(expected, "Sub", [adds[1], adds[0]])]
    _equal(graph, expected)
    assert not graph.find_nodes("ReadReplica", GRAPHDIST_DOMAIN)
    x0, x1 = np.array([1.0, -2.0], np.float32), np.array([4.0, 0.5], np.float32)
    y0, y1, summed, difference = _run(graph, {"arg0_r0": x0, "arg0_r1": x1})
    np.testing.assert_array_equal(y0, x0 + 10)
    np.testing.assert_array_equal(y1, x1 + 10)
    np.testing.assert_array_equal(summed, x0 + x1 + 20)
    np.testing.assert_array_equal(difference, [3.0, 2.5])


def test_read_replica_of_a_replica_not_made_is_an_error() -> None:
    with pytest.raises(gd.GraphError, match=r"reads replica 1's component .* replicas \[0\]"):
        ReplicatePass(1)(_local_results_step().graph("traced").copy(), PassContext())


def test_cross_replica_gather_and_reduce_of_a_shared_value() -> None:
    """Gather: every replica's copy in order; reduce of a value that is not per replica: the one input."""
    graph = Graph("gather")
    x, w = graph.add_input("x", np.float32, (2,)), graph.add_input("w", np.float32, (2,))
    y = _op(graph, "Neg", [x], context="replica")
    gathered = _op(graph, "CrossReplicaGather", [y], {"axis": 0, "num_replicas": 3, "group_key": "g"},
                   domain=GRAPHDIST_DOMAIN)
    graph.outputs = [gathered, _op(graph, "CrossReplicaReduce", [w], {"reduce_op": "MEAN", "group_key": "r"},
                                   domain=GRAPHDIST_DOMAIN)]
    graph.meta.per_replica_inputs = {"x": None}
    graph = _replicate(graph, 3)

    expected = Graph("expected")
    xs = [expected.add_input(f"x{r}", np.float32, (2,)) for r in range(3)]
    w = expected.add_input("w", np.float32, (2,))
    negs = [_op(expected, "Neg", [xs[r]], replica=r) for r in range(3)]
    gather = {"axis": 0, "num_replicas": 3, "group_key": "a"}
    expected.outputs = [_op(expected, "CrossReplicaGather", negs, gather, domain=GRAPHDIST_DOMAIN),
                        _op(expected, "CrossReplicaReduce", [w], {"reduce_op": "MEAN", "group_key": "b"},
                            domain=GRAPHDIST_DOMAIN)]
    _equal(graph, expected)
    feeds = {"x_r0": np.array([1, 2], np.float32), "x_r1": np.array([3, 4], np.float32),
             "x_r2": np.array([5, 6], np.float32), "w": np.array([7, 8], np.float32)}
    gathered, mean = _run(graph, feeds)
    np.testing.assert_array_equal(gathered, [-1, -2, -3, -4, -5, -6])
    np.testing.assert_array_equal(mean, [7, 8])


def test_per_replica_output_of_a_shared_value_gets_an_identity_per_replica() -> None:
    graph = Graph("shared")
    w = graph.add_input("w", np.float32, (2,))
    graph.outputs = [_op(graph, "Neg", [w])]
    graph.meta.per_replica_outputs = {0: None}
    graph = _replicate(graph, 2)

    expected = Graph("expected")
    neg = _op(expected, "Neg", [expected.add_input("w", np.float32, (2,))])
    expected.outputs = [_op(expected, "Identity", [neg], replica=r) for r in range(2)]
    _equal(graph, expected)
    assert graph.meta.replication.replica_outputs == {0: {0: 0, 1: 1}}
    for got in _run(graph, {"w": np.array([1.5, -2.0], np.float32)}):
        np.testing.assert_array_equal(got, [-1.5, 2.0])


def test_already_replicated_graph_is_unchanged() -> None:
    graph = _replicate(_mul_add_graph(), 2)
    before = graph.copy()
    result = ReplicatePass(4)(graph, PassContext())  # another replica count: still nothing to do
    assert not result.modified
    _equal(result.graph, before)
