"""ShardParametersPass (FSDP / ZeRO-3): two replicas that read a weight forward and backward and update it
with momentum from an all-reduced gradient (as InsertCollectivesPass leaves them) vs the hand-built form:
the weight fed in per-replica parts, each replica's readers reading an AllGather of the parts (the forward
and the backward readers a gather each), the gradient reduce-scattered, each replica updating and writing
back its own shard of the weight and of the slot. Honest ``modified``, a second run changes nothing, the
rewritten graph computes the same values, and the cases of the docstring."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.backends import get_backend
from graphdist.compile.plan import Plan
from graphdist.errors import InvalidArgumentError, PipelineOrderError, PreconditionError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.ir.placement import VariableSpec
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.partition import PartitionPass
from graphdist.passes.replicate import Replication
from graphdist.passes.shard_optimizer_state import REPLICA_PARTS_OPTION, ShardOptimizerStatePass
from graphdist.passes.shard_parameters import ShardParametersPass, parameter_bytes_per_replica
from tests.passes.pass_checks import check_pass
from tests.passes.pass_checks import replica_op as _op

CTX = PassContext(devices=("cpu:0", "cpu:1"))
PARTS_CTX = PassContext(devices=("cpu:0", "cpu:1"), options={REPLICA_PARTS_OPTION: True})
META = ("replica", "side_effect", "backward")
SHAPE = (3,)  # 3 elements over 2 replicas: shards of 2, one element of padding


def _before() -> Graph:
    """Replica r: y_r = x_r * w (forward), z_r = x_r * -w (a backward reader), its gradient all-reduced and a
    momentum update (replica 1's written back, replica 0's dead)."""
    graph = Graph("before")
    xs = [graph.add_input(f"x{r}", np.float32, SHAPE) for r in range(2)]
    grads = [graph.add_input(f"g{r}", np.float32, SHAPE) for r in range(2)]
    w, m = graph.add_input("w", np.float32, SHAPE), graph.add_input("m", np.float32, SHAPE)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    ys = [_op(graph, "Mul", [xs[r], w], replica=r) for r in range(2)]
    zs = [_op(graph, "Mul", [xs[r], _op(graph, "Neg", [w], replica=r, backward=True)], replica=r, backward=True)
          for r in range(2)]
    sums = [_op(graph, "AllReduce", [grads[r]], {"reduce_op": "SUM", "group_key": "g", "group_size": 2},
                replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(2)]
    for r in range(2):
        new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, m], replica=r), sums[r]], replica=r)
        new_w = _op(graph, "Sub", [w, _op(graph, "Mul", [lr, new_m], replica=r)], replica=r)
    graph.outputs = [*ys, *zs, new_w, new_m]
    graph.meta.variables = [("w", VariableSpec("w1", "w", "<f4", SHAPE, True, "MirroredVariable")),
                               ("m", VariableSpec("m1", "m", "<f4", SHAPE, False, "MirroredVariable"))]
    graph.meta.variable_updates = [(new_w.name, "w1"), (new_m.name, "m1")]
    graph.meta.replication = Replication(2, 0, 2, {}, {}, {})
    return graph


def _unflatten(graph: Graph, flat: Value, replica: int, **meta) -> Value:
    bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 0), ("e", 3), ("a", 0))]
    whole = _op(graph, "Slice", [flat, *bounds], replica=replica, **meta)
    return _op(graph, "Reshape", [whole, graph.add_initializer("shape", np.array(SHAPE))], replica=replica, **meta)


def _gathered(graph: Graph, parts: list[Value], key: str, **meta) -> list[Value]:
    """Each replica's whole copy of w: an AllGather of the parts (4 elements), un-padded and reshaped."""
    flats = [_op(graph, "AllGather", [parts[r]], {"axis": 0, "group_key": key, "group_size": 2}, replica=r,
                 domain=GRAPHDIST_DOMAIN, side_effect=True, **meta) for r in range(2)]
    return [_unflatten(graph, flats[r], r, **meta) for r in range(2)]


def _padded(graph: Graph, value: Value, replica: int) -> Value:
    flat = _op(graph, "Reshape", [value, graph.add_initializer("flat", np.array([-1]))], replica=replica)
    return _op(graph, "Concat", [flat, graph.add_initializer("pad", np.zeros(1, np.float32))], {"axis": 0},
               replica=replica)


def _sharded_update(graph: Graph, grads: list[Value], w_parts: list[Value], m_parts: list[Value],
                    ) -> tuple[list[Value], list[Value]]:
    """ZeRO's sharded momentum update: replica r's shard of the reduce-scattered gradient, of m and of w."""
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    new_ws, new_ms = [], []
    for r in range(2):
        scattered = _op(graph, "ReduceScatter", [_padded(graph, grads[r], r)],
                        {"reduce_op": "SUM", "group_key": "g.scatter", "group_size": 2, "shard": r},
                        replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True)
        new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, m_parts[r]], replica=r), scattered], replica=r)
        new_ws.append(_op(graph, "Sub", [w_parts[r], _op(graph, "Mul", [lr, new_m], replica=r)], replica=r))
        new_ms.append(new_m)
    return new_ws, new_ms


def _expected_parts() -> Graph:
    """w and m fed in parts; the forward readers and the backward readers each read a gather of w's parts; each
    replica updates its shards and writes them back: no all-gather of the new w, no slice, no concatenation."""
    graph = Graph("expected_parts")
    xs = [graph.add_input(f"x{r}", np.float32, SHAPE) for r in range(2)]
    grads = [graph.add_input(f"g{r}", np.float32, SHAPE) for r in range(2)]
    w_parts = [graph.add_input(f"w/part{r}", np.float32, (2,)) for r in range(2)]
    m_parts = [graph.add_input(f"m/part{r}", np.float32, (2,)) for r in range(2)]
    forward = _gathered(graph, w_parts, "w.forward")
    ys = [_op(graph, "Mul", [xs[r], forward[r]], replica=r) for r in range(2)]
    backward = _gathered(graph, w_parts, "w.backward", backward=True)
    zs = [_op(graph, "Mul", [xs[r], _op(graph, "Neg", [backward[r]], replica=r, backward=True)], replica=r,
              backward=True) for r in range(2)]
    new_ws, new_ms = _sharded_update(graph, grads, w_parts, m_parts)
    graph.outputs = [*ys, *zs, *new_ws, *new_ms]
    return graph


def _expected_whole() -> Graph:
    """Stored whole (a plan directory): each replica slices its shard of w (and of m) out of the input, the
    gathers and the update are the same, and the new shards are joined on replica 1 for the write-back."""
    graph = Graph("expected_whole")
    xs = [graph.add_input(f"x{r}", np.float32, SHAPE) for r in range(2)]
    grads = [graph.add_input(f"g{r}", np.float32, SHAPE) for r in range(2)]
    w, m = graph.add_input("w", np.float32, SHAPE), graph.add_input("m", np.float32, SHAPE)

    def sliced(value: Value, replica: int) -> Value:
        bounds = [graph.add_initializer(n, np.array([b])) for n, b in (("s", 2 * replica), ("e", 2 * replica + 2),
                                                                       ("a", 0))]
        return _op(graph, "Slice", [_padded(graph, value, replica), *bounds], replica=replica)

    w_parts = [sliced(w, r) for r in range(2)]
    forward = _gathered(graph, w_parts, "w.forward")
    ys = [_op(graph, "Mul", [xs[r], forward[r]], replica=r) for r in range(2)]
    backward = _gathered(graph, w_parts, "w.backward", backward=True)
    zs = [_op(graph, "Mul", [xs[r], _op(graph, "Neg", [backward[r]], replica=r, backward=True)], replica=r,
              backward=True) for r in range(2)]
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    new_ws, new_ms = [], []
    for r in range(2):
        scattered = _op(graph, "ReduceScatter", [_padded(graph, grads[r], r)],
                        {"reduce_op": "SUM", "group_key": "g.scatter", "group_size": 2, "shard": r},
                        replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True)
        new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, sliced(m, r)], replica=r), scattered], replica=r)
        new_ws.append(_op(graph, "Sub", [w_parts[r], _op(graph, "Mul", [lr, new_m], replica=r)], replica=r))
        new_ms.append(new_m)
    m_out = _unflatten(graph, _op(graph, "Concat", new_ms, {"axis": 0}, replica=1), 1)
    w_out = _unflatten(graph, _op(graph, "Concat", new_ws, {"axis": 0}, replica=1), 1)
    _op(graph, "Mul", [mu, m], replica=0)  # replica 0's dead copy of slot arithmetic: EliminateDeadNodesPass's
    graph.outputs = [*ys, *zs, w_out, m_out]
    return graph


def _shard(graph: Graph, ctx: PassContext = PARTS_CTX, expected: Graph | None = None, **options) -> Graph:
    """The pass on ``graph``: modified, verified, equal to ``expected``, and a second run changes nothing."""
    return check_pass(ShardParametersPass(["w"], **options), graph, modified=True, expected=expected, ctx=ctx,
                      numerics=False, meta_keys=META)


def _run(graph: Graph, feeds: dict[str, np.ndarray], ctx: PassContext = CTX) -> list[np.ndarray]:
    """The graph's outputs, its collectives run between the two replicas' devices (reference backend)."""
    passes = [LowerCollectivesPass(), EliminateDeadNodesPass(), AssignDevicesPass(), PartitionPass()]
    placed = PassManager(passes).run(graph.copy(), ctx).graph
    plan = Plan.from_graph(placed).compile(get_backend("reference"))
    return plan.run({v.name: feeds[v.name] for v in placed.inputs})


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(SHAPE).astype(np.float32) for name in ("x0", "x1", "g0", "g1", "w", "m")}


def _parts_of(value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    padded = np.concatenate([value, np.zeros(1, np.float32)])
    return padded[:2], padded[2:]


def test_a_weight_stored_in_parts_is_gathered_before_use_and_updated_in_shards() -> None:
    graph = _shard(_before(), expected=_expected_parts())
    assert graph.meta.sharded_state == {
        "w1": {"replicas": 2, "shard": 2, "size": 3, "parts": ["w/part0", "w/part1"], "parameter": True},
        "m1": {"replicas": 2, "shard": 2, "size": 3, "parts": ["m/part0", "m/part1"]}}
    assert [v.name for v in graph.inputs] == ["x0", "x1", "g0", "g1", "w/part0", "w/part1", "m/part0", "m/part1"]
    assert [uid for _, uid in graph.meta.variable_updates] == ["w1", "w1", "m1", "m1"]
    assert [name for name, _ in graph.meta.variable_updates] == [v.name for v in graph.outputs[4:]]
    assert graph.meta.placement["w1"].describe() == "sharded 1/2 on each of cpu:0, cpu:1"
    keys = {n.attrs["group_key"] for n in graph.find_nodes("AllGather", GRAPHDIST_DOMAIN)}
    assert keys == {"fsdp.w.forward", "fsdp.w.backward"}  # and no all-gather of the new weights


def test_sharded_weight_computes_the_same_values() -> None:
    feeds = _feeds(0)
    want = _run(_before(), feeds)
    feeds.update(zip(("w/part0", "w/part1"), _parts_of(feeds["w"])))
    feeds.update(zip(("m/part0", "m/part1"), _parts_of(feeds["m"])))
    got = _run(_shard(_before()), feeds)
    for a, b in zip(got[:4], want[:4]):  # the readers see the whole weight
        np.testing.assert_array_equal(a, b)
    # Sums of random values can come near zero, where float32 rounding is no longer relative: an absolute floor.
    np.testing.assert_allclose(np.concatenate(got[4:6])[:3], want[4], rtol=1e-6, atol=1e-6)  # new w, from its shards
    np.testing.assert_allclose(np.concatenate(got[6:8])[:3], want[5], rtol=1e-6, atol=1e-6)  # new m
    np.testing.assert_allclose(want[5], 0.9 * feeds["m"] + feeds["g0"] + feeds["g1"], rtol=1e-6, atol=1e-6)


def test_a_weight_stored_whole_is_sliced_into_its_parts_and_joined_for_the_write_back() -> None:
    graph = _shard(_before(), CTX, expected=_expected_whole())
    assert graph.meta.sharded_state == {"w1": {"replicas": 2, "shard": 2, "size": 3, "parameter": True},
                                           "m1": {"replicas": 2, "shard": 2, "size": 3}}
    feeds = _feeds(1)
    for a, b in zip(_run(graph, feeds), _run(_before(), feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_without_resharding_after_forward_one_gather_serves_every_reader() -> None:
    graph = _shard(_before(), reshard_after_forward=False)
    gathers = graph.find_nodes("AllGather", GRAPHDIST_DOMAIN)
    assert [(n.attrs["group_key"], n.replica) for n in gathers] == [("fsdp.w.forward", 0), ("fsdp.w.forward", 1)]
    assert "reshard_after_forward=False" in repr(ShardParametersPass(["w"], reshard_after_forward=False))


def _read_only() -> Graph:
    """An evaluation step: both replicas read w, nothing updates it."""
    graph = Graph("read_only")
    xs = [graph.add_input(f"x{r}", np.float32, SHAPE) for r in range(2)]
    w = graph.add_input("w", np.float32, SHAPE)
    graph.outputs = [_op(graph, "Mul", [xs[r], w], replica=r) for r in range(2)]
    graph.meta.variables = [("w", VariableSpec("w1", "w", "<f4", SHAPE, True, "MirroredVariable"))]
    graph.meta.replication = Replication(2, 0, 2, {}, {}, {})
    return graph


def test_a_weight_read_but_not_updated_is_stored_in_parts_and_gathered() -> None:
    expected = Graph("expected_read_only")
    xs = [expected.add_input(f"x{r}", np.float32, SHAPE) for r in range(2)]
    parts = [expected.add_input(f"w/part{r}", np.float32, (2,)) for r in range(2)]
    forward = _gathered(expected, parts, "w.forward")
    expected.outputs = [_op(expected, "Mul", [xs[r], forward[r]], replica=r) for r in range(2)]
    graph = _shard(_read_only(), expected=expected)
    assert graph.meta.sharded_state["w1"]["parts"] == ["w/part0", "w/part1"]
    assert not graph.meta.variable_updates


def test_the_variable_name_is_the_key_and_a_name_no_variable_has_changes_nothing() -> None:
    assert ShardParametersPass(["w:0", "w", "v"]).variables == ("v", "w")  # gd.Variable.name works too
    check_pass(ShardParametersPass(["other"]), _before(), modified=False, ctx=PARTS_CTX, numerics=False)
    check_pass(ShardParametersPass([]), _before(), modified=False, ctx=PARTS_CTX, numerics=False)
    with pytest.raises(InvalidArgumentError, match=r"write \('w',\)"):
        ShardParametersPass("w")


def test_one_replica_in_all_changes_nothing() -> None:
    graph = _read_only()
    graph.meta.replication = Replication(1, 0, 1, {}, {}, {})
    graph.outputs = graph.outputs[:1]
    check_pass(ShardParametersPass(["w"]), graph, modified=False, ctx=PassContext(devices=("cpu:0",)),
               numerics=False)


def test_an_update_that_cannot_be_sharded_is_refused_naming_the_variable() -> None:
    """w's new value is a MatMul of the summed gradient (not elementwise): its shards could not be updated alone."""
    graph = _before()
    sums = graph.find_nodes("AllReduce", GRAPHDIST_DOMAIN)
    square = graph.add_initializer("square", np.eye(3, dtype=np.float32))
    w = next(v for v in graph.inputs if v.name == "w")
    news = [_op(graph, "Sub", [w, _op(graph, "MatMul", [s.outputs[0], square], replica=s.replica)],
                replica=s.replica) for s in sums]
    graph.outputs[4] = news[1]
    graph.meta.variable_updates[0] = (news[1].name, "w1")
    with pytest.raises(NotImplementedError, match=r"variable w \(float32\[3\]\) cannot be sharded.*MatMul"):
        ShardParametersPass(["w"])(graph, PARTS_CTX)


def test_an_assigned_weight_is_refused() -> None:
    graph = _read_only()
    w = next(v for v in graph.inputs if v.name == "w")
    doubled = _op(graph, "Add", [w, w], replica=1)
    graph.outputs.append(doubled)
    graph.meta.variable_updates = [(doubled.name, "w1")]
    with pytest.raises(NotImplementedError, match="not updated from a summed gradient"):
        ShardParametersPass(["w"])(graph, PARTS_CTX)


def test_an_updated_non_trainable_variable_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="m is not trainable and the step updates it.*name the weight"):
        ShardParametersPass(["w", "m"])(_before(), PARTS_CTX)


def test_zero1_runs_after_and_finds_nothing_left_of_the_sharded_weight() -> None:
    graph = _shard(_before())
    check_pass(ShardOptimizerStatePass(), graph, modified=False, ctx=PARTS_CTX, numerics=False)
    with pytest.raises(PipelineOrderError, match="runs ShardOptimizerStatePass .* before ShardParametersPass"):
        PassManager([ShardOptimizerStatePass(), ShardParametersPass(["w"])])
    zero = ShardOptimizerStatePass()(_before(), PARTS_CTX).graph
    with pytest.raises(NotImplementedError, match="already sharded by ZeRO-1"):
        ShardParametersPass(["w"])(zero, PARTS_CTX)


def test_requires_a_replicated_graph() -> None:
    graph = _before()
    graph.meta.replication = None
    with pytest.raises(PreconditionError, match="ShardParametersPass cannot run .* not replicated"):
        ShardParametersPass(["w"])(graph, PARTS_CTX)


def test_parameter_bytes_per_replica_count_the_shards() -> None:
    before = _before()
    assert parameter_bytes_per_replica(before) == 12  # w whole
    assert parameter_bytes_per_replica(_shard(_before())) == 8  # its shard of 2 (padded) elements


def _one_replica_per_worker() -> Graph:
    """This worker's one replica of 2 workers: it reads w forward and updates it from a cross-worker sum."""
    graph = Graph("before_workers")
    x, grad = graph.add_input("x0", np.float32, SHAPE), graph.add_input("g0", np.float32, SHAPE)
    w, m = graph.add_input("w", np.float32, SHAPE), graph.add_input("m", np.float32, SHAPE)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    y = _op(graph, "Mul", [x, w], replica=0)
    total = _op(graph, "AllReduce", [grad], {"reduce_op": "SUM", "group_key": "g", "group_size": 2}, replica=0,
                domain=GRAPHDIST_DOMAIN, side_effect=True)
    new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, m], replica=0), total], replica=0)
    new_w = _op(graph, "Sub", [w, _op(graph, "Mul", [lr, new_m], replica=0)], replica=0)
    graph.outputs = [y, new_w, new_m]
    graph.meta.variables = [("w", VariableSpec("w1", "w", "<f4", SHAPE, True, "MirroredVariable")),
                               ("m", VariableSpec("m1", "m", "<f4", SHAPE, False, "MirroredVariable"))]
    graph.meta.variable_updates = [(new_w.name, "w1"), (new_m.name, "m1")]
    graph.meta.replication = Replication(1, 1, 2, {}, {}, {})
    return graph


def _expected_worker_one() -> Graph:
    """Worker 1 stores shard 1 of w and m; its reader reads w gathered from the workers; it reduce-scatters the
    gradient through MPI and updates its shards."""
    graph = Graph("expected_workers")
    x, grad = graph.add_input("x0", np.float32, SHAPE), graph.add_input("g0", np.float32, SHAPE)
    part = graph.add_input("w/part0", np.float32, (2,))
    m = graph.add_input("m/part0", np.float32, (2,))
    cross = {"num_workers": 2, "comm_group": "mw", "per_participant": 1}
    gathered = _op(graph, "CrossWorkerAllGather", [part], {"axis": 0, "group_key": "w.forward/workers", **cross},
                   replica=0, domain=GRAPHDIST_DOMAIN, side_effect=True)
    y = _op(graph, "Mul", [x, _unflatten(graph, gathered, 0)], replica=0)
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    scattered = _op(graph, "CrossWorkerReduceScatter", [_padded(graph, grad, 0)],
                    {"reduce_op": "SUM", "group_key": "g.scatter/workers", **cross},
                    replica=0, domain=GRAPHDIST_DOMAIN, side_effect=True)
    new_m = _op(graph, "Add", [_op(graph, "Mul", [mu, m], replica=0), scattered], replica=0)
    new_w = _op(graph, "Sub", [part, _op(graph, "Mul", [lr, new_m], replica=0)], replica=0)
    graph.outputs = [y, new_w, new_m]
    return graph


def test_across_workers_each_worker_stores_gathers_and_updates_its_shard() -> None:
    shard = ShardParametersPass(["w"], num_workers=2, worker=1, comm_group="mw")
    graph = check_pass(shard, _one_replica_per_worker(), modified=True, expected=_expected_worker_one(),
                       ctx=PassContext(devices=("cpu:0",)), numerics=False, meta_keys=META)
    assert graph.meta.sharded_state["w1"] == {"replicas": 2, "shard": 2, "size": 3, "workers": 2, "worker": 1,
                                                 "local": 1, "parts": ["w/part0"], "parameter": True}
    assert "num_workers=2, worker=1, comm_group='mw'" in repr(shard)
