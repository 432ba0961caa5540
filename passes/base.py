"""Pass infrastructure: ``PassBase``, ``PassResult``, ``PassContext``, ``PassManager``.

A pass establishes one invariant (stated in its docstring). ``call`` first
analyses, then rewrites, and reports honestly whether it changed the graph;
running a pass twice changes nothing the second time. The manager verifies
the graph after each pass when ``ctx.check`` (``GRAPHDIST_VERIFY=passes``;
the tests set it), else once, after the last pass; and dumps every stage
when ``GRAPHDIST_DUMP`` (or ``ctx.dump_dir``) names a directory.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphdist.ir.graph import Graph
from graphdist.ir.verify import verify

__all__ = ["PassBase", "PassResult", "PassContext", "PassManager"]

logger = logging.getLogger(__name__)


@dataclass
class PassResult:
    """What a pass returns: the (possibly new) graph and whether it changed."""

    graph: Graph
    modified: bool


@dataclass
class PassContext:
    """Information every pass may read.

    Attributes:
        devices: Device strings of the replicas, in replica order.
        check: Verify the graph after every pass (default: ``GRAPHDIST_VERIFY=passes``); otherwise the
            graph is verified once, after the last pass.
        dump_dir: Directory to write every stage into (text + ONNX).
        options: Pass-specific options by name.
    """

    devices: tuple[str, ...] = ("cpu:0",)
    check: bool = field(default_factory=lambda: os.environ.get("GRAPHDIST_VERIFY", "") == "passes")
    dump_dir: str | None = field(default_factory=lambda: os.environ.get("GRAPHDIST_DUMP") or None)
    options: dict[str, Any] = field(default_factory=dict)


class PassBase:
    """Base class of graph passes.

    Attributes:
        stage: Stage the graph is in after this pass (``None``: unchanged).
    """

    stage: str | None = None

    @property
    def name(self) -> str:
        """The pass's class name."""
        return type(self).__name__

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        """Runs the pass on ``graph``."""
        raise NotImplementedError

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> PassResult:
        result = self.call(graph, ctx or PassContext())
        if self.stage is not None:
            result.graph.stage = self.stage
        return result

    def __repr__(self) -> str:
        return f"{self.name}()"


class PassManager:
    """Runs a list of passes in order."""

    def __init__(self, passes: list[PassBase]) -> None:
        self.passes = list(passes)

    def run(self, graph: Graph, ctx: PassContext | None = None,
            on_pass: Callable[[PassBase, PassResult], None] | None = None) -> PassResult:
        """Runs every pass; returns the final graph and whether any pass changed it.

        ``on_pass(pass_, result)``, when given, is called after each pass (once
        the graph is verified), e.g. to record what the pass changed.
        """
        ctx = ctx or PassContext()
        modified = False
        self._dump(graph, ctx, 0, "traced")
        for index, pass_ in enumerate(self.passes, start=1):
            start = time.perf_counter()
            result = pass_(graph, ctx)
            graph, modified = result.graph, modified or result.modified
            logger.info("pass %s on %s: %.1f ms, modified=%s, %d nodes", pass_.name, graph.name,
                        (time.perf_counter() - start) * 1e3, result.modified, len(graph.nodes))
            if ctx.check:
                verify(graph)  # names the pass that broke an invariant
            self._dump(graph, ctx, index, pass_.name)
            if on_pass is not None:
                on_pass(pass_, result)
        if not ctx.check and self.passes:
            verify(graph)
        return PassResult(graph, modified)

    @staticmethod
    def _dump(graph: Graph, ctx: PassContext, index: int, label: str) -> None:
        if not ctx.dump_dir:
            return
        directory = Path(ctx.dump_dir)
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', graph.name)}.{index:02d}.{label}"
        (directory / f"{stem}.txt").write_text(graph.summary() + "\n")
        try:
            import onnx

            onnx.save(graph.to_onnx(), str(directory / f"{stem}.onnx"))
        except Exception as err:  # noqa: BLE001 - a dump must never break compilation
            logger.warning("could not write ONNX dump %s: %s", stem, err)
