"""Differences between two graphs, and what each pass of a pipeline changed.

Passes keep node and value names (``Graph.copy`` preserves them and new nodes
get fresh unique names), so two stages of one step are compared by node name:

* *added*: a node name only in the later graph;
* *removed*: a node name only in the earlier graph;
* *changed*: the same name (and op) with other inputs, attributes, output
  types or placement (device, replica, segment);
* a name whose op changed counts as removed and added.

Graph inputs, outputs and initializers are compared by name as well.

:func:`diff_graphs` compares two graphs (``traced`` vs ``rewritten``);
:func:`pipeline_diffs` runs a list of passes one by one and records a
:class:`GraphDiff` per pass; :func:`strategy_pass_diffs` does that for a
``ConcreteFunction``'s whole pipeline (partitioning included), from its traced
graph (``graphdist inspect ... --stage diff``)::

    concrete = step.get_concrete_function(x)
    print(gd.compile.diff.diff_graphs(concrete.graph("traced"), concrete.graph("rewritten")))
    print(gd.compile.diff.strategy_pass_diffs(concrete))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphdist.ir.graph import Graph, Node
from graphdist.ir.printer import format_table

__all__ = ["NodeChange", "GraphDiff", "PassDiff", "PipelineDiff", "diff_graphs", "pipeline_diffs",
           "strategy_pass_diffs"]


@dataclass
class NodeChange:
    """A node present in both graphs whose definition differs.

    Attributes:
        name: Node name.
        op: Qualified op (``MatMul``, ``graphdist.AllReduce``).
        aspects: What changed, e.g. ``["device None -> cpu:0", "attrs +algorithm"]``.
    """

    name: str
    op: str
    aspects: list[str]


@dataclass
class GraphDiff:
    """What distinguishes graph ``after`` from graph ``before``.

    Attributes:
        before: ``"name (stage)"`` of the earlier graph.
        after: ``"name (stage)"`` of the later graph.
        nodes_before: Node count of the earlier graph.
        nodes_after: Node count of the later graph.
        added: Nodes only in ``after`` (in its order), as ``(name, op)``.
        removed: Nodes only in ``before``, as ``(name, op)``.
        changed: Nodes in both whose definition differs.
        inputs_added, inputs_removed, outputs_added, outputs_removed,
        initializers_added, initializers_removed: Value names.
    """

    before: str
    after: str
    nodes_before: int
    nodes_after: int
    added: list[tuple[str, str]] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)
    changed: list[NodeChange] = field(default_factory=list)
    inputs_added: list[str] = field(default_factory=list)
    inputs_removed: list[str] = field(default_factory=list)
    outputs_added: list[str] = field(default_factory=list)
    outputs_removed: list[str] = field(default_factory=list)
    initializers_added: list[str] = field(default_factory=list)
    initializers_removed: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when the graphs do not differ (by the rules in the module doc)."""
        return not (self.added or self.removed or self.changed or self.inputs_added or self.inputs_removed
                    or self.outputs_added or self.outputs_removed or self.initializers_added
                    or self.initializers_removed)

    def by_op(self) -> dict[str, dict[str, int]]:
        """``{op: {"added": n, "removed": n, "changed": n}}`` sorted by total count."""
        table: dict[str, Counter[str]] = {}
        for _, op in self.added:
            table.setdefault(op, Counter())["added"] += 1
        for _, op in self.removed:
            table.setdefault(op, Counter())["removed"] += 1
        for change in self.changed:
            table.setdefault(change.op, Counter())["changed"] += 1
        ordered = sorted(table.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
        return {op: {k: counts[k] for k in ("added", "removed", "changed")} for op, counts in ordered}

    def aspects(self) -> Counter[str]:
        """How many changed nodes changed in each aspect (``device``, ``attrs``, ``inputs``...)."""
        return Counter(aspect.split()[0] for change in self.changed for aspect in change.aspects)

    def brief(self, limit: int = 4) -> str:
        """One line: ``+AllReduce x10, -Gradient x2, ~MatMul x4 (device)``."""
        parts = []
        for kind, sign in (("added", "+"), ("removed", "-")):
            counts = Counter(op for _, op in getattr(self, kind))
            parts += [f"{sign}{op} x{n}" for op, n in counts.most_common(limit)]
            if len(counts) > limit:
                parts.append(f"{sign}{len(counts) - limit} more op types")
        if self.changed:
            details: dict[str, set[str]] = {}
            for change in self.changed:
                for aspect in change.aspects:
                    details.setdefault(aspect.split()[0], set()).add(aspect)
            what = ", ".join(next(iter(details[kind])) if len(details[kind]) == 1 else kind
                             for kind, _ in self.aspects().most_common(3))
            parts.append(f"~{len(self.changed)} node(s) ({what})")
        for label, names in (("inputs", self.inputs_added), ("outputs", self.outputs_added)):
            if names:
                parts.append(f"+{len(names)} {label}")
        for label, names in (("inputs", self.inputs_removed), ("outputs", self.outputs_removed)):
            if names:
                parts.append(f"-{len(names)} {label}")
        return ", ".join(parts) or "no change"

    def format(self, max_names: int = 6, max_ops: int = 12) -> str:
        """Readable text: header, a table per op type (at most ``max_ops`` rows),
        then the names of what changed (at most ``max_names`` per list).
        """
        lines = [f"diff {self.before} -> {self.after}: nodes {self.nodes_before} -> {self.nodes_after} "
                 f"(+{len(self.added)} added, -{len(self.removed)} removed, ~{len(self.changed)} changed)"]
        if self.empty:
            lines.append("  (no change)")
            return "\n".join(lines)
        rows = [[op, _count(c["added"], "+"), _count(c["removed"], "-"), _count(c["changed"], "~")]
                for op, c in self.by_op().items()]
        if len(rows) > max_ops:
            rest = rows[max_ops - 1:]
            total = [sum(int(r[i][1:] or 0) for r in rest) for i in (1, 2, 3)]
            rows = rows[:max_ops - 1] + [[f"({len(rest)} more op types)", _count(total[0], "+"),
                                          _count(total[1], "-"), _count(total[2], "~")]]
        if rows:
            lines.append(format_table(["op", "added", "removed", "changed"], rows))
        for label, items in (("added", [n for n, _ in self.added]), ("removed", [n for n, _ in self.removed])):
            if items:
                lines.append(f"  {label}: {_names(items, max_names)}")
        if self.changed:
            aspects = ", ".join(f"{a} x{n}" for a, n in self.aspects().most_common())
            lines.append(f"  changed ({aspects}):")
            for change in self.changed[:max_names]:
                lines.append(f"    {change.name} ({change.op}): {'; '.join(change.aspects)}")
            if len(self.changed) > max_names:
                lines.append(f"    ... {len(self.changed) - max_names} more")
        for label, names in (("inputs added", self.inputs_added), ("inputs removed", self.inputs_removed),
                             ("outputs added", self.outputs_added), ("outputs removed", self.outputs_removed),
                             ("initializers added", self.initializers_added),
                             ("initializers removed", self.initializers_removed)):
            if names:
                lines.append(f"  {label}: {_names(names, max_names)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _count(n: int, sign: str) -> str:
    return f"{sign}{n}" if n else ""


def _names(names: Sequence[str], limit: int) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _label(graph: Graph) -> str:
    return f"{graph.name!r} ({graph.stage})"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and \
            a.dtype == b.dtype and bool(np.array_equal(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - exotic attribute values: compare by identity
        return a is b


def _node_aspects(old: Node, new: Node) -> list[str]:
    aspects = []
    if old.device != new.device:
        aspects.append(f"device {old.device} -> {new.device}")
    if old.replica != new.replica:
        aspects.append(f"replica {old.replica} -> {new.replica}")
    if old.meta.get("segment") != new.meta.get("segment"):
        aspects.append(f"segment {old.meta.get('segment')} -> {new.meta.get('segment')}")
    added = sorted(set(new.attrs) - set(old.attrs))
    removed = sorted(set(old.attrs) - set(new.attrs))
    modified = sorted(k for k in set(old.attrs) & set(new.attrs) if not _same(old.attrs[k], new.attrs[k]))
    if added or removed or modified:
        parts = [f"+{k}" for k in added] + [f"-{k}" for k in removed] + [f"{k}" for k in modified]
        aspects.append("attrs " + " ".join(parts))
    old_inputs = [None if v is None else v.name for v in old.inputs]
    new_inputs = [None if v is None else v.name for v in new.inputs]
    if old_inputs != new_inputs:
        swapped = [f"{a} -> {b}" for a, b in zip(old_inputs, new_inputs) if a != b]
        if len(old_inputs) != len(new_inputs):
            swapped.append(f"{len(old_inputs)} -> {len(new_inputs)} inputs")
        aspects.append("inputs " + ", ".join(swapped[:3]) + (" ..." if len(swapped) > 3 else ""))
    old_types = [v.type_str() for v in old.outputs]
    new_types = [v.type_str() for v in new.outputs]
    if old_types != new_types:
        aspects.append(f"outputs {', '.join(old_types)} -> {', '.join(new_types)}")
    return aspects


def _name_diff(before: Sequence[str], after: Sequence[str]) -> tuple[list[str], list[str]]:
    old, new = set(before), set(after)
    return [n for n in after if n not in old], [n for n in before if n not in new]


def diff_graphs(before: Graph, after: Graph) -> GraphDiff:
    """Compares two graphs by node name (see the module doc).

    Args:
        before: The earlier graph (e.g. ``concrete.graph("traced")``).
        after: The later graph (e.g. ``concrete.graph("rewritten")``).

    Returns:
        A :class:`GraphDiff`; ``str()`` of it is a readable report.
    """
    old_nodes = {n.name: n for n in before.nodes}
    new_nodes = {n.name: n for n in after.nodes}
    diff = GraphDiff(_label(before), _label(after), len(before.nodes), len(after.nodes))
    for node in after.nodes:
        old = old_nodes.get(node.name)
        if old is None or old.qualified_op != node.qualified_op:
            diff.added.append((node.name, node.qualified_op))
        else:
            aspects = _node_aspects(old, node)
            if aspects:
                diff.changed.append(NodeChange(node.name, node.qualified_op, aspects))
    for node in before.nodes:
        new = new_nodes.get(node.name)
        if new is None or new.qualified_op != node.qualified_op:
            diff.removed.append((node.name, node.qualified_op))
    diff.inputs_added, diff.inputs_removed = _name_diff([v.name for v in before.inputs],
                                                        [v.name for v in after.inputs])
    diff.outputs_added, diff.outputs_removed = _name_diff([v.name for v in before.outputs],
                                                          [v.name for v in after.outputs])
    diff.initializers_added, diff.initializers_removed = _name_diff(list(before.initializers),
                                                                    list(after.initializers))
    return diff


@dataclass
class PassDiff:
    """What one pass did.

    Attributes:
        index: Position in the pipeline (1-based).
        name: The pass's name.
        modified: What the pass reported.
        stage: The graph's stage after the pass.
        diff: The graph before vs after the pass.
    """

    index: int
    name: str
    modified: bool
    stage: str
    diff: GraphDiff


@dataclass
class PipelineDiff:
    """Per-pass diffs of a pipeline run, plus the overall diff.

    Attributes:
        title: What was run (strategy, devices, step).
        passes: One :class:`PassDiff` per pass, in order.
        overall: First graph vs final graph.
        final: The final graph.
    """

    title: str
    passes: list[PassDiff]
    overall: GraphDiff
    final: Graph

    def format(self, details: bool = True, max_names: int = 6) -> str:
        """A table of the passes (nodes before/after, added/removed/changed, a
        one-line summary), then each modifying pass's diff when ``details``.
        """
        rows = []
        for p in self.passes:
            d = p.diff
            rows.append([str(p.index), p.name, f"{d.nodes_before} -> {d.nodes_after}", _count(len(d.added), "+"),
                         _count(len(d.removed), "-"), _count(len(d.changed), "~"), d.brief(3)])
        lines = [self.title,
                 format_table(["#", "pass", "nodes", "added", "removed", "changed", "what changed"], rows),
                 f"overall: {self.overall.brief(6)}"]
        if details:
            for p in self.passes:
                if p.diff.empty:
                    continue
                body = p.diff.format(max_names).splitlines()
                lines.append("")
                lines.append(f"[{p.index}] {p.name} (stage {p.stage}): {body[0].split(': ', 1)[1]}")
                lines += body[1:]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def pipeline_diffs(graph: Graph, passes: Sequence[Any], ctx: Any = None, *, title: str | None = None
                   ) -> PipelineDiff:
    """Runs ``passes`` on a copy of ``graph`` one by one and diffs each step.

    Args:
        graph: Input graph (not modified).
        passes: Pass instances (``graphdist.passes.base.PassBase``).
        ctx: A ``graphdist.passes.base.PassContext`` (default: one on ``cpu:0``, no dumps).
        title: First line of the report.
    """
    from graphdist.passes.base import PassContext, PassManager

    ctx = ctx or PassContext(dump_dir=None)
    start = graph.copy()
    snapshot = [graph.copy()]
    diffs: list[PassDiff] = []

    def record(pass_: Any, result: Any) -> None:
        diffs.append(PassDiff(len(diffs) + 1, pass_.name, bool(result.modified), result.graph.stage,
                              diff_graphs(snapshot[0], result.graph)))
        snapshot[0] = result.graph.copy()

    final = PassManager(list(passes)).run(start, ctx, on_pass=record).graph
    title = title or f"{len(diffs)} pass(es) on {graph.name!r}"
    return PipelineDiff(title, diffs, diff_graphs(graph, final), final)


def strategy_pass_diffs(concrete: Any) -> PipelineDiff:
    """Per-pass diffs of a ``ConcreteFunction``: its whole pipeline
    (:func:`~graphdist.compile.pipeline.build_pipeline`, partitioning included),
    re-run from the traced graph (the compiled function is not touched; the
    final graph equals ``concrete.graph("partitioned")``).
    """
    from graphdist.compile.pipeline import build_pipeline, pass_context

    config = concrete.config
    ctx = pass_context(config, dump_dir=None)
    traced = concrete.graph("traced")
    title = (f"passes of {config.strategy} on {', '.join(config.devices)} for {traced.name!r}: "
             f"traced ({len(traced.nodes)} nodes) -> partitioned")
    # The configuration it was compiled with: accumulate_steps and op determinism's chunks included.
    pipeline = build_pipeline(concrete.config)
    return pipeline_diffs(traced, list(pipeline), ctx, title=title)
