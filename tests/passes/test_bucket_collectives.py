"""BucketCollectivesPass: before vs expected structure, honest ``modified``, a second
run changes nothing, numerics unchanged (reference backend with all-reduces as one
participant, and the partitioned plan with the local communicator), packing rule;
between workers: local all-reduce + CrossWorkerAllReduce chains (and the cross-worker
all-reduce alone, one device per worker) packed into one MPI call per pack, numbered
again in readiness order."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import default_cache, get_backend
from graphdist.compile.pipeline import PipelineConfig, build_pipeline
from graphdist.compile.plan import Plan
from graphdist.ir import Graph, assert_structural_equal, to_onnx, verify
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node, Value
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.bucket_collectives import BucketCollectivesPass, pack_groups
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.insert_cross_worker_collectives import InsertCrossWorkerCollectivesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.partition import PartitionPass
from graphdist.runtime.devices import parse_device

DEVICES = ("cpu:0", "cpu:1")
CTX = PassContext(devices=DEVICES)
AR = "graphdist.AllReduce"

#: (shape, dtype, reduce_op) of each all-reduced value, in "variable order".
SPECS = [((2, 3), np.float32, "SUM"), ((3,), np.float32, "SUM"), ((), np.float32, "SUM"), ((4,), np.float32, "SUM")]


def _placed(node: Node, replica: int) -> Node:
    node.replica = replica
    node.meta.update(context="replica")
    return node


def _graph(specs=SPECS, replicas: int = 2, lower: bool = True) -> Graph:
    """Per replica: one input per spec, producers emitted in reverse spec order (as
    reverse-mode autodiff emits gradients), then one AllReduce per spec in spec order,
    then a reader (Add 1) per result."""
    graph = Graph("buckets")
    for replica in range(replicas):
        inputs = [graph.add_input(f"x{i}_r{replica}", dtype, shape) for i, (shape, dtype, _) in enumerate(specs)]
        produced: dict[int, Value] = {}
        for i in reversed(range(len(specs))):
            two = graph.add_initializer("two", np.array(2, specs[i][1]))
            produced[i] = _placed(graph.add_node("Mul", [inputs[i], two], name=f"grad{i}"), replica).outputs[0]
        reduced = []
        for i, (_, _, op) in enumerate(specs):
            node = graph.add_node("AllReduce", [produced[i]], {"reduce_op": op, "group_size": replicas,
                                                               "group_key": f"all_reduce0.{i}"},
                                  domain=GRAPHDIST_DOMAIN)
            node.meta["side_effect"] = True
            reduced.append(_placed(node, replica).outputs[0])
        for i, value in enumerate(reduced):
            one = graph.add_initializer("one", np.array(1, specs[i][1]))
            graph.outputs.append(_placed(graph.add_node("Add", [value, one], name=f"use{i}"), replica).outputs[0])
    if lower:
        graph = LowerCollectivesPass()(graph, PassContext(devices=tuple(f"cpu:{i}" for i in range(replicas)))).graph
    return graph


def _feeds(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {v.name: (rng.standard_normal(v.shape) * 10).astype(v.dtype) for v in graph.inputs}


def _reference(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Whole graph on the reference backend (every AllReduce as one participant: the identity)."""
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run(feeds)


def _plan(graph: Graph) -> Plan:
    """Places and partitions a copy of ``graph`` and compiles its plan (local communicator)."""
    partitioned = PassManager([EliminateDeadNodesPass(), AssignDevicesPass(), PartitionPass()]).run(
        graph.copy(), CTX).graph
    return Plan.from_graph(partitioned).compile(get_backend("reference"))


def _ops(graph: Graph, replica: int | None = None) -> list[str]:
    return [n.qualified_op for n in graph.nodes if replica is None or n.replica == replica]


def _groups(graph: Graph) -> list[str]:
    keys = [n.attrs["group_key"] for n in graph.nodes if n.qualified_op == AR]
    return list(dict.fromkeys(keys))


def _check(pass_: BucketCollectivesPass, graph: Graph) -> tuple[Graph, bool]:
    """Runs the pass; checks verification, numerics, idempotence; returns the new graph and ``modified``."""
    feeds = _feeds(graph)
    before_ref, before_plan = _reference(graph, feeds), _plan(graph).run(feeds)
    result = pass_(graph.copy(), CTX)
    verify(result.graph)
    for got, want in zip(_reference(result.graph, feeds), before_ref):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_plan(result.graph).run(feeds), before_plan):
        np.testing.assert_array_equal(got, want)
    again = pass_(result.graph, CTX)
    assert not again.modified, f"{pass_!r} is not idempotent"
    assert _ops(again.graph) == _ops(result.graph)
    return result.graph, result.modified


# ------------------------------------------------------------------ packing rule
def test_pack_groups_bytes_per_pack_is_greedy_and_contiguous() -> None:
    assert pack_groups([12, 48, 16, 128], bytes_per_pack=64) == [[0, 1], [2], [3]]
    assert pack_groups([10, 10, 10, 10], bytes_per_pack=20) == [[0, 1], [2, 3]]
    assert pack_groups([100, 1, 1], bytes_per_pack=50) == [[0], [1, 2]]  # too big for a pack: alone
    assert pack_groups([4, 4], bytes_per_pack=1) == [[0], [1]]
    assert pack_groups([], bytes_per_pack=8) == []


def test_pack_groups_num_packs_balances_bytes() -> None:
    assert pack_groups([12, 48, 16, 128], num_packs=1) == [[0, 1, 2, 3]]
    assert pack_groups([12, 48, 16, 128], num_packs=2) == [[0, 1, 2], [3]]
    assert pack_groups([10] * 6, num_packs=3) == [[0, 1], [2, 3], [4, 5]]
    assert pack_groups([10] * 3, num_packs=8) == [[0], [1], [2]]  # at most one pack per group
    sizes = list(range(1, 40))
    packs = pack_groups(sizes, num_packs=5)
    assert len(packs) == 5 and [i for p in packs for i in p] == list(range(len(sizes)))
    totals = [sum(sizes[i] for i in p) for p in packs]
    assert max(totals) < 1.5 * sum(sizes) / 5


# ------------------------------------------------------------------ structure
def test_one_pack_structure_and_numerics() -> None:
    graph = _graph()
    assert _ops(graph, 0) == ["Mul"] * 4 + [AR] * 4 + ["Add"] * 4
    packed, modified = _check(BucketCollectivesPass(num_packs=1), graph)
    assert modified
    # per replica: the pack sits right after the last gradient; the flat Reshapes only for non-1-D values
    expected = ["Mul"] * 4 + ["Reshape", "Reshape", "Concat", AR, "Split", "Reshape", "Reshape"] + ["Add"] * 4
    assert _ops(packed, 0) == expected and _ops(packed, 1) == expected
    assert _groups(packed) == ["bucket0"]
    concat = next(n for n in packed.nodes if n.op_type == "Concat" and n.replica == 0)
    # members in readiness order: grad3 was produced first, grad0 last
    sources = [v.producer.inputs[0].name if v.producer.op_type == "Reshape" else v.name for v in concat.inputs]
    assert sources == ["grad3", "grad2", "grad1", "grad0"]
    split = next(n for n in packed.nodes if n.op_type == "Split" and n.replica == 0)
    assert split.inputs[1].const_value.tolist() == [4, 1, 3, 6]
    reduce = next(n for n in packed.nodes if n.qualified_op == AR and n.replica == 0)
    assert reduce.attrs == {"reduce_op": "SUM", "group_size": 2, "group_key": "bucket0", "algorithm": "ring"}
    assert reduce.meta["side_effect"] and reduce.meta["bucket_members"] == [f"all_reduce0.{i}" for i in (3, 2, 1, 0)]
    use0 = next(n for n in packed.nodes if n.name == "use0")
    assert use0.inputs[0].shape == (2, 3) and use0.inputs[0].producer.op_type == "Reshape"
    # the new nodes are on their replica: placement puts them on that replica's device
    placed = AssignDevicesPass()(packed.copy(), CTX).graph
    assert {n.device for n in placed.nodes if n.replica == 1} == {"cpu:1"}


def test_several_packs_follow_readiness_order() -> None:
    graph = _graph()  # bytes in readiness order: grad3 16, grad2 4, grad1 12, grad0 24
    packed, modified = _check(BucketCollectivesPass(bytes_per_pack=32), graph)
    assert modified
    assert _groups(packed) == ["bucket0", "all_reduce0.0"]
    reduce = [n for n in packed.nodes if n.qualified_op == AR and n.replica == 0]
    assert reduce[0].meta["bucket_members"] == ["all_reduce0.3", "all_reduce0.2", "all_reduce0.1"]
    assert reduce[1].attrs["group_key"] == "all_reduce0.0" and "bucket_members" not in reduce[1].meta
    plan = _plan(packed)
    assert [c.name for c in plan.comms if c.op == "AllReduce"] == ["bucket0", "all_reduce0.0"]


def test_packs_keep_the_first_pack_free_of_late_gradients() -> None:
    graph = _graph()
    packed, _ = _check(BucketCollectivesPass(num_packs=2), graph)
    reduce = [n for n in packed.nodes if n.qualified_op == AR and n.replica == 0]
    # grad3 (produced first) is reduced in the first communication task, grad0 (produced last) alone after it
    assert reduce[0].meta["bucket_members"] == ["all_reduce0.3", "all_reduce0.2", "all_reduce0.1"]
    assert reduce[1].attrs["group_key"] == "all_reduce0.0"


def test_four_replicas() -> None:
    graph = _graph(replicas=4, lower=False)
    graph = LowerCollectivesPass()(graph, PassContext(devices=("cpu:0", "cpu:1", "cpu:2", "cpu:3"))).graph
    result = BucketCollectivesPass(num_packs=1)(graph, CTX)
    assert result.modified
    verify(result.graph)
    assert [n.replica for n in result.graph.nodes if n.qualified_op == AR] == [0, 1, 2, 3]
    assert _groups(result.graph) == ["bucket0"]


# ------------------------------------------------------------------ what is not packed
def test_incompatible_groups_stay_apart() -> None:
    specs = [((3,), np.float32, "SUM"), ((3,), np.float32, "MAX"), ((2,), np.int32, "SUM"),
             ((5,), np.float32, "SUM"), ((2, 2), np.int32, "SUM"), ((4,), np.float32, "MAX")]
    packed, _ = _check(BucketCollectivesPass(num_packs=1), _graph(specs))
    packs = {tuple(n.meta["bucket_members"]) for n in packed.nodes if n.qualified_op == AR and "bucket_members" in
             n.meta}
    assert packs == {("all_reduce0.3", "all_reduce0.0"), ("all_reduce0.5", "all_reduce0.1"),
                     ("all_reduce0.4", "all_reduce0.2")}


def test_dependent_groups_are_not_packed_together() -> None:
    """y = all_reduce(2x); z = all_reduce(3y) depends on y's result; w = all_reduce(4x) does not."""
    graph = Graph("chain")
    for replica in range(2):
        x = graph.add_input(f"x_r{replica}", np.float32, (3,))
        values = {}
        for name, source, factor in (("y", "x", 2), ("w", "x", 4), ("z", "y", 3)):
            base = x if source == "x" else values[source]
            scale = graph.add_initializer("c", np.array(factor, np.float32))
            product = _placed(graph.add_node("Mul", [base, scale]), replica).outputs[0]
            node = _placed(graph.add_node("AllReduce", [product], {"reduce_op": "SUM", "group_size": 2,
                                                                  "group_key": name}, domain=GRAPHDIST_DOMAIN),
                           replica)
            values[name] = node.outputs[0]
        graph.outputs += [values["z"], values["w"]]
    graph = LowerCollectivesPass()(graph, CTX).graph
    packed, modified = _check(BucketCollectivesPass(num_packs=1), graph)
    assert modified
    assert set(_groups(packed)) == {"bucket0", "z"}
    reduce = next(n for n in packed.nodes if n.attrs.get("group_key") == "bucket0")
    assert sorted(reduce.meta["bucket_members"]) == ["w", "y"]
    feeds = _feeds(packed)
    z0, w0 = _plan(packed).run(feeds)[:2]
    total = feeds["x_r0"] + feeds["x_r1"]
    np.testing.assert_allclose(z0, 2 * 3 * 2 * total, rtol=1e-6)
    np.testing.assert_allclose(w0, 4 * total, rtol=1e-6)


def test_value_placed_on_another_device_is_not_packed() -> None:
    """A member reading a value placed elsewhere keeps its own all-reduce (no transfer before the Concat)."""
    graph = _graph()
    next(n for n in graph.nodes if n.name == "grad0").device = "cpu:1"  # replica 0's gradient, on cpu:1
    result = BucketCollectivesPass(num_packs=1)(graph, CTX)
    assert result.modified
    packed = next(n for n in result.graph.nodes if n.attrs.get("group_key") == "bucket0")
    assert packed.meta["bucket_members"] == ["all_reduce0.3", "all_reduce0.2", "all_reduce0.1"]
    assert "all_reduce0.0" in _groups(result.graph)


@pytest.mark.parametrize("pass_", [BucketCollectivesPass(num_packs=0), BucketCollectivesPass(bytes_per_pack=0),
                                   BucketCollectivesPass(bytes_per_pack=2)],
                         ids=["num_packs_0", "bytes_0", "every_pack_alone"])
def test_nothing_to_pack_is_unmodified(pass_) -> None:
    graph = _graph()
    before = _ops(graph)
    result = pass_(graph, CTX)
    assert not result.modified
    assert _ops(result.graph) == before
    assert not pass_(result.graph, CTX).modified


def test_unlowered_and_single_participant_groups_are_left_alone() -> None:
    unlowered = _graph(lower=False)
    result = BucketCollectivesPass(num_packs=1)(unlowered, CTX)
    assert not result.modified and _ops(result.graph).count(AR) == 8
    single = _graph(replicas=1, lower=False)
    for node in single.nodes:
        if node.qualified_op == AR:
            node.attrs["algorithm"] = "ring"
    assert not BucketCollectivesPass(num_packs=1)(single, CTX).modified


def test_settings_are_validated() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="not both"):
        BucketCollectivesPass(num_packs=2, bytes_per_pack=1024)
    with pytest.raises(gd.InvalidArgumentError, match="non-negative"):
        BucketCollectivesPass(num_packs=-1)
    with pytest.raises(gd.InvalidArgumentError, match="non-negative"):
        BucketCollectivesPass(bytes_per_pack=1.5)
    with pytest.raises(gd.InvalidArgumentError, match="needs"):
        BucketCollectivesPass()
    assert repr(BucketCollectivesPass(bytes_per_pack=64)) == "BucketCollectivesPass(bytes_per_pack=64)"


# ------------------------------------------------------------------ pipeline wiring
def _names(passes) -> list[str]:
    return [p.name for p in passes]


def test_pipeline_runs_the_pass_only_when_asked() -> None:
    assert "BucketCollectivesPass" not in _names(gd.MirroredStrategy(["cpu:0"], gd.NcclAllReduce()).pipeline())
    assert "BucketCollectivesPass" not in _names(
        gd.MirroredStrategy(["cpu:0"], gd.NcclAllReduce(num_packs=0)).pipeline())
    assert "BucketCollectivesPass" not in _names(build_pipeline(PipelineConfig()))
    names = _names(gd.MirroredStrategy(["cpu:0"], gd.HierarchicalCopyAllReduce(bytes_per_pack=4096)).pipeline())
    at = names.index("BucketCollectivesPass")
    assert names[at - 1] == "LowerCollectivesPass"
    assert names[at + 1:] == ["FoldConstantsPass", "EliminateDeadNodesPass", "AssignDevicesPass",
                              "LowerIndexChecksPass", "PartitionPass"]
    (bucket,) = [p for p in gd.MirroredStrategy(["cpu:0"], gd.NcclAllReduce(num_packs=3)).pipeline()
                 if p.name == "BucketCollectivesPass"]
    assert bucket.num_packs == 3 and bucket.bytes_per_pack is None


# ------------------------------------------------------------------ between workers (MultiWorkerMirroredStrategy)
CROSS = "graphdist.CrossWorkerAllReduce"
WORKERS = 2


def _cross_graph(local: int) -> Graph:
    """``_graph`` as MultiWorkerMirroredStrategy's pipeline leaves it for 2 workers of ``local`` devices: every
    all-reduce followed by a CrossWorkerAllReduce (InsertCrossWorkerCollectivesPass), then lowered (with one
    local device the local all-reduce is the identity and only the cross-worker one remains)."""
    graph = _graph(replicas=local, lower=False)
    ctx = PassContext(devices=DEVICES[:local])
    return PassManager([InsertCrossWorkerCollectivesPass(WORKERS, "workers"), LowerCollectivesPass()]).run(
        graph, ctx).graph


def _cross_attrs(reduce_op: str, local: int, sequence: int) -> dict:
    return {"num_workers": WORKERS, "group_key": f"k{sequence}/workers", "group_size": local, "reduce_op": reduce_op,
            "algorithm": "auto", "comm_group": "workers", "sequence": sequence, "name": f"step collective {sequence}"}


def _expected_one_pack(local: int) -> Graph:
    """Hand-built: per replica the gradients, then Reshape/Concat -> [AllReduce] -> CrossWorkerAllReduce ->
    Split/Reshape in readiness order (grad3, grad2, grad1, grad0), then the readers."""
    graph = Graph("expected")
    flat = graph.add_initializer("flat", np.array([-1], np.int64))
    sizes = graph.add_initializer("sizes", np.array([4, 1, 3, 6], np.int64))
    for replica in range(local):
        inputs = [graph.add_input(f"x{i}_r{replica}", dtype, shape) for i, (shape, dtype, _) in enumerate(SPECS)]
        grads = {}
        for i in reversed(range(len(SPECS))):
            grads[i] = _placed(graph.add_node("Mul", [inputs[i], graph.add_initializer("two", np.array(
                2, SPECS[i][1]))]), replica).outputs[0]
        pieces = [grads[i] if len(SPECS[i][0]) == 1 else
                  _placed(graph.add_node("Reshape", [grads[i], flat]), replica).outputs[0] for i in (3, 2, 1, 0)]
        packed = _placed(graph.add_node("Concat", pieces, {"axis": 0}), replica).outputs[0]
        if local > 1:
            packed = _placed(graph.add_node("AllReduce", [packed], {"reduce_op": "SUM", "group_size": local,
                                                                    "group_key": "b", "algorithm": "ring"},
                                            domain=GRAPHDIST_DOMAIN), replica).outputs[0]
        packed = _placed(graph.add_node("CrossWorkerAllReduce", [packed], _cross_attrs("SUM", local, 0),
                                        domain=GRAPHDIST_DOMAIN), replica).outputs[0]
        split = _placed(graph.add_node("Split", [packed, sizes], {"axis": 0}, num_outputs=4), replica)
        reduced = {}
        for i, piece in zip((3, 2, 1, 0), split.outputs):
            shape = SPECS[i][0]
            reduced[i] = piece if len(shape) == 1 else _placed(graph.add_node("Reshape", [piece, graph.add_initializer(
                "shape", np.array(shape, np.int64).reshape(-1))]), replica).outputs[0]
        for i in range(len(SPECS)):
            one = graph.add_initializer("one", np.array(1, SPECS[i][1]))
            graph.outputs.append(_placed(graph.add_node("Add", [reduced[i], one]), replica).outputs[0])
    return graph


def _simulated_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cross-worker all-reduces run as if the other worker held the same values (no MPI in unit tests)."""
    from graphdist.runtime.comm import handlers

    def handler(op: str, attrs: dict, buffers: list[np.ndarray]) -> list[np.ndarray]:
        assert attrs["reduce_op"] == "SUM"
        return [buffers[0] * np.asarray(attrs["num_workers"], buffers[0].dtype)] * len(buffers)

    monkeypatch.setitem(handlers._handlers, "CrossWorkerAllReduce", handler)


@pytest.mark.parametrize("local", [1, 2], ids=["one_device_per_worker", "two_devices_per_worker"])
def test_cross_worker_chain_is_packed_into_one_mpi_call(local: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _simulated_workers(monkeypatch)
    graph = _cross_graph(local)
    ctx = PassContext(devices=DEVICES[:local])
    assert _ops(graph).count(CROSS) == 4 * local and _ops(graph).count(AR) == (4 * local if local > 1 else 0)
    feeds = _feeds(graph)
    partition = [EliminateDeadNodesPass(), AssignDevicesPass(), PartitionPass()]
    before = Plan.from_graph(PassManager(partition).run(graph.copy(), ctx).graph).compile(get_backend("reference"))
    result = BucketCollectivesPass(num_packs=1)(graph.copy(), ctx)
    assert result.modified
    verify(result.graph)
    assert_structural_equal(result.graph, _expected_one_pack(local), meta_keys=("replica",))
    for node in result.graph.nodes:
        if node.qualified_op in (AR, CROSS):
            assert node.meta["bucket"] == "bucket0" and node.meta["side_effect"]
            assert node.meta["bucket_members"] == [f"all_reduce0.{i}{'' if local > 1 else '/workers'}"
                                                   for i in (3, 2, 1, 0)]
    after = Plan.from_graph(PassManager(partition).run(result.graph.copy(), ctx).graph).compile(
        get_backend("reference"))
    assert [c.op for c in after.comms] == (["AllReduce"] if local > 1 else []) + ["CrossWorkerAllReduce"]
    expected = before.run(feeds)
    for got, want in zip(after.run(feeds), expected):
        np.testing.assert_array_equal(got, want)
    local_sum = sum(feeds[f"x0_r{r}"] * 2 for r in range(local))  # then the same from the other worker
    np.testing.assert_allclose(expected[0], local_sum * WORKERS + 1, rtol=1e-6)
    again = BucketCollectivesPass(num_packs=1)(result.graph, ctx)
    assert not again.modified and _ops(again.graph) == _ops(result.graph)


def test_cross_worker_groups_are_numbered_again_in_readiness_order() -> None:
    """grad0 (produced last) was the first cross-worker group; after packing, the pack of the gradients produced
    first is issued first (sequence 0) on every worker, grad0 second."""
    graph = _cross_graph(1)
    numbers = {n.attrs["group_key"]: n.attrs["sequence"] for n in graph.nodes if n.qualified_op == CROSS}
    assert numbers == {f"all_reduce0.{i}/workers": i for i in range(4)}
    result = BucketCollectivesPass(bytes_per_pack=32)(graph, PassContext(devices=("cpu:0",)))
    assert result.modified
    cross = [n for n in result.graph.nodes if n.qualified_op == CROSS]
    assert [(n.attrs["group_key"], n.attrs["sequence"], n.attrs["name"]) for n in cross] == [
        ("bucket0/workers", 0, "step collective 0"), ("all_reduce0.0/workers", 1, "step collective 1")]
    assert [n.meta["bucket"] for n in cross] == ["bucket0", "all_reduce0.0/workers"]
    # PartitionPass cuts the one device's first phase at the two buckets
    partitioned = PassManager([AssignDevicesPass(), PartitionPass(overlap=True)]).run(
        result.graph, PassContext(devices=("cpu:0",))).graph
    assert sorted({n.meta["segment"] for n in partitioned.nodes if "segment" in n.meta}) == [
        "cpu0.p0.s0", "cpu0.p0.s1", "cpu0.p1"]


def test_local_group_read_by_more_than_its_cross_worker_group_is_left_alone() -> None:
    graph = _cross_graph(2)
    local = next(n for n in graph.nodes if n.qualified_op == AR and n.attrs["group_key"] == "all_reduce0.3")
    graph.outputs.append(local.outputs[0])  # the local sum is also a step output: it cannot become a pack's slice
    result = BucketCollectivesPass(num_packs=1)(graph, CTX)
    assert result.modified
    untouched = [n for n in result.graph.nodes if n.attrs.get("group_key", "").startswith("all_reduce0.3")]
    assert len(untouched) == 4 and not any("bucket" in n.meta for n in untouched)
    packed = next(n for n in result.graph.nodes if n.qualified_op == AR and n.attrs["group_key"] == "bucket0")
    assert packed.meta["bucket_members"] == ["all_reduce0.2", "all_reduce0.1", "all_reduce0.0"]
