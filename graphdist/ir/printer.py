"""Readable text rendering of graphs (used by :func:`graphdist.ir.render.graph_summary`)."""

from __future__ import annotations

from collections import Counter

from graphdist.ir.graph import Graph, Node, Value

__all__ = ["format_graph", "format_table"]

_MAX_VALUE = 24  # characters of one attribute value before it is elided


def format_table(header: list[str], rows: list[list[str]], indent: str = "  ") -> str:
    """Left-aligned plain-text table with a header rule."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)] if rows else [len(h) for h in header]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append(indent + "  ".join("-" * w for w in widths))
    lines += [indent + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _attrs(node: Node) -> str:
    # Every key stays visible; only long values are elided.
    parts = []
    for key, value in sorted(node.attrs.items()):
        text = repr(value.tolist() if hasattr(value, "tolist") else value)
        if len(text) > _MAX_VALUE:
            text = text[: _MAX_VALUE - 3] + "..."
        parts.append(f"{key}={text}")
    return ", ".join(parts)


def _operand(value: Value | None) -> str:
    if value is None:
        return "-"
    if value.const_value is not None and value.const_value.size <= 4:
        return f"{value.const_value.tolist()!r}"
    return f"%{value.name}"


def format_graph(graph: Graph) -> str:
    """Renders inputs, initializers, nodes (with types, attrs, placement) and outputs."""
    counts = Counter(n.qualified_op for n in graph.nodes)
    ops = ", ".join(f"{op} x{c}" for op, c in counts.most_common())
    lines = [
        f"Graph {graph.name!r}  stage={graph.stage}  inputs={len(graph.inputs)}  "
        f"initializers={len(graph.initializers)}  nodes={len(graph.nodes)}",
        f"ops: {ops or '(none)'}",
        "inputs:",
    ]
    lines += [f"  %{v.name}: {v.type_str()}" for v in graph.inputs] or ["  (none)"]
    if graph.initializers:
        lines.append("initializers:")
        lines += [f"  %{v.name}: {v.type_str()}" for v in graph.initializers.values()]
    placed = any(n.device is not None for n in graph.nodes)
    header = ["#", "op", "inputs", "outputs", "attrs"] + (["device", "replica"] if placed else [])
    rows = []
    for index, node in enumerate(graph.nodes):
        row = [
            str(index),
            node.qualified_op,
            ", ".join(_operand(v) for v in node.inputs),
            ", ".join(f"%{v.name}: {v.type_str()}" for v in node.outputs),
            _attrs(node),
        ]
        if placed:
            row += [node.device or "-", "-" if node.replica is None else str(node.replica)]
        rows.append(row)
    lines.append("nodes:")
    lines.append(format_table(header, rows) if rows else "  (none)")
    lines.append("outputs:")
    lines += [f"  %{v.name}: {v.type_str()}" for v in graph.outputs] or ["  (none)"]
    return "\n".join(lines)
