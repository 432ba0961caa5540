"""Compile progress: which segment of which plan is compiling, for whoever shows it.

``Plan.compile`` reports every segment it compiles (before and after, with the
time it took) to the callbacks registered in the current context with
:func:`on_segment_compile`; the CLI and Keras' progress bar use it to say what
a long compile is doing. Callbacks run in the compiling thread and must be
quick; an exception in one is logged, never raised into the compile.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["SegmentCompile", "notify", "on_segment_compile"]

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
