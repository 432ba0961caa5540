"""PlacePSVariablesPass: before vs hand-built expected structure, honest ``modified``, a second run changes
nothing. ``PSPull`` / ``PSPush`` run on parameter-server processes, which the reference backend cannot
reach, so numerics are checked by simulating the ps tasks in numpy (a pull returns the stored rows, a push
adds the delta and returns the new rows) and end to end in tests/distribute/test_parameter_server.py."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.placement import PlacementSpec, Shard, VariablePlacement, VariableSpec
from graphdist.passes.base import PassContext
from graphdist.passes.place_ps_variables import PlacePSVariablesPass
from tests.passes.pass_checks import check_pass

CTX = PassContext(devices=("cpu:0", "cpu:1"))
W_SHARDS = (Shard(0, "w0", 0, 4),)
B_SHARDS = (Shard(0, "b0", 0, 2), Shard(1, "b1", 2, 3))  # rows 0:2 on ps 0, row 2 on ps 1
LR = np.float32(0.5)


def _placement(kind: str) -> PlacementSpec:
    if kind != "ps":
        return PlacementSpec({"u_w": VariablePlacement(kind, ("cpu:0",)), "u_b": VariablePlacement(kind, ("cpu:0",))})
    return PlacementSpec({"u_w": VariablePlacement("ps", shards=W_SHARDS),
                          "u_b": VariablePlacement("ps", shards=B_SHARDS)})


def _comm(graph: Graph, op: str, source: Value, variable: str, shard: Shard, sharded: bool) -> Value:
    attrs = {"ps": shard.ps, "key": shard.key, "variable": variable, "group_key": f"{op}_{shard.key}"}
    if sharded:
        attrs.update(row_start=shard.start, row_stop=shard.stop)
    return _placed(graph.add_node(op, [source], attrs, domain=GRAPHDIST_DOMAIN)).outputs[0]


def _placed(node: Node) -> Node:
    node.device, node.replica = "cpu:0", 0
    node.replica = 0
    if node.domain == GRAPHDIST_DOMAIN:
        node.meta["side_effect"] = True
    return node


def _step(kind: str, placed: bool) -> Graph:
    """``y = x @ w + b`` and the update ``w -= w * lr`` (``w`` read and updated, ``b`` only read);
    ``placed``: what the pass makes of it, in the order its docstring's rule (after the inputs' producers)
    puts the new nodes."""
    graph = Graph("expected" if placed else "step")
    x = graph.add_input("x", np.float32, (2, 4))
    w = graph.add_input("w", np.float32, (4, 3))
    b = graph.add_input("b", np.float32, (3,))
    graph.meta.variables = [("w", VariableSpec("u_w", "w", "<f4", (4, 3))),
                               ("b", VariableSpec("u_b", "b", "<f4", (3,)))]
    graph.meta.placement = _placement(kind)
    if placed:
        parts = [_comm(graph, "PSPull", b, "b", shard, True) for shard in reversed(B_SHARDS)][::-1]
        b = _placed(graph.add_node("Concat", parts, {"axis": 0})).outputs[0]
        w = pulled = _comm(graph, "PSPull", w, "w", W_SHARDS[0], False)
    y = graph.add_node("Add", [graph.add_node("MatMul", [x, w]).outputs[0], b]).outputs[0]
    new = graph.add_node("Sub", [w, graph.add_node("Mul", [w, graph.add_initializer("lr", LR)]).outputs[0]])
    new = new.outputs[0]
    if placed:
        delta = _placed(graph.add_node("Sub", [new, pulled])).outputs[0]
        new = _comm(graph, "PSPush", delta, "w", W_SHARDS[0], False)
    graph.outputs = [y, new]
    graph.meta.variable_updates = [(new.name, "u_w")]
    return graph


def _simulate(graph: Graph, feeds: dict[str, np.ndarray], store: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluates ``graph`` in numpy, with ``store`` (ps key -> rows) standing in for the ps tasks."""
    env = {id(v): feeds[v.name] for v in graph.inputs}
    env.update({id(v): v.const_value for v in graph.initializers.values()})
    ops = {"MatMul": np.matmul, "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
           "Concat": lambda *parts: np.concatenate(parts, axis=0)}
    for node in graph.nodes:
        args = [env[id(v)] for v in node.inputs]
        key = node.attrs.get("key")
        if node.op_type == "PSPull":
            result = store[key]
        elif node.op_type == "PSPush":
            store[key] = result = store[key] + args[0]
        else:
            result = ops[node.op_type](*args)
        env[id(node.outputs[0])] = result
    return [env[id(v)] for v in graph.outputs]


def test_reads_pull_and_updates_push() -> None:
    graph = _step("ps", placed=False)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32), "w": rng.standard_normal((4, 3)).astype(np.float32),
             "b": rng.standard_normal(3).astype(np.float32)}
    before = _simulate(graph, feeds, {})
    graph = check_pass(PlacePSVariablesPass(), graph, modified=True, expected=_step("ps", placed=True), ctx=CTX,
                       numerics=False, placement=True, meta_keys=("replica", "side_effect"))
    assert graph.meta.variable_updates == [(graph.outputs[1].name, "u_w")]
    store = {"w0": feeds["w"], "b0": feeds["b"][:2], "b1": feeds["b"][2:]}  # what the ps tasks hold
    stale = dict(feeds, w=np.zeros_like(feeds["w"]), b=np.zeros_like(feeds["b"]))  # the worker's copy is not read
    after = _simulate(graph, stale, store)
    for got, want in zip(after, before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(store["w0"], feeds["w"] * (1 - LR), rtol=1e-6)  # the ps holds the update


@pytest.mark.parametrize("kind", ["mirrored", "central"])
def test_variables_elsewhere_are_unchanged(kind: str) -> None:
    check_pass(PlacePSVariablesPass(), _step(kind, placed=False), modified=False, expected=_step(kind, placed=False),
               ctx=CTX, placement=True)
