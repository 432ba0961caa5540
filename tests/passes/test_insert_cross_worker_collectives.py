"""InsertCrossWorkerCollectivesPass: before vs hand-built expected structure, honest ``modified``, a second run
changes nothing, numerics unchanged where the reference backend can run the graph (one worker; cross-worker
collectives run between processes, tested end to end in tests/distribute/test_multi_worker.py)."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import GraphError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value
from graphdist.passes.base import PassContext
from graphdist.passes.insert_cross_worker_collectives import InsertCrossWorkerCollectivesPass
from tests.passes.pass_checks import check_pass

TWO = PassContext(devices=("cpu:0", "cpu:1"))


def _graphdist(graph: Graph, op: str, inputs: list[Value], attrs: dict, replica: int,
               output_types: list | None = None) -> Value:
    node = graph.add_node(op, inputs, attrs, domain=GRAPHDIST_DOMAIN, output_types=output_types)
    node.device, node.replica = f"cpu:{replica}", replica
    node.replica = replica
    return node.outputs[0]


def _step(crossed: bool, workers: int = 2, group_size: int = 2, comm_group: str = "") -> Graph:
    """Per local replica ``r`` of 2: ``AllReduce(x_r)`` (group ``k``) and ``AllGather(x_r)`` (group ``g``),
    each read by a ``Neg``, traced for ``workers`` workers. ``crossed``: what the pass makes of it for them."""
    graph = Graph("expected" if crossed else "step")
    workers = workers if crossed else -workers  # negative: traced for that many, not crossed
    xs = [graph.add_input(f"x{r}", np.float32, (3,)) for r in range(2)]
    outputs = []
    for r, x in enumerate(xs):
        reduced = _graphdist(graph, "AllReduce", [x], {"reduce_op": "MEAN", "group_size": group_size,
                                                      "group_key": "k"}, r)
        if workers > 1:
            reduced = _graphdist(graph, "CrossWorkerAllReduce", [reduced], {
                "num_workers": workers, "group_key": "k/workers", "group_size": 2, "reduce_op": "MEAN",
                "algorithm": "auto", "sequence": 0, "name": "step collective 0",
                **({"comm_group": comm_group} if comm_group else {})}, r)
            reduced.producer.meta["side_effect"] = True
        outputs.append(reduced)
    for r, x in enumerate(xs):
        if workers > 1:
            local = _graphdist(graph, "AllGather", [x], {"axis": 0, "group_size": 2, "group_key": "g"}, r)
            gathered = _graphdist(graph, "CrossWorkerAllGather", [local], {
                "num_workers": workers, "group_key": "g/workers", "group_size": 2, "axis": 0, "sequence": 1,
                "name": "step collective 1", **({"comm_group": comm_group} if comm_group else {})}, r)
            gathered.producer.meta["side_effect"] = True
        else:  # typed for all the replicas in sync: 2 per worker
            gathered = _graphdist(graph, "AllGather", [x], {"axis": 0, "group_size": group_size, "group_key": "g"},
                                  r, output_types=[(np.float32, (3 * 2 * abs(workers),))])
        outputs.append(gathered)
    graph.outputs = [graph.add_node("Neg", [v]).outputs[0] for v in outputs]
    return graph


@pytest.mark.parametrize("comm_group", ["", "workers"])
def test_each_local_group_gets_a_cross_worker_node(comm_group: str) -> None:
    graph = check_pass(InsertCrossWorkerCollectivesPass(2, comm_group), _step(False), modified=True,
                       expected=_step(True, comm_group=comm_group), ctx=TWO, numerics=False, placement=True,
                       meta_keys=("replica", "side_effect"))
    for node in graph.find_nodes("Neg"):  # readers read the combined value, typed for every replica in sync
        assert node.inputs[0].producer.op_type.startswith("CrossWorker")


def test_one_worker_only_sets_the_group_sizes() -> None:
    check_pass(InsertCrossWorkerCollectivesPass(1), _step(False, workers=1, group_size=1), modified=True, ctx=TWO,
               expected=_step(True, workers=1), placement=True)


def test_one_worker_with_sizes_set_is_unchanged() -> None:
    check_pass(InsertCrossWorkerCollectivesPass(1), _step(False, workers=1), modified=False,
               expected=_step(True, workers=1), ctx=TWO, placement=True)


def test_value_typed_for_another_worker_count_is_refused() -> None:
    with pytest.raises(GraphError, match=r"AllGather g produces float32\[12\] for 3 worker\(s\).*traced for a "
                                         r"different number of replicas in sync"):
        InsertCrossWorkerCollectivesPass(3)(_step(False), TWO)
