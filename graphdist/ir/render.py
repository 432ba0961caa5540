"""Inspection views of graphs: overview tables, Graphviz DOT, pictures.

* :func:`graph_overview`: the tables :func:`graph_summary` shows above the node
  listing: ops per device, collectives (grouped, with sizes and algorithm),
  variables and their placement, bytes communicated per step.
* :func:`graph_to_dot`: DOT text. Devices are clusters
  (``subgraph cluster_...``; the segments of a partitioned graph are nested
  clusters), collectives and transfers are highlighted (orange; the
  participants of one collective are joined by a dashed line), edges that
  cross devices are red, inputs / variables / outputs / constants have their
  own shapes. The public pieces (tables, byte estimates, DOT statements and
  styles) also draw compiled plans: :mod:`graphdist.compile.render`.
* :func:`render_dot`: runs Graphviz's ``dot`` to write SVG or PNG (``.dot``
  writes the text). ``dot`` is a system program (Debian's ``graphviz``
  package), not a Python package; when it is missing the error says how to
  install it.

Sizes are static byte counts; "moved" is an estimate of the bytes a
collective sends between devices per step for ``n`` participants holding
``S`` bytes each: all-reduce ``2 (n-1) S`` (ring, hierarchical copy and
reduce-to-one all send that much), all-gather ``n (n-1) S``, all-to-all
``(n-1) S`` (each keeps ``1/n`` of its value), transfer ``S``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphdist.errors import GraphdistError, InvalidArgumentError, StorageError
from graphdist.ir.comm_ops import SUMMED_GROUP, SUMMED_REPLICAS, is_communication, is_runtime_check
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value, register_view
from graphdist.ir.placement import VariableSpec, placement_of, variable_specs
from graphdist.ir.printer import format_graph, format_table

__all__ = [
    "graph_summary",
    "graph_overview",
    "graph_to_dot",
    "render_dot",
    "render_graph",
    "dot_executable",
    "RENDER_FORMATS",
    "DOT_INSTALL_HINT",
    "moved_bytes",
    "format_bytes",
    "CLUSTER_COLORS",
    "COLORS",
    "COMM_STYLE",
    "INPUT_STYLE",
    "OUTPUT_STYLE",
    "UPDATE_STYLE",
    "VARIABLE_STYLE",
    "attr_text",
    "check_lines",
    "device_key",
    "dot_cluster_open",
    "dot_header",
    "dot_stmt",
    "graph_variables",
    "join_items",
    "short_type",
    "summed_lines",
    "top_ops",
    "transfer_route",
    "variable_rows",
]

#: File suffixes :func:`render_dot` understands (``dot``/``gv``: the DOT text itself).
RENDER_FORMATS = ("svg", "png", "pdf", "dot", "gv")

DOT_INSTALL_HINT = (
    "install Graphviz, which provides it (it is a system program, not on PyPI): "
    "`apt-get install -y graphviz` on Debian/Ubuntu (as root), `brew install graphviz` on macOS or "
    "`conda install graphviz`; or set GRAPHDIST_DOT to the path of a dot executable. Without it, "
    "graph_to_dot(graph) and plan.to_dot() still give the DOT text"
)

_FAST_LAYOUT_NODES = 300  # above this many nodes the DOT text asks dot for a quicker layout
_SMALL_CONSTANT = 4  # initializers with at most this many elements are not drawn (shown inline in summaries)

# Colours (Graphviz accepts #rrggbb).
COLORS = {
    "op_fill": "#eef3fb", "op_line": "#7d8da1",
    "graphdist_fill": "#e9e1f7", "graphdist_line": "#7048b6",
    "comm_fill": "#ffd8a8", "comm_line": "#e8590c",
    "input_fill": "#d3f9d8", "input_line": "#2f9e44",
    "variable_fill": "#fff3bf", "variable_line": "#e0a800",
    "output_fill": "#c5f6fa", "output_line": "#0c8599",
    "const_fill": "#f1f3f5", "const_line": "#adb5bd",
    "cross_edge": "#e03131", "edge": "#8a94a6",
}
CLUSTER_COLORS = ["#4a78c2", "#37b24d", "#ae3ec9", "#f59f00", "#1098ad", "#d6336c", "#74b816", "#7950f2"]


# ------------------------------------------------------------------ helpers
def format_bytes(count: int | None) -> str:
    """``8,192 B`` style (``?`` when unknown)."""
    return "?" if count is None else f"{count:,} B"


def _short(text: str, limit: int = 24) -> str:
    """``text`` elided to ``limit`` characters (as the node listing elides attribute values)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def moved_bytes(op: str, participants: int, nbytes: int | None, attrs: dict | None = None) -> int | None:
    """Estimated bytes sent between devices by one collective or transfer (see the module doc).

    Between processes a plan is one worker's: a cross-worker collective counts this worker's share of
    the traffic among ``attrs["num_workers"]`` workers, and a parameter-server pull or push moves its
    value once.
    """
    if nbytes is None:
        return None
    n = max(int(participants), 1)
    if op in ("Transfer", "PSPull", "PSPush"):
        return nbytes
    if op.startswith("CrossWorker"):
        workers = max(int((attrs or {}).get("num_workers", 1)), 1)
        total = moved_bytes(op.removeprefix("CrossWorker"), workers, nbytes)
        return None if total is None else total // workers
    if op == "AllGather":
        return n * (n - 1) * nbytes
    if op == "AllToAll":
        return (n - 1) * nbytes  # each participant keeps 1/n of its value and sends the rest
    return 2 * (n - 1) * nbytes  # AllReduce, ReduceScatter + AllGather, Broadcast-like


def device_key(device: str | None) -> tuple:
    """Sort key of a device name: its kind, then its index as a number (``cpu:2`` before ``cpu:10``), ``None`` last."""
    if device is None:
        return ("~", 0, "")
    kind, _, index = device.partition(":")
    return (kind, int(index) if index.isdigit() else 0, device)


def join_items(items: Iterable[str]) -> str:
    """The items joined by commas (``-`` when there are none)."""
    return ", ".join(items) or "-"


def top_ops(nodes: Iterable[Node], limit: int = 5) -> str:
    """The most frequent op types of ``nodes`` with their counts, most frequent first."""
    counts = Counter(n.qualified_op for n in nodes)
    text = ", ".join(f"{op} x{c}" for op, c in counts.most_common(limit))
    return text + (", ..." if len(counts) > limit else "")


def _collective_groups(nodes: Iterable[Node]) -> dict[str, list[Node]]:
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        if is_communication(node) and not is_runtime_check(node):
            groups.setdefault(node.attrs.get("group_key") or node.name, []).append(node)
    return groups


def check_lines(checks: Iterable[tuple[str, dict[str, Any], Sequence[str]]]) -> str:
    """The ``run-time checks`` section: what each assertion bounds, and where it runs (``""`` if none)."""
    rows = [f"  {name}: {attrs.get('argument', '?')} of {attrs.get('op', '?')} in [{attrs.get('low', '?')}, "
            f"{attrs.get('high', '?')}) on {join_items(devices)}" for name, attrs, devices in checks]
    return f"run-time checks ({len(rows)}):\n" + "\n".join(rows) if rows else ""


def summed_lines(nodes: Iterable[Node]) -> str:
    """The ``summed on the reader`` section: groups replaced by a sum on the one replica that reads them.

    ``LowerSingleReaderAllReducesPass`` marks those nodes with ``meta[SUMMED_GROUP]`` (``""`` if none).
    """
    last: dict[str, Node] = {}
    for node in nodes:
        if SUMMED_GROUP in node.meta:
            last[str(node.meta[SUMMED_GROUP])] = node  # the chain's last node holds the result
    rows = [[_short(key), node.device or "-", str(node.meta.get(SUMMED_REPLICAS, "?")),
             format_bytes(node.outputs[0].nbytes if node.outputs else None)] for key, node in last.items()]
    if not rows:
        return ""
    table = format_table(["group", "summed on", "replicas", "bytes each"], rows)
    return f"summed on the reader ({len(rows)} group(s) read by one replica, no all-reduce):\n{table}"


def layout_lines(graph: Graph) -> str:
    """The ``layouts`` section: values split or partial over the device mesh (``LowerLayoutsPass``)."""
    table = graph.meta.layouts
    mesh = graph.meta.mesh
    if not table or mesh is None:
        return ""
    shape = " x ".join(f"{a}={s}" for a, s in zip(mesh.axis_names, mesh.shape))
    rows = [[f"%{name}", *columns] for name, columns in table.items()]
    shown = rows[:_LAYOUT_ROWS]
    more = f"\n  ... and {len(rows) - len(shown)} more (graph.meta.layouts)" if len(rows) > len(shown) else ""
    return (f"layouts over the mesh {shape} (batch axis {mesh.batch_axis!r}; {len(rows)} value(s) split or partial, "
            f"the others replicated):\n" + format_table(["value", "type", "layout", "block per device"], shown) + more)


#: Rows of the layouts section a summary shows (the variables come first).
_LAYOUT_ROWS = 60


def attr_text(attrs: dict[str, Any], skip: Sequence[str] = ("group_key", "group_size", "algorithm",
                                                             "reduce_op")) -> str:
    """The attributes not shown in their own column, as ``key=value`` text."""
    return ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()) if k not in skip and v is not None)


def transfer_route(graph: Graph, source: Value, destination: str) -> str:
    """``cpu:0 -> cpu:1``: the source is the producer's device, a variable's
    device for a variable input, else ``host`` (a graph input).
    """
    origin = source.producer.device if source.producer is not None else None
    if origin is None:
        placement = placement_of(graph).get(source.name)
        origin = placement.devices[0] if placement is not None and placement.devices else None
    return f"{origin or 'host'} -> {destination}"


def graph_variables(graph: Graph) -> list[tuple[str, VariableSpec]]:
    """The graph's variables (name and spec) from its metadata."""
    return [(name, spec) for name, spec in variable_specs(graph) if isinstance(name, str)]


def variable_rows(graph: Graph) -> list[list[str]]:
    """Table rows of the graph's variables: type, bytes, kind, placement, where read and updated."""
    by_name = {v.name: v for v in graph.inputs}
    updates = {uid: out_name for out_name, uid in graph.meta.variable_updates}
    placements = placement_of(graph)
    produced = {out.name: node for node in graph.nodes for out in node.outputs}
    # A ZeRO-1 slot stored in per-replica parts has one input per local replica (and one write-back each).
    parts = {uid: [by_name[n] for n in layout["parts"] if n in by_name]
             for uid, layout in graph.meta.sharded_state.items() if layout.get("parts")}
    written: dict[str, list[str]] = {}
    for out_name, uid in graph.meta.variable_updates:
        written.setdefault(uid, []).append(out_name)
    rows = []
    for name, spec in graph_variables(graph):
        value = by_name.get(name)
        inputs = [value] if value is not None else parts.get(spec.uid, [])
        if not inputs:
            continue
        uses = [use for v in inputs for use in v.uses]
        readers = sorted({n.device for n, _ in uses if n.device}, key=device_key)
        via = any(n.op_type == "Transfer" for n, _ in uses)
        read_on = join_items(readers) + (" (transfers)" if via else "")
        if spec.uid not in updates:
            updated = "-"
        else:
            nodes = [produced.get(out) for out in written.get(spec.uid, [updates[spec.uid]])]
            devices = sorted({n.device for n in nodes if n is not None and n.device}, key=device_key)
            updated = join_items(devices) if devices else "yes"
        placement = placements.get(name)
        if value is not None:
            type_text, nbytes = value.type_str(), value.nbytes
        else:  # the variable's type; the bytes of its parts (padded)
            type_text = f"{np.dtype(spec.dtype).name}{list(spec.shape)} in {len(inputs)} parts"
            nbytes = sum(v.nbytes or 0 for v in inputs)
        rows.append([name, type_text, format_bytes(nbytes), spec.kind,
                     placement.describe() if placement is not None else "-", read_on if uses else "-", updated])
    return rows


# ------------------------------------------------------------ graph tables
def graph_summary(graph: Graph) -> str:
    """The text of :func:`graph_summary`: :func:`~graphdist.ir.printer.format_graph`'s listing, with
    :func:`graph_overview`'s tables after the header when there are any.
    """
    text, overview = format_graph(graph), graph_overview(graph)
    if not overview:
        return text
    head, _, rest = text.partition("\ninputs:")
    return f"{head}\n{overview}\ninputs:{rest}"


def graph_overview(graph: Graph) -> str:
    """Tables for :func:`graph_summary`: ops per device, collectives, variables, bytes per step.

    Returns ``""`` for a graph without placement, collectives or variables.
    """
    sections: list[str] = []
    placed = [n for n in graph.nodes if n.device is not None]
    if placed:
        by_device: dict[str, list[Node]] = {}
        for node in graph.nodes:
            by_device.setdefault(node.device or "(unplaced)", []).append(node)
        rows = []
        for device in sorted(by_device, key=device_key):
            nodes = by_device[device]
            replicas = sorted({n.replica for n in nodes if n.replica is not None})
            segments = sorted({n.meta["segment"] for n in nodes if "segment" in n.meta})
            comm = sum(1 for n in nodes if is_communication(n) and not is_runtime_check(n))
            rows.append([device, join_items(str(r) for r in replicas), str(len(nodes)), str(comm),
                         join_items(segments), top_ops([n for n in nodes if not is_communication(n)])])
        header = ["device", "replicas", "nodes", "comm", "segments", "top ops"]
        if not any("segment" in n.meta for n in graph.nodes):
            header, rows = header[:4] + header[5:], [row[:4] + row[5:] for row in rows]
        sections.append("ops per device:\n" + format_table(header, rows))
    groups = _collective_groups(graph.nodes)
    if groups:
        rows = []
        total_payload = total_moved = 0
        unknown = 0
        for key, nodes in groups.items():
            first = nodes[0]
            n = max(len(nodes), int(first.attrs.get("group_size", len(nodes)) or 1))
            size = first.inputs[0].nbytes if first.inputs and first.inputs[0] is not None else None
            moved = moved_bytes(first.op_type, n, size, first.attrs)
            if size is None or moved is None:
                unknown += 1
            else:
                total_payload += size * len(nodes)
                total_moved += moved
            devices = join_items(sorted({d.device for d in nodes if d.device}, key=device_key))
            if first.op_type == "Transfer" and first.inputs and first.inputs[0] is not None:
                devices = transfer_route(graph, first.inputs[0], devices)
            rows.append([_short(key), first.qualified_op, str(first.attrs.get("reduce_op", "-")),
                         str(first.attrs.get("algorithm", "-")), str(n), format_bytes(size), format_bytes(moved),
                         devices, attr_text(first.attrs)])
        table = format_table(["group", "op", "reduce", "algorithm", "participants", "bytes each", "moved (est.)",
                              "devices", "other attrs"], rows)
        if unknown == len(groups):
            per_step = "  per step: unknown (symbolic shapes)"
        else:
            note = f" (+ {unknown} group(s) of unknown size)" if unknown else ""
            per_step = (f"  per step: {format_bytes(total_payload)} into collectives (all participants), "
                        f"~{format_bytes(total_moved)} sent between devices (estimate){note}")
        sections.append(f"communication ({len(groups)} collective/transfer group(s), "
                        f"{sum(map(len, groups.values()))} node(s)):\n{table}\n{per_step}")
    summed = summed_lines(graph.nodes)
    if summed:
        sections.append(summed)
    layouts = layout_lines(graph)
    if layouts:
        sections.append(layouts)
    checks = check_lines((n.name, n.attrs, [n.device] if n.device else []) for n in graph.nodes
                          if is_runtime_check(n))
    if checks:
        sections.append(checks)
    variables = variable_rows(graph)
    if variables:
        sections.append("variables:\n" + format_table(
            ["variable", "type", "bytes", "kind", "placement", "read on", "updated on"], variables))
    return "\n".join(sections)


# --------------------------------------------------------------------- DOT
def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**attrs: Any) -> str:
    return "[" + ", ".join(f"{k}={_quote(v)}" for k, v in attrs.items() if v is not None) + "]"


def dot_stmt(indent: str, ident: str, **attrs: Any) -> str:
    """One DOT statement ``ident [attrs];`` at ``indent``."""
    return f"{indent}{ident} {_attrs(**attrs)};"


def short_type(value: Value | None) -> str:
    """A value's type as a short label (empty for no value)."""
    return "" if value is None else value.type_str()


def _node_label(node: Node) -> str:
    head = node.op_type
    if is_communication(node):
        parts = [str(node.attrs[k]) for k in ("reduce_op", "algorithm") if k in node.attrs]
        if "axis" in node.attrs:
            parts.append(f"axis={node.attrs['axis']}")
        head = " ".join([node.op_type, *parts])
        size = node.inputs[0].nbytes if node.inputs and node.inputs[0] is not None else None
        group = node.attrs.get("group_key")
        tail = f"{format_bytes(size)}" + (f"  [{group}]" if group else "")
        return f"{head}\n{short_type(node.outputs[0] if node.outputs else None)}\n{tail}"
    if node.domain and node.domain != GRAPHDIST_DOMAIN:
        head = node.qualified_op
    out = node.outputs[0] if node.outputs else None
    extra = f" (+{len(node.outputs) - 1})" if len(node.outputs) > 1 else ""
    return f"{head}\n{short_type(out)}{extra}"


INPUT_STYLE = {"shape": "invhouse", "style": "filled", "fillcolor": COLORS["input_fill"], "color": COLORS["input_line"]}
VARIABLE_STYLE = {"shape": "cylinder", "style": "filled", "fillcolor": COLORS["variable_fill"],
             "color": COLORS["variable_line"]}
UPDATE_STYLE = dict(VARIABLE_STYLE, style="filled,dashed")
OUTPUT_STYLE = {"shape": "house", "style": "filled", "fillcolor": COLORS["output_fill"], "color": COLORS["output_line"]}
_CONST = {"shape": "note", "style": "filled", "fillcolor": COLORS["const_fill"], "color": COLORS["const_line"],
          "fontsize": "8"}
COMM_STYLE = {"shape": "box", "style": "rounded,filled,bold", "fillcolor": COLORS["comm_fill"],
         "color": COLORS["comm_line"], "penwidth": "2"}
_GRAPHDIST_OP = {"shape": "box", "style": "rounded,filled", "fillcolor": COLORS["graphdist_fill"],
                 "color": COLORS["graphdist_line"]}


def _style_for(node: Node) -> dict[str, Any]:
    if is_communication(node):
        return dict(COMM_STYLE)
    if node.domain == GRAPHDIST_DOMAIN:
        return dict(_GRAPHDIST_OP)
    return {}


def dot_header(name: str, label: str, **graph_attrs: Any) -> list[str]:
    """The opening lines of a DOT digraph named ``name`` with a title label."""
    return [
        f"digraph {_quote(name)} {{",
        dot_stmt("  ", "graph", label=label, labelloc="t", fontname="Helvetica", fontsize="12", newrank="true",
              **graph_attrs),
        dot_stmt("  ", "node", shape="box", style="rounded,filled", fillcolor=COLORS["op_fill"],
              color=COLORS["op_line"], fontname="Helvetica", fontsize="9", margin="0.08,0.03", height="0.3"),
        dot_stmt("  ", "edge", color=COLORS["edge"], arrowsize="0.6", fontname="Helvetica", fontsize="8"),
    ]


def dot_cluster_open(indent: str, ident: str, label: str, color: str) -> list[str]:
    """The opening lines of a DOT cluster (close it with ``}``)."""
    return [f"{indent}subgraph {ident} {{",
            dot_stmt(indent + "  ", "graph", label=label, style="rounded,filled", fillcolor="#fbfcfe", color=color,
                  penwidth="2", fontcolor=color, fontsize="12")]


def graph_to_dot(graph: Graph, *, title: str | None = None, constants: bool = True, legend: bool = True,
                 rankdir: str = "TB") -> str:
    """DOT text of ``graph`` (see the module doc for the conventions).

    Args:
        graph: Graph at any stage.
        title: Graph label (default: name and stage).
        constants: Draw initializers with more than four elements (weights baked
            into the graph); smaller constants are never drawn.
        legend: Add a legend of the shapes and colours.
        rankdir: ``"TB"`` (top to bottom) or ``"LR"``.
    """
    ids: dict[int, str] = {}
    # Large graphs: cap dot's network-simplex iterations (a 1,450-node graph lays out in ~10 s, not ~1 min).
    fast = {"nslimit": "2", "nslimit1": "2"} if len(graph.nodes) > _FAST_LAYOUT_NODES else {}
    lines = dot_header(graph.name, title or f"{graph.name} ({graph.stage})", rankdir=rankdir, nodesep="0.25",
                    ranksep="0.35", **fast)
    variable_inputs = {name for name, _ in graph_variables(graph)}
    names_by_uid = {spec.uid: f"{spec.name}:0" for _, spec in graph_variables(graph)}
    update_outputs = {out: names_by_uid.get(uid, out) for out, uid in graph.meta.variable_updates}

    for index, value in enumerate(graph.inputs):
        ids[id(value)] = f"in{index}"
        style = VARIABLE_STYLE if value.name in variable_inputs else INPUT_STYLE
        lines.append(dot_stmt("  ", f"in{index}", label=f"{value.name}\n{value.type_str()}", **style))
    if constants:
        for index, value in enumerate(graph.initializers.values()):
            if value.const_value is not None and np.size(value.const_value) > _SMALL_CONSTANT:
                ids[id(value)] = f"k{index}"
                lines.append(dot_stmt("  ", f"k{index}", label=f"{value.name}\n{value.type_str()}", **_CONST))

    # Nodes, grouped in device clusters (and segment sub-clusters).
    tree: dict[str | None, dict[str | None, list[tuple[int, Node]]]] = {}
    position: dict[int, int] = {}
    for index, node in enumerate(graph.nodes):
        position[id(node)] = index
        segment = None if is_communication(node) else node.meta.get("segment")
        tree.setdefault(node.device, {}).setdefault(segment, []).append((index, node))
        for out in node.outputs:
            ids[id(out)] = f"n{index}"

    def node_line(index: int, node: Node, indent: str) -> str:
        return dot_stmt(indent, f"n{index}", label=_node_label(node), tooltip=f"{node.name}: {node!r}",
                     **_style_for(node))

    for cluster_index, device in enumerate(sorted(tree, key=device_key)):
        segments = tree[device]
        if device is None:
            lines += [node_line(i, n, "  ") for nodes in segments.values() for i, n in nodes]
            continue
        color = CLUSTER_COLORS[cluster_index % len(CLUSTER_COLORS)]
        lines += dot_cluster_open("  ", f"cluster_{cluster_index}", device, color)
        for seg_index, (segment, nodes) in enumerate(sorted(segments.items(), key=lambda kv: kv[0] or "")):
            if segment is None:
                lines += [node_line(i, n, "    ") for i, n in nodes]
                continue
            lines.append(f"    subgraph cluster_{cluster_index}_{seg_index} {{")
            lines.append(dot_stmt("      ", "graph", label=f"segment {segment}", style="dashed,rounded", color=color,
                               fontsize="9", fontcolor=color))
            lines += [node_line(i, n, "      ") for i, n in nodes]
            lines.append("    }")
        lines.append("  }")

    for index, value in enumerate(graph.outputs):
        variable = update_outputs.get(value.name)
        if variable is not None:
            lines.append(dot_stmt("  ", f"out{index}", label=f"update {variable}\n{value.type_str()}", **UPDATE_STYLE))
        else:
            lines.append(dot_stmt("  ", f"out{index}", label=f"output {index}\n{value.type_str()}", **OUTPUT_STYLE))

    # Edges: one per (value, reader); edges between devices are red and labelled with the type.
    device_of = {id(out): node.device for node in graph.nodes for out in node.outputs}
    for index, node in enumerate(graph.nodes):
        seen: set[int] = set()
        for value in node.inputs:
            if value is None or id(value) not in ids or id(value) in seen:
                continue
            seen.add(id(value))
            source = device_of.get(id(value))
            if source is not None and node.device is not None and source != node.device:
                lines.append(dot_stmt("  ", f"{ids[id(value)]} -> n{index}", color=COLORS["cross_edge"],
                                   penwidth="1.6", label=value.type_str(), fontcolor=COLORS["cross_edge"]))
            else:
                lines.append(f"  {ids[id(value)]} -> n{index};")
    for index, value in enumerate(graph.outputs):
        if id(value) in ids:
            lines.append(f"  {ids[id(value)]} -> out{index};")

    # Participants of one collective: a dashed orange line between them (no layout constraint).
    for nodes in _collective_groups(graph.nodes).values():
        members = [position[id(n)] for n in nodes]
        for a, b in zip(members, members[1:]):
            lines.append(dot_stmt("  ", f"n{a} -> n{b}", dir="none", style="dashed", color=COLORS["comm_line"],
                               constraint="false", penwidth="1.5"))
    if legend:
        lines += _legend()
    lines.append("}")
    return "\n".join(lines) + "\n"


def _legend() -> list[str]:
    entries = [("input", INPUT_STYLE), ("variable", VARIABLE_STYLE),
               ("op", {"shape": "box", "style": "rounded,filled", "fillcolor": COLORS["op_fill"],
                       "color": COLORS["op_line"]}),
               ("graphdist op", _GRAPHDIST_OP), ("collective / transfer", COMM_STYLE), ("output", OUTPUT_STYLE)]
    lines = ["  subgraph cluster_legend {",
             dot_stmt("    ", "graph", label="legend", style="rounded", color="#ced4da", fontsize="9")]
    for index, (label, style) in enumerate(entries):
        lines.append(dot_stmt("    ", f"legend{index}", label=label, **dict(style, fontsize="8")))
    lines += [f"    legend{i} -> legend{i + 1} [style=invis];" for i in range(len(entries) - 1)]
    lines.append("  }")
    return lines


# ------------------------------------------------------------------ render
def dot_executable() -> str | None:
    """Path of Graphviz's ``dot`` (``$GRAPHDIST_DOT`` or on ``PATH``), or ``None``."""
    override = os.environ.get("GRAPHDIST_DOT", "").strip()
    if override:
        return override if os.path.isfile(override) and os.access(override, os.X_OK) else None
    return shutil.which("dot")


def render_dot(source: str, path: str | os.PathLike[str], *, format: str | None = None,  # noqa: A002
               timeout: float = 120.0) -> Path:
    """Writes DOT ``source`` to ``path`` as SVG, PNG or PDF (by suffix or ``format``).

    ``.dot``/``.gv`` write the text itself (no Graphviz needed).

    Raises:
        InvalidArgumentError: Unknown format.
        GraphdistError: ``dot`` is not installed (the message says how to
            install it), failed, or ran past ``timeout`` seconds.
        StorageError: ``path`` cannot be written (also an ``OSError``).
    """
    path = Path(path)
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt not in RENDER_FORMATS:
        raise InvalidArgumentError(
            f"cannot render to {str(path)!r}: unknown picture format {fmt or '(no suffix)'!r}; use a path ending "
            f"in .svg or .png (also .pdf, or .dot for the DOT text)")
    if fmt in ("dot", "gv"):
        try:
            _atomic_write(path, source.encode())
        except OSError as err:
            raise StorageError.from_os_error(err, os.path.abspath(path), "render") from None
        return path
    exe = dot_executable()
    if exe is None:
        raise GraphdistError(f"rendering {str(path)!r} needs Graphviz's 'dot' program, which was not found; "
                             f"{DOT_INSTALL_HINT}")
    try:
        result = subprocess.run([exe, f"-T{fmt}"], input=source.encode(), capture_output=True, timeout=timeout,
                                check=False)
    except subprocess.TimeoutExpired:
        raise GraphdistError(f"Graphviz 'dot' did not finish rendering {str(path)!r} within {timeout:g} s; the "
                             "graph may be too large: render a smaller stage or use plan.to_dot()") from None
    except OSError as err:
        raise GraphdistError(f"cannot run Graphviz 'dot' ({exe}): {err}; {DOT_INSTALL_HINT}") from err
    if result.returncode != 0 or not result.stdout:
        message = " ".join(result.stderr.decode(errors="replace").split())[:500]
        raise GraphdistError(f"Graphviz 'dot' failed rendering {str(path)!r} (exit {result.returncode}): "
                             f"{message or 'no output'}")
    try:
        _atomic_write(path, result.stdout)
    except OSError as err:
        raise StorageError.from_os_error(err, os.path.abspath(path), "render") from None
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    if not path.parent.is_dir():
        raise GraphdistError(f"cannot write {str(path)!r}: directory {str(path.parent)!r} does not exist")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; a picture is as readable as any new file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render_graph(graph: Graph, path: str | os.PathLike[str], **options: Any) -> Path:
    """Writes ``graph`` as a picture: SVG or PNG by ``path``'s suffix (``.dot``: the DOT text of
    :func:`graph_to_dot`, whose ``options`` these are). Needs Graphviz's ``dot`` program; raises
    :class:`~graphdist.errors.GraphdistError` with an install hint without it. Returns the path written.
    """
    return render_dot(graph_to_dot(graph, **options), path)


register_view("summary", graph_summary)
register_view("to_dot", graph_to_dot)
register_view("render", render_graph)
