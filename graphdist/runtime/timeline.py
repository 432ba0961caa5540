"""A timeline of one step as Chrome-trace / Perfetto JSON (``GRAPHDIST_TRACE=file.json``).

Set ``GRAPHDIST_TRACE`` to a file path and the scheduler records the next
step any plan runs (the first one run after the variable is set, or after it
changes to another path) and writes it there; open the file in
https://ui.perfetto.dev or ``chrome://tracing``. With
``GRAPHDIST_TRACE_EVERY=N`` it records every N-th step instead (steps N, 2N,
... counted from when the path was set), each rewriting the file, so the file
always holds the latest recorded step.

What the file holds (the Trace Event Format: a ``traceEvents`` list of
complete events, ``ph: "X"``, with ``ts`` and ``dur`` in microseconds from
the step's start, ``pid`` and ``tid`` integers, named by ``ph: "M"``
metadata events):

* ``pid``: the worker: its MPI rank under ``graphdist launch`` (``PMI_RANK``
  / ``OMPI_COMM_WORLD_RANK``) or in a job of tasks started on their own
  (its task's rank), else 0. Each worker writes its own file: with
  more than one worker, rank ``r`` writes ``file.rank<r>.json``.
* ``tid`` 0, 1, ...: the plan's devices in order (one per device): its
  segments (``cat: "segment"``);
* the last ``tid``, *communication*: the collectives and transfers the
  communication lane runs (``cat: "collective"``; ``args`` has the op, the
  bytes per participant and the segments the plan lets it overlap), and
  ``cat: "wait"`` events: the time in which communication ran and no device
  computed (the exposed communication, what overlap hides), plus the time a
  collective between workers spent blocked on its peers (MPI).

A path that cannot be written gives a warning (once per path) and the step,
and training, go on. :func:`record` records steps for code that wants the
events themselves (the overlap benchmark).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphdist.runtime import rendezvous

__all__ = ["TRACE_ENV", "TRACE_EVERY_ENV", "Event", "StepRecorder", "start_step", "current", "set_current",
           "record", "exposed_communication", "chrome_trace", "write_trace"]

logger = logging.getLogger(__name__)

#: Path of the trace file to write.
TRACE_ENV = "GRAPHDIST_TRACE"
#: Record every N-th step instead of only the first.
TRACE_EVERY_ENV = "GRAPHDIST_TRACE_EVERY"

COMM_LANE = "communication"


@dataclass
class Event:
    """One span of a recorded step.

    Attributes:
        name: Segment or task name.
        cat: ``segment``, ``collective`` or ``wait``.
        lane: Device string, or ``communication``.
        start: Seconds from the step's start.
        duration: Seconds.
        args: Extra fields shown by the viewer.
    """

    name: str
    cat: str
    lane: str
    start: float
    duration: float
    args: dict[str, Any] = field(default_factory=dict)


class StepRecorder:
    """Collects the events of one step (thread-safe: device threads add their segments).

    Args:
        devices: The plan's devices (one lane each, in order).
        path: File to write when the step ends, or ``None`` (keep the events only).
    """

    def __init__(self, devices: Sequence[str], path: str | None = None) -> None:
        self.devices = list(devices)
        self.path = path
        self.events: list[Event] = []
        self.origin = time.perf_counter()
        self._lock = threading.Lock()

    def now(self) -> float:
        """Seconds since the step started."""
        return time.perf_counter() - self.origin

    def add(self, name: str, cat: str, lane: str, start: float, end: float, **args: Any) -> None:
        """Records a span from ``start`` to ``end`` (seconds from the step's start)."""
        with self._lock:
            self.events.append(Event(name, cat, lane, start, max(end - start, 0.0), args))

    @contextlib.contextmanager
    def span(self, name: str, cat: str, lane: str, **args: Any) -> Iterator[None]:
        """Records the time the ``with`` body takes."""
        start = self.now()
        try:
            yield
        finally:
            self.add(name, cat, lane, start, self.now(), **args)

    def finish(self) -> list[Event]:
        """Adds the exposed-communication ``wait`` events; writes the file when there is a path."""
        for start, end in exposed_communication(self.events):
            self.add("waiting for communication", "wait", COMM_LANE, start, end)
        if self.path is not None:
            write_trace(self.path, chrome_trace(self.events, self.devices))
        return self.events


# ------------------------------------------------------------ which step is recorded
_state_lock = threading.Lock()
_state: dict[str, Any] = {"path": None, "steps": 0, "failed": set()}
_listeners: list[list[list[Event]]] = []
_local = threading.local()


def _every() -> int:
    text = os.environ.get(TRACE_EVERY_ENV, "").strip()
    if not text:
        return 0
    try:
        every = int(text)
    except ValueError:
        every = -1
    if every < 1:
        warnings.warn(f"{TRACE_EVERY_ENV}={text!r} is not a positive integer; recording the first step only",
                      stacklevel=3)
        return 0
    return every


def start_step(devices: Sequence[str]) -> StepRecorder | None:
    """The recorder for the step about to run, or ``None`` when this step is not recorded.

    Cheap when nothing is asked for (one environment look-up).
    """
    path = os.environ.get(TRACE_ENV) or None
    if path is None and not _listeners:
        return None
    with _state_lock:
        if _listeners:
            return StepRecorder(devices, path)
        if path != _state["path"]:
            _state["path"], _state["steps"] = path, 0
        _state["steps"] += 1
        every = _every()
        wanted = _state["steps"] % every == 0 if every else _state["steps"] == 1
        target = _worker_path(path)
        if not wanted or target in _state["failed"]:
            return None
    return StepRecorder(devices, target)


def finish_step(recorder: StepRecorder) -> None:
    """Ends a recorded step: writes its file, hands its events to :func:`record` listeners."""
    events = recorder.finish()
    with _state_lock:
        for sink in _listeners:
            sink.append(events)


@contextlib.contextmanager
def record() -> Iterator[list[list[Event]]]:
    """Records every step run inside the ``with`` block; yields the list each step's events are added to."""
    sink: list[list[Event]] = []
    with _state_lock:
        _listeners.append(sink)
    try:
        yield sink
    finally:
        with _state_lock:
            _listeners.remove(sink)


def current() -> StepRecorder | None:
    """The recorder of the step this thread is running communication for (for the communicators)."""
    return getattr(_local, "recorder", None)


def set_current(recorder: StepRecorder | None) -> None:
    """Makes ``recorder`` this thread's :func:`current` one."""
    _local.recorder = recorder


# ------------------------------------------------------------ analysis and output
def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def exposed_communication(events: Sequence[Event]) -> list[tuple[float, float]]:
    """Spans in which a collective or transfer ran and no segment ran (every device waited on it)."""
    comm = _union([(e.start, e.start + e.duration) for e in events if e.cat == "collective"])
    busy = _union([(e.start, e.start + e.duration) for e in events if e.cat == "segment"])
    exposed = []
    for start, end in comm:
        cursor = start
        for busy_start, busy_end in busy:
            if busy_end <= cursor or busy_start >= end:
                continue
            if busy_start > cursor:
                exposed.append((cursor, busy_start))
            cursor = max(cursor, busy_end)
        if cursor < end:
            exposed.append((cursor, end))
    return exposed


def _rank() -> int:
    joined = rendezvous.current()  # a job of tasks started on their own: each is rank 0 of its own mpiexec
    if joined is not None:
        return joined.rank
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        text = os.environ.get(name, "")
        if text.isdigit():
            return int(text)
    return 0


def _world_size() -> int:
    joined = rendezvous.current()
    if joined is not None:
        return len(joined.ranks)
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        text = os.environ.get(name, "")
        if text.isdigit():
            return int(text)
    return 1


def _worker_path(path: str | None) -> str | None:
    if path is None or _world_size() <= 1:
        return path
    root, suffix = os.path.splitext(path)
    return f"{root}.rank{_rank()}{suffix or '.json'}"


def chrome_trace(events: Sequence[Event], devices: Sequence[str]) -> dict[str, Any]:
    """The Trace Event Format document of one step (see the module docstring)."""
    pid = _rank()
    lanes = [*devices, COMM_LANE]
    for event in events:
        if event.lane not in lanes:
            lanes.insert(len(lanes) - 1, event.lane)
    tids = {lane: index for index, lane in enumerate(lanes)}
    trace: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"graphdist worker {pid}"}}]
    trace += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}
              for lane, tid in tids.items()]
    trace += [{"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
              for tid in tids.values()]
    for event in sorted(events, key=lambda e: e.start):
        trace.append({"name": event.name, "cat": event.cat, "ph": "X", "ts": round(event.start * 1e6, 3),
                      "dur": round(event.duration * 1e6, 3), "pid": pid, "tid": tids[event.lane],
                      "args": event.args})
    return {"traceEvents": trace, "displayTimeUnit": "ms",
            "otherData": {"producer": "graphdist", "devices": list(devices)}}


def write_trace(path: str, document: dict[str, Any]) -> bool:
    """Writes ``document`` to ``path`` atomically; on failure warns (once per path) and returns False."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".graphdist-trace-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w") as stream:
                json.dump(document, stream)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as err:
        with _state_lock:
            first = path not in _state["failed"]
            _state["failed"].add(path)
        if first:
            message = (f"{TRACE_ENV}: cannot write the step's timeline to {path!r} ({err.strerror or err}); "
                       "training goes on without it. Point it at a writable file, e.g. "
                       f"{TRACE_ENV}=/tmp/step.json")
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            logger.warning(message)
        return False
    logger.info("wrote the step's timeline to %s (open it in https://ui.perfetto.dev)", path)
    return True
