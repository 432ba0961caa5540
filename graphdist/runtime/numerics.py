"""NaN and infinity checks: the switch behind ``gd.debugging.enable_check_numerics()``, and save warnings.

* :func:`enable` / :func:`disable` / :func:`enabled`: while on, the scheduler
  checks every floating-point value each segment of a step computes for the
  others (its outputs), and a step in which one is NaN or infinite ends with
  :class:`NonFiniteOutputsError` once every task of the step has run (so that every
  collective completes on every process, as the run-time range checks do).
  The step's results are not returned and its variable updates are not
  written. Off (the default), the scheduler reads the switch once per step
  and checks nothing.
* :class:`NonFiniteOutputsError`: which segment, which outputs, and the feeds it
  ran on; ``graphdist.compile.numerics`` re-runs that segment with every
  intermediate value exposed to name the op that made the first NaN or
  infinity.
* :func:`non_finite` and :func:`warn_non_finite`: which arrays of a set hold
  NaN or infinity; ``Checkpoint.save`` and ``model.save`` warn once per save.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist.errors import NumericsError

__all__ = ["enable", "disable", "enabled", "non_finite", "count_non_finite", "warn_non_finite",
           "NonFiniteOutputsError", "find_non_finite_outputs"]

logger = logging.getLogger(__name__)

_enabled = False


def enable() -> None:
    """Turns the checks on for every step run from now on (every process's own switch)."""
    global _enabled
    _enabled = True
    logger.info("check numerics enabled: every segment's floating-point outputs are checked for NaN and Inf")


def disable() -> None:
    """Turns the checks off (the default)."""
    global _enabled
    _enabled = False


def enabled() -> bool:
    """Whether the checks are on."""
    return _enabled


def count_non_finite(array: Any) -> tuple[int, int]:
    """``(NaN count, infinity count)`` of a floating-point or complex array (``(0, 0)`` for other dtypes)."""
    array = np.asarray(array)
    if array.dtype.kind not in "fc" or array.size == 0:
        return 0, 0
    if np.isfinite(array).all():
        return 0, 0
    nans = int(np.count_nonzero(np.isnan(array)))
    return nans, int(np.count_nonzero(np.isinf(array)))


def describe_counts(nans: int, infs: int, size: int) -> str:
    """``"NaN (3 of 8 elements)"``, ``"Inf (1 of 8 elements)"`` or ``"NaN and Inf (2 and 1 of 8 elements)"``."""
    if nans and infs:
        return f"NaN and Inf ({nans:,} and {infs:,} of {size:,} elements)"
    return f"{'NaN' if nans else 'Inf'} ({max(nans, infs):,} of {size:,} elements)"


def non_finite(arrays: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """``(name, NaN count, infinity count)`` of each array of ``arrays`` that holds NaN or infinity."""
    found = []
    for name, array in arrays.items():
        nans, infs = count_non_finite(array)
        if nans or infs:
            found.append((name, nans, infs))
    return found


def warn_non_finite(arrays: Mapping[str, Any], what: str, target: str | None = None) -> list[str]:
    """Logs one warning when arrays of ``arrays`` hold NaN or infinity (every time: once per save).

    Args:
        arrays: Name -> array (for a save: every weight it writes).
        what: Who is saving (``"Checkpoint.save"``, ``"model.save"``).
        target: Where to (named in the message).

    Returns:
        The names of the arrays that hold NaN or infinity.
    """
    found = non_finite(arrays)
    if not found:
        return []
    listed = ", ".join(f"{name} ({'NaN' if nans else ''}{' and ' if nans and infs else ''}{'Inf' if infs else ''})"
                       for name, nans, infs in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    message = (f"{what}{f' to {target}' if target else ''}: {len(found)} weight(s) hold NaN or Inf: {listed}{more}; "
               "they are saved as they are, and a restore brings them back: restore an earlier checkpoint, or find "
               "the step that made them with gd.debugging.enable_check_numerics()")
    logger.warning("%s", message)  # logged, not warnings.warn: Python would show a repeated save's warning once
    return [name for name, _, _ in found]


@dataclass
class _Bad:
    name: str
    nans: int
    infs: int
    size: int


class NonFiniteOutputsError(NumericsError):
    """A segment of a step computed NaN or infinity (raised by the scheduler while the checks are on).

    Attributes:
        segment: The index of the segment in its plan.
        feeds: The values the segment ran on (by input name), to run it again.
        bad: ``(output name, NaN count, infinity count, size)`` of each non-finite output.
    """

    def __init__(self, message: str, segment: int, feeds: dict[str, Any], bad: list[_Bad]) -> None:
        super().__init__(message)
        self.segment = segment
        self.feeds = feeds
        self.bad = bad


def find_non_finite_outputs(index: int, segment: Any, feeds: Mapping[str, Any],
                            outputs: Iterable[Any]) -> NonFiniteOutputsError | None:
    """The error to raise when ``outputs`` (of ``segment``, run on ``feeds``) hold NaN or infinity, else ``None``.

    The message names the segment, its device and the op that computed the first non-finite output (the
    compile layer names the op that made it first, running the segment again).
    """
    bad = []
    for name, array in zip(segment.outputs, outputs):
        nans, infs = count_non_finite(array)
        if nans or infs:
            bad.append(_Bad(name, nans, infs, int(np.asarray(array).size)))
    if not bad:
        return None
    first = bad[0]
    producer = _producer(segment.graph, first.name)
    message = (f"check numerics: {describe_counts(first.nans, first.infs, first.size)} in %{first.name}, "
               f"computed by {producer} in segment {segment.name!r} on {segment.device}")
    return NonFiniteOutputsError(message, index, dict(feeds), bad)


def _producer(graph: Any, name: str) -> str:
    for node in reversed(graph.nodes):
        if any(out.name == name for out in node.outputs):
            source = node.meta.get("source")
            return f"op {node.qualified_op} (node {node.name!r}{f', traced at {source}' if source else ''})"
    return "no op (a value the segment passes through)"
