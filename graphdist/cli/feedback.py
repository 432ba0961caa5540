"""What a long compile is doing, on stderr: the CLI's listener for :mod:`graphdist.compile.progress`.

A segment that takes longer than :data:`SLOW_SECONDS` to compile gets one
line on stderr naming it (segment k of n, device, backend) while it compiles,
and one with its time when it ends; quick compiles and cache hits print
nothing, so scripted output stays clean.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

from graphdist.compile import progress
from graphdist.compile.progress import SLOW_SECONDS

__all__ = ["SLOW_SECONDS", "announce_slow_compiles"]


@contextlib.contextmanager
def announce_slow_compiles(prog: str, stream: TextIO | None = None, after: float = SLOW_SECONDS) -> Iterator[None]:
    """Within the block, every segment compile longer than ``after`` seconds is announced on ``stream``.

    Args:
        prog: The program name the lines start with.
        stream: Where to write (default: ``sys.stderr`` at call time).
        after: Seconds before a compile is announced.
    """
    out = stream or sys.stderr
    with progress.announce_slow_compiles(lambda message: print(f"{prog}: {message}", file=out, flush=True), after):
        yield
