"""Executes a plan's segments and communication tasks in dependency order.

With one segment (one device, no collectives) the scheduler calls the
executable directly, so the per-step overhead is one dictionary and one
backend call. Otherwise every task (segment or communication) starts as
soon as the values it reads exist: segments run on a thread pool with one
worker per device (backends release the GIL while they compute, and each
executable was compiled with its device's share of the host cores), and
communication tasks run on the coordinating thread, the communication lane,
so a collective of one replica's gradients overlaps other devices' work.
A ``Transfer`` between logical devices is no task at all: its output is another name for
its input (one process's devices share host memory), bound as soon as the input exists.
When no collective is ready, the coordinating thread runs one ready segment itself if every
task still to launch waits for it (data parallelism: both devices' updates read both
gradients), which saves a hand-off to a device thread and back (tens of microseconds each on
a virtual machine's idle cores).
When a communication task and segments become ready together, the segments
are handed to the device threads first and the collective runs meanwhile:
with PartitionPass's overlap cut (a device's backward pass in one segment
per gradient bucket) bucket ``k``'s all-reduce runs while the backward pass
of the earlier layers still computes.

``GRAPHDIST_TRACE=file.json`` records a step's timeline (segments per
device, collectives, waits) as Chrome-trace JSON: see
:mod:`graphdist.runtime.timeline`.

Run-time assertions (``AssertInRange`` tasks, :mod:`graphdist.ir.check_ops`:
an index argument out of its range) are checked as their values appear;
a failure is raised once every task has run, so that every collective
completes on every process and no one waits for a peer that gave up.
With ``gd.debugging.enable_check_numerics()`` (:mod:`graphdist.runtime.numerics`)
every segment's floating-point outputs are checked for NaN and infinity as
they appear, and the first segment found to hold one is raised the same way
(:class:`~graphdist.runtime.numerics.NonFiniteOutputsError`, after a failed range
check); with the checks off the switch is read once per step.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from graphdist import stats
from graphdist.errors import PlanError
from graphdist.ir.check_ops import in_range, range_error
from graphdist.runtime import numerics, timeline
from graphdist.runtime.comm.handlers import comm_handler, register_comm_handler
from graphdist.runtime.tasks import CommTask, Segment, overlapping_segments

__all__ = ["Scheduler", "register_comm_handler"]

class _Task:
    __slots__ = ("kind", "index", "inputs", "outputs", "name")

    def __init__(self, kind: str, index: int, inputs: Sequence[str], outputs: Sequence[str], name: str) -> None:
        self.kind, self.index, self.inputs, self.outputs, self.name = kind, index, list(inputs), list(outputs), name


class Scheduler:
    """Runs a plan's tasks with their compiled executables.

    Args:
        plan: What to run: ``segments`` (:class:`Segment`, one executable
            each), ``comms`` (:class:`CommTask`), ``constants`` (values that
            are outputs or collective inputs), ``input_names`` and
            ``output_names``. The scheduler reads nothing else: it does not
            know which compiler or strategy made the plan.
        executables: One compiled executable per segment, in order.
    """

    def __init__(self, plan: Any, executables: Sequence[Any]) -> None:
        self._plan = plan
        self._executables = list(executables)
        asserts_only = all(c.op == _ASSERT for c in plan.comms)
        self._single = (len(plan.segments) == 1 and asserts_only and not plan.constants
                        and set(plan.output_names) <= set(plan.segments[0].outputs)
                        and all(set(c.inputs) <= set(plan.segments[0].outputs) for c in plan.comms))
        if self._single:
            positions = {name: i for i, name in enumerate(plan.segments[0].outputs)}
            self._checks = [(positions[name], c.attrs) for c in plan.comms for name in c.inputs]
            self._picks = [positions[name] for name in plan.output_names]
            self._identity = self._picks == list(range(len(plan.segments[0].outputs)))
            self._seg_inputs = list(plan.segments[0].inputs)
            return
        self._aliases = _transfer_aliases(plan.comms)
        self._tasks = [_Task("segment", i, s.inputs, s.outputs, s.name) for i, s in enumerate(plan.segments)]
        self._tasks += [_Task("comm", i, c.inputs, c.outputs, c.name) for i, c in enumerate(plan.comms)
                        if c.op != "Transfer"]
        producer = {name: t for t in self._tasks for name in t.outputs}
        producer.update({alias: producer[source] for source, aliases in self._aliases.items() if source in producer
                         for alias in aliases})
        self._deps = [{id(producer[n]) for n in t.inputs if n in producer} for t in self._tasks]
        self._add_awaited_segments(plan)
        self._readers = _reader_counts(self._tasks, plan.output_names)
        # Tasks numbered by attrs["sequence"] (collectives between processes) run in that order, so that
        # every process issues them in the same order whatever order its devices finish in.
        ordered = sorted((t for t in self._tasks if t.kind == "comm" and "sequence" in plan.comms[t.index].attrs),
                         key=lambda t: int(plan.comms[t.index].attrs["sequence"]))
        position = {id(t): i for i, t in enumerate(self._tasks)}
        for before, after in zip(ordered, ordered[1:]):
            self._deps[position[id(after)]].add(id(before))
        self._checks_ids = {id(t) for t in self._tasks if t.kind == "comm" and plan.comms[t.index].op == _ASSERT}
        self._after = _descendants(self._tasks, self._deps)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._overlaps = overlapping_segments(plan.segments, plan.comms)

    def _add_awaited_segments(self, plan: Any) -> None:
        """A collective waits for the segments its ``attrs["after_segments"]`` names (a gather of sharded
        weights waits for the previous layer's readers: ``LimitParameterGathersPass``).

        Raises:
            PlanError: A named segment is not in the plan.
        """
        segments = {t.name: t for t in self._tasks if t.kind == "segment"}
        for task, deps in zip(self._tasks, self._deps):
            if task.kind != "comm":
                continue
            for name in plan.comms[task.index].attrs.get("after_segments", ()):
                if name not in segments:
                    raise PlanError(f"collective {task.name} waits for segment {name!r}, which the plan lacks")
                deps.add(id(segments[name]))

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                workers = max(1, len({s.device for s in self._plan.segments}))
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="graphdist-device")
            return self._pool

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs every task and returns the plan's outputs in order."""
        stats.increment("plan_runs")
        numbers = [] if numerics.enabled() else None  # NaN/Inf found by gd.debugging.enable_check_numerics()
        recorder = timeline.start_step(self._plan.devices)
        if recorder is not None:
            try:
                return self._run_recorded(feeds, recorder, numbers)
            finally:
                timeline.finish_step(recorder)
        if self._single:
            return self._run_single(feeds, None, numbers)
        env = self._initial_env(feeds)
        failures: list[tuple[int, Exception] | None] = []
        self._run_tasks(env, failures, None, numbers)
        _raise_first(failures)
        if numbers:
            raise min(numbers, key=lambda found: found.segment)  # the same whatever order tasks ran in
        return [env[name] for name in self._plan.output_names]

    def _run_single(self, feeds: dict[str, np.ndarray], recorder: timeline.StepRecorder | None = None,
                    numbers: list[Any] | None = None) -> list[np.ndarray]:
        seg_feeds = feeds if len(feeds) == len(self._seg_inputs) else {n: feeds[n] for n in self._seg_inputs}
        if recorder is None:
            outs = self._executables[0].run(seg_feeds)
        else:
            segment = self._plan.segments[0]
            with recorder.span(segment.name, "segment", segment.device):
                outs = self._executables[0].run(seg_feeds)
        if self._checks:
            _raise_first([_range_failure(outs[position], attrs) for position, attrs in self._checks])
        if numbers is not None:
            found = numerics.find_non_finite_outputs(0, self._plan.segments[0], seg_feeds, outs)
            if found is not None:
                raise found
        return outs if self._identity else [outs[i] for i in self._picks]

    def _run_recorded(self, feeds: dict[str, np.ndarray], recorder: timeline.StepRecorder,
                      numbers: list[Any] | None = None) -> list[np.ndarray]:
        """:meth:`run` with every task's span recorded."""
        if self._single:
            return self._run_single(feeds, recorder, numbers)
        env = self._initial_env(feeds)
        failures: list[tuple[int, Exception] | None] = []
        self._run_tasks(env, failures, recorder, numbers)
        _raise_first(failures)
        if numbers:
            raise min(numbers, key=lambda found: found.segment)  # the same whatever order tasks ran in
        return [env[name] for name in self._plan.output_names]

    def _initial_env(self, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        env: dict[str, Any] = dict(self._plan.constants)
        env.update(feeds)
        for source, aliases in self._aliases.items():
            if source in env:
                env.update(dict.fromkeys(aliases, env[source]))
        return env

    # ----------------------------------------------------------- tasks
    def _run_segment(self, index: int, env: dict[str, Any], recorder: timeline.StepRecorder | None = None,
                     numbers: list[Any] | None = None) -> list[np.ndarray]:
        segment: Segment = self._plan.segments[index]
        try:
            seg_feeds = {name: env[name] for name in segment.inputs}
        except KeyError as err:
            missing = err.args[0]
            raise PlanError(f"segment {segment.name} needs {missing!r}, which no earlier step produced") from None
        if recorder is None:
            outputs = self._executables[index].run(seg_feeds)
        else:
            with recorder.span(segment.name, "segment", segment.device):
                outputs = self._executables[index].run(seg_feeds)
        if numbers is not None:
            found = numerics.find_non_finite_outputs(index, segment, seg_feeds, outputs)
            if found is not None:
                numbers.append(found)  # raised once every task has run (see the module docstring)
        return outputs

    def _run_comm(self, task: CommTask, env: dict[str, Any], failures: list[tuple[int, Exception] | None],
                  recorder: timeline.StepRecorder | None = None) -> list[np.ndarray]:
        if recorder is None or task.op == _ASSERT:
            return self._comm(task, env, failures)
        buffers = [env[name] for name in task.inputs]
        args = {"op": task.op, "bytes": int(sum(np.asarray(b).nbytes for b in buffers[:1])),
                "participants": list(task.devices),
                "overlaps": self._overlaps.get(task.name, [])}
        timeline.set_current(recorder)
        try:
            with recorder.span(task.name, "collective", timeline.COMM_LANE, **args):
                return self._comm(task, env, failures)
        finally:
            timeline.set_current(None)

    def _comm(self, task: CommTask, env: dict[str, Any],
              failures: list[tuple[int, Exception] | None]) -> list[np.ndarray]:
        buffers = [np.asarray(env[name]) for name in task.inputs]
        if task.op == _ASSERT:  # raised after the other tasks (see the module docstring)
            failures.extend(_range_failure(buffer, task.attrs) for buffer in buffers)
            return buffers
        handler = comm_handler(task.op)
        if handler is not None:
            return handler(task.op, task.attrs, buffers)
        raise PlanError(f"communication op {task.op!r} ({task.name}) is not supported by the local communicator")

    def _run_tasks(self, env: dict[str, Any], failures: list[tuple[int, Exception] | None],
                   recorder: timeline.StepRecorder | None, numbers: list[Any] | None = None) -> None:
        remaining = {id(t): set(deps) for t, deps in zip(self._tasks, self._deps)}
        unread = dict(self._readers)
        by_id = {id(t): t for t in self._tasks}
        done: set[int] = set()
        running: dict[Future, _Task] = {}
        pool = self._executor()

        def ready() -> list[_Task]:
            return [by_id[k] for k, deps in remaining.items() if not deps]

        def cancel_running() -> None:
            for other in running:
                other.cancel()

        def collect(finished: Sequence[Future]) -> None:
            for future in finished:
                task = running.pop(future)
                try:
                    outputs = future.result()
                except BaseException:
                    cancel_running()
                    raise
                self._finish(task, outputs, env, done, remaining, unread)

        while remaining or running:
            launch = ready()
            while launch:
                segments = [t for t in launch if t.kind == "segment"]
                comms = [t for t in launch if t.kind == "comm"]
                for task in launch:
                    del remaining[id(task)]
                # With collectives to run, every ready segment goes to the device threads first, so the
                # collectives (run inline on this communication lane) overlap them. Without (run-time
                # checks aside), one ready segment may run on this coordinating thread, saving a hand-off
                # to a device thread and back, when every task still to launch waits for it: then no task
                # can become ready while this thread is busy (otherwise one device's chain of segments
                # could run here while the other devices wait for this thread to hand them theirs).
                inline_segment = self._inline_choice(segments, comms, remaining)
                if inline_segment is not None:
                    segments.remove(inline_segment)
                for task in segments:
                    running[pool.submit(self._run_segment, task.index, env, recorder, numbers)] = task
                for task in comms:
                    try:
                        outputs = self._run_comm(self._plan.comms[task.index], env, failures, recorder)
                    except BaseException:
                        cancel_running()
                        raise
                    self._finish(task, outputs, env, done, remaining, unread)
                if inline_segment is not None:
                    try:
                        outputs = self._run_segment(inline_segment.index, env, recorder, numbers)
                    except BaseException:
                        cancel_running()
                        raise
                    self._finish(inline_segment, outputs, env, done, remaining, unread)
                    collect([f for f in running if f.done()])  # what finished meanwhile, without waiting
                launch = ready()
            if not running:
                if remaining:
                    stuck = ", ".join(by_id[k].name for k in remaining)
                    raise PlanError(f"plan {self._plan.graph.name!r} cannot make progress; waiting tasks: {stuck}")
                break
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            collect(list(finished))

    def _inline_choice(self, segments: list[_Task], comms: list[_Task],
                       remaining: dict[int, set[int]]) -> _Task | None:
        """A ready segment this thread may run itself (see ``_run_tasks``), or ``None``."""
        if not segments or any(id(t) not in self._checks_ids for t in comms):
            return None
        waiting = {k for k in remaining if k not in self._checks_ids}  # a check may wait: it only records
        return next((t for t in reversed(segments) if waiting <= self._after[id(t)]), None)

    def _finish(self, task: _Task, outputs: Sequence[np.ndarray], env: dict[str, Any], done: set[int],
                remaining: dict[int, set[int]], unread: dict[str, int]) -> None:
        env.update(zip(task.outputs, outputs))
        if self._aliases:
            for name, value in zip(task.outputs, outputs):
                env.update(dict.fromkeys(self._aliases.get(name, ()), value))
        done.add(id(task))
        for deps in remaining.values():
            deps.discard(id(task))
        self._free_read_values(task, env, unread)

    @staticmethod
    def _free_read_values(task: _Task, env: dict[str, Any], unread: dict[str, int]) -> None:
        """Drops the values no task still to run reads (so a step holds, e.g., one layer's gathered weights at
        a time, not every value until it ends); the plan's outputs are not counted, so they stay.
        """
        for name in task.inputs:
            if name in unread:
                unread[name] -= 1
                if unread[name] <= 0:
                    env.pop(name, None)
        for name in task.outputs:
            if unread.get(name) == 0:  # read by no task and not an output (its aliases may be)
                env.pop(name, None)


_ASSERT = "AssertInRange"


def _reader_counts(tasks: Sequence[_Task], outputs: Sequence[str]) -> dict[str, int]:
    """Value name -> how many task inputs read it, for every value but the plan's outputs; a value some
    task produces and none reads counts ``0``.
    """
    kept = set(outputs)
    counts: dict[str, int] = {name: 0 for task in tasks for name in task.outputs if name not in kept}
    for task in tasks:
        for name in task.inputs:
            if name not in kept:
                counts[name] = counts.get(name, 0) + 1
    return counts


def _descendants(tasks: Sequence[_Task], deps: Sequence[set[int]]) -> dict[int, frozenset[int]]:
    """Task id -> ids of the tasks that wait for it, directly or through others."""
    readers: dict[int, set[int]] = {id(t): set() for t in tasks}
    for task, needs in zip(tasks, deps):
        for need in needs:
            readers[need].add(id(task))
    missing = {id(t): len(needs) for t, needs in zip(tasks, deps)}
    order = [key for key, count in missing.items() if count == 0]  # Kahn: every task after what it waits for
    for key in order:
        for reader in readers[key]:
            missing[reader] -= 1
            if missing[reader] == 0:
                order.append(reader)
    after: dict[int, frozenset[int]] = {key: frozenset() for key in readers}  # (a cycle stays empty)
    for key in reversed(order):
        after[key] = frozenset(readers[key]).union(*(after[r] for r in readers[key]))
    return after


def _transfer_aliases(comms: Sequence[CommTask]) -> dict[str, list[str]]:
    """Source value -> the names ``Transfer`` tasks give it on other devices (through chains of transfers).

    Logical devices of one process share host memory, so a transfer is a second name for the same array:
    the scheduler binds the names when the source appears instead of running a task (which would cost a
    turn of the coordinating thread between a segment and its readers on the other device).
    """
    source_of = {out: src for c in comms if c.op == "Transfer" for src, out in zip(c.inputs, c.outputs)}
    aliases: dict[str, list[str]] = {}
    for out, src in source_of.items():
        while src in source_of:
            src = source_of[src]
        aliases.setdefault(src, []).append(out)
    return aliases


def _range_failure(bounds: np.ndarray, attrs: dict[str, Any]) -> tuple[int, Exception] | None:
    """``(replica, error)`` of an ``AssertInRange`` task whose ``[min, max]`` left its range, else ``None``."""
    if in_range(bounds, int(attrs.get("low", 0)), int(attrs.get("high", 0))):
        return None
    replica = int(attrs.get("replica", -1))
    return replica, range_error(attrs, bounds, replica if replica >= 0 else None)


def _raise_first(failures: Sequence[tuple[int, Exception] | None]) -> None:
    """Raises the failed check of the lowest replica (the same error whatever order the tasks ran in)."""
    found = [f for f in failures if f is not None]
    if found:
        raise min(found, key=lambda f: f[0])[1]
