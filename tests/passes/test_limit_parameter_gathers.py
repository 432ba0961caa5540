"""LimitParameterGathersPass: each unit's weight gathers wait for the previous unit's readers.

Before: two replicas, two layers ``l0`` and ``l1`` (a kernel each, ``l1`` also a bias), each weight gathered
from its parts as ShardParametersPass leaves them (the first collective and the gathered weight marked).
Expected: the gathers of ``l1`` (kernel and bias: one unit) list, in ``attrs["after"]``, the values made by
``l0``'s readers on both replicas; ``l0`` waits for nothing. Honest ``modified``, a second run changes
nothing; PartitionPass then puts ``l1``'s gathers and readers in later phases than ``l0``'s readers and
names their segments; a tied weight read again after the next layer is not waited for (that would be a
cycle); and the scheduler frees each gathered weight once its readers ran (a two-device run holds one
layer's gathered weights at a time, and gives the same numbers as without the pass).
"""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.backends import get_backend
from graphdist.compile.plan import Plan
from graphdist.errors import GraphError, InvalidArgumentError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.limit_parameter_gathers import AFTER_ATTR, LimitParameterGathersPass, unit_of
from graphdist.passes.partition import AFTER_SEGMENTS_ATTR, PartitionPass
from graphdist.passes.shard_parameters import GATHER_META, WEIGHT_META
from graphdist.runtime.scheduler import Scheduler
from tests.passes.pass_checks import check_pass
from tests.passes.pass_checks import replica_op as _op

CTX = PassContext(devices=("cpu:0", "cpu:1"))
META = ("replica", GATHER_META, WEIGHT_META)


def _gathered(graph: Graph, variable: str, shape: tuple[int, ...]) -> list[Value]:
    """Each replica's copy of ``variable``: an AllGather of its two parts, reshaped (ShardParametersPass's form)."""
    key = f"fsdp.{variable}.forward"
    size = int(np.prod(shape))
    parts = [graph.add_input(f"{variable}/part{r}", np.float32, (size // 2,)) for r in range(2)]
    flats = [_op(graph, "AllGather", [parts[r]], {"axis": 0, "group_key": key, "group_size": 2}, replica=r,
                 domain=GRAPHDIST_DOMAIN, side_effect=True, **{GATHER_META: key}) for r in range(2)]
    target = graph.add_initializer("shape", np.array(shape))
    return [_op(graph, "Reshape", [flats[r], target], replica=r, **{WEIGHT_META: key}) for r in range(2)]


def _two_layers(tied: bool = False) -> tuple[Graph, list[Value]]:
    """y_r = tanh(x_r @ l0) @ l1 + b (+ tanh(...) @ l0 again when ``tied``); returns the graph and ``l0``'s
    reader outputs (the MatMuls of the first layer, one per replica)."""
    graph = Graph("two_layers")
    xs = [graph.add_input(f"x{r}", np.float32, (3, 4)) for r in range(2)]
    w0 = _gathered(graph, "l0/kernel", (4, 4))
    hidden = [_op(graph, "MatMul", [xs[r], w0[r]], replica=r) for r in range(2)]
    act = [_op(graph, "Tanh", [hidden[r]], replica=r) for r in range(2)]
    w1, b1 = _gathered(graph, "l1/kernel", (4, 4)), _gathered(graph, "l1/bias", (4,))
    ys = [_op(graph, "Add", [_op(graph, "MatMul", [act[r], w1[r]], replica=r), b1[r]], replica=r) for r in range(2)]
    if tied:
        ys = [_op(graph, "MatMul", [ys[r], w0[r]], replica=r) for r in range(2)]
    graph.outputs = ys
    return graph, hidden


def _expected() -> Graph:
    graph, hidden = _two_layers()
    names = sorted(h.name for h in hidden)
    for node in graph.nodes:
        if node.meta.get(GATHER_META, "").startswith("fsdp.l1/"):
            node.attrs[AFTER_ATTR] = names
    return graph


def test_the_next_layers_gathers_wait_for_the_previous_layers_readers() -> None:
    graph, _ = _two_layers()
    result = check_pass(LimitParameterGathersPass(), graph, modified=True, expected=_expected(), ctx=CTX,
                        numerics=False, meta_keys=META)
    waiting = {n.meta[GATHER_META] for n in result.nodes if n.attrs.get(AFTER_ATTR)}
    assert waiting == {"fsdp.l1/kernel.forward", "fsdp.l1/bias.forward"}


def test_a_tied_weight_read_after_the_next_layer_is_not_waited_for() -> None:
    graph, hidden = _two_layers(tied=True)
    result = check_pass(LimitParameterGathersPass(), graph, modified=True, ctx=CTX, numerics=False, meta_keys=META)
    waits = {tuple(n.attrs[AFTER_ATTR]) for n in result.nodes if n.attrs.get(AFTER_ATTR)}
    assert waits == {tuple(sorted(h.name for h in hidden))}  # the last MatMul reads l1's result: not listed
    result.topological_sort()  # no cycle through the data edges; the pass's own order is checked by partition
    PassManager([AssignDevicesPass(), PartitionPass()]).run(result, CTX)


def test_without_marked_gathers_nothing_changes() -> None:
    graph = Graph("plain")
    x = graph.add_input("x", np.float32, (3,))
    graph.outputs = [graph.add_node("Neg", [x]).outputs[0]]
    check_pass(LimitParameterGathersPass(), graph, modified=False, ctx=CTX)


@pytest.mark.parametrize(("key", "unit"), [
    ("fsdp.mlp/dense_0/kernel.forward", ("mlp/dense_0", "forward")),
    ("fsdp.fc1.weight.backward", ("fc1", "backward")),
    ("fsdp.w.forward", ("w", "forward")),
])
def test_units_are_layers_and_phases(key: str, unit: tuple[str, str]) -> None:
    assert unit_of(key) == unit


def _partitioned() -> Graph:
    graph, _ = _two_layers()
    LimitParameterGathersPass()(graph, CTX)
    return PassManager([AssignDevicesPass(), PartitionPass()]).run(graph, CTX).graph


def test_partition_puts_the_next_layer_after_the_readers_and_names_their_segments() -> None:
    graph = _partitioned()
    by_name = {out.name: n for n in graph.nodes for out in n.outputs}
    for node in graph.nodes:
        if not node.meta.get(GATHER_META, "").startswith("fsdp.l1/"):
            continue
        awaited = {by_name[name].meta["segment"] for name in node.attrs[AFTER_ATTR]}
        assert node.attrs[AFTER_SEGMENTS_ATTR] == sorted(awaited) == ["cpu0.p1", "cpu1.p1"]
    l1_readers = [n for n in graph.nodes if n.op_type == "MatMul"
                  and any(user.op_type == "Add" for user, _ in n.outputs[0].uses)]
    assert {n.meta["segment"] for n in l1_readers} == {"cpu0.p2", "cpu1.p2"}  # a phase later than l0's readers
    again = PartitionPass()(graph, CTX)
    assert not again.modified


def test_a_waited_value_that_no_node_makes_is_an_error() -> None:
    graph, _ = _two_layers()
    LimitParameterGathersPass()(graph, CTX)
    head = next(n for n in graph.nodes if n.attrs.get(AFTER_ATTR))
    head.attrs[AFTER_ATTR] = ["gone"]
    with pytest.raises(GraphError, match="waits for .*gone"):
        PartitionPass()(AssignDevicesPass()(graph, CTX).graph, CTX)


def _alive_gathered(limit: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[np.ndarray]]:
    """Runs the two-layer plan on two devices; returns the most gathered weights alive at once on one
    replica and the outputs."""
    graph, _ = _two_layers()
    if limit:
        LimitParameterGathersPass()(graph, CTX)
    graph = PassManager([AssignDevicesPass(), PartitionPass()]).run(graph, CTX).graph
    plan = Plan.from_graph(graph).compile(get_backend("ort"))
    gathered = {name: device for c in plan.comms if c.op == "AllGather" for name, device in zip(c.outputs, c.devices)}
    most = [0]
    original = Scheduler._finish

    def spy(self, task, outputs, env, *rest):  # noqa: ANN001, ANN202 - the scheduler's own signature
        original(self, task, outputs, env, *rest)
        alive = [gathered[name] for name in env if name in gathered]
        most[0] = max([most[0], *(alive.count(d) for d in set(alive))])

    monkeypatch.setattr(Scheduler, "_finish", spy)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(tuple(v.shape)).astype(np.float32) for v in graph.inputs}
    outputs = plan.run(feeds)
    monkeypatch.undo()
    return most[0], outputs


def test_the_scheduler_holds_one_layers_gathered_weights_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    limited, outputs = _alive_gathered(True, monkeypatch)
    unlimited, reference = _alive_gathered(False, monkeypatch)
    assert limited == 2  # l1's kernel and bias; l0's kernel was freed before they were gathered
    assert unlimited == 3  # every weight gathered at the start of the step
    for got, want in zip(outputs, reference):
        np.testing.assert_array_equal(got, want)


def _three_layers() -> tuple[Graph, list[list[str]]]:
    """y_r = ((x_r @ l0) @ l1) @ l2: three units of one kernel each; returns the graph and, per layer, the
    names of its readers' outputs (both replicas)."""
    graph = Graph("three_layers")
    values = [graph.add_input(f"x{r}", np.float32, (3, 4)) for r in range(2)]
    readers = []
    for layer in range(3):
        weights = _gathered(graph, f"l{layer}/kernel", (4, 4))
        values = [_op(graph, "MatMul", [values[r], weights[r]], replica=r) for r in range(2)]
        readers.append(sorted(v.name for v in values))
    graph.outputs = values
    return graph, readers


def test_prefetch_lets_the_next_layers_gathers_run_while_a_layer_computes() -> None:
    graph, readers = _three_layers()
    result = check_pass(LimitParameterGathersPass(prefetch=1), graph, modified=True, ctx=CTX, numerics=False,
                        meta_keys=META)
    waits = {n.meta[GATHER_META]: n.attrs.get(AFTER_ATTR) for n in result.nodes if GATHER_META in n.meta}
    # l0 and l1 wait for nothing (l1 is gathered while l0 computes); l2 waits for l0's readers, not l1's.
    assert waits == {"fsdp.l0/kernel.forward": None, "fsdp.l1/kernel.forward": None,
                     "fsdp.l2/kernel.forward": readers[0]}
    assert repr(LimitParameterGathersPass(prefetch=1)) == "LimitParameterGathersPass(prefetch=1)"


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_a_bad_prefetch_names_the_argument(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="prefetch must be an integer >= 0"):
        LimitParameterGathersPass(prefetch=bad)  # type: ignore[arg-type]


def test_a_plan_whose_collective_waits_for_a_missing_segment_is_refused() -> None:
    from graphdist.errors import PlanError

    plan = Plan.from_graph(_partitioned())
    waiting = next(c for c in plan.comms if c.attrs.get(AFTER_SEGMENTS_ATTR))
    waiting.attrs[AFTER_SEGMENTS_ATTR] = ["cpu0.p9"]  # as an edited plan.json could say
    with pytest.raises(PlanError, match=r"waits for segment 'cpu0.p9', which the plan lacks"):
        plan.compile(get_backend("ort"))
