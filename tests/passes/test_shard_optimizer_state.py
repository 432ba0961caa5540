"""ShardOptimizerStatePass: a gradient all-reduce + momentum update (as InsertCollectivesPass leaves it)
vs the hand-built reduce-scatter -> sliced update -> all-gather structure (slots stored whole, or in
per-replica parts), honest ``modified``, a second run changes nothing, the rewritten graph computes the same
update, a slot read outside its update stays whole, and a non-gradient all-reduce is left alone."""

from __future__ import annotations

import numpy as np

from graphdist.backends import get_backend
from graphdist.compile.plan import Plan
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal, verify
from graphdist.ir.placement import VariableSpec
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.partition import PartitionPass
from graphdist.passes.shard_optimizer_state import REPLICA_PARTS_OPTION, ShardOptimizerStatePass
from tests.passes.pass_checks import replica_op as _op

CTX = PassContext(devices=("cpu:0", "cpu:1"))
META = ("replica", "side_effect")
SHAPE = (3,)  # 3 elements over 2 replicas: shards of 2, one element of padding


def _before(shape: tuple[int, ...] = SHAPE) -> Graph:
    """Two replicas' gradients all-reduced; replica 1's momentum update is written back, replica 0's is dead."""
    graph = Graph("before")
    grads = [graph.add_input(f"g{r}", np.float32, shape) for r in range(2)]
    w, m = graph.add_input("w", np.float32, shape), graph.add_input("m", np.float32, shape)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    sums = [_op(graph, "AllReduce", [grads[r]], {"reduce_op": "SUM", "group_key": "g", "group_size": 2},
                replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    for r in range(2):
        new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, m], replica=r), sums[r]], replica=r)
        new_w = _op(graph, "Sub", [w, _op(graph, "Mul", [lr, new_m], replica=r)], replica=r)
    graph.outputs = [new_w, new_m]
    graph.meta.variables = [("w", VariableSpec("w1", "w", "<f4", shape, True, "MirroredVariable")),
                               ("m", VariableSpec("m1", "m", "<f4", shape, False, "MirroredVariable"))]
    graph.meta.variable_updates = [(new_w.name, "w1"), (new_m.name, "m1")]
    return graph


def _expected() -> Graph:
    graph = Graph("expected")
    grads = [graph.add_input(f"g{r}", np.float32, SHAPE) for r in range(2)]
    w, m = graph.add_input("w", np.float32, SHAPE), graph.add_input("m", np.float32, SHAPE)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))

    def padded(value: Value, replica: int) -> Value:
        flat = _op(graph, "Reshape", [value, graph.add_initializer("flat", np.array([-1]))], replica=replica)
        return _op(graph, "Concat", [flat, graph.add_initializer("pad", np.zeros(1, np.float32))], {"axis": 0},
                   replica=replica)

    def sliced(value: Value, replica: int) -> Value:
        bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 2 * replica), ("e", 2 * replica + 2),
                                                                       ("a", 0))]
        return _op(graph, "Slice", [padded(value, replica), *bounds], replica=replica)

    new_ms, new_ws = [], []
    for r in range(2):
        scattered = _op(graph, "ReduceScatter", [padded(grads[r], r)],
                        {"reduce_op": "SUM", "group_key": "g.scatter", "group_size": 2, "shard": r},
                        replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True)
        new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, sliced(m, r)], replica=r), scattered], replica=r)
        step = _op(graph, "Mul", [lr, new_m], replica=r)
        new_ws.append(_op(graph, "Sub", [sliced(w, r), step], replica=r))
        new_ms.append(new_m)

    def unflatten(flat: Value) -> Value:
        bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 0), ("e", 3), ("a", 0))]
        whole = _op(graph, "Slice", [flat, *bounds], replica=1)
        return _op(graph, "Reshape", [whole, graph.add_initializer("shape", np.array(SHAPE))], replica=1)

    m_out = unflatten(_op(graph, "Concat", new_ms, {"axis": 0}, replica=1))
    gathered = [_op(graph, "AllGather", [new_ws[r]], {"axis": 0, "group_key": "g.gather", "group_size": 2},
                    replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    graph.outputs = [unflatten(gathered[1]), m_out]
    _op(graph, "Mul", [mu, m], replica=0)  # replica 0's dead copy of slot arithmetic: EliminateDeadNodesPass's
    return graph


def _expected_parts() -> Graph:
    """As _expected, with m stored in parts: replica r reads m/part<r> and writes back its new part."""
    graph = Graph("expected_parts")
    grads = [graph.add_input(f"g{r}", np.float32, SHAPE) for r in range(2)]
    w = graph.add_input("w", np.float32, SHAPE)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    parts = [graph.add_input(f"m/part{r}", np.float32, (2,)) for r in range(2)]

    def padded(value: Value, replica: int) -> Value:
        flat = _op(graph, "Reshape", [value, graph.add_initializer("flat", np.array([-1]))], replica=replica)
        return _op(graph, "Concat", [flat, graph.add_initializer("pad", np.zeros(1, np.float32))], {"axis": 0},
                   replica=replica)

    new_ms, new_ws = [], []
    for r in range(2):
        scattered = _op(graph, "ReduceScatter", [padded(grads[r], r)],
                        {"reduce_op": "SUM", "group_key": "g.scatter", "group_size": 2, "shard": r},
                        replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True)
        new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, parts[r]], replica=r), scattered], replica=r)
        step = _op(graph, "Mul", [lr, new_m], replica=r)
        bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 2 * r), ("e", 2 * r + 2), ("a", 0))]
        new_ws.append(_op(graph, "Sub", [_op(graph, "Slice", [padded(w, r), *bounds], replica=r), step], replica=r))
        new_ms.append(new_m)
    gathered = [_op(graph, "AllGather", [new_ws[r]], {"axis": 0, "group_key": "g.gather", "group_size": 2},
                    replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 0), ("e", 3), ("a", 0))]
    whole = _op(graph, "Slice", [gathered[1], *bounds], replica=1)
    graph.outputs = [_op(graph, "Reshape", [whole, graph.add_initializer("shape", np.array(SHAPE))], replica=1),
                     *new_ms]
    return graph


def _shard(graph: Graph, ctx: PassContext = CTX) -> Graph:
    result = ShardOptimizerStatePass()(graph, ctx)
    assert result.modified
    verify(result.graph)
    snapshot = result.graph.copy()
    again = ShardOptimizerStatePass()(result.graph, ctx)
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, meta_keys=META)
    return result.graph


def _run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    passes = [LowerCollectivesPass(), EliminateDeadNodesPass(), AssignDevicesPass(), PartitionPass()]
    placed = PassManager(passes).run(graph.copy(), CTX).graph
    plan = Plan.from_graph(placed).compile(get_backend("reference"))
    return plan.run({v.name: feeds[v.name] for v in placed.inputs})


def test_gradient_group_becomes_reduce_scatter_sliced_update_all_gather() -> None:
    graph = _shard(_before())
    assert_structural_equal(graph, _expected(), meta_keys=META)
    assert graph.meta.sharded_state == {"m1": {"replicas": 2, "shard": 2, "size": 3}}
    assert graph.meta.placement["m1"].describe() == "sharded 1/2 on each of cpu:0, cpu:1"
    outputs = {name for name, _ in graph.meta.variable_updates}
    assert outputs == {v.name for v in graph.outputs}


def test_sharded_update_computes_the_same_values() -> None:
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(SHAPE).astype(np.float32) for name in ("g0", "g1", "w", "m")}
    want = _run(_before(), feeds)
    got = _run(_shard(_before()), feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(want[1], 0.9 * feeds["m"] + feeds["g0"] + feeds["g1"], rtol=1e-6)


PARTS_CTX = PassContext(devices=("cpu:0", "cpu:1"), options={REPLICA_PARTS_OPTION: True})


def test_slots_stored_in_parts_are_read_and_written_back_per_replica() -> None:
    """The caller stores m in parts: no slice of m, no concatenation; m's write-back is one output per replica."""
    graph = _shard(_before(), PARTS_CTX)
    assert_structural_equal(graph, _expected_parts(), meta_keys=META)
    assert graph.meta.sharded_state == {"m1": {"replicas": 2, "shard": 2, "size": 3, "parts": ["m/part0",
                                                                                               "m/part1"]}}
    assert [v.name for v in graph.inputs] == ["g0", "g1", "w", "m/part0", "m/part1"]  # m itself is gone
    assert [uid for _, uid in graph.meta.variable_updates] == ["w1", "m1", "m1"]
    assert [name for name, _ in graph.meta.variable_updates] == [v.name for v in graph.outputs]
    # The constructor's replica_parts overrides the context.
    explicit = ShardOptimizerStatePass(replica_parts=True)(_before(), CTX).graph
    assert_structural_equal(explicit, _expected_parts(), meta_keys=META)
    assert "replica_parts=True" in repr(ShardOptimizerStatePass(replica_parts=True))


def test_slots_stored_in_parts_compute_the_same_values() -> None:
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal(SHAPE).astype(np.float32) for name in ("g0", "g1", "w", "m")}
    want = _run(_before(), feeds)
    padded = np.concatenate([feeds["m"], np.zeros(1, np.float32)])
    feeds.update({"m/part0": padded[:2], "m/part1": padded[2:]})
    new_w, *parts = _run(_shard(_before(), PARTS_CTX), feeds)
    np.testing.assert_allclose(new_w, want[0], rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(parts)[:3], want[1], rtol=1e-6)


def test_in_one_process_a_slot_read_outside_its_update_is_stored_whole() -> None:
    """The step also returns m's old value: m cannot be stored in parts; the update is sharded, m stays whole."""
    graph = _before()
    m = next(v for v in graph.inputs if v.name == "m")
    graph.outputs.insert(0, _op(graph, "Identity", [m], replica=1))
    graph = _shard(graph, PARTS_CTX)
    assert graph.meta.sharded_state == {"m1": {"replicas": 2, "shard": 2, "size": 3}}
    assert [v.name for v in graph.inputs] == ["g0", "g1", "w", "m"]
    assert len(graph.find_nodes("ReduceScatter", GRAPHDIST_DOMAIN)) == 2


def test_a_reduction_that_updates_no_variable_is_left_alone() -> None:
    graph = Graph("loss")
    losses = [graph.add_input(f"l{r}", np.float32, (4,)) for r in range(2)]
    sums = [_op(graph, "AllReduce", [losses[r]], {"reduce_op": "SUM", "group_key": "l", "group_size": 2},
                replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    graph.outputs = [_op(graph, "Mul", [sums[0], graph.add_initializer("half", np.float32(0.5))], replica=0)]
    snapshot = graph.copy()
    result = ShardOptimizerStatePass()(graph, CTX)
    assert not result.modified
    assert_structural_equal(result.graph, snapshot, meta_keys=META)


def _before_one_replica_per_worker() -> Graph:
    """This worker's one replica (of 2 workers): its gradient all-reduced over the workers, a momentum update."""
    graph = Graph("before_workers")
    grad = graph.add_input("g0", np.float32, SHAPE)
    w, m = graph.add_input("w", np.float32, SHAPE), graph.add_input("m", np.float32, SHAPE)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    total = _op(graph, "AllReduce", [grad], {"reduce_op": "SUM", "group_key": "g", "group_size": 2}, replica=0,
                domain=GRAPHDIST_DOMAIN, side_effect=True)
    new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, m], replica=0), total], replica=0)
    new_w = _op(graph, "Sub", [w, _op(graph, "Mul", [lr, new_m], replica=0)], replica=0)
    graph.outputs = [new_w, new_m]
    graph.meta.variables = [("w", VariableSpec("w1", "w", "<f4", SHAPE, True, "MirroredVariable")),
                               ("m", VariableSpec("m1", "m", "<f4", SHAPE, False, "MirroredVariable"))]
    graph.meta.variable_updates = [(new_w.name, "w1"), (new_m.name, "m1")]
    return graph


def _expected_worker_one() -> Graph:
    """Worker 1 reduce-scatters through MPI, updates elements [2, 4) (one of them padding), stores m's chunk."""
    graph = Graph("expected_workers")
    grad = graph.add_input("g0", np.float32, SHAPE)
    w, m = graph.add_input("w", np.float32, SHAPE), graph.add_input("m/part0", np.float32, (2,))  # m's part
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))

    def padded(value: Value) -> Value:
        flat = _op(graph, "Reshape", [value, graph.add_initializer("flat", np.array([-1]))], replica=0)
        return _op(graph, "Concat", [flat, graph.add_initializer("pad", np.zeros(1, np.float32))], {"axis": 0},
                   replica=0)

    scattered = _op(graph, "CrossWorkerReduceScatter", [padded(grad)],
                    {"reduce_op": "SUM", "num_workers": 2, "group_key": "g.scatter/workers", "comm_group": "mw",
                     "per_participant": 1},
                    replica=0, domain=GRAPHDIST_DOMAIN, side_effect=True)
    new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, m], replica=0), scattered], replica=0)
    step = _op(graph, "Mul", [lr, new_m], replica=0)
    bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 2), ("e", 4), ("a", 0))]
    new_w = _op(graph, "Sub", [_op(graph, "Slice", [padded(w), *bounds], replica=0), step], replica=0)
    gathered = _op(graph, "CrossWorkerAllGather", [new_w],
                   {"axis": 0, "num_workers": 2, "group_key": "g.gather/workers", "comm_group": "mw",
                    "per_participant": 1},
                   replica=0, domain=GRAPHDIST_DOMAIN, side_effect=True)
    bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 0), ("e", 3), ("a", 0))]
    whole = _op(graph, "Slice", [gathered, *bounds], replica=0)
    graph.outputs = [_op(graph, "Reshape", [whole, graph.add_initializer("shape", np.array(SHAPE))], replica=0),
                     new_m]
    return graph


def test_across_workers_each_worker_updates_and_stores_its_chunk() -> None:
    shard = ShardOptimizerStatePass(num_workers=2, worker=1, comm_group="mw")
    result = shard(_before_one_replica_per_worker(), PassContext(devices=("cpu:0",)))
    assert result.modified
    verify(result.graph)
    assert_structural_equal(result.graph, _expected_worker_one(), meta_keys=META)
    assert result.graph.meta.sharded_state == {"m1": {"replicas": 2, "shard": 2, "size": 3, "workers": 2,
                                                         "worker": 1, "local": 1, "parts": ["m/part0"]}}
    assert [v.name for v in result.graph.inputs] == ["g0", "w", "m/part0"]
    snapshot = result.graph.copy()
    again = shard(result.graph, PassContext(devices=("cpu:0",)))
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, meta_keys=META)


def test_across_workers_a_slot_read_outside_its_update_stays_whole() -> None:
    graph = _before_one_replica_per_worker()
    m = next(v for v in graph.inputs if v.name == "m")
    graph.outputs.append(_op(graph, "Identity", [m], replica=0))  # the step also returns the old slot value
    snapshot = graph.copy()
    result = ShardOptimizerStatePass(num_workers=2, worker=0)(graph, PassContext(devices=("cpu:0",)))
    assert not result.modified
    assert_structural_equal(result.graph, snapshot, meta_keys=META)


def test_across_workers_with_two_local_replicas_scatters_locally_then_across() -> None:
    """Worker 0 of 2, 2 local replicas (group_size 4): 4 shards of 1 element (3 + 1 padding); local replica r
    updates shard 2r (r * workers + worker), so m's parts (inputs and write-backs) are shards 0 and 2."""
    graph = _before()
    for node in graph.find_nodes("AllReduce", GRAPHDIST_DOMAIN):
        node.attrs["group_size"] = 4
    result = ShardOptimizerStatePass(num_workers=2, worker=0)(graph, CTX)
    assert result.modified
    verify(result.graph)
    ops = [n.op_type for n in result.graph.nodes if n.domain == GRAPHDIST_DOMAIN]
    assert sorted(ops) == ["AllGather"] * 2 + ["CrossWorkerAllGather"] * 2 + ["CrossWorkerReduceScatter"] * 2 + [
        "ReduceScatter"] * 2
    local = result.graph.find_nodes("ReduceScatter", GRAPHDIST_DOMAIN)
    assert [(n.attrs["group_size"], n.attrs["shard"]) for n in local] == [(2, 0), (2, 1)]
    assert all(n.attrs["per_participant"] for n in result.graph.find_nodes("CrossWorkerReduceScatter",
                                                                           GRAPHDIST_DOMAIN))
    parts = [v for v in result.graph.inputs if v.name.startswith("m/")]
    assert [(v.name, v.shape) for v in parts] == [("m/part0", (1,)), ("m/part1", (1,))]
    assert [v.shape for v in result.graph.outputs] == [SHAPE, (1,), (1,)]
    assert [uid for _, uid in result.graph.meta.variable_updates] == ["w1", "m1", "m1"]
    w_starts = sorted(int(n.inputs[1].const_value[0]) for n in result.graph.nodes
                      if n.op_type == "Slice" and n.inputs[0].producer is not None
                      and n.inputs[0].producer.inputs[0].producer is not None
                      and n.inputs[0].producer.inputs[0].producer.inputs[0].name == "w")
    assert w_starts == [0, 2]  # shards 0 and 2 of w's 4 one-element shards
    assert result.graph.meta.sharded_state["m1"] == {"replicas": 4, "shard": 1, "size": 3, "workers": 2,
                                                        "worker": 0, "local": 2, "parts": ["m/part0", "m/part1"]}


def _expected_unpadded() -> Graph:
    """A (2, 2) momentum update over 2 replicas, m in parts: no padding, so each ReduceScatter reads the
    gradient as it is (flat in the communicator: no flattened copy out of the backward segment)."""
    shape = (2, 2)
    graph = Graph("expected_unpadded")
    grads = [graph.add_input(f"g{r}", np.float32, shape) for r in range(2)]
    w = graph.add_input("w", np.float32, shape)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    parts = [graph.add_input(f"m/part{r}", np.float32, (2,)) for r in range(2)]
    new_ms, new_ws = [], []
    for r in range(2):
        scattered = _op(graph, "ReduceScatter", [grads[r]],
                        {"reduce_op": "SUM", "group_key": "g.scatter", "group_size": 2, "shard": r},
                        replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True)
        new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, parts[r]], replica=r), scattered], replica=r)
        step = _op(graph, "Mul", [lr, new_m], replica=r)
        flat = _op(graph, "Reshape", [w, graph.add_initializer("flat", np.array([-1]))], replica=r)
        bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 2 * r), ("e", 2 * r + 2), ("a", 0))]
        new_ws.append(_op(graph, "Sub", [_op(graph, "Slice", [flat, *bounds], replica=r), step], replica=r))
        new_ms.append(new_m)
    gathered = [_op(graph, "AllGather", [new_ws[r]], {"axis": 0, "group_key": "g.gather", "group_size": 2},
                    replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    graph.outputs = [_op(graph, "Reshape", [gathered[1], graph.add_initializer("shape", np.array(shape))], replica=1),
                     *new_ms]
    return graph


def test_an_unpadded_gradient_is_reduce_scattered_without_flattening() -> None:
    graph = _shard(_before((2, 2)), PARTS_CTX)
    assert_structural_equal(graph, _expected_unpadded(), meta_keys=META)
    rng = np.random.default_rng(2)
    feeds = {name: rng.standard_normal((2, 2)).astype(np.float32) for name in ("g0", "g1", "w", "m")}
    want = _run(_before((2, 2)), feeds)
    feeds.update({"m/part0": feeds["m"].reshape(-1)[:2], "m/part1": feeds["m"].reshape(-1)[2:]})
    new_w, *parts = _run(graph, feeds)
    np.testing.assert_allclose(new_w, want[0], rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(parts).reshape(2, 2), want[1], rtol=1e-6)
