"""What a long compile is doing, on stderr: the CLI's listener for :mod:`graphdist.compile.progress`.

A segment that takes longer than :data:`SLOW_SECONDS` to compile gets one
line on stderr naming it (segment k of n, device, backend) while it compiles,
and one with its time when it ends; quick compiles and cache hits print
nothing, so scripted output stays clean.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

from graphdist.compile.progress import SegmentCompile, on_segment_compile

__all__ = ["SLOW_SECONDS", "announce_slow_compiles"]

#: A compile running longer than this is announced.
SLOW_SECONDS = 1.0


class _SlowCompileAnnouncer:
    """Starts a timer per segment; if it fires before the segment is done, says what is compiling."""

    def __init__(self, stream: TextIO, prog: str, after: float) -> None:
        self.stream, self.prog, self.after = stream, prog, after
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
                self._print(f"compiled {event.describe()} in {event.seconds:.1f} s")

    def _announce(self, event: SegmentCompile) -> None:
        with self._lock:
            self._announced = True
            self._print(f"compiling {event.describe()}...")

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _print(self, message: str) -> None:
        print(f"{self.prog}: {message}", file=self.stream, flush=True)


@contextlib.contextmanager
def announce_slow_compiles(prog: str, stream: TextIO | None = None, after: float = SLOW_SECONDS) -> Iterator[None]:
    """Within the block, every segment compile longer than ``after`` seconds is announced on ``stream``.

    Args:
        prog: The program name the lines start with.
        stream: Where to write (default: ``sys.stderr`` at call time).
        after: Seconds before a compile is announced.
    """
    announcer = _SlowCompileAnnouncer(stream or sys.stderr, prog, after)
    try:
        with on_segment_compile(announcer):
            yield
    finally:
        with announcer._lock:
            announcer._cancel()
