"""The graph as a ``networkx.MultiDiGraph`` (:func:`graph_to_networkx`), for analyses networkx already has."""

from __future__ import annotations

from graphdist.ir.graph import Graph, Value, register_view

__all__ = ["graph_to_networkx"]


def graph_to_networkx(graph: Graph):  # -> networkx.MultiDiGraph
    """Returns a ``networkx.MultiDiGraph``: one vertex per node, graph input
    and initializer, and ``output:<name>`` per graph output; one edge per
    value use, keyed ``<value name>:<input index>`` (so ``Mul(x, x)`` has two
    edges) with attributes ``value`` (the value name) and ``type``.
    """
    import networkx as nx

    g = nx.MultiDiGraph(name=graph.name)
    for value in graph.inputs:
        g.add_node(value.name, kind="input", type=value.type_str())
    for value in graph.initializers.values():
        g.add_node(value.name, kind="initializer", type=value.type_str())
    for node in graph.nodes:
        g.add_node(node.name, kind="op", op=node.qualified_op, device=node.device, replica=node.replica)
        for index, value in enumerate(node.inputs):
            if value is not None:
                g.add_edge(_vertex_of(value), node.name, key=f"{value.name}:{index}", value=value.name,
                           type=value.type_str())
    for value in graph.outputs:
        sink = f"output:{value.name}"
        g.add_node(sink, kind="output", type=value.type_str())
        g.add_edge(_vertex_of(value), sink, key=f"{value.name}:0", value=value.name, type=value.type_str())
    return g


def _vertex_of(value: Value) -> str:
    return value.producer.name if value.producer is not None else value.name


register_view("to_networkx", graph_to_networkx)
