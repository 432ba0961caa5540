"""``CompileTarget``: everything compilation needs from a strategy, and nothing more.

``gd.function``, re-planning and the pass diffs know a strategy only through
this protocol; every :class:`graphdist.distribute.Strategy` implements it
publicly. Compilation never reads a strategy's private members, never tests
which methods it has, and never finds it through the thread-local scope
stack: the trace records the strategies the step used
(``TraceContext.strategies``, and ``TraceContext.scope_strategy`` for a step
that only ran inside a scope), and :class:`~graphdist.compile.function.Function`
picks from those or from its own ``strategy`` argument.

Devices and replica counts reach the passes through one channel, the
:class:`~graphdist.compile.pipeline.PipelineConfig` that
:meth:`CompileTarget.pipeline_config` returns: the pipeline's passes are built
from it, and :func:`~graphdist.compile.pipeline.pass_context` makes the
``PassContext`` from the same config.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

from graphdist.compile.pipeline import PipelineConfig
from graphdist.ir.placement import VariablePlacement, VariableSpec

__all__ = ["CompileTarget", "Communicator"]


@runtime_checkable
class Communicator(Protocol):
    """What a compiled step needs of the communicator between workers: gathering a ZeRO-1 state's chunks."""

    def all_gather(self, buffer: np.ndarray, axis: int = 0, name: str = "") -> np.ndarray:
        """Every worker's ``buffer``, joined along ``axis`` in worker order (a collective: all workers call it)."""
        ...


@runtime_checkable
class CompileTarget(Protocol):
    """A strategy, as compilation sees it.

    Attributes:
        name: The strategy's name, for messages (``"MirroredStrategy"``).
        communicator: The communicator between this strategy's workers, or ``None`` (one worker, or no
            collectives between processes).
    """

    @property
    def name(self) -> str: ...

    @property
    def communicator(self) -> Communicator | None: ...

    def pipeline_config(self) -> PipelineConfig:
        """How a traced step is distributed (devices, replica counts, collectives: plain data)."""
        ...

    def variable_placement(self, spec: VariableSpec, variable: Any = None) -> VariablePlacement:
        """Where ``variable`` (a ``gd.Variable`` the step reads or updates, described by ``spec``) lives."""
        ...

    def value_placement(self, spec: VariableSpec, value: np.ndarray) -> VariablePlacement:
        """Where a re-planned step's variable lives, given its stored value (there is no ``gd.Variable``)."""
        ...

    def scope(self) -> AbstractContextManager[Any]:
        """The context a step is traced in (``strategy.scope()``)."""
        ...
