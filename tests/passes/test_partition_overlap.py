"""PartitionPass's overlap cut: a small MLP step under Mirrored(2) with gradient bucketing.

Before (overlap off): one forward+backward segment per device (``cpuN.p0``).
Expected (overlap on): that segment cut at the gradient buckets, last layer
first (``cpuN.p0.s0``, ``.s1``, ...): part ``k`` holds exactly what bucket
``k``'s input needs beyond the earlier parts, the bucket's all-reduce reads
part ``k`` and the later parts may run while it runs. ``modified`` is honest,
a second run changes nothing, and training gives bitwise the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.plan import Plan
from graphdist.ir import verify
from graphdist.ir.comm_ops import is_communication
from graphdist.ir.graph import Graph
from graphdist.models.mlp import MLP
from graphdist.passes.base import PassContext
from graphdist.passes.partition import PartitionPass

DEVICES = ("cpu:0", "cpu:1")
CTX = PassContext(devices=DEVICES)
SIZES = (12, 10, 8, 6, 4)  # 4 layers, 8 gradients
BATCH = 16


def _step(strategy: gd.Strategy) -> tuple[MLP, gd.Function, tuple]:
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    replica_step = model.make_train_step(optimizer, BATCH)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    labels = rng.integers(0, SIZES[-1], BATCH)
    batch = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))))
    return model, train, batch


def _mirrored(num_packs: int | None = 3) -> gd.MirroredStrategy:
    ops = gd.NcclAllReduce(num_packs=num_packs) if num_packs else None
    return gd.MirroredStrategy(list(DEVICES), cross_device_ops=ops)


@pytest.fixture(scope="module")
def rewritten() -> Graph:
    _, train, batch = _step(_mirrored())
    return train.get_concrete_function(*batch).graph("rewritten")


def _segments(graph: Graph) -> dict[str, list]:
    found: dict[str, list] = {}
    for node in graph.nodes:
        if not is_communication(node):
            found.setdefault(node.meta["segment"], []).append(node)
    return found


def _buckets(graph: Graph, device: str) -> list:
    """The bucketed all-reduces of ``device`` reading phase 0, in the order their inputs become ready."""
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    nodes = [n for n in graph.nodes if n.qualified_op == "graphdist.AllReduce" and n.device == device
             and "bucket" in n.meta and not is_communication(n.inputs[0].producer)]
    return sorted(nodes, key=lambda n: position[id(n.inputs[0].producer)])


def _ancestors(node, inside: set[int]) -> set[int]:
    seen, stack = set(), [node]
    while stack:
        for value in stack.pop().inputs:
            producer = value.producer if value is not None else None
            if producer is not None and id(producer) in inside and id(producer) not in seen:
                seen.add(id(producer))
                stack.append(producer)
    return seen


def test_backward_is_cut_at_the_buckets(rewritten: Graph) -> None:
    before = PartitionPass(overlap=False)(rewritten.copy(), CTX)
    after = PartitionPass(overlap=True)(rewritten.copy(), CTX)
    assert before.modified and after.modified
    verify(after.graph, "partitioned")
    old, new = _segments(before.graph), _segments(after.graph)
    for device in DEVICES:
        base = device.replace(":", "")
        buckets = _buckets(after.graph, device)
        assert len(buckets) >= 2, "the test needs several buckets per device"
        # before: the whole forward + backward pass of the device is one segment
        assert f"{base}.p0" in old and not any(name.startswith(f"{base}.p0.") for name in old)
        # after: one part per bucket, in readiness order, and the same nodes in all
        parts = [f"{base}.p0.s{k}" for k in range(len(buckets))]
        assert sorted(name for name in new if name.startswith(f"{base}.p0")) == parts
        assert sorted(n.name for p in parts for n in new[p]) == sorted(n.name for n in old[f"{base}.p0"])
        inside = {id(n) for p in parts for n in new[p]}
        claimed: set[int] = set()
        for k, bucket in enumerate(buckets):
            producer = bucket.inputs[0].producer
            assert producer.meta["segment"] == parts[k]  # bucket k reads part k
            needed = _ancestors(producer, inside) | {id(producer)}
            # part k is what bucket k needs beyond the earlier buckets; later parts are not needed by it
            assert {id(n) for n in new[parts[k]]} - claimed >= needed - claimed
            if k < len(buckets) - 1:
                assert {id(n) for n in new[parts[k]]} == needed - claimed
            claimed |= needed
        # phases after the collectives are not cut
        assert [name for name in new if name.startswith(f"{base}.p1")] == [
            name for name in old if name.startswith(f"{base}.p1")]


def test_modified_is_honest_and_a_second_run_changes_nothing(rewritten: Graph) -> None:
    first = PartitionPass(overlap=True)(rewritten.copy(), CTX)
    names = {n.name: n.meta.get("segment") for n in first.graph.nodes}
    again = PartitionPass(overlap=True)(first.graph, CTX)
    assert not again.modified
    assert {n.name: n.meta.get("segment") for n in again.graph.nodes} == names
    # re-cutting an uncut plan changes it; uncutting a cut one too
    uncut = PartitionPass(overlap=False)(rewritten.copy(), CTX).graph
    assert PartitionPass(overlap=True)(uncut, CTX).modified
    assert PartitionPass(overlap=False)(uncut, CTX).modified


def test_no_buckets_no_cut() -> None:
    _, train, batch = _step(_mirrored(num_packs=None))
    graph = train.get_concrete_function(*batch).graph("rewritten")
    cut = _segments(PartitionPass(overlap=True)(graph.copy(), CTX).graph)
    plain = _segments(PartitionPass(overlap=False)(graph.copy(), CTX).graph)
    assert cut.keys() == plain.keys()
    assert not any(".s" in name for name in cut)


def test_plan_shows_which_collectives_overlap_which_segments(rewritten: Graph) -> None:
    plan = Plan.from_graph(PartitionPass(overlap=True)(rewritten.copy(), CTX).graph)
    overlaps = plan.overlaps()
    partitioned = plan.graph
    buckets = _buckets(partitioned, "cpu:0")
    for k, bucket in enumerate(buckets):
        later = {f"cpu{d}.p0.s{j}" for d in (0, 1) for j in range(k + 1, len(buckets))}
        assert later <= set(overlaps.get(bucket.attrs["group_key"], []))
        earlier = {f"cpu{d}.p0.s{j}" for d in (0, 1) for j in range(k + 1)}
        assert not earlier & set(overlaps.get(bucket.attrs["group_key"], []))
    text = plan.summary()
    assert "overlap (segments that may run while each collective runs):" in text
    first = buckets[0].attrs["group_key"]
    section = text.split("overlap (segments that may run while each collective runs):", 1)[1]
    line = next(line for line in section.splitlines() if line.strip().startswith(first + " "))
    assert "cpu0.p0.s1" in line and "cpu1.p0.s1" in line
    uncut = Plan.from_graph(PartitionPass(overlap=False)(rewritten.copy(), CTX).graph).overlaps()
    assert not any(".p0" in name for names in uncut.values() for name in names)


def _weights_after_steps(monkeypatch: pytest.MonkeyPatch, overlap: str) -> tuple[list[np.ndarray], list]:
    monkeypatch.setenv("GRAPHDIST_OVERLAP", overlap)
    model, train, batch = _step(_mirrored())
    losses = [train(*batch) for _ in range(3)]
    segments = [s.name for s in train.get_concrete_function(*batch).plan.segments]
    return [v.numpy() for v in model.trainable_variables] + losses, segments


def test_weights_bitwise_equal_with_and_without_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    with_overlap, cut = _weights_after_steps(monkeypatch, "1")
    without, plain = _weights_after_steps(monkeypatch, "0")
    assert any(".s1" in name for name in cut) and not any(".s" in name for name in plain)
    for got, want in zip(with_overlap, without):
        np.testing.assert_array_equal(got, want)


def test_bad_overlap_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(gd.errors.InvalidArgumentError, match="overlap"):
        PartitionPass(overlap="yes")  # type: ignore[arg-type]
    monkeypatch.setenv("GRAPHDIST_OVERLAP", "maybe")
    with pytest.raises(gd.errors.InvalidArgumentError, match="GRAPHDIST_OVERLAP"):
        PartitionPass()(Graph("empty"), CTX)
