"""PartitionPass numbers the cross-worker groups by phase, then graph order, so the order every worker issues
them in never makes a group wait for a segment that waits for a later group.

Before (graph order, ZeRO-1 with SGD across workers): each variable's reduce-scatter, update and all-gather in
turn, so variable 0's all-gather was numbered before variable 1's reduce-scatter; both updates are one
segment (one device, one phase), which needs variable 1's reduce-scatter: a cycle, and every worker's step
stopped with "cannot make progress". Expected: both reduce-scatters first, then both all-gathers; the plan's
tasks with the scheduler's sequence order form a DAG; a second run changes nothing.
"""

from __future__ import annotations

import numpy as np

from graphdist.compile.plan import Plan
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.insert_cross_worker_collectives import number_cross_worker_groups
from graphdist.passes.partition import PartitionPass
from graphdist.runtime.scheduler import Scheduler

CTX = PassContext(devices=("cpu:0",))


def _cross(graph: Graph, op_type: str, value: Value, key: str) -> Value:
    node = graph.add_node(op_type, [value], {"group_key": key, "group_size": 1, "reduce_op": "SUM"},
                          domain=GRAPHDIST_DOMAIN)
    node.replica = 0
    node.meta.update(context="replica", side_effect=True)
    return node.outputs[0]


def _sgd_across_workers() -> Graph:
    """Per variable, in graph order: gradient -> CrossWorkerAllReduce (the scatter's stand-in) -> SGD update
    -> CrossWorkerAllReduce (the gather's stand-in) -> new weight."""
    graph = Graph("zero_sgd")
    lr = graph.add_initializer("lr", np.float32(0.1))
    outputs = []
    for i in range(2):
        grad = graph.add_input(f"g{i}", np.float32, (4,))
        weight = graph.add_input(f"w{i}", np.float32, (4,))
        summed = _cross(graph, "CrossWorkerAllReduce", grad, f"scatter{i}")
        update = graph.add_node("Sub", [weight, graph.add_node("Mul", [lr, summed]).outputs[0]])
        update.replica = 0
        update.meta.update(context="replica")
        update.inputs[1].producer.replica = 0
        update.inputs[1].producer.meta.update(context="replica")
        outputs.append(_cross(graph, "CrossWorkerAllReduce", update.outputs[0], f"gather{i}"))
    graph.outputs = outputs
    number_cross_worker_groups(graph)  # graph order, as InsertCrossWorkerCollectivesPass numbers them
    return graph


def _sequence(graph: Graph) -> dict[str, int]:
    return {n.attrs["group_key"]: n.attrs["sequence"] for n in graph.find_nodes("CrossWorkerAllReduce",
                                                                                 GRAPHDIST_DOMAIN)}


def _acyclic(plan: Plan) -> bool:
    scheduler = Scheduler(plan, [None] * len(plan.segments))
    deps = {id(t): set(d) for t, d in zip(scheduler._tasks, scheduler._deps)}
    while deps:
        ready = [k for k, d in deps.items() if not d]
        if not ready:
            return False
        for k in ready:
            del deps[k]
        for d in deps.values():
            d.difference_update(ready)
    return True


def test_groups_are_issued_by_phase_so_the_plan_can_make_progress() -> None:
    graph = _sgd_across_workers()
    assert _sequence(graph) == {"scatter0": 0, "gather0": 1, "scatter1": 2, "gather1": 3}  # before
    result = PassManager([AssignDevicesPass(), PartitionPass()]).run(graph, CTX)
    partitioned = result.graph
    assert _sequence(partitioned) == {"scatter0": 0, "scatter1": 1, "gather0": 2, "gather1": 3}
    assert {n.meta["segment"] for n in partitioned.nodes if n.op_type == "Sub"} == {"cpu0.p1"}  # one segment
    assert _acyclic(Plan.from_graph(partitioned))
    again = PartitionPass()(partitioned, CTX)
    assert not again.modified and _sequence(again.graph) == {"scatter0": 0, "scatter1": 1, "gather0": 2,
                                                            "gather1": 3}


def test_the_graph_order_made_a_cycle() -> None:
    graph = PassManager([AssignDevicesPass(), PartitionPass()]).run(_sgd_across_workers(), CTX).graph
    number_cross_worker_groups(graph)  # back to graph order, as before the fix
    assert _sequence(graph) == {"scatter0": 0, "gather0": 1, "scatter1": 2, "gather1": 3}
    assert not _acyclic(Plan.from_graph(graph))
