"""BalanceVariableUpdatesPass: updates as InsertCollectivesPass leaves them (every replica computes them, the
last replica's are written back) vs the hand-built graph writing each back from the balanced replica; a
weight and its momentum slot move together, an update from per-replica values or a random op stays, a
replica's copy that is already an output gets an Identity, ZeRO-1 groups, one replica and a second run
change nothing, groups spanning other workers balance like local ones, and the written-back values are
bitwise the same."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.backends import get_backend
from graphdist.compile.plan import Plan
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal, verify
from graphdist.ir.placement import VariableSpec
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.balance_variable_updates import BalanceVariableUpdatesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.partition import PartitionPass
from graphdist.passes.shard_optimizer_state import ShardOptimizerStatePass
from tests.passes.pass_checks import replica_op as _op

CTX = PassContext(devices=("cpu:0", "cpu:1"))
META = ("replica", "side_effect")
#: Variable -> (shape, dtype): w (48 B) and its momentum m (48 B), b (12 B), a per-replica statistic s (20 B), n.
VARIABLES = {"w": ((4, 3), np.float32), "m": ((4, 3), np.float32), "b": ((3,), np.float32),
             "s": ((5,), np.float32), "n": ((), np.int64)}
TRAINABLE = {"w", "b"}


def _sum(graph: Graph, key: str, parts: list[Value], group_size: int) -> list[Value]:
    return [_op(graph, "AllReduce", [parts[r]], {"reduce_op": "SUM", "group_key": key, "group_size": group_size},
                replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True) for r in range(len(parts))]


def _graph(written_from: dict[str, int], *, group_size: int = 2, statistic: str = "input") -> Graph:
    """Two replicas; each computes every update; variable ``v``'s write-back is replica ``written_from[v]``'s.

    ``statistic``: what makes s's update differ between replicas ("input": the per-replica input x_r, "random":
    a RandomUniformLike draw).
    """
    graph = Graph("updates")
    gw = [graph.add_input(f"gw{r}", np.float32, VARIABLES["w"][0]) for r in range(2)]
    gb = [graph.add_input(f"gb{r}", np.float32, VARIABLES["b"][0]) for r in range(2)]
    x = [graph.add_input(f"x{r}", np.float32, VARIABLES["s"][0]) for r in range(2)]
    var = {name: graph.add_input(name, dtype, shape) for name, (shape, dtype) in VARIABLES.items()}
    mu, lr = graph.add_initializer("mu", np.float32(0.9)), graph.add_initializer("lr", np.float32(0.1))
    decay, one = graph.add_initializer("decay", np.float32(0.5)), graph.add_initializer("one", np.int64(1))
    sum_w, sum_b = _sum(graph, "gw", gw, group_size), _sum(graph, "gb", gb, group_size)
    new: dict[str, list[Value]] = {name: [] for name in VARIABLES}
    for r in range(2):
        new["m"].append(_op(graph, "Add", [_op(graph, "Mul", [mu, var["m"]], replica=r), sum_w[r]], replica=r))
        new["w"].append(_op(graph, "Sub", [var["w"], _op(graph, "Mul", [lr, new["m"][r]], replica=r)], replica=r))
        new["b"].append(_op(graph, "Sub", [var["b"], _op(graph, "Mul", [lr, sum_b[r]], replica=r)], replica=r))
        local = x[r] if statistic == "input" else _op(graph, "RandomUniformLike", [var["s"]], replica=r)
        new["s"].append(_op(graph, "Add", [_op(graph, "Mul", [decay, var["s"]], replica=r), local], replica=r))
        new["n"].append(_op(graph, "Add", [var["n"], one], replica=r))
    graph.outputs = [new[name][written_from[name]] for name in VARIABLES]
    graph.meta.variables = [(name, VariableSpec(f"{name}1", name, np.dtype(dtype).str, shape, name in TRAINABLE,
                                                   "MirroredVariable"))
                               for name, (shape, dtype) in VARIABLES.items()]
    graph.meta.variable_updates = [(v.name, f"{name}1") for v, name in zip(graph.outputs, VARIABLES)]
    return graph


BEFORE = {"w": 1, "m": 1, "b": 1, "s": 1, "n": 1}  # what LowerVariableUpdatesPass writes back
# Weights: bytes written back + 16 KiB (NODE_COST_BYTES) per node. s stays on replica 1 (2 nodes, 20 B); w
# with m (4 nodes, 96 B) goes to replica 0, the lighter; then b (2 nodes, 12 B) and n (1 node, 8 B) to
# replica 1 (4 nodes + 32 B, then 5 nodes + 40 B, against 4 nodes + 96 B).
BALANCED = {"w": 0, "m": 0, "b": 1, "s": 1, "n": 1}


def _balance(graph: Graph, ctx: PassContext = CTX) -> Graph:
    result = BalanceVariableUpdatesPass()(graph, ctx)
    assert result.modified
    verify(result.graph)
    updates = result.graph.meta.variable_updates
    assert [name for name, _ in updates] == [v.name for v in result.graph.outputs[-len(updates):]]
    snapshot = result.graph.copy()
    again = BalanceVariableUpdatesPass()(result.graph, ctx)
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, meta_keys=META)
    return result.graph


def _unchanged(graph: Graph, ctx: PassContext = CTX) -> None:
    snapshot = graph.copy()
    result = BalanceVariableUpdatesPass()(graph, ctx)
    assert not result.modified
    assert_structural_equal(result.graph, snapshot, meta_keys=META)


def _written_from(graph: Graph) -> list[int]:
    return [v.producer.replica for v in graph.outputs]


def _run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    passes = [LowerCollectivesPass(), EliminateDeadNodesPass(), AssignDevicesPass(), PartitionPass()]
    placed = PassManager(passes).run(graph.copy(), CTX).graph
    plan = Plan.from_graph(placed).compile(get_backend("reference"))
    return plan.run({v.name: feeds[v.name] for v in placed.inputs})


@pytest.mark.parametrize("group_size", [2, 4])  # 4: the groups span another worker with 2 replicas
def test_updates_are_written_back_from_the_balanced_replicas(group_size: int) -> None:
    graph = _balance(_graph(BEFORE, group_size=group_size))
    assert_structural_equal(graph, _graph(BALANCED, group_size=group_size), meta_keys=META)
    assert _written_from(graph) == [BALANCED[name] for name in VARIABLES]


def test_balanced_updates_compute_the_same_bits() -> None:
    rng = np.random.default_rng(0)
    feeds = {v.name: (rng.standard_normal(v.shape) * 10).astype(v.dtype) for v in _graph(BEFORE).inputs}
    want = _run(_graph(BEFORE), feeds)
    got = _run(_balance(_graph(BEFORE)), feeds)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    summed = feeds["gw0"] + feeds["gw1"]
    np.testing.assert_allclose(want[1], 0.9 * feeds["m"] + summed, rtol=1e-6)


def test_a_random_update_stays_on_its_replica() -> None:
    graph = _balance(_graph(BEFORE, statistic="random"))
    # s stays on replica 1, now 3 nodes (the draw, Mul, Add): 3 x 16 KiB + 20 B there, so after w with m
    # (4 nodes) to replica 0 and b (2 nodes) to replica 1, n (1 node) goes to replica 0, the lighter.
    assert _written_from(graph) == [{**BALANCED, "n": 0}[name] for name in VARIABLES]


def _only(graph: Graph, *names: str) -> Graph:
    """``graph`` writing back only the variables ``names``."""
    keep = [list(VARIABLES).index(name) for name in names]
    graph.outputs = [graph.outputs[i] for i in keep]
    graph.meta.variable_updates = [graph.meta.variable_updates[i] for i in keep]
    graph.meta.variables = [graph.meta.variables[i] for i in keep]
    return graph


def test_updates_that_differ_between_replicas_stay() -> None:
    _unchanged(_only(_graph(BEFORE), "s"))
    _unchanged(_only(_graph(BEFORE, statistic="random"), "s"))


def test_a_copy_that_is_already_an_output_gets_an_identity() -> None:
    graph = _only(_graph(BEFORE), "w", "m", "b")  # w and m stay on replica 1, b goes to replica 0
    readers = graph.outputs[2].producer.inputs[0].uses  # of the variable b: both replicas' Sub
    copy0 = next(node for node, _ in readers if node.replica == 0).outputs[0]
    graph.outputs.insert(0, copy0)  # the step returns replica 0's new b (cross-replica code reads replica 0's copy)
    balanced = _balance(graph)
    written = balanced.outputs[3]
    assert written is not copy0 and balanced.outputs[0] is copy0
    assert (written.producer.op_type, written.producer.inputs[0], written.producer.replica) == (
        "Identity", copy0, 0)
    assert _written_from(balanced)[1:3] == [1, 1]


def test_one_replica_is_unchanged() -> None:
    graph = _graph(BEFORE)
    _unchanged(graph, PassContext(devices=("cpu:0",)))


def test_zero1_groups_are_left_alone() -> None:
    graph = _only(_graph(BEFORE), "w", "m")
    assert ShardOptimizerStatePass()(graph, CTX).modified
    _unchanged(graph)


def test_tiny_updates_spread_by_their_nodes() -> None:
    """The ConvNet's variables are tiny (32 B to 4.6 KiB): weighed by bytes alone, cpu:0 got 5 of its 6 Adam
    updates (56 nodes in its update segment against 11). With a cost per node the two update segments are
    within a few nodes of each other."""
    import graphdist as gd
    from graphdist.models.convnet import ConvNet

    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model, optimizer = ConvNet(seed=0), gd.optimizers.Adam(0.01)
    replica_step = model.make_train_step(optimizer, 16)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    x, labels = ConvNet.example_data(n=16, seed=0)
    batch = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))))
    plan = train.get_concrete_function(*batch).plan
    updates = {s.device: len(s.graph.nodes) for s in plan.segments if s.name.endswith(".p1")}
    assert set(updates) == {"cpu:0", "cpu:1"} and abs(updates["cpu:0"] - updates["cpu:1"]) <= 4, updates
