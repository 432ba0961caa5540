"""Executes a plan's segments in dependency order.

With one segment (one device) the scheduler calls the executable directly,
so the per-step overhead is one dictionary and one backend call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graphdist import stats
from graphdist.errors import PlanError

if TYPE_CHECKING:
    from graphdist.compile.plan import Plan

__all__ = ["Scheduler"]


class Scheduler:
    """Runs a compiled :class:`~graphdist.compile.plan.Plan`."""

    def __init__(self, plan: Plan, executables: Sequence[Any]) -> None:
        self._plan = plan
        self._executables = list(executables)
        self._single = len(plan.segments) == 1 and not plan.constants and set(
            plan.output_names) <= set(plan.segments[0].outputs)
        if self._single:
            positions = {name: i for i, name in enumerate(plan.segments[0].outputs)}
            self._picks = [positions[name] for name in plan.output_names]
            self._identity = self._picks == list(range(len(plan.segments[0].outputs)))
            self._seg_inputs = list(plan.segments[0].inputs)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs every segment and returns the plan's outputs in order."""
        stats.increment("plan_runs")
        if self._single:
            seg_feeds = feeds if len(feeds) == len(self._seg_inputs) else {n: feeds[n] for n in self._seg_inputs}
            outs = self._executables[0].run(seg_feeds)
            return outs if self._identity else [outs[i] for i in self._picks]
        env: dict[str, Any] = dict(self._plan.constants)
        env.update(feeds)
        for segment, executable in zip(self._plan.segments, self._executables):
            try:
                seg_feeds = {name: env[name] for name in segment.inputs}
            except KeyError as err:
                missing = err.args[0]
                raise PlanError(f"segment {segment.name} needs {missing!r}, which no earlier step produced") from None
            env.update(zip(segment.outputs, executable.run(seg_feeds)))
        return [env[name] for name in self._plan.output_names]
