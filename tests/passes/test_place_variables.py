"""PlaceVariablesPass: before vs expected structure, honest ``modified``, a second run
changes nothing, numerics before == after (executed as a two-replica plan with the
local communicator)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.backends import get_backend
from graphdist.compile.plan import Plan
from graphdist.ir import Graph, verify
from graphdist.ir.placement import VariableSpec
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.autodiff import AutodiffPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.insert_collectives import InsertCollectivesPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.lower_variable_updates import LowerVariableUpdatesPass
from graphdist.passes.partition import PartitionPass
from graphdist.passes.place_variables import PlaceVariablesPass
from graphdist.passes.replicate import ReplicatePass

CTX = PassContext(devices=("cpu:0", "cpu:1"))
RNG = np.random.default_rng(0)
FEEDS = {"w": RNG.standard_normal(3).astype(np.float32), "m": RNG.standard_normal(3).astype(np.float32),
         "x0": RNG.standard_normal(3).astype(np.float32), "x1": RNG.standard_normal(3).astype(np.float32)}


def _ops(graph: Graph) -> list[str]:
    return [n.qualified_op for n in graph.nodes]


def _devices(graph: Graph) -> list[str | None]:
    return [n.device for n in graph.nodes]


def _execute(graph: Graph, feeds: dict[str, np.ndarray], ctx: PassContext = CTX) -> list[np.ndarray]:
    """Places the rest, partitions and runs the graph as a plan (collectives included)."""
    placed = PassManager([LowerCollectivesPass(), AssignDevicesPass(), PartitionPass()]).run(graph.copy(), ctx).graph
    plan = Plan.from_graph(placed).compile(get_backend("reference"))
    return plan.run({v.name: feeds[v.name] for v in placed.inputs})


def _step_graph(with_collective: bool = True) -> Graph:
    """Two replicas: ``y_r = x_r * w``; gradient ``2 y_r`` summed over replicas (or replica 1's
    own when ``with_collective`` is false); momentum update ``m' = 0.9 m + g``, ``w' = w - m'``
    computed in replica 1 (as ``LowerVariableUpdatesPass`` leaves the last replica's copy)."""
    graph = Graph("step")
    w, m = graph.add_input("w", np.float32, (3,)), graph.add_input("m", np.float32, (3,))
    w.meta["variable"], m.meta["variable"] = _spec("w"), _spec("m")
    xs = [graph.add_input(f"x{r}", np.float32, (3,)) for r in range(2)]
    two, momentum = graph.add_initializer("two", np.float32(2.0)), graph.add_initializer("mu", np.float32(0.9))
    losses, grads = [], []
    for r, x in enumerate(xs):
        nodes = [graph.add_node("Mul", [x, w])]
        nodes.append(graph.add_node("ReduceSum", [nodes[0].outputs[0]], {"keepdims": 0}))
        nodes.append(graph.add_node("Mul", [nodes[0].outputs[0], two]))
        grad = nodes[-1].outputs[0]
        if with_collective:
            nodes.append(graph.add_node("AllReduce", [grad], {"reduce_op": "SUM", "group_size": 2,
                                                               "group_key": "g0"}, domain="graphdist"))
            grad = nodes[-1].outputs[0]
        for node in nodes:
            node.replica = r
        losses.append(nodes[1].outputs[0])
        grads.append(grad)
    chain = [graph.add_node("Mul", [m, momentum])]
    chain.append(graph.add_node("Add", [chain[0].outputs[0], grads[1]]))
    chain.append(graph.add_node("Sub", [w, chain[1].outputs[0]]))
    for node in chain:
        node.replica = 1
    new_m, new_w = chain[1].outputs[0], chain[2].outputs[0]
    graph.outputs = [*losses, new_m, new_w]
    graph.meta.variable_updates = [(new_m.name, "m#1"), (new_w.name, "w#0")]
    verify(graph)
    return graph


def _check_pass(pass_, graph: Graph, expected_ops: list[str], ctx: PassContext = CTX) -> Graph:
    before = _execute(graph, FEEDS, ctx)
    result = pass_(graph.copy(), ctx)
    assert result.modified, f"{pass_.name} changed the graph but said it did not"
    assert _ops(result.graph) == expected_ops
    verify(result.graph)
    for got, want in zip(_execute(result.graph, FEEDS, ctx), before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    placement = _devices(result.graph)
    again = pass_(result.graph, ctx)
    assert not again.modified, f"{pass_.name} is not idempotent"
    assert _ops(again.graph) == expected_ops and _devices(again.graph) == placement
    return result.graph


def _spec(name: str) -> VariableSpec:
    return VariableSpec({"w": "w#0", "m": "m#1"}.get(name, f"{name}#9"), name, "<f4", (3,))


def _updates(graph: Graph) -> dict[str, object]:
    producers = {out.name: node for node in graph.nodes for out in node.outputs}
    return {uid.split("#")[0]: producers[name] for name, uid in graph.meta.variable_updates}


BODY = ["Mul", "ReduceSum", "Mul", "graphdist.AllReduce", "Mul", "ReduceSum", "Mul", "graphdist.AllReduce"]


def test_update_after_all_reduce_moves_to_the_parameter_device() -> None:
    graph = _check_pass(PlaceVariablesPass("cpu:0"), _step_graph(), [
        "graphdist.Transfer",  # w for replica 1; replica 0 and the update read it on cpu:0
        *BODY, "Mul", "Add", "Sub"])
    assert _devices(graph) == ["cpu:1", *[None] * 8, "cpu:0", "cpu:0", "cpu:0"]
    transfer = graph.nodes[0]
    assert transfer.inputs[0] is graph.inputs[0] and transfer.meta["variable_read"] == "w"
    assert transfer.replica == 1
    assert graph.nodes[5].inputs[1] is transfer.outputs[0]  # replica 1's x * w
    assert graph.nodes[1].inputs[1] is graph.inputs[0]  # replica 0's x * w
    add = graph.nodes[10]
    # the gradient sum is read from the participant on the parameter device (replica 0's)
    assert add.inputs[1] is graph.nodes[4].outputs[0]
    assert {n.name for n in _updates(graph).values()} == {"add", "sub"}
    assert all(n.replica is None for n in graph.nodes[9:])


def test_separate_parameter_device() -> None:
    graph = _check_pass(PlaceVariablesPass("cpu:9"), _step_graph(), [
        "graphdist.Transfer", "graphdist.Transfer", *BODY, "Mul", "Add", "Sub"])
    assert _devices(graph) == ["cpu:0", "cpu:1", *[None] * 8, "cpu:9", "cpu:9", "cpu:9"]
    assert [n.meta["variable_read"] for n in graph.nodes[:2]] == ["w", "w"]  # m: only the update reads it
    assert graph.nodes[11].inputs[1] is graph.nodes[9].outputs[0]  # no participant on cpu:9: replica 1's sum


def test_partitioned_plan_moves_variables_and_gradients() -> None:
    graph = PlaceVariablesPass("cpu:9")(_step_graph(), CTX).graph
    replica_1_sum = graph.nodes[9].outputs[0].name
    placed = PassManager([LowerCollectivesPass(), AssignDevicesPass(), PartitionPass()]).run(graph, CTX).graph
    verify(placed, "partitioned")
    transfers = sorted((n.inputs[0].name, n.device) for n in placed.nodes if n.op_type == "Transfer")
    # w goes to both replicas, m to nobody (only the update reads it), the sum comes to cpu:9
    assert transfers == [(replica_1_sum, "cpu:9"), ("w", "cpu:0"), ("w", "cpu:1")]
    plan = Plan.from_graph(placed)
    # m * 0.9 is ready at once; Add and Sub follow the transfers of w, the sum and the sum to cpu:9
    assert {s.name for s in plan.segments if s.device == "cpu:9"} == {"cpu9.p0", "cpu9.p3"}


def test_update_from_replica_data_stays_on_the_replica() -> None:
    graph = _step_graph(with_collective=False)
    graph = _check_pass(PlaceVariablesPass("cpu:0"), graph, [
        "graphdist.Transfer", "graphdist.Transfer", "Mul", "ReduceSum", "Mul", "Mul", "ReduceSum", "Mul",
        "Mul", "Add", "Sub", "Identity", "Identity"])  # the updates, copied onto the parameter device
    # Add/Sub read replica 1's own gradient, and m * 0.9 feeds only them: all stay with replica 1
    assert _devices(graph) == ["cpu:1", "cpu:1", *[None] * 9, "cpu:0", "cpu:0"]
    updates = _updates(graph)
    assert [n.meta["variable_update"] for n in updates.values()] == ["add", "sub"]
    assert graph.outputs[-2:] == [updates["m"].outputs[0], updates["w"].outputs[0]]
    # w and m are read on replica 1's device through one transfer each
    assert [n.meta["variable_read"] for n in graph.nodes[:2]] == ["w", "m"]


def test_value_also_returned_is_not_moved() -> None:
    graph = _step_graph()
    graph.outputs.insert(2, graph.outputs[2])  # the user also returns m' (user outputs come before updates)
    graph = _check_pass(PlaceVariablesPass("cpu:0"), graph, [
        "graphdist.Transfer", "graphdist.Transfer", *BODY, "Mul", "Add", "Sub", "Identity"])
    mul, add, sub, update_copy = graph.nodes[10:]
    assert mul.device is None and add.device is None  # shared with a user output: left to AssignDevicesPass
    assert sub.device == "cpu:0"  # only feeds w's update: reads Add through a transfer later
    assert update_copy.device == "cpu:0" and update_copy.inputs[0] is add.outputs[0]
    assert graph.outputs[2] is add.outputs[0] and graph.outputs[3] is update_copy.outputs[0]
    assert graph.meta.variable_updates[0][0] == update_copy.outputs[0].name
    assert mul.inputs[0].producer.meta["variable_read"] == "m"  # replica 1 reads m through a transfer


def test_updates_must_be_the_last_outputs() -> None:
    graph = _step_graph()
    graph.outputs.append(graph.outputs[0])
    with pytest.raises(gd.GraphError, match="LowerVariableUpdatesPass"):
        PlaceVariablesPass("cpu:0")(graph, CTX)


def test_no_variables_is_unchanged() -> None:
    graph = Graph("pure")
    x = graph.add_input("x", np.float32, (2,))
    graph.outputs = graph.add_node("Neg", [x]).outputs
    result = PlaceVariablesPass("cpu:0")(graph, CTX)
    assert not result.modified
    assert _ops(result.graph) == ["Neg"] and _devices(result.graph) == [None]


def _read_only_graph() -> Graph:
    graph = Graph("read_only")
    w = graph.add_input("w", np.float32, (2,))
    w.meta["variable"] = VariableSpec("w#0", "w", "<f4", (2,))
    x = graph.add_input("x", np.float32, (2,))
    graph.outputs = graph.add_node("Mul", [x, w]).outputs
    return graph


def test_read_only_variable_gets_a_read_and_no_update_region() -> None:
    result = PlaceVariablesPass("cpu:3")(_read_only_graph(), CTX)
    assert result.modified
    assert _ops(result.graph) == ["graphdist.Transfer", "Mul"] and _devices(result.graph) == ["cpu:0", None]
    assert not PlaceVariablesPass("cpu:3")(result.graph, CTX).modified
    on_reader = PlaceVariablesPass("cpu:0")(_read_only_graph(), CTX)  # the reader runs on the parameter device
    assert not on_reader.modified and _ops(on_reader.graph) == ["Mul"]


def test_default_parameter_device_is_the_first_replica() -> None:
    graph = PlaceVariablesPass()(_step_graph(), CTX).graph
    assert [n.device for n in graph.nodes if n.device is not None] == ["cpu:1", "cpu:0", "cpu:0", "cpu:0"]


def test_bad_parameter_device() -> None:
    with pytest.raises(gd.DeviceError, match="invalid device string"):
        PlaceVariablesPass("ps:0")


def test_traced_adam_step_in_the_strategy_pipeline() -> None:
    """A real step: the optimizer math lands on the parameter device, the numerics do not change."""
    from graphdist.models.mlp import MLP

    strategy = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:9")
    with strategy.scope():
        model = MLP((4, 3), seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(0.01)
    step = model.make_train_step(optimizer, 4)
    x = gd.PerReplica((RNG.standard_normal((2, 4)).astype(np.float32),) * 2)
    y = gd.PerReplica((np.array([0, 1]), np.array([2, 1])))
    traced = strategy._function_for(step).get_concrete_function(x, y).graph("traced")
    graph = PassManager([AutodiffPass(), ReplicatePass(2), LowerVariableUpdatesPass(), InsertCollectivesPass()]).run(
        traced.copy(), CTX).graph
    feeds = {v.name: RNG.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f"
             else np.zeros(v.shape, v.dtype) for v in graph.inputs}
    feeds.update({"arg1_r0": np.array([0, 1]), "arg1_r1": np.array([2, 1])})
    feeds.update({name: np.abs(feeds[name]) for name in feeds if name.endswith("/v")})  # Adam's v >= 0
    before = _execute(graph, feeds)
    result = PlaceVariablesPass("cpu:9")(graph, CTX)
    assert result.modified
    verify(result.graph)
    for got, want in zip(_execute(result.graph, feeds), before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    placed = {n.op_type for n in result.graph.nodes if n.device == "cpu:9"}
    assert {"Sqrt", "Pow", "Div"} <= placed
    assert not placed & {"MatMul", "ReduceMax", "Exp", "Log"}  # forward and backward stay on the replicas
    assert all(n.device == "cpu:9" for n in _updates(result.graph).values())
    assert not PlaceVariablesPass("cpu:9")(result.graph, CTX).modified
