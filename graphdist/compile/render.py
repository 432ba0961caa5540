"""Inspection views of compiled plans: the text of :meth:`Plan.summary` and the DOT text of :meth:`Plan.to_dot`.

* :func:`plan_summary`: devices, segments, communication tasks, variables.
* :func:`plan_to_dot`: segments in device clusters, communication tasks
  between them (highlighted), edges that cross devices red.

Built from the graph views' pieces in :mod:`graphdist.ir.render` (tables,
byte estimates, DOT statements and styles); a picture is written with
:func:`graphdist.ir.render.render_dot`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from graphdist.ir.graph import Graph
from graphdist.ir.printer import format_table
from graphdist.ir.render import (
    CLUSTER_COLORS,
    COLORS,
    COMM_STYLE,
    INPUT_STYLE,
    OUTPUT_STYLE,
    UPDATE_STYLE,
    VARIABLE_STYLE,
    attr_text,
    check_lines,
    device_key,
    dot_cluster_open,
    dot_header,
    dot_stmt,
    format_bytes,
    graph_variables,
    join_items,
    moved_bytes,
    short_type,
    summed_lines,
    top_ops,
    transfer_route,
    variable_rows,
)

if TYPE_CHECKING:
    from graphdist.compile.plan import Plan

__all__ = ["plan_summary", "plan_to_dot"]


def plan_summary(plan: Plan) -> str:
    """The text of :meth:`Plan.summary`.

    Sections: devices (segments, nodes, communication per device), segments
    (ops, inputs, outputs), communication tasks (op, algorithm, participants,
    sizes, bytes moved), variables and their placement, totals per step.
    """
    graph: Graph = plan.graph
    devices = list(plan.devices)
    backend = f"  backend={plan.backend_name}" if getattr(plan, "backend_name", None) else ""
    lines = [f"Plan {graph.name!r}: {len(plan.segments)} segment(s) on {join_items(devices)}{backend}"]

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
        devices_text = join_items(task.devices)
        if task.op == "Transfer" and value is not None:
            devices_text = transfer_route(graph, value, devices_text)
        task_rows.append([task.name, task.op, str(task.attrs.get("algorithm", "-")),
                          str(task.attrs.get("reduce_op", "-")), str(n), format_bytes(size), format_bytes(moved),
                          devices_text, attr_text(task.attrs)])

    device_rows = []
    for device in devices:
        segs = [s for s in plan.segments if s.device == device]
        nodes = [n for s in segs for n in s.graph.nodes]
        device_rows.append([device, join_items(s.name for s in segs), str(len(nodes)), str(per_device_tasks[device]),
                            format_bytes(per_device_sent[device]) if plan.collectives else "-", top_ops(nodes, 4)])
    lines.append("devices:")
    lines.append(format_table(["device", "segments", "nodes", "comm tasks", "sent/step (est.)", "top ops"],
                              device_rows))

    seg_rows = []
    for seg in plan.segments:
        seg_rows.append([seg.name, seg.device, str(len(seg.graph.nodes)), str(len(seg.inputs)),
                         str(len(seg.outputs)), top_ops(seg.graph.nodes, 6)])
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
    summed = summed_lines(graph.nodes)
    if summed:
        lines.append(summed)
    checks = check_lines((task.name, task.attrs, task.devices) for task in plan.checks)
    if checks:
        lines.append(checks)
    variables = variable_rows(graph)
    if variables:
        inputs = {v.name: v for v in graph.inputs}
        var_bytes = sum(inputs[name].nbytes or 0 for name, _ in graph_variables(graph) if name in inputs)
        lines.append(f"variables ({len(variables)}, {format_bytes(var_bytes)}):")
        lines.append(format_table(["variable", "type", "bytes", "kind", "placement", "read on", "updated on"],
                                  variables))
    return "\n".join(lines)




def plan_to_dot(plan: Plan, *, title: str | None = None) -> str:
    """DOT text of a plan: segments in device clusters, communication tasks
    between them (highlighted), the plan's inputs, variables and outputs.
    Edges carry the values (or their count) and bytes that flow along them;
    edges between devices are red.
    """
    graph: Graph = plan.graph
    values = {v.name: v for v in graph.values()}
    variable_inputs = {name for name, _ in graph_variables(graph)}
    update_outputs = {name for name, _ in graph.meta.variable_updates}
    producer: dict[str, str] = {}
    label = title or f"plan {graph.name}: {len(plan.segments)} segment(s), {plan.describe_tasks()}"
    lines = dot_header(f"plan {graph.name}", label, rankdir="TB", nodesep="0.3", ranksep="0.45")
    inputs = [n for n in plan.input_names if n not in variable_inputs]
    variables = [n for n in plan.input_names if n in variable_inputs]
    if inputs:
        text = "inputs\n" + "\n".join(f"{n}: {short_type(values.get(n))}" for n in inputs[:8])
        text += f"\n... {len(inputs) - 8} more" if len(inputs) > 8 else ""
        lines.append(dot_stmt("  ", "inputs", label=text, **INPUT_STYLE))
        producer.update({n: "inputs" for n in inputs})
    if variables:
        total = sum(values[n].nbytes or 0 for n in variables if n in values)
        lines.append(dot_stmt("  ", "variables", label=f"variables\n{len(variables)} tensors, {format_bytes(total)}",
                           **VARIABLE_STYLE))
        producer.update({n: "variables" for n in variables})

    by_device: dict[str, list[tuple[int, Any]]] = {}
    for index, seg in enumerate(plan.segments):
        by_device.setdefault(seg.device, []).append((index, seg))
        producer.update({name: f"s{index}" for name in seg.outputs})
    for index, task in enumerate(plan.comms):
        producer.update({name: f"c{index}" for name in task.outputs})
    for cluster_index, device in enumerate(sorted(by_device, key=device_key)):
        lines += dot_cluster_open("  ", f"cluster_{cluster_index}", device,
                               CLUSTER_COLORS[cluster_index % len(CLUSTER_COLORS)])
        for index, seg in by_device[device]:
            lines.append(dot_stmt("    ", f"s{index}",
                               label=f"{seg.name}\n{len(seg.graph.nodes)} nodes\n{top_ops(seg.graph.nodes, 3)}"))
        lines.append("  }")
    for index, task in enumerate(plan.comms):
        value = values.get(task.inputs[0]) if task.inputs else None
        size = value.nbytes if value is not None else None
        detail = " ".join(str(task.attrs[k]) for k in ("reduce_op", "algorithm") if k in task.attrs)
        text = f"{task.op} {detail}".strip() + f"\n{task.name}\n{len(task.devices)} x {format_bytes(size)}"
        lines.append(dot_stmt("  ", f"c{index}", label=text, **COMM_STYLE))
    lines.append(dot_stmt("  ", "outputs", label=f"outputs ({len(plan.output_names) - len(update_outputs)})",
                       **OUTPUT_STYLE))
    if update_outputs:
        lines.append(dot_stmt("  ", "updates", label=f"variable updates ({len(update_outputs)})", **UPDATE_STYLE))

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
        style = {"color": COLORS["cross_edge"], "fontcolor": COLORS["cross_edge"]} if cross else {}
        lines.append(dot_stmt("  ", f"{source} -> {target}", label=text, **style))
    lines.append("}")
    return "\n".join(lines) + "\n"
