"""LowerOpsPass with the registered ``AllReduce -> ReduceScatter + AllGather`` lowering: before vs hand-built
expected structure, honest ``modified``, a second run changes nothing, numerics unchanged (the participants
run through the runtime's own communicators), unknown lowerings refused when the pass is built."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import InvalidArgumentError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Node
from graphdist.ir.comm_ops import is_communication
from graphdist.passes.base import PassContext
from graphdist.passes.lower_ops import LowerOpsPass
from graphdist.passes.lowerings import get_lowering, lowering_names, register_lowering
from graphdist.runtime.comm.handlers import comm_handler
from tests.passes.pass_checks import check_pass

LOWER = {"AllReduce": "reduce_scatter_all_gather"}
TWO = PassContext(devices=("cpu:0", "cpu:1"))


def _inputs(graph: Graph, shape: tuple[int, ...]) -> list:
    return [graph.add_input(f"x{r}", np.float32, shape) for r in range(2)]


def _placed(node: Node, replica: int) -> Node:
    node.device, node.replica = f"cpu:{replica}", replica
    return node


def _before(shape: tuple[int, ...] = (2, 3), reduce_op: str = "SUM") -> Graph:
    """Each replica all-reduces its ``x`` (one group of two) and doubles the result."""
    graph = Graph("before")
    two = graph.add_initializer("two", np.float32(2.0))
    reduced = []
    for replica, x in enumerate(_inputs(graph, shape)):
        node = graph.add_node("AllReduce", [x], {"reduce_op": reduce_op, "group_size": 2, "group_key": "g",
                                                 "algorithm": "ring"}, domain=GRAPHDIST_DOMAIN)
        reduced.append(_placed(node, replica).outputs[0])
    graph.outputs = [_placed(graph.add_node("Mul", [y, two]), r).outputs[0] for r, y in enumerate(reduced)]
    return graph


def _expected(reduce_op: str = "SUM") -> Graph:
    """The same, the all-reduce as a reduce-scatter, an all-gather of the shards, and a reshape back."""
    graph = Graph("expected")
    two = graph.add_initializer("two", np.float32(2.0))
    shape = graph.add_initializer("shape", np.array([2, 3], np.int64))
    outputs = []
    for replica, x in enumerate(_inputs(graph, (2, 3))):
        shard = graph.add_node("ReduceScatter", [x], {"reduce_op": reduce_op, "group_size": 2, "group_key": "s",
                                                      "shard": replica}, domain=GRAPHDIST_DOMAIN)
        gathered = graph.add_node("AllGather", [_placed(shard, replica).outputs[0]],
                                  {"axis": 0, "group_size": 2, "group_key": "a"}, domain=GRAPHDIST_DOMAIN)
        whole = _placed(graph.add_node("Reshape", [_placed(gathered, replica).outputs[0], shape]), replica)
        outputs.append(_placed(graph.add_node("Mul", [whole.outputs[0], two]), replica).outputs[0])
    graph.outputs = outputs
    return graph


def _run_participants(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs ``graph``, every participant of a collective group together through the runtime's handler."""
    env = {v.name: np.asarray(v.const_value) for v in graph.initializers.values()}
    env.update(feeds)
    pending = list(graph.nodes)
    compute = {"Mul": lambda a, b: a * b, "Reshape": lambda a, s: a.reshape(tuple(s))}
    while pending:
        node = next(n for n in pending if all(v.name in env for v in n.inputs))
        group = [node]
        if is_communication(node):
            group = sorted((n for n in pending if n.attrs.get("group_key") == node.attrs["group_key"]),
                           key=lambda n: n.replica)
            if not all(v.name in env for n in group for v in n.inputs):
                pending.remove(node)
                pending.append(node)  # a member waits for another participant's input
                continue
            outs = comm_handler(node.op_type)(node.op_type, node.attrs, [env[n.inputs[0].name] for n in group])
        else:
            outs = [compute[node.op_type](*(env[v.name] for v in node.inputs))]
        for member, out in zip(group, outs):
            env[member.outputs[0].name] = out
            pending.remove(member)
    return [env[v.name] for v in graph.outputs]


@pytest.mark.parametrize("reduce_op", ["SUM", "MEAN", "MAX"])
def test_all_reduce_becomes_reduce_scatter_then_all_gather(reduce_op: str) -> None:
    before = _before(reduce_op=reduce_op)
    feeds = {f"x{r}": np.random.default_rng(r).standard_normal((2, 3)).astype(np.float32) for r in range(2)}
    want = _run_participants(before, feeds)
    after = check_pass(LowerOpsPass(LOWER), before, modified=True, expected=_expected(reduce_op), ctx=TWO,
                       numerics=False, placement=True)
    got = _run_participants(after, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)  # the ring's reduce-scatter is the ring all-reduce's first phase


def test_groups_that_do_not_split_evenly_stay_whole() -> None:
    before = _before(shape=(3,))
    check_pass(LowerOpsPass(LOWER), before, modified=False, expected=_before(shape=(3,)), ctx=TWO, numerics=False)


def test_unknown_lowering_is_refused_when_the_pass_is_built() -> None:
    with pytest.raises(InvalidArgumentError, match="no lowering 'butterfly' for op 'AllReduce'; choose one of: "
                                                   "reduce_scatter_all_gather"):
        LowerOpsPass({"AllReduce": "butterfly"})
    with pytest.raises(InvalidArgumentError, match="no lowering 'x' for op 'Conv'; choose one of: none is registered"):
        LowerOpsPass({"Conv": "x"})


def test_lowerings_are_registered_per_op() -> None:
    assert lowering_names("AllReduce") == ("reduce_scatter_all_gather",)

    @register_lowering("Mul", "test_square_as_pow")
    def lower(graph, group):  # noqa: ANN001, ANN202 - the registered signature
        return None

    try:
        assert get_lowering("Mul", "test_square_as_pow") is lower
    finally:
        from graphdist.passes import lowerings

        del lowerings._LOWERINGS["Mul"]
