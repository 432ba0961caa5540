"""Value, Node and Graph: construction, use lists, rewiring, ordering, copies.

The invariant under test throughout: every ``(node, index)`` in ``value.uses``
matches ``node.inputs[index] is value`` and vice versa, whatever the edit.
"""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest

import graphdist as gd
from graphdist.errors import GraphError
from graphdist.ir import Graph, Node, Value, graph_to_networkx, verify


def assert_uses_consistent(graph: Graph) -> None:
    expected = {id(v): [] for v in graph.values()}
    for node in graph.nodes:
        for index, value in enumerate(node.inputs):
            if value is not None:
                expected.setdefault(id(value), []).append((node, index))
        for position, out in enumerate(node.outputs):
            assert out.producer is node and out.index == position
    for value in graph.values():
        assert sorted(value.uses, key=lambda u: (id(u[0]), u[1])) == sorted(
            expected[id(value)], key=lambda u: (id(u[0]), u[1])
        ), f"use list of %{value.name}"


def diamond() -> tuple[Graph, dict[str, Node]]:
    """x -> a=exp(x), b=neg(x) -> c=a+b -> d=c*w (w an initializer)."""
    graph = Graph("diamond")
    x = graph.add_input("x", np.float32, (2, 3))
    w = graph.add_initializer("w", np.full((2, 3), 2.0, np.float32))
    a = graph.add_node("Exp", [x])
    b = graph.add_node("Neg", [x])
    c = graph.add_node("Add", [a.outputs[0], b.outputs[0]])
    d = graph.add_node("Mul", [c.outputs[0], w])
    graph.outputs = [d.outputs[0]]
    return graph, {"a": a, "b": b, "c": c, "d": d}


def test_value_properties() -> None:
    value = Value("v", np.float32, (2, 3))
    assert (value.rank, value.is_static, value.nbytes) == (2, True, 24)
    assert value.type_str() == "float32[2,3]" and repr(value) == "%v: float32[2,3]"
    symbolic = Value("s", "int64", ("batch", 4))
    assert symbolic.dtype == np.int64 and not symbolic.is_static and symbolic.nbytes is None
    assert Value("scalar", np.bool_, ()).type_str() == "bool[]"


def test_construction_tracks_producers_and_uses() -> None:
    graph, nodes = diamond()
    x = graph.inputs[0]
    assert sorted((n.name, i) for n, i in x.uses) == [("exp", 0), ("neg", 0)]
    c_out = nodes["c"].outputs[0]
    assert c_out.producer is nodes["c"] and c_out.uses == [(nodes["d"], 0)]
    assert c_out.shape == (2, 3) and c_out.dtype == np.float32
    assert all(n.graph is graph for n in graph.nodes)
    assert graph.initializers["w"].const_value is not None and graph.initializers["w"].producer is None
    assert [v.name for v in graph.values()] == ["x", "w", "exp", "neg", "add", "mul"]
    assert_uses_consistent(graph)
    verify(graph)


def test_names_are_unique_per_namespace() -> None:
    graph = Graph()
    first, second = graph.add_input("x", np.float32, (1,)), graph.add_input("x", np.float32, (1,))
    assert first.name == "x" and second.name != "x"
    n1 = graph.add_node("Relu", [first])
    n2 = graph.add_node("Relu", [second])
    assert n1.name != n2.name
    # Node and value names are separate namespaces (as in ONNX): a node may be called "x".
    node = graph.add_node("Identity", [first], name="x")
    assert node.name == "x"
    verify(graph)


def test_node_repr_and_qualified_op() -> None:
    graph = Graph()
    x = graph.add_input("x", np.float32, (4,))
    node = graph.add_node("AllReduce", [x], {"reduce_op": "SUM", "group_size": 1}, domain="graphdist")
    assert node.qualified_op == "graphdist.AllReduce"
    assert repr(node) == f"%{node.outputs[0].name} = graphdist.AllReduce(%x)"
    assert graph.find_nodes("AllReduce") == [node]
    assert graph.find_nodes("AllReduce", "graphdist") == [node]
    assert graph.find_nodes("AllReduce", "") == []


def test_replace_input_keeps_uses_consistent() -> None:
    graph, nodes = diamond()
    x, w = graph.inputs[0], graph.initializers["w"]
    nodes["d"].replace_input(1, nodes["a"].outputs[0])
    assert (nodes["d"], 1) not in w.uses and (nodes["d"], 1) in nodes["a"].outputs[0].uses
    nodes["c"].replace_input(0, x)
    assert_uses_consistent(graph)
    verify(graph)


def test_replace_all_uses_with_rewires_nodes_and_outputs() -> None:
    graph, nodes = diamond()
    old, new = nodes["c"].outputs[0], nodes["a"].outputs[0]
    graph.outputs.append(old)
    count = graph.replace_all_uses_with(old, new)
    assert count == 2
    assert old.uses == [] and graph.outputs[-1] is new
    assert nodes["d"].inputs[0] is new
    assert_uses_consistent(graph)
    assert graph.replace_all_uses_with(new, new) == 0


def test_replace_all_uses_with_excluding_the_new_producer() -> None:
    graph, nodes = diamond()
    x = graph.inputs[0]
    doubled = graph.add_node("Add", [x, x], name="double")
    graph.insert_before(nodes["a"], doubled)  # moved from the end
    count = graph.replace_all_uses_with(x, doubled.outputs[0], exclude=[doubled])
    assert count == 2
    assert doubled.inputs == [x, x] and nodes["a"].inputs[0] is doubled.outputs[0]
    assert_uses_consistent(graph)
    verify(graph)


def test_replace_all_uses_with_type_mismatch() -> None:
    graph, nodes = diamond()
    cast = graph.add_node("Cast", [nodes["c"].outputs[0]], {"to": 7})  # int64
    with pytest.raises(GraphError, match=r"float32\[2,3\].*int64\[2,3\].*Cast"):
        graph.replace_all_uses_with(nodes["c"].outputs[0], cast.outputs[0])
    other = graph.add_input("y", np.float32, (3, 2))
    with pytest.raises(GraphError, match="shapes must match"):
        graph.replace_all_uses_with(nodes["c"].outputs[0], other)
    assert_uses_consistent(graph)


def test_remove_node() -> None:
    graph, nodes = diamond()
    with pytest.raises(GraphError, match=r"cannot remove node add .*still used.*replace_all_uses_with"):
        graph.remove_node(nodes["c"])
    with pytest.raises(GraphError, match="still used"):
        graph.remove_node(nodes["d"])  # a graph output
    graph.replace_all_uses_with(nodes["c"].outputs[0], nodes["a"].outputs[0])
    graph.remove_node(nodes["c"])
    assert nodes["c"] not in graph.nodes and nodes["c"].graph is None
    assert all(user is not nodes["c"] for user, _ in nodes["b"].outputs[0].uses)
    graph.remove_node(nodes["b"])
    assert [n.name for n in graph.nodes] == ["exp", "mul"]
    assert [u[0].name for u in graph.inputs[0].uses] == ["exp"]
    assert_uses_consistent(graph)
    verify(graph)


def test_topological_sort_restores_a_valid_order() -> None:
    graph = gd.trace(lambda x, y: (np.tanh(x @ y) + x.sum(0) * 2, (x - 1).T), np.ones((3, 3), np.float32),
                     np.ones((3, 3), np.float32))
    original = [n.name for n in graph.nodes]
    random.Random(0).shuffle(graph.nodes)
    assert [n.name for n in graph.nodes] != original
    with pytest.raises(GraphError):
        verify(graph)
    graph.topological_sort()
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        for value in node.inputs:
            if value is not None and value.producer is not None:
                assert position[id(value.producer)] < position[id(node)]
    assert sorted(n.name for n in graph.nodes) == sorted(original)
    verify(graph)


def test_topological_sort_is_stable() -> None:
    graph, _ = diamond()
    before = list(graph.nodes)
    graph.topological_sort()
    assert graph.nodes == before


def test_topological_sort_detects_a_cycle() -> None:
    graph, nodes = diamond()
    nodes["a"].replace_input(0, nodes["c"].outputs[0])  # exp reads add, add reads exp
    with pytest.raises(GraphError, match="cycle"):
        graph.topological_sort()
    with pytest.raises(GraphError):
        verify(graph)


def test_to_networkx() -> None:
    graph, nodes = diamond()
    g = graph_to_networkx(graph)
    assert isinstance(g, nx.MultiDiGraph)
    uses = sum(1 for n in graph.nodes for v in n.inputs if v is not None)
    assert g.number_of_nodes() == len(graph.inputs) + len(graph.initializers) + len(graph.nodes) + len(graph.outputs)
    assert g.number_of_edges() == uses + len(graph.outputs)
    assert nx.is_directed_acyclic_graph(g)
    assert g.nodes["x"]["kind"] == "input" and g.nodes["w"]["kind"] == "initializer"
    assert g.nodes["add"]["op"] == "Add" and g.nodes["output:mul"]["kind"] == "output"
    assert set(g.successors("x")) == {"exp", "neg"}
    assert list(nx.topological_sort(g))[-1] == "output:mul"


def test_to_networkx_counts_each_use() -> None:
    graph = Graph()
    x = graph.add_input("x", np.float32, (2,))
    square = graph.add_node("Mul", [x, x])
    graph.outputs = [square.outputs[0]]
    g = graph_to_networkx(graph)
    assert g.number_of_edges("x", "mul") == 2
    assert {d["value"] for _, _, d in g.edges(data=True)} == {"x", "mul"}


def test_copy_is_independent() -> None:
    graph = gd.trace(lambda x: np.transpose(x * 2.0, (1, 0)).sum(axis=0), np.ones((2, 3), np.float32))
    twin = graph.copy()
    assert [n.name for n in twin.nodes] == [n.name for n in graph.nodes]
    assert [v.name for v in twin.values()] == [v.name for v in graph.values()]
    assert twin.meta == graph.meta and twin.stage == graph.stage
    originals = {id(v) for v in graph.values()} | {id(n) for n in graph.nodes}
    assert not originals & ({id(v) for v in twin.values()} | {id(n) for n in twin.nodes})
    for value in twin.initializers.values():  # constant arrays are shared, not copied
        assert value.const_value is graph.initializers[value.name].const_value
    verify(twin)

    transpose = twin.find_nodes("Transpose")[0]
    transpose.attrs["perm"].reverse()
    transpose.device = "cpu:1"
    twin.outputs[0].shape = (99,)
    extra = twin.add_node("Neg", [twin.outputs[0]])
    twin.replace_all_uses_with(twin.inputs[0], twin.add_input("z", np.float32, (2, 3)))
    assert graph.find_nodes("Transpose")[0].attrs["perm"] == [1, 0]
    assert graph.find_nodes("Transpose")[0].device is None
    assert graph.outputs[0].shape == (2,)
    assert extra.name not in {n.name for n in graph.nodes}
    assert graph.inputs[0].uses and len(graph.inputs) == 1
    assert_uses_consistent(graph)
    assert_uses_consistent(twin)
    verify(graph)


def test_copy_keeps_name_reservations() -> None:
    graph, _ = diamond()
    twin = graph.copy()
    fresh = twin.add_node("Relu", [twin.inputs[0]], name="add")
    assert fresh.name != "add" and fresh.outputs[0].name not in {v.name for v in graph.values()}
    verify(twin)


def test_insert_before_and_placement_fields() -> None:
    graph, nodes = diamond()
    relu = Node("Relu", [graph.inputs[0]], name="first")
    relu.outputs.append(Value("first_out", np.float32, (2, 3), producer=relu))
    graph.insert_before(nodes["a"], relu)
    assert graph.nodes[0] is relu and relu.graph is graph
    assert relu.device is None and relu.replica is None and relu.meta == {}
    verify(graph)


def test_traced_graph_meta_output_tree() -> None:
    graph = gd.trace(lambda x: {"a": x + 1, "b": (x, 2)}, np.ones(2, np.float32))
    rebuilt = gd.nest.unflatten(graph.meta.output_tree, [v.name for v in graph.outputs])
    assert set(rebuilt) == {"a", "b"} and len(rebuilt["b"]) == 2
    assert len({v.name for v in graph.outputs}) == 3
    assert all(v.producer is not None for v in graph.outputs)


# ------------------------------------------------------------- edits the graph owns
def _order(graph: Graph) -> list[str]:
    return [n.name for n in graph.nodes]


def _detached(graph: Graph, op_type: str, inputs: list[Value]) -> Node:
    """A node built outside the graph (as passes build replacements), one output typed like its first input."""
    node = Node(op_type, inputs)
    node.name = graph.unique_name(op_type.lower(), node=True)
    node.add_output(Value(graph.unique_name(node.name), inputs[0].dtype, inputs[0].shape))
    return node


def test_insert_before_and_after_take_several_nodes_in_order() -> None:
    graph, nodes = diamond()
    x = graph.inputs[0]
    first, second = _detached(graph, "Abs", [x]), _detached(graph, "Sin", [x])
    graph.insert_before(nodes["b"], [first, second])
    assert _order(graph) == ["exp", first.name, second.name, "neg", "add", "mul"]
    third = _detached(graph, "Cos", [x])
    graph.insert_after(nodes["a"], third)
    assert _order(graph) == ["exp", third.name, first.name, second.name, "neg", "add", "mul"]
    assert first.graph is graph and third.graph is graph
    graph.insert_after(nodes["d"], first)  # a node of the graph moves
    assert _order(graph) == ["exp", third.name, second.name, "neg", "add", "mul", first.name]
    assert_uses_consistent(graph)
    verify(graph)


def test_insert_refuses_a_node_of_another_graph() -> None:
    graph, nodes = diamond()
    other, _ = diamond()
    with pytest.raises(GraphError, match="belongs to graph"):
        graph.insert_before(nodes["b"], other.nodes[0])


def test_inserting_before_is_a_cursor_for_add_node() -> None:
    graph, nodes = diamond()
    x = graph.inputs[0]
    with graph.inserting_before(nodes["c"]):
        one = graph.add_node("Abs", [x], name="one")
        two = graph.add_node("Neg", [one.outputs[0]], name="two")
    after = graph.add_node("Sin", [x], name="after")  # the cursor is gone: appended
    assert _order(graph) == ["exp", "neg", "one", "two", "add", "mul", "after"]
    assert two.graph is graph and after.graph is graph
    verify(graph)


def test_inserting_after_keeps_the_order_of_the_added_nodes() -> None:
    graph, nodes = diamond()
    x = graph.inputs[0]
    with graph.inserting_after(nodes["a"]):
        one = graph.add_node("Abs", [x], name="one")
        graph.add_node("Neg", [one.outputs[0]], name="two")
    assert _order(graph) == ["exp", "one", "two", "neg", "add", "mul"]
    verify(graph)


def test_the_cursor_is_restored_when_the_block_raises() -> None:
    graph, nodes = diamond()
    with pytest.raises(GraphError), graph.inserting_before(nodes["b"]):
        graph.add_node("NoSuchOp", [graph.inputs[0]])
    graph.add_node("Abs", [graph.inputs[0]], name="last")
    assert _order(graph)[-1] == "last"


def test_remove_is_safe_by_default() -> None:
    graph, nodes = diamond()
    with pytest.raises(GraphError, match=r"cannot remove node exp .*%exp is still used"):
        graph.remove(nodes["a"])
    with pytest.raises(GraphError, match="still used"):
        graph.remove(nodes["d"])  # a graph output
    assert _order(graph) == ["exp", "neg", "add", "mul"]  # nothing removed
    graph.outputs = []
    graph.remove([nodes["a"], nodes["b"], nodes["c"], nodes["d"]])  # a dead chain in one call
    assert graph.nodes == [] and graph.inputs[0].uses == []
    assert all(n.graph is None for n in nodes.values())


def test_remove_unsafe_skips_the_check() -> None:
    graph, nodes = diamond()
    graph.remove(nodes["b"], safe=False)
    assert _order(graph) == ["exp", "add", "mul"] and nodes["b"].graph is None
    with pytest.raises(GraphError):
        verify(graph)  # add reads a value nothing computes any more: the caller's to fix


def test_replace_node_rewires_the_readers() -> None:
    graph, nodes = diamond()
    x = graph.inputs[0]
    new = _detached(graph, "Abs", [x])
    graph.replace_node(nodes["a"], new)
    assert _order(graph) == [new.name, "neg", "add", "mul"]
    assert nodes["c"].inputs[0] is new.outputs[0] and nodes["a"].graph is None
    assert nodes["a"].outputs[0].uses == [] and x.uses == [(nodes["b"], 0), (new, 0)]
    assert_uses_consistent(graph)
    verify(graph)


def test_replace_node_keep_values_hands_the_outputs_over() -> None:
    graph, nodes = diamond()
    x = graph.inputs[0]
    kept = nodes["d"].outputs[0]  # a graph output: its name and position stay
    with graph.inserting_before(nodes["d"]):
        new = graph.add_node("Add", [nodes["c"].outputs[0], x])
    graph.replace_node(nodes["d"], new, keep_values=True)
    assert new.outputs == [kept] and kept.producer is new and graph.outputs == [kept]
    assert nodes["d"].graph is None and nodes["d"].outputs == []
    assert_uses_consistent(graph)
    verify(graph)


def test_replace_node_refuses_mismatched_outputs() -> None:
    graph, nodes = diamond()
    graph.add_input("y", np.int64, (2, 3))
    wrong = _detached(graph, "Abs", [graph.inputs[1]])
    with pytest.raises(GraphError, match="replace_all_uses_with: %exp is float32"):
        graph.replace_node(nodes["a"], wrong)
    with graph.inserting_before(nodes["c"]):
        read = graph.add_node("Abs", [graph.inputs[0]])
    graph.add_node("Neg", [read.outputs[0]])
    with pytest.raises(GraphError, match="keep_values=True"):
        graph.replace_node(nodes["a"], read, keep_values=True)


def test_set_nodes_adopts_and_removes() -> None:
    graph, nodes = diamond()
    new = _detached(graph, "Abs", [graph.inputs[0]])
    with pytest.raises(GraphError, match="still used"):
        graph.set_nodes([nodes["a"], nodes["c"], nodes["d"]])  # neg is read by add
    graph.replace_all_uses_with(nodes["b"].outputs[0], new.outputs[0])
    graph.set_nodes([nodes["a"], new, nodes["c"], nodes["d"]])
    assert new.graph is graph and nodes["b"].graph is None and nodes["b"].inputs == []
    assert_uses_consistent(graph)
    verify(graph)


def test_node_graph_and_value_producer_are_read_only() -> None:
    graph, nodes = diamond()
    with pytest.raises(AttributeError):
        nodes["a"].graph = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        nodes["a"].outputs[0].producer = None  # type: ignore[misc]
