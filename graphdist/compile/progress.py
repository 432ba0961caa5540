"""Compile progress: which segment of which plan is compiling, for whoever shows it.

``Plan.compile`` reports every segment it compiles (before and after, with the
time it took) to the callbacks registered in the current context with
:func:`on_segment_compile`. :func:`announce_slow_compiles` is the listener
the CLI (on stderr) and Keras' ``fit``/``evaluate``/``predict`` (on their
progress display) use to say what a long compile is doing: a segment still
compiling after ``after`` seconds is named (segment k of n, device,
backend), and its time is said when it ends; quick compiles and cache hits
say nothing. Callbacks run in the compiling thread and must be quick; an
exception in one is logged, never raised into the compile.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["SLOW_SECONDS", "SegmentCompile", "announce_slow_compiles", "notify", "on_segment_compile"]

#: A segment compiling longer than this is announced by :func:`announce_slow_compiles`.
SLOW_SECONDS = 1.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentCompile:
    """One segment's compile, as reported before it starts and after it ends.

    Attributes:
        index: The segment's position in the plan, from 1.
        count: How many segments the plan has.
        segment: The segment's name.
        device: Its device (``cpu:0``).
        backend: The backend compiling it (``ort``, ``tvm``, ...).
        seconds: ``None`` when starting; the time it took once done (a cache hit is fast).
    """

    index: int
    count: int
    segment: str
    device: str
    backend: str
    seconds: float | None = None

    def describe(self) -> str:
        """``segment 2 of 5 (step.cpu1) on cpu:1 with tvm``."""
        return f"segment {self.index} of {self.count} ({self.segment}) on {self.device} with {self.backend}"


_listeners: contextvars.ContextVar[tuple[Callable[[SegmentCompile], None], ...]] = contextvars.ContextVar(
    "graphdist_compile_listeners", default=())


@contextlib.contextmanager
def on_segment_compile(callback: Callable[[SegmentCompile], None]) -> Iterator[None]:
    """Calls ``callback`` for every segment compiled in this context (before and after each).

    Args:
        callback: Receives a :class:`SegmentCompile`; ``seconds`` is ``None`` at the start.
    """
    token = _listeners.set((*_listeners.get(), callback))
    try:
        yield
    finally:
        _listeners.reset(token)


def notify(event: SegmentCompile) -> None:
    """Hands ``event`` to the callbacks of the current context (a failing one is logged and skipped)."""
    for callback in _listeners.get():
        try:
            callback(event)
        except Exception:  # noqa: BLE001 - progress display must never break a compile
            logger.warning("compile progress callback %r failed", callback, exc_info=True)


class _SlowCompileAnnouncer:
    """Starts a timer per segment; if it fires before the segment is done, says what is compiling."""

    def __init__(self, say: Callable[[str], None], after: float) -> None:
        self.say, self.after = say, after
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._announced = False

    def __call__(self, event: SegmentCompile) -> None:
        with self._lock:
            if event.seconds is None:
                self._cancel()
                self._announced = False
                self._timer = threading.Timer(self.after, self._announce, args=(event,))
                self._timer.daemon = True
                self._timer.start()
                return
            self._cancel()
            if self._announced:
                self.say(f"compiled {event.describe()} in {event.seconds:.1f} s")

    def _announce(self, event: SegmentCompile) -> None:
        with self._lock:
            self._announced = True
            self.say(f"compiling {event.describe()}...")

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Cancels the pending announcement (compiling is over)."""
        with self._lock:
            self._cancel()


@contextlib.contextmanager
def announce_slow_compiles(say: Callable[[str], None], after: float = SLOW_SECONDS) -> Iterator[None]:
    """Within the block, every segment compile longer than ``after`` seconds is announced through ``say``
    (``"compiling segment 2 of 3 (step.cpu1) on cpu:1 with tvm..."``, then ``"compiled ... in 9.1 s"``).

    Args:
        say: Receives each message (called from a timer thread or the compiling thread).
        after: Seconds before a compile is announced.
    """
    announcer = _SlowCompileAnnouncer(say, after)
    try:
        with on_segment_compile(announcer):
            yield
    finally:
        announcer.close()
