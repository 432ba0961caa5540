"""Graph-level metadata: what the tracer, the strategies and the passes record about a whole graph.

:class:`GraphMeta` is ``Graph.meta``: one typed field per entry, each documented with the modules that
write it and what it holds. Node and value annotations stay free-form (``Node.meta``, ``Value.meta``).

An empty container field means what an absent key meant before: nothing recorded. ``None`` fields
(``batch``, ``placement``, ``replication``, ``accumulate_steps``...) are ``None`` until written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from graphdist.ir.layouts import MeshSpec
from graphdist.ir.placement import PlacementSpec, VariableSpec

__all__ = ["GraphMeta", "Replication"]


@dataclass(frozen=True)
class Replication:
    """What ``ReplicatePass`` did (``graph.meta.replication``).

    Attributes:
        replicas: Local replicas made.
        offset: Global index of the first local replica.
        replicas_in_sync: Replicas over all workers.
        input_map: Traced per-replica input name -> ``{replica: rewritten input name}``.
        output_map: Traced output position -> rewritten position (outputs that are not per replica).
        replica_outputs: Traced per-replica output position -> ``{replica: rewritten position}``.
    """

    replicas: int
    offset: int
    replicas_in_sync: int
    input_map: dict[str, dict[int, str]]
    output_map: dict[int, int]
    replica_outputs: dict[int, dict[int, int]]


@dataclass
class GraphMeta:
    """Annotations of a whole :class:`~graphdist.ir.graph.Graph` (``graph.meta``).

    Attributes:
        output_tree: The step's result structure (a :mod:`graphdist.nest` treedef) whose leaves are the
            graph outputs. Written by the tracer (``trace/tracer.py``); read by callers that rebuild results.
        variables: ``(input name, VariableSpec)`` of every variable the graph reads, in input order.
            Written by ``trace/variables.py`` while tracing, by ``compile/step.py`` and ``compile/load.py``
            for loaded plans; read by ``ir/placement.py``, the strategies' passes and ``compile/``.
        placement: Where each variable lives (by uid), the strategy's decision. Written by
            ``compile/build.py``, ``compile/load.py`` and ``ShardOptimizerStatePass``; read by
            ``ir/placement.py``, ``compile/export.py`` and the placement passes.
        variable_updates: ``(output name, variable uid)`` pairs: graph outputs that are a variable's new
            value. Written by ``LowerVariableUpdatesPass``, ``PlaceVariablesPass``, ``PlacePsVariablesPass``,
            ``BalanceVariableUpdatesPass``, ``ShardOptimizerStatePass`` and ``compile/load.py``; read by
            ``compile/`` (function, export, build, render) and ``ir/render.py``.
        replication: What ``ReplicatePass`` did (replica count, offset, input and output maps); ``None``
            before it ran. Read by the passes after it and ``compile/interface.py``.
        batch: The per-replica batch size the per-replica inputs share, or ``None``. Written by
            ``compile/function.py`` after tracing, ``compile/step.py`` for loaded plans and ``RebatchPass``;
            read by the batch-cutting passes and ``compile/replan.py``.
        sharded_state: Variable uid -> layout (``replicas``, ``shard``, ``size``, maybe ``workers`` and
            ``parts``) of optimizer slots sharded across replicas. Written by ``ShardOptimizerStatePass``;
            read by ``compile/function.py`` and ``ir/render.py``.
        accumulate_steps: Micro-batches per replica step, once a pass cut the batch
            (``AccumulateGradientsPass``, ``SplitBatchChunksPass``, ``ChunkBatchReductionsPass``); ``None``
            before. Its presence tells the batch-cutting passes the cut is done.
        deterministic_chunks: Chunks of the global batch the deterministic-reduction passes cut it into
            (``SplitBatchChunksPass``, ``ChunkBatchReductionsPass``; ``compile/load.py`` for loaded plans, whose
            ``Plan.compile`` then keeps to the intra-op thread counts op determinism was checked with); ``None``
            when not cut that way.
        per_replica_inputs: Graph input name -> variant (``None`` when every replica has the same shape) of
            the inputs that hold a per-replica value. Written by ``compile/step_io.py`` while tracing and
            ``compile/step.py`` for loaded plans; read by ``ReplicatePass``, the batch passes, replan.
        per_replica_outputs: Graph output position -> variant of the outputs that are per-replica values.
            Written by ``compile/step_io.py`` and ``compile/step.py``; read by ``ReplicatePass``.
        replica_variants: Variant name -> the replicas that run it, when per-replica inputs differ in shape
            across replicas. Written by ``compile/step_io.py`` and ``compile/step.py``; read by
            ``ReplicatePass``, ``trace/variables.py`` and the passes that need even shapes.
        specialised: Input name -> ``(argument, value)`` of inputs the trace used as constants (see
            ``compile/guards.py``). Written by ``compile/function.py`` and ``compile/step.py``.
        reads_num_replicas: ``file:line`` of user code that read ``num_replicas_in_sync`` while tracing.
            Written by ``distribute/strategy.py``; read by ``compile/function.py`` and ``compile/replan.py``.
        converted: Opset -> this (imported) graph converted to that opset; a cache of ``trace/inline.py``.
        scan_bodies: Imported Scan bodies by ``(node name, input types)``; a cache of
            ``trace/control_flow.py``.
        loop_bodies: Imported Loop bodies, as ``scan_bodies``.
        branches: Imported If branches, as ``scan_bodies``.
        mesh: The device mesh (:class:`~graphdist.ir.layouts.MeshSpec`) the layouts refer to, under
            tensor parallelism. Written by ``PropagateLayoutsPass``; read by ``LowerLayoutsPass`` and
            ``ir/render.py``.
        layouts: Value name -> ``[type, layout, block per device]`` of the values split or partial over the
            mesh. Written by ``LowerLayoutsPass``; read by ``ir/render.py`` (the summary's layouts section).
        extra: Extension data of one module, by key (no graphdist module uses it today).
    """

    output_tree: Any = None
    variables: list[tuple[str, VariableSpec]] = field(default_factory=list)
    placement: PlacementSpec | None = None
    variable_updates: list[tuple[str, str]] = field(default_factory=list)
    replication: Replication | None = None
    batch: int | None = None
    sharded_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    accumulate_steps: int | None = None
    deterministic_chunks: int | None = None
    per_replica_inputs: dict[str, str | None] = field(default_factory=dict)
    per_replica_outputs: dict[int, str | None] = field(default_factory=dict)
    replica_variants: dict[str, list[int]] = field(default_factory=dict)
    specialised: dict[str, tuple[str, Any]] = field(default_factory=dict)
    reads_num_replicas: list[str] = field(default_factory=list)
    converted: dict[int, Any] = field(default_factory=dict)
    scan_bodies: dict[Any, Any] = field(default_factory=dict)
    loop_bodies: dict[Any, Any] = field(default_factory=dict)
    branches: dict[Any, Any] = field(default_factory=dict)
    mesh: MeshSpec | None = None
    layouts: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> GraphMeta:
        """A shallow copy, as ``Graph.copy`` made of the former dict: a recorded container is shared with
        the copy (a pass that edits one builds a new one), an empty one is the copy's own, as an absent
        key was; ``extra`` is a new dict of the same entries.
        """
        values = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            values[item.name] = type(value)() if isinstance(value, (list, dict)) and not value else value
        values["extra"] = dict(self.extra)
        return GraphMeta(**values)
