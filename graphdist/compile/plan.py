"""``Plan``: a partitioned graph as data (segments per device) plus its compiled form.

A plan lists devices, segments (a sub-graph lowered to ONNX, its device,
inputs and outputs), constants that are outputs themselves, and the order to
run segments in. ``compile`` turns each segment into a backend executable
(through the compile cache); ``run`` executes the plan with the scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from graphdist.compile.progress import SegmentCompile, notify
from graphdist.compile.render import plan_summary, plan_to_dot
from graphdist.errors import GraphError, PlanError
from graphdist.ir.comm_ops import RUNTIME_CHECK_OPS, is_communication
from graphdist.ir.graph import Graph, Node, Value
from graphdist.runtime.devices import parse_device, thread_budget
from graphdist.runtime.numerics import NonFiniteOutputsError
from graphdist.runtime.tasks import CommTask, Segment, overlapping_segments

__all__ = ["Segment", "CommTask", "Plan", "extract_subgraph"]

logger = logging.getLogger(__name__)

# The most intra-op threads a segment of an op-deterministic step gets (see Plan.compile).
DETERMINISTIC_MAX_THREADS = 4


def extract_subgraph(graph: Graph, nodes: list[Node], name: str, outputs: list[Value]) -> Graph:
    """Copies ``nodes`` (in order) into a new graph.

    Values read but not produced by ``nodes`` become inputs (initializers are
    copied); ``outputs`` become the sub-graph's outputs.
    """
    sub = Graph(name, stage=graph.stage, opset_imports=graph.opset_imports)
    mapping: dict[int, Value] = {}

    def resolve(value: Value) -> Value:
        twin = mapping.get(id(value))
        if twin is None:
            if value.const_value is not None:
                twin = Value(value.name, value.dtype, value.shape, const_value=value.const_value)
                sub.initializers[value.name] = twin
            else:
                twin = Value(value.name, value.dtype, value.shape)
                sub.inputs.append(twin)
            sub.unique_name(value.name)  # reserves it (the names are unique in ``graph`` already)
            mapping[id(value)] = twin
        return twin

    for node in nodes:
        twin = Node(node.op_type, [None if v is None else resolve(v) for v in node.inputs], node.attrs,
                    domain=node.domain, name=node.name)
        twin.device, twin.replica, twin.meta = node.device, node.replica, dict(node.meta)
        sub.unique_name(node.name, node=True)
        for out in node.outputs:
            out_twin = Value(out.name, out.dtype, out.shape, producer=twin, index=out.index)
            sub.unique_name(out.name)
            twin.outputs.append(out_twin)
            mapping[id(out)] = out_twin
        sub.append(twin)
    sub.outputs = [mapping[id(v)] for v in outputs]
    return sub


class Plan:
    """A partitioned step: segments per device and how to run them.

    Attributes:
        graph: The partitioned graph the plan was built from.
        segments: Segments in execution order.
        input_names: Names of the plan's inputs, in call order.
        output_names: Names of the values returned, in order (may repeat).
        constants: Outputs that are constants, by name.
        devices: Devices the plan runs on.
    """

    def __init__(self, graph: Graph, segments: list[Segment], constants: dict[str, np.ndarray],
                 comms: list[CommTask] | None = None) -> None:
        self.graph = graph
        self.segments = segments
        self.comms = list(comms or [])
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        self.constants = constants
        used = {s.device for s in segments} | {d for c in self.comms for d in c.devices}
        self.devices = sorted(used, key=lambda d: (parse_device(d).kind, parse_device(d).index))
        self._scheduler: Any = None
        self._backend: Any = None
        self._calls = 0  # runs of the compiled plan: check numerics names the call that made a NaN
        self.backend_name: str | None = None
        # weakref to what exports this plan with its interface (a ConcreteFunction or LoadedPlan), if any
        self._owner: Any = None

    @property
    def collectives(self) -> list[CommTask]:
        """The communication tasks that move data (``comms`` without the run-time checks)."""
        return [c for c in self.comms if c.op not in RUNTIME_CHECK_OPS]

    @property
    def checks(self) -> list[CommTask]:
        """The run-time assertions (label and index ranges) scheduled between segments."""
        return [c for c in self.comms if c.op in RUNTIME_CHECK_OPS]

    def describe_tasks(self) -> str:
        """``"5 communication task(s)"``, with ``" and 2 run-time check(s)"`` where the plan has checks."""
        checks = f" and {len(self.checks)} run-time check(s)" if self.checks else ""
        return f"{len(self.collectives)} communication task(s){checks}"

    # -------------------------------------------------------------- build
    @classmethod
    def from_graph(cls, graph: Graph) -> Plan:
        """Builds segments and communication tasks from a partitioned graph.

        Compute nodes carry ``meta["segment"]``; collective nodes of one group
        (``attrs["group_key"]``) become one :class:`CommTask`, as does each
        ``Transfer``.
        """
        if graph.stage != "partitioned":
            raise GraphError(f"Plan.from_graph needs a partitioned graph, got stage {graph.stage!r}")
        members: dict[str, list[Node]] = {}
        groups: dict[str, list[Node]] = {}
        for node in graph.nodes:
            if is_communication(node):
                groups.setdefault(node.attrs.get("group_key") or node.name, []).append(node)
            else:
                members.setdefault(node.meta["segment"], []).append(node)
        graph_outputs = {id(v) for v in graph.outputs}
        segments = []
        for name, nodes in members.items():
            inside = {id(n) for n in nodes}
            outs = [out for n in nodes for out in n.outputs
                    if id(out) in graph_outputs or any(id(user) not in inside for user, _ in out.uses)]
            sub = extract_subgraph(graph, nodes, f"{graph.name}.{name}", outs)
            segments.append(Segment(name, nodes[0].device, sub, [v.name for v in sub.inputs], [v.name for v in outs]))
        comms = []
        for key, nodes in groups.items():
            nodes = sorted(nodes, key=lambda n: n.replica or 0)
            attrs = {k: v for k, v in nodes[0].attrs.items() if k != "group_key"}
            comms.append(CommTask(key, nodes[0].op_type, attrs, [n.inputs[0].name for n in nodes],
                                  [n.outputs[0].name for n in nodes], [n.device for n in nodes]))
        constants = {v.name: np.asarray(v.const_value) for v in graph.outputs if v.const_value is not None}
        constants.update({v.name: np.asarray(v.const_value) for n in graph.nodes if is_communication(n)
                          for v in n.inputs if v is not None and v.const_value is not None})
        return cls(graph, segments, constants, comms)

    # ------------------------------------------------------------ compile
    def compile(self, backend: Any, cache: Any = None) -> Plan:
        """Compiles every segment with ``backend`` (through the compile cache)."""
        from graphdist.backends import default_cache
        from graphdist.runtime.scheduler import Scheduler

        cache = cache or default_cache()
        threads = thread_budget(len(self.devices) or 1)
        if self.graph.meta.deterministic_chunks:
            # Past 4 intra-op threads ONNX Runtime's SGEMM splits a matmul's sum between threads (its bits then
            # follow the thread count, i.e. the host's cores per device): op determinism keeps to the thread
            # counts tests/backends/test_kernel_determinism.py checks.
            threads = min(threads, DETERMINISTIC_MAX_THREADS)
        executables = [self._compile_segment(index, segment, backend, cache, threads)
                       for index, segment in enumerate(self.segments, start=1)]
        self.backend_name = backend.name
        self._backend = backend
        self._scheduler = Scheduler(self, executables)
        return self

    def _compile_segment(self, index: int, segment: Segment, backend: Any, cache: Any, threads: int) -> Any:
        """Compiles one segment, reporting it to :mod:`graphdist.compile.progress` and the log (with its time)."""
        event = SegmentCompile(index, len(self.segments), segment.name, segment.device, backend.name)
        notify(event)
        start = time.perf_counter()
        executable = cache.get_or_compile(backend, segment.model, parse_device(segment.device), threads)
        done = dataclasses.replace(event, seconds=time.perf_counter() - start)
        logger.info("compiled %s in %.2f s", done.describe(), done.seconds)
        notify(done)
        return executable

    @property
    def compiled(self) -> bool:
        """True once :meth:`compile` has run."""
        return self._scheduler is not None

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the compiled plan; ``feeds`` maps every input name to an array.

        Raises:
            NumericsError: With ``gd.debugging.enable_check_numerics()``: a value of the step is NaN or
                infinite (names the op that made it first; see :mod:`graphdist.compile.numerics`).
        """
        if self._scheduler is None:
            raise PlanError("the plan is not compiled; call plan.compile(backend) first")
        self._calls += 1
        try:
            return self._scheduler.run(feeds)
        except NonFiniteOutputsError as found:
            from graphdist.compile.numerics import name_the_op

            raise name_the_op(found, self, self._backend, self._calls) from None

    # -------------------------------------------------------------- export
    def export(self, directory: Any, *, overwrite: bool = False) -> str:
        """Writes the plan to ``directory`` atomically; load it with ``gd.load_plan``.

        A plan of a concrete function (``step.get_concrete_function(...).plan``)
        is exported with the step's interface and current variables (see
        :mod:`graphdist.compile.export`); a plan built directly takes its
        inputs positionally and returns a list.

        Returns:
            The directory's absolute path.

        Raises:
            PlanError: ``directory`` exists (pass ``overwrite=True`` to
                replace a plan there) or the plan is not compiled.
        """
        from graphdist.compile.export import export_plan

        return export_plan(self, directory, overwrite=overwrite)

    # ---------------------------------------------------------- inspection
    def summary(self) -> str:
        """Readable tables: devices (segments, nodes, bytes sent), segments (ops,
        inputs, outputs), communication tasks (algorithm, sizes, bytes moved per
        step) and variables with their placement (see
        :func:`graphdist.compile.render.plan_summary`), then which collectives may
        overlap which segments (:meth:`overlaps`).
        """
        return f"{plan_summary(self)}\n{self._overlap_text()}"

    def overlaps(self) -> dict[str, list[str]]:
        """Collective name -> the segments that may run while it runs (neither feed it nor read its result).

        With gradient bucketing, PartitionPass cuts each device's backward pass
        at the buckets, so a bucket's all-reduce overlaps the segments that
        compute the earlier layers' gradients.
        """
        return overlapping_segments(self.segments, self.comms)

    def _overlap_text(self) -> str:
        found = self.overlaps()
        collectives = [c for c in self.collectives if c.op != "Transfer"]  # no task runs for a transfer
        if not collectives:
            return "overlap: no collectives (transfers between devices of one process run no task)"
        width = max(len(c.name) for c in collectives)
        lines = ["overlap (segments that may run while each collective runs):"]
        lines += [f"  {c.name:<{width}}  {', '.join(found.get(c.name, [])) or '- (on the critical path)'}"
                  for c in collectives]
        return "\n".join(lines)

    def to_dot(self, **options: Any) -> str:
        """Graphviz DOT text: segments in device clusters, communication tasks highlighted."""
        return plan_to_dot(self, **options)

    def render(self, path: str, **options: Any) -> Any:
        """Writes :meth:`to_dot` as SVG or PNG by ``path``'s suffix (needs Graphviz's ``dot``)."""
        from graphdist.ir.render import render_dot

        return render_dot(self.to_dot(**options), path)

    def graph_value(self, name: str) -> Any:
        """The partitioned graph's value called ``name`` (or ``None``)."""
        for value in self.graph.values():
            if value.name == name:
                return value
        return None

    def __repr__(self) -> str:
        return f"<Plan {self.graph.name!r} segments={len(self.segments)} devices={self.devices}>"
