"""Pass infrastructure: ``PassBase``, ``PassResult``, ``PassContext``, ``PassManager``.

The contract of a pass, as onnx-ir's ``_pass_infra`` and torch.fx's ``PassBase`` state it:

* A pass establishes one invariant (stated in its docstring). ``call`` first analyses, then rewrites, and
  reports honestly whether it changed the graph (``PassResult.modified``); running a pass twice changes
  nothing the second time.
* ``requires(graph, ctx)`` checks what the pass needs of its input (raise :class:`PreconditionError`);
  ``ensures(graph, ctx)`` checks what it promises of its output (raise :class:`PostconditionError`). Both
  run around every call; a failure names the pass.
* ``in_place``: ``True`` when ``call`` edits the graph it is given and returns it; ``False`` when it returns
  a new graph and leaves its input alone.
* ``runs_after``: names of passes that must come earlier when a pipeline holds both. A
  :class:`PassManager` checks the order when it is made (:class:`PipelineOrderError`), so a wrong pipeline
  fails when it is built, not when a graph is half rewritten.

With ``ctx.check`` (``GRAPHDIST_VERIFY=passes``; the tests set it) the graph is verified after every pass,
and a broken invariant is a :class:`PostconditionError` naming the pass; otherwise the manager verifies
once, after the last pass. Every stage is dumped when ``GRAPHDIST_DUMP`` (or ``ctx.dump_dir``) names a
directory.
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

from graphdist.errors import GraphError, PipelineOrderError, PostconditionError, PreconditionError
from graphdist.ir.graph import Graph
from graphdist.ir.onnx_io import to_onnx
from graphdist.ir.render import graph_summary
from graphdist.ir.verify import verify

__all__ = ["PassBase", "PassResult", "PassContext", "PassManager", "check_order", "PreconditionError",
           "PostconditionError", "PipelineOrderError"]

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
    """Base class of graph passes (the contract: see the module docstring).

    Attributes:
        stage: Stage the graph is in after this pass (``None``: unchanged).
        in_place: ``call`` edits and returns the graph it is given (else it returns a new one).
        runs_after: Names of the passes that must run before this one when a pipeline holds both.
    """

    stage: str | None = None
    in_place: bool = True
    runs_after: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The pass's class name."""
        return type(self).__name__

    def requires(self, graph: Graph, ctx: PassContext) -> None:
        """Checks that ``graph`` is one this pass can rewrite; raises :class:`PreconditionError` if not."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        """Runs the pass on ``graph``."""
        raise NotImplementedError

    def ensures(self, graph: Graph, ctx: PassContext) -> None:
        """Checks what the pass promises of its result; raises :class:`PostconditionError` if broken."""

    def __call__(self, graph: Graph, ctx: PassContext | None = None) -> PassResult:
        ctx = ctx or PassContext()
        try:
            self.requires(graph, ctx)
        except PreconditionError as err:
            raise PreconditionError(f"{self.name} cannot run on graph {graph.name!r}: {err}") from None
        result = self.call(graph, ctx)
        if self.stage is not None:
            result.graph.stage = self.stage
        try:
            self.ensures(result.graph, ctx)
            if ctx.check:
                verify(result.graph)
        except GraphError as err:
            raise PostconditionError(f"{self.name} broke graph {result.graph.name!r}: {err}") from None
        return result

    def __repr__(self) -> str:
        return f"{self.name}()"


def check_order(passes: list[PassBase]) -> None:
    """Raises :class:`PipelineOrderError` when a pass comes before a pass it must run after."""
    position = {}
    for index, pass_ in enumerate(passes):
        position.setdefault(pass_.name, index)
    for index, pass_ in enumerate(passes):
        late = [name for name in pass_.runs_after if position.get(name, -1) > index]
        if late:
            raise PipelineOrderError(
                f"pipeline [{', '.join(p.name for p in passes)}] runs {pass_.name} (position {index}) before "
                f"{', '.join(f'{n} (position {position[n]})' for n in late)}, which it must run after")


class PassManager:
    """Runs a list of passes in order."""

    def __init__(self, passes: list[PassBase]) -> None:
        self.passes = list(passes)
        check_order(self.passes)

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
        (directory / f"{stem}.txt").write_text(graph_summary(graph) + "\n")
        try:
            import onnx

            onnx.save(to_onnx(graph), str(directory / f"{stem}.onnx"))
        except Exception as err:  # noqa: BLE001 - a dump must never break compilation
            logger.warning("could not write ONNX dump %s: %s", stem, err)
