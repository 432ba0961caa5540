"""LowerSingleReaderAllReducesPass: all-reduce groups as BalanceVariableUpdatesPass leaves them (every replica
computes the update, one replica's is written back) vs the hand-built graph summing on that replica; the
reduce ops (SUM of floats and of integers, MEAN, MAX over 2 and 3 replicas); groups read by two replicas, by
none, or spanning other workers stay; a second run changes nothing; the values are bitwise the same for two
replicas and within an ulp for three, on the reference backend and through a Mirrored training step."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import get_backend
from graphdist.compile.plan import Plan
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, assert_structural_equal, verify
from graphdist.models.mlp import MLP
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.lower_single_reader_all_reduces import LowerSingleReaderAllReducesPass
from graphdist.passes.partition import PartitionPass
from tests.passes.pass_checks import replica_op as _op

META = ("replica", "side_effect")
SHAPE = (4, 3)


def _ctx(replicas: int) -> PassContext:
    return PassContext(devices=tuple(f"cpu:{r}" for r in range(replicas)))


def _before(readers: tuple[int, ...], *, replicas: int = 2, reduce_op: str = "SUM", dtype=np.float32,
            group_size: int | None = None) -> Graph:
    """Every replica all-reduces its ``g_r`` and updates ``w``; the replicas in ``readers`` write theirs back."""
    graph = Graph("updates")
    grads = [graph.add_input(f"g{r}", dtype, SHAPE) for r in range(replicas)]
    w = graph.add_input("w", dtype, SHAPE)
    attrs = {"reduce_op": reduce_op, "group_key": "g", "group_size": group_size or replicas}
    summed = [_op(graph, "AllReduce", [grads[r]], attrs, replica=r, domain=GRAPHDIST_DOMAIN, side_effect=True)
              for r in range(replicas)]
    new = [_op(graph, "Sub", [w, summed[r]], replica=r) for r in range(replicas)]
    graph.outputs = [new[r] for r in readers]
    return graph


def _expected(reader: int, *, replicas: int = 2, reduce_op: str = "SUM", dtype=np.float32) -> Graph:
    """The same step with the group lowered: the sum (or its chain) on ``reader``, nothing on the others."""
    graph = Graph("updates")
    grads = [graph.add_input(f"g{r}", dtype, SHAPE) for r in range(replicas)]
    w = graph.add_input("w", dtype, SHAPE)
    if np.dtype(dtype).kind == "f" and reduce_op in ("SUM", "MEAN"):
        total = _op(graph, "Sum", grads, replica=reader)
        if reduce_op == "MEAN":
            total = _op(graph, "Div", [total, graph.add_initializer("count", np.array(replicas, dtype))],
                        replica=reader)
    else:
        total = grads[0]
        for g in grads[1:]:
            total = _op(graph, {"SUM": "Add", "MAX": "Max", "MIN": "Min"}[reduce_op], [total, g], replica=reader)
    graph.outputs = [_op(graph, "Sub", [w, total], replica=reader)]
    return graph


def _lower(graph: Graph, replicas: int = 2) -> Graph:
    result = LowerSingleReaderAllReducesPass()(graph, _ctx(replicas))
    assert result.modified
    verify(result.graph)
    snapshot = result.graph.copy()
    again = LowerSingleReaderAllReducesPass()(result.graph, _ctx(replicas))
    assert not again.modified
    assert_structural_equal(again.graph, snapshot, meta_keys=META)
    return result.graph


def _unchanged(graph: Graph, replicas: int = 2) -> None:
    snapshot = graph.copy()
    result = LowerSingleReaderAllReducesPass()(graph, _ctx(replicas))
    assert not result.modified
    assert_structural_equal(result.graph, snapshot, meta_keys=META)


def _run(graph: Graph, feeds: dict[str, np.ndarray], replicas: int) -> list[np.ndarray]:
    passes = [LowerCollectivesPass(), EliminateDeadNodesPass(), AssignDevicesPass(), PartitionPass()]
    placed = PassManager(passes).run(graph.copy(), _ctx(replicas)).graph
    plan = Plan.from_graph(placed).compile(get_backend("reference"))
    return plan.run({v.name: feeds[v.name] for v in placed.inputs})


CASES = [  # (replicas, reduce_op, dtype, reader)
    (2, "SUM", np.float32, 1),
    (2, "SUM", np.float32, 0),
    (3, "SUM", np.float32, 2),
    (2, "MEAN", np.float32, 0),
    (3, "SUM", np.int64, 1),
    (3, "MAX", np.float32, 0),
    (2, "MIN", np.int32, 1),
]


@pytest.mark.parametrize(("replicas", "reduce_op", "dtype", "reader"), CASES)
def test_a_group_read_by_one_replica_becomes_its_sum(replicas, reduce_op, dtype, reader) -> None:
    before = _before((reader,), replicas=replicas, reduce_op=reduce_op, dtype=dtype)
    name = before.outputs[0].producer.inputs[1].name  # the read member's result
    after = _lower(before, replicas)
    assert_structural_equal(after, _expected(reader, replicas=replicas, reduce_op=reduce_op, dtype=dtype),
                            meta_keys=META)
    assert after.outputs[0].producer.inputs[1].name == name  # its readers still read that value
    assert not after.find_nodes("AllReduce", GRAPHDIST_DOMAIN)


@pytest.mark.parametrize(("replicas", "reduce_op", "dtype", "reader"), CASES)
def test_the_sum_equals_the_all_reduce(replicas, reduce_op, dtype, reader) -> None:
    rng = np.random.default_rng(replicas)
    feeds = {v.name: (rng.standard_normal(v.shape) * 100).astype(v.dtype)
             for v in _before((reader,), replicas=replicas, dtype=dtype).inputs}
    want = _run(_before((reader,), replicas=replicas, reduce_op=reduce_op, dtype=dtype), feeds, replicas)
    got = _run(_lower(_before((reader,), replicas=replicas, reduce_op=reduce_op, dtype=dtype), replicas), feeds,
               replicas)
    if replicas == 2 or np.dtype(dtype).kind != "f" or reduce_op in ("MAX", "MIN"):
        np.testing.assert_array_equal(got[0], want[0])  # one addition, or exact arithmetic
    else:
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)  # the ring adds in another order
    grads = np.stack([feeds[f"g{r}"] for r in range(replicas)])
    combined = {"SUM": grads.sum(0), "MEAN": grads.mean(0), "MAX": grads.max(0), "MIN": grads.min(0)}[reduce_op]
    np.testing.assert_allclose(got[0], feeds["w"] - combined, rtol=1e-5)


def test_groups_read_by_several_replicas_by_none_or_across_workers_stay() -> None:
    _unchanged(_before((0, 1)))  # both replicas read the sum
    nobody = _before((0,))
    nobody.outputs = []  # a group whose result nothing reads (dead code left for EliminateDeadNodesPass)
    _unchanged(nobody)
    _unchanged(_before((1,), group_size=4))  # 2 more members in another worker: MPI joins them later
    _unchanged(_before((1,), reduce_op="MEAN", dtype=np.int64))  # integer mean: the communicator's rounding
    _unchanged(_before((0,), dtype=np.bool_))  # SUM of booleans is a logical or


def test_a_reader_behind_a_side_effect_counts() -> None:
    graph = _before((1,))  # replica 1 writes its update back
    replica0 = graph.find_nodes("AllReduce", GRAPHDIST_DOMAIN)[0].outputs[0]
    _op(graph, "Identity", [replica0], replica=0, side_effect=True)  # a node kept for its side effect reads it
    _unchanged(graph)  # replica 0's result is read too


def test_mirrored_training_by_default_equals_explicit_all_reduces() -> None:
    """The default MirroredStrategy (sums at the readers) trains bitwise like NcclAllReduce (all-reduces)."""
    def train(cross_device_ops):
        strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=cross_device_ops)
        with strategy.scope():
            model = MLP((12, 10, 6, 4), seed=0, trainable=True)
            optimizer = gd.optimizers.Adam(0.01)
        replica_step = model.make_train_step(optimizer, 16)

        @gd.function
        def step(x, labels):
            return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

        rng = np.random.default_rng(0)
        x = rng.standard_normal((16, 12)).astype(np.float32)
        labels = rng.integers(0, 4, 16)
        batch = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))))
        losses = [float(step(*batch)) for _ in range(3)]
        plan = step.get_concrete_function(*batch).plan
        return losses, [np.array(v.numpy()) for v in model.trainable_variables], plan

    losses, weights, plan = train(None)
    want_losses, want_weights, reference = train(gd.NcclAllReduce())
    assert not [c for c in plan.comms if c.op == "AllReduce"]
    assert [c for c in reference.comms if c.op == "AllReduce"]
    assert losses == want_losses
    for got, want in zip(weights, want_weights):
        np.testing.assert_array_equal(got, want)
