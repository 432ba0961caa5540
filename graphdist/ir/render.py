"""Inspection views of graphs and plans: overview tables, Graphviz DOT, pictures.

* :func:`graph_overview`: the tables :meth:`Graph.summary` shows above the node
  listing: ops per device, collectives (grouped, with sizes and algorithm),
  variables and their placement, bytes communicated per step.
* :func:`plan_summary`: :meth:`Plan.summary`: devices, segments, communication
  tasks, variables.
* :func:`graph_to_dot` / :func:`plan_to_dot`: DOT text. Devices are clusters
  (``subgraph cluster_...``; the segments of a partitioned graph are nested
  clusters), collectives and transfers are highlighted (orange; the
  participants of one collective are joined by a dashed line), edges that
  cross devices are red, inputs / variables / outputs / constants have their
  own shapes.
* :func:`render_dot`: runs Graphviz's ``dot`` to write SVG or PNG (``.dot``
  writes the text). ``dot`` is a system program (Debian's ``graphviz``
  package), not a Python package; when it is missing the error says how to
  install it.

Sizes are static byte counts; "moved" is an estimate of the bytes a
collective sends between devices per step for ``n`` participants holding
``S`` bytes each: all-reduce ``2 (n-1) S`` (ring, hierarchical copy and
reduce-to-one all send that much), all-gather ``n (n-1) S``, transfer ``S``.
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
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.placement import VariableSpec, placement_of, variable_specs
from graphdist.ir.printer import format_table

__all__ = [
    "graph_overview",
    "plan_summary",
    "graph_to_dot",
    "plan_to_dot",
    "render_dot",
    "dot_executable",
    "RENDER_FORMATS",
    "DOT_INSTALL_HINT",
    "moved_bytes",
    "format_bytes",
]

#: File suffixes :func:`render_dot` understands (``dot``/``gv``: the DOT text itself).
RENDER_FORMATS = ("svg", "png", "pdf", "dot", "gv")

DOT_INSTALL_HINT = (
    "install Graphviz, which provides it (it is a system program, not on PyPI): "
    "`apt-get install -y graphviz` on Debian/Ubuntu (as root), `brew install graphviz` on macOS or "
    "`conda install graphviz`; or set GRAPHDIST_DOT to the path of a dot executable. Without it, "
    "to_dot() still gives the DOT text"
)

_FAST_LAYOUT_NODES = 300  # above this many nodes the DOT text asks dot for a quicker layout
_SMALL_CONSTANT = 4  # initializers with at most this many elements are not drawn (shown inline in summaries)

# Colours (Graphviz accepts #rrggbb).
_COLORS = {
    "op_fill": "#eef3fb", "op_line": "#7d8da1",
    "graphdist_fill": "#e9e1f7", "graphdist_line": "#7048b6",
    "comm_fill": "#ffd8a8", "comm_line": "#e8590c",
    "input_fill": "#d3f9d8", "input_line": "#2f9e44",
    "variable_fill": "#fff3bf", "variable_line": "#e0a800",
    "output_fill": "#c5f6fa", "output_line": "#0c8599",
    "const_fill": "#f1f3f5", "const_line": "#adb5bd",
    "cross_edge": "#e03131", "edge": "#8a94a6",
}
_CLUSTER_COLORS = ["#4a78c2", "#37b24d", "#ae3ec9", "#f59f00", "#1098ad", "#d6336c", "#74b816", "#7950f2"]


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
    return 2 * (n - 1) * nbytes  # AllReduce, ReduceScatter + AllGather, Broadcast-like


def _device_key(device: str | None) -> tuple:
    if device is None:
        return ("~", 0, "")
    kind, _, index = device.partition(":")
    return (kind, int(index) if index.isdigit() else 0, device)


def _join(items: Iterable[str]) -> str:
    return ", ".join(items) or "-"


def _top_ops(nodes: Iterable[Node], limit: int = 5) -> str:
    counts = Counter(n.qualified_op for n in nodes)
    text = ", ".join(f"{op} x{c}" for op, c in counts.most_common(limit))
    return text + (", ..." if len(counts) > limit else "")


def _collective_groups(nodes: Iterable[Node]) -> dict[str, list[Node]]:
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        if is_communication(node) and not is_runtime_check(node):
            groups.setdefault(node.attrs.get("group_key") or node.name, []).append(node)
    return groups


def _check_lines(checks: Iterable[tuple[str, dict[str, Any], Sequence[str]]]) -> str:
    """The ``run-time checks`` section: what each assertion bounds, and where it runs (``""`` if none)."""
    rows = [f"  {name}: {attrs.get('argument', '?')} of {attrs.get('op', '?')} in [{attrs.get('low', '?')}, "
            f"{attrs.get('high', '?')}) on {_join(devices)}" for name, attrs, devices in checks]
    return f"run-time checks ({len(rows)}):\n" + "\n".join(rows) if rows else ""


def _summed_lines(nodes: Iterable[Node]) -> str:
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


def _attr_text(attrs: dict[str, Any], skip: Sequence[str] = ("group_key", "group_size", "algorithm",
                                                             "reduce_op")) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()) if k not in skip and v is not None)


def _transfer_route(graph: Graph, source: Value, destination: str) -> str:
    """``cpu:0 -> cpu:1``: the source is the producer's device, a variable's
    device for a variable input, else ``host`` (a graph input).
    """
    origin = source.producer.device if source.producer is not None else None
    if origin is None:
        placement = placement_of(graph).get(source.name)
        origin = placement.devices[0] if placement is not None and placement.devices else None
    return f"{origin or 'host'} -> {destination}"


def _variables(graph: Graph) -> list[tuple[str, VariableSpec]]:
    return [(name, spec) for name, spec in variable_specs(graph) if isinstance(name, str)]


def _variable_rows(graph: Graph) -> list[list[str]]:
    by_name = {v.name: v for v in graph.inputs}
    updates = {uid: out_name for out_name, uid in graph.meta.get("variable_updates", [])}
    placements = placement_of(graph)
    produced = {out.name: node for node in graph.nodes for out in node.outputs}
    # A ZeRO-1 slot stored in per-replica parts has one input per local replica (and one write-back each).
    parts = {uid: [by_name[n] for n in layout["parts"] if n in by_name]
             for uid, layout in graph.meta.get("sharded_state", {}).items() if layout.get("parts")}
    written: dict[str, list[str]] = {}
    for out_name, uid in graph.meta.get("variable_updates", []):
        written.setdefault(uid, []).append(out_name)
    rows = []
    for name, spec in _variables(graph):
        value = by_name.get(name)
        inputs = [value] if value is not None else parts.get(spec.uid, [])
        if not inputs:
            continue
        uses = [use for v in inputs for use in v.uses]
        readers = sorted({n.device for n, _ in uses if n.device}, key=_device_key)
        via = any(n.op_type == "Transfer" for n, _ in uses)
        read_on = _join(readers) + (" (transfers)" if via else "")
        if spec.uid not in updates:
            updated = "-"
        else:
            nodes = [produced.get(out) for out in written.get(spec.uid, [updates[spec.uid]])]
            devices = sorted({n.device for n in nodes if n is not None and n.device}, key=_device_key)
            updated = _join(devices) if devices else "yes"
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
def graph_overview(graph: Graph) -> str:
    """Tables for :meth:`Graph.summary`: ops per device, collectives, variables, bytes per step.

    Returns ``""`` for a graph without placement, collectives or variables.
    """
    sections: list[str] = []
    placed = [n for n in graph.nodes if n.device is not None]
    if placed:
        by_device: dict[str, list[Node]] = {}
        for node in graph.nodes:
            by_device.setdefault(node.device or "(unplaced)", []).append(node)
        rows = []
        for device in sorted(by_device, key=_device_key):
            nodes = by_device[device]
            replicas = sorted({n.replica for n in nodes if n.replica is not None})
            segments = sorted({n.meta["segment"] for n in nodes if "segment" in n.meta})
            comm = sum(1 for n in nodes if is_communication(n) and not is_runtime_check(n))
            rows.append([device, _join(str(r) for r in replicas), str(len(nodes)), str(comm),
                         _join(segments), _top_ops([n for n in nodes if not is_communication(n)])])
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
            devices = _join(sorted({d.device for d in nodes if d.device}, key=_device_key))
            if first.op_type == "Transfer" and first.inputs and first.inputs[0] is not None:
                devices = _transfer_route(graph, first.inputs[0], devices)
            rows.append([_short(key), first.qualified_op, str(first.attrs.get("reduce_op", "-")),
                         str(first.attrs.get("algorithm", "-")), str(n), format_bytes(size), format_bytes(moved),
                         devices, _attr_text(first.attrs)])
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
    summed = _summed_lines(graph.nodes)
    if summed:
        sections.append(summed)
    checks = _check_lines((n.name, n.attrs, [n.device] if n.device else []) for n in graph.nodes
                          if is_runtime_check(n))
    if checks:
        sections.append(checks)
    variables = _variable_rows(graph)
    if variables:
        sections.append("variables:\n" + format_table(
            ["variable", "type", "bytes", "kind", "placement", "read on", "updated on"], variables))
    return "\n".join(sections)


# ------------------------------------------------------------- plan tables
def plan_summary(plan: Any) -> str:
    """The text of :meth:`Plan.summary`.

    Sections: devices (segments, nodes, communication per device), segments
    (ops, inputs, outputs), communication tasks (op, algorithm, participants,
    sizes, bytes moved), variables and their placement, totals per step.
    """
    graph: Graph = plan.graph
    devices = list(plan.devices)
    backend = f"  backend={plan.backend_name}" if getattr(plan, "backend_name", None) else ""
    lines = [f"Plan {graph.name!r}: {len(plan.segments)} segment(s) on {_join(devices)}{backend}"]

    task_rows = []
    per_device_sent: Counter[str] = Counter()
    per_device_tasks: Counter[str] = Counter()
    total_payload = total_moved = 0
    for task in plan.collectives:
        value = plan.graph_value(task.inputs[0]) if task.inputs else None
        size = value.nbytes if value is not None else None
        n = len(task.devices)
        moved = moved_bytes(task.op, n, size, task.attrs)
        if size is not None:
            total_payload += size * n
            total_moved += moved or 0
            share = (moved or 0) // max(n, 1)
            for device in task.devices:
                per_device_sent[device] += share
        for device in set(task.devices):
            per_device_tasks[device] += 1
        devices_text = _join(task.devices)
        if task.op == "Transfer" and value is not None:
            devices_text = _transfer_route(graph, value, devices_text)
        task_rows.append([task.name, task.op, str(task.attrs.get("algorithm", "-")),
                          str(task.attrs.get("reduce_op", "-")), str(n), format_bytes(size), format_bytes(moved),
                          devices_text, _attr_text(task.attrs)])

    device_rows = []
    for device in devices:
        segs = [s for s in plan.segments if s.device == device]
        nodes = [n for s in segs for n in s.graph.nodes]
        device_rows.append([device, _join(s.name for s in segs), str(len(nodes)), str(per_device_tasks[device]),
                            format_bytes(per_device_sent[device]) if plan.collectives else "-", _top_ops(nodes, 4)])
    lines.append("devices:")
    lines.append(format_table(["device", "segments", "nodes", "comm tasks", "sent/step (est.)", "top ops"],
                              device_rows))

    seg_rows = []
    for seg in plan.segments:
        seg_rows.append([seg.name, seg.device, str(len(seg.graph.nodes)), str(len(seg.inputs)),
                         str(len(seg.outputs)), _top_ops(seg.graph.nodes, 6)])
    lines.append("segments (execution order):")
    lines.append(format_table(["segment", "device", "nodes", "inputs", "outputs", "ops"], seg_rows))

    if task_rows:
        lines.append("communication:")
        lines.append(format_table(["task", "op", "algorithm", "reduce", "participants", "bytes each",
                                   "moved (est.)", "devices", "other attrs"], task_rows))
        lines.append(f"  per step: {len(task_rows)} task(s), {format_bytes(total_payload)} into collectives "
                     f"(all participants), ~{format_bytes(total_moved)} sent between devices (estimate)")
    else:
        lines.append("communication: none")
    summed = _summed_lines(graph.nodes)
    if summed:
        lines.append(summed)
    checks = _check_lines((task.name, task.attrs, task.devices) for task in plan.checks)
    if checks:
        lines.append(checks)
    variables = _variable_rows(graph)
    if variables:
        inputs = {v.name: v for v in graph.inputs}
        var_bytes = sum(inputs[name].nbytes or 0 for name, _ in _variables(graph) if name in inputs)
        lines.append(f"variables ({len(variables)}, {format_bytes(var_bytes)}):")
        lines.append(format_table(["variable", "type", "bytes", "kind", "placement", "read on", "updated on"],
                                  variables))
    return "\n".join(lines)


# --------------------------------------------------------------------- DOT
def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**attrs: Any) -> str:
    return "[" + ", ".join(f"{k}={_quote(v)}" for k, v in attrs.items() if v is not None) + "]"


def _stmt(indent: str, ident: str, **attrs: Any) -> str:
    return f"{indent}{ident} {_attrs(**attrs)};"


def _short_type(value: Value | None) -> str:
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
        return f"{head}\n{_short_type(node.outputs[0] if node.outputs else None)}\n{tail}"
    if node.domain and node.domain != GRAPHDIST_DOMAIN:
        head = node.qualified_op
    out = node.outputs[0] if node.outputs else None
    extra = f" (+{len(node.outputs) - 1})" if len(node.outputs) > 1 else ""
    return f"{head}\n{_short_type(out)}{extra}"


_INPUT = {"shape": "invhouse", "style": "filled", "fillcolor": _COLORS["input_fill"], "color": _COLORS["input_line"]}
_VARIABLE = {"shape": "cylinder", "style": "filled", "fillcolor": _COLORS["variable_fill"],
             "color": _COLORS["variable_line"]}
_UPDATE = dict(_VARIABLE, style="filled,dashed")
_OUTPUT = {"shape": "house", "style": "filled", "fillcolor": _COLORS["output_fill"], "color": _COLORS["output_line"]}
_CONST = {"shape": "note", "style": "filled", "fillcolor": _COLORS["const_fill"], "color": _COLORS["const_line"],
          "fontsize": "8"}
_COMM = {"shape": "box", "style": "rounded,filled,bold", "fillcolor": _COLORS["comm_fill"],
         "color": _COLORS["comm_line"], "penwidth": "2"}
_GRAPHDIST_OP = {"shape": "box", "style": "rounded,filled", "fillcolor": _COLORS["graphdist_fill"],
                 "color": _COLORS["graphdist_line"]}


def _style_for(node: Node) -> dict[str, Any]:
    if is_communication(node):
        return dict(_COMM)
    if node.domain == GRAPHDIST_DOMAIN:
        return dict(_GRAPHDIST_OP)
    return {}


def _header(name: str, label: str, **graph_attrs: Any) -> list[str]:
    return [
        f"digraph {_quote(name)} {{",
        _stmt("  ", "graph", label=label, labelloc="t", fontname="Helvetica", fontsize="12", newrank="true",
              **graph_attrs),
        _stmt("  ", "node", shape="box", style="rounded,filled", fillcolor=_COLORS["op_fill"],
              color=_COLORS["op_line"], fontname="Helvetica", fontsize="9", margin="0.08,0.03", height="0.3"),
        _stmt("  ", "edge", color=_COLORS["edge"], arrowsize="0.6", fontname="Helvetica", fontsize="8"),
    ]


def _cluster_open(indent: str, ident: str, label: str, color: str) -> list[str]:
    return [f"{indent}subgraph {ident} {{",
            _stmt(indent + "  ", "graph", label=label, style="rounded,filled", fillcolor="#fbfcfe", color=color,
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
    lines = _header(graph.name, title or f"{graph.name} ({graph.stage})", rankdir=rankdir, nodesep="0.25",
                    ranksep="0.35", **fast)
    variable_inputs = {name for name, _ in _variables(graph)}
    names_by_uid = {spec.uid: f"{spec.name}:0" for _, spec in _variables(graph)}
    update_outputs = {out: names_by_uid.get(uid, out) for out, uid in graph.meta.get("variable_updates", [])}

    for index, value in enumerate(graph.inputs):
        ids[id(value)] = f"in{index}"
        style = _VARIABLE if value.name in variable_inputs else _INPUT
        lines.append(_stmt("  ", f"in{index}", label=f"{value.name}\n{value.type_str()}", **style))
    if constants:
        for index, value in enumerate(graph.initializers.values()):
            if value.const_value is not None and np.size(value.const_value) > _SMALL_CONSTANT:
                ids[id(value)] = f"k{index}"
                lines.append(_stmt("  ", f"k{index}", label=f"{value.name}\n{value.type_str()}", **_CONST))

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
        return _stmt(indent, f"n{index}", label=_node_label(node), tooltip=f"{node.name}: {node!r}",
                     **_style_for(node))

    for cluster_index, device in enumerate(sorted(tree, key=_device_key)):
        segments = tree[device]
        if device is None:
            lines += [node_line(i, n, "  ") for nodes in segments.values() for i, n in nodes]
            continue
        color = _CLUSTER_COLORS[cluster_index % len(_CLUSTER_COLORS)]
        lines += _cluster_open("  ", f"cluster_{cluster_index}", device, color)
        for seg_index, (segment, nodes) in enumerate(sorted(segments.items(), key=lambda kv: kv[0] or "")):
            if segment is None:
                lines += [node_line(i, n, "    ") for i, n in nodes]
                continue
            lines.append(f"    subgraph cluster_{cluster_index}_{seg_index} {{")
            lines.append(_stmt("      ", "graph", label=f"segment {segment}", style="dashed,rounded", color=color,
                               fontsize="9", fontcolor=color))
            lines += [node_line(i, n, "      ") for i, n in nodes]
            lines.append("    }")
        lines.append("  }")

    for index, value in enumerate(graph.outputs):
        variable = update_outputs.get(value.name)
        if variable is not None:
            lines.append(_stmt("  ", f"out{index}", label=f"update {variable}\n{value.type_str()}", **_UPDATE))
        else:
            lines.append(_stmt("  ", f"out{index}", label=f"output {index}\n{value.type_str()}", **_OUTPUT))

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
                lines.append(_stmt("  ", f"{ids[id(value)]} -> n{index}", color=_COLORS["cross_edge"],
                                   penwidth="1.6", label=value.type_str(), fontcolor=_COLORS["cross_edge"]))
            else:
                lines.append(f"  {ids[id(value)]} -> n{index};")
    for index, value in enumerate(graph.outputs):
        if id(value) in ids:
            lines.append(f"  {ids[id(value)]} -> out{index};")

    # Participants of one collective: a dashed orange line between them (no layout constraint).
    for nodes in _collective_groups(graph.nodes).values():
        members = [position[id(n)] for n in nodes]
        for a, b in zip(members, members[1:]):
            lines.append(_stmt("  ", f"n{a} -> n{b}", dir="none", style="dashed", color=_COLORS["comm_line"],
                               constraint="false", penwidth="1.5"))
    if legend:
        lines += _legend()
    lines.append("}")
    return "\n".join(lines) + "\n"


def _legend() -> list[str]:
    entries = [("input", _INPUT), ("variable", _VARIABLE),
               ("op", {"shape": "box", "style": "rounded,filled", "fillcolor": _COLORS["op_fill"],
                       "color": _COLORS["op_line"]}),
               ("graphdist op", _GRAPHDIST_OP), ("collective / transfer", _COMM), ("output", _OUTPUT)]
    lines = ["  subgraph cluster_legend {",
             _stmt("    ", "graph", label="legend", style="rounded", color="#ced4da", fontsize="9")]
    for index, (label, style) in enumerate(entries):
        lines.append(_stmt("    ", f"legend{index}", label=label, **dict(style, fontsize="8")))
    lines += [f"    legend{i} -> legend{i + 1} [style=invis];" for i in range(len(entries) - 1)]
    lines.append("  }")
    return lines


def plan_to_dot(plan: Any, *, title: str | None = None) -> str:
    """DOT text of a plan: segments in device clusters, communication tasks
    between them (highlighted), the plan's inputs, variables and outputs.
    Edges carry the values (or their count) and bytes that flow along them;
    edges between devices are red.
    """
    graph: Graph = plan.graph
    values = {v.name: v for v in graph.values()}
    variable_inputs = {name for name, _ in _variables(graph)}
    update_outputs = {name for name, _ in graph.meta.get("variable_updates", [])}
    producer: dict[str, str] = {}
    label = title or f"plan {graph.name}: {len(plan.segments)} segment(s), {plan.describe_tasks()}"
    lines = _header(f"plan {graph.name}", label, rankdir="TB", nodesep="0.3", ranksep="0.45")
    inputs = [n for n in plan.input_names if n not in variable_inputs]
    variables = [n for n in plan.input_names if n in variable_inputs]
    if inputs:
        text = "inputs\n" + "\n".join(f"{n}: {_short_type(values.get(n))}" for n in inputs[:8])
        text += f"\n... {len(inputs) - 8} more" if len(inputs) > 8 else ""
        lines.append(_stmt("  ", "inputs", label=text, **_INPUT))
        producer.update({n: "inputs" for n in inputs})
    if variables:
        total = sum(values[n].nbytes or 0 for n in variables if n in values)
        lines.append(_stmt("  ", "variables", label=f"variables\n{len(variables)} tensors, {format_bytes(total)}",
                           **_VARIABLE))
        producer.update({n: "variables" for n in variables})

    by_device: dict[str, list[tuple[int, Any]]] = {}
    for index, seg in enumerate(plan.segments):
        by_device.setdefault(seg.device, []).append((index, seg))
        producer.update({name: f"s{index}" for name in seg.outputs})
    for index, task in enumerate(plan.comms):
        producer.update({name: f"c{index}" for name in task.outputs})
    for cluster_index, device in enumerate(sorted(by_device, key=_device_key)):
        lines += _cluster_open("  ", f"cluster_{cluster_index}", device,
                               _CLUSTER_COLORS[cluster_index % len(_CLUSTER_COLORS)])
        for index, seg in by_device[device]:
            lines.append(_stmt("    ", f"s{index}",
                               label=f"{seg.name}\n{len(seg.graph.nodes)} nodes\n{_top_ops(seg.graph.nodes, 3)}"))
        lines.append("  }")
    for index, task in enumerate(plan.comms):
        value = values.get(task.inputs[0]) if task.inputs else None
        size = value.nbytes if value is not None else None
        detail = " ".join(str(task.attrs[k]) for k in ("reduce_op", "algorithm") if k in task.attrs)
        text = f"{task.op} {detail}".strip() + f"\n{task.name}\n{len(task.devices)} x {format_bytes(size)}"
        lines.append(_stmt("  ", f"c{index}", label=text, **_COMM))
    lines.append(_stmt("  ", "outputs", label=f"outputs ({len(plan.output_names) - len(update_outputs)})",
                       **_OUTPUT))
    if update_outputs:
        lines.append(_stmt("  ", "updates", label=f"variable updates ({len(update_outputs)})", **_UPDATE))

    flows: dict[tuple[str, str], list[str]] = {}

    def flow(names: Iterable[str], target: str) -> None:
        for name in names:
            source = producer.get(name)
            if source and name not in flows.setdefault((source, target), []):
                flows[(source, target)].append(name)

    for index, seg in enumerate(plan.segments):
        flow(seg.inputs, f"s{index}")
    for index, task in enumerate(plan.comms):
        flow(task.inputs, f"c{index}")
    flow([n for n in plan.output_names if n not in update_outputs], "outputs")
    flow([n for n in plan.output_names if n in update_outputs], "updates")
    device_of = {f"s{i}": s.device for i, s in enumerate(plan.segments)}
    for (source, target), names in flows.items():
        size = sum(values[n].nbytes or 0 for n in names if n in values)
        text = f"{len(names)} values, {format_bytes(size)}" if len(names) > 1 else f"{names[0]}\n{format_bytes(size)}"
        cross = source in device_of and target in device_of and device_of[source] != device_of[target]
        style = {"color": _COLORS["cross_edge"], "fontcolor": _COLORS["cross_edge"]} if cross else {}
        lines.append(_stmt("  ", f"{source} -> {target}", label=text, **style))
    lines.append("}")
    return "\n".join(lines) + "\n"



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
