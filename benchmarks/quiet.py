"""Timing on a shared machine: CPU-share metering and interleaved rounds repeated until quiet.

Used by the training-step benchmarks: each round times every variant in turn
(order reversed every other round), measures how much CPU time other
processes took meanwhile, and rounds are repeated (within a budget) until
enough of them were quiet.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["QUIET", "CpuMeter", "wait_quiet", "loadavg", "timed", "quiet_rounds"]

logger = logging.getLogger(__name__)

#: A round is quiet when other processes used at most this share of all CPUs' time.
QUIET = 0.10


class CpuMeter:
    """Share of the machine's CPU time used by processes other than ours (Linux ``/proc``)."""

    def __init__(self) -> None:
        self.pids = [os.getpid()]
        self.available = Path("/proc/stat").exists()
        self.cpus = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def _busy() -> int:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields[:8]) - fields[3] - fields[4]  # minus idle and iowait

    def _own(self) -> int:
        total = 0
        for pid in self.pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total

    def start(self) -> tuple[float, int, int] | None:
        return (time.perf_counter(), self._busy(), self._own()) if self.available else None

    def foreign(self, mark: tuple[float, int, int] | None) -> float | None:
        """Other processes' share of all CPUs' time since ``mark``."""
        if mark is None:
            return None
        wall, busy, own = mark
        elapsed = (time.perf_counter() - wall) * self.tick * self.cpus
        return max(self._busy() - busy - (self._own() - own), 0) / max(elapsed, 1e-9)


def wait_quiet(meter: CpuMeter, timeout: float, window: float = 2.0) -> float:
    """Waits (at most ``timeout`` s) for a ``window`` in which other processes stay under :data:`QUIET`.

    Returns:
        Seconds waited.
    """
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        mark = meter.start()
        if mark is None:
            break
        time.sleep(window)
        if (meter.foreign(mark) or 0.0) <= QUIET:
            break
    return time.perf_counter() - start


def loadavg(ndigits: int | None = None) -> list[float] | None:
    """1/5/15-minute load averages (rounded to ``ndigits`` when given), or ``None``."""
    try:
        values = [float(v) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None
    return values if ndigits is None else [round(v, ndigits) for v in values]


def timed(fn: Callable[[], Any]) -> Callable[[int], float]:
    """A block timer: ``block(calls)`` runs ``fn`` that many times, returns microseconds per call."""

    def block(calls: int) -> float:
        clock = time.perf_counter_ns
        start = clock()
        for _ in range(calls):
            fn()
        return (clock() - start) / calls / 1e3

    return block


def quiet_rounds(variants: Mapping[str, Callable[[int], float]], names: Sequence[str], meter: CpuMeter, *,
                 calls: int, rounds: int, max_rounds: int, budget_s: float, wait_s: float, patience: float,
                 settle: float, foreign: list[float], quiet_window: float = 2.0) -> dict[str, Any]:
    """Times ``variants`` in interleaved rounds until ``rounds`` were quiet (or limits are reached).

    Each round runs every variant for ``calls`` calls after a ``settle`` pause,
    in ``names`` order, reversed every other round; ``foreign`` receives each
    round's worst share of CPU time taken by other processes (the caller keeps
    it even if timing fails midway).

    Returns:
        ``{"times": {name: [us per call per round]}, "waited": s, "load_start": ..., "load_end": ...}``.
    """
    for name in names:
        variants[name](max(calls // 2, 2))  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    load_start = loadavg()
    waited = wait_quiet(meter, wait_s, quiet_window)
    deadline = time.perf_counter() + budget_s
    index = 0
    # Rounds go on until `rounds` of them were quiet, or max_rounds or the time budget are used up.
    while sum(share <= QUIET for share in foreign) < rounds and index < max(max_rounds, rounds) and (
            index < rounds or time.perf_counter() < deadline):
        order = list(names) if index % 2 == 0 else list(names)[::-1]
        worst = 0.0
        for name in order:
            time.sleep(settle)
            mark = meter.start()
            times[name].append(variants[name](calls))
            share = meter.foreign(mark)
            worst = max(worst, share if share is not None else 0.0)
        foreign.append(worst)
        logger.debug("round %d (other processes %.0f%%): %s", index, 100 * worst,
                     ", ".join(f"{n} {times[n][-1]:.0f}" for n in names))
        index += 1
        if worst > QUIET and patience and index < max_rounds and time.perf_counter() < deadline:
            wait_quiet(meter, patience, quiet_window)  # let a burst of other work pass before the next round
    return {"times": times, "waited": waited, "load_start": load_start, "load_end": loadavg()}
