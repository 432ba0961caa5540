"""Process-wide counters of expensive events (traces, compiles, cache hits).

Tests and users read them to check that a second call with the same input
signature neither re-traces nor recompiles::

    before = gd.stats.snapshot()
    strategy.run(fn, args=(x,))
    assert gd.stats.snapshot()["traces"] == before["traces"]
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["increment", "snapshot", "reset", "delta"]

_lock = threading.Lock()
_counts: Counter[str] = Counter()

# Names used across the code base; other names are allowed.
KNOWN = (
    "traces",  # functions traced into a graph
    "compiles",  # backend compile calls that did real work
    "memory_cache_hits",  # compiled executables found in memory
    "disk_cache_hits",  # compiled artefacts loaded from the on-disk cache
    "plan_runs",  # plans executed
)


def increment(name: str, amount: int = 1) -> None:
    """Adds ``amount`` to counter ``name``."""
    with _lock:
        _counts[name] += amount


def snapshot() -> dict[str, int]:
    """Returns a copy of every counter (known names default to 0)."""
    with _lock:
        out = {name: 0 for name in KNOWN}
        out.update(_counts)
        return out


def delta(before: dict[str, int]) -> dict[str, int]:
    """Returns how much each counter grew since ``before`` (a snapshot)."""
    now = snapshot()
    return {name: now[name] - before.get(name, 0) for name in now}


def reset() -> None:
    """Sets every counter back to zero."""
    with _lock:
        _counts.clear()
