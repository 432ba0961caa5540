"""RebatchPass: give a traced step another per-replica batch size.

Re-planning a step for another replica count on the same global batch
changes every replica's batch: ``G / N`` rows become ``G / N'``. The traced
graph records the per-replica batch it was traced with
(``graph.meta.batch``), which inputs carry it (``graph.meta.per_replica_inputs``,
first dimension) and which constants were computed from it
(``value.meta["batch"]``, see :mod:`graphdist.ir.batch`).

Invariant established: ``graph.meta.batch`` is the new size; every
gather over the replicas records the new replica count (``num_replicas``); every
per-replica input's first dimension is it; every constant recorded as
``scale * B + offset`` holds that value for the new ``B``; every node's
outputs have the types its shape rule gives for the new inputs.

Cases:

* the size (and replica count) already in place: unchanged;
* only the replica count changes (a step without per-replica inputs that
  gathers over the replicas): gathers' ``num_replicas`` and shapes updated;
* per-replica inputs of rank 0 (no batch dimension): unchanged;
* a recorded constant (a Reshape target ``(B, -1)``, a divisor ``B``): recomputed;
* a node whose shape rule rejects the new shapes, or whose output dtype
  would change: ``GraphError`` naming the node and where it was traced;
* a graph traced with uneven per-replica shapes (replica variants) or
  without a per-replica batch: ``GraphError`` (there is no one batch size).

This pass trusts the recorded provenance; a step that computed something
from the batch size without recording it (``int(x.shape[0]) // 2``) is
caught before re-planning by comparing this pass's result with the step
traced again at another batch size (``graphdist.compile.replan``).
"""

from __future__ import annotations

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.batch import BatchDim, elements, evaluate
from graphdist.ir.graph import Graph
from graphdist.ir.ops import node_opdef
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["RebatchPass"]

#: Gathers over the replicas: their ``num_replicas`` attribute sizes their output.
_GATHERS = frozenset({"ReplicaAllGather", "CrossReplicaGather"})


class RebatchPass(PassBase):
    """Sets the per-replica batch size (and the replica count) of a traced step.

    Args:
        batch: The new per-replica batch size (``None``: keep it; for a step without per-replica inputs).
        replicas: The new number of replicas in sync (``None``: keep it): gathers over the replicas
            (``ReplicaAllGather``, ``CrossReplicaGather``) record it in ``num_replicas``.
    """

    def __init__(self, batch: int | None, replicas: int | None = None) -> None:
        if batch is not None and int(batch) < 1:
            raise GraphError(f"RebatchPass needs a positive batch size, got {batch}")
        if replicas is not None and int(replicas) < 1:
            raise GraphError(f"RebatchPass needs a positive replica count, got {replicas}")
        self.batch = None if batch is None else int(batch)
        self.replicas = None if replicas is None else int(replicas)

    def __repr__(self) -> str:
        return f"{self.name}(batch={self.batch}" + (f", replicas={self.replicas})" if self.replicas else ")")

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        current = graph.meta.batch
        rebatch = self.batch is not None and (current is None or int(current) != self.batch)
        recount = [n for n in graph.nodes if n.op_type in _GATHERS and self.replicas is not None
                   and int(n.attrs.get("num_replicas", 1)) != self.replicas]
        if not rebatch and not recount:
            return PassResult(graph, modified=False)
        if rebatch and (graph.meta.replica_variants or current is None):
            how = "with uneven per-replica shapes" if graph.meta.replica_variants else \
                "without per-replica inputs"
            raise GraphError(f"graph {graph.name!r} has no single per-replica batch size (it was traced {how}); it "
                             "cannot be given another one")
        if rebatch:
            self._set_batch(graph)
        for node in recount:
            node.attrs["num_replicas"] = self.replicas
        self._reinfer(graph)
        return PassResult(graph, modified=True)

    def _set_batch(self, graph: Graph) -> None:
        per_replica = graph.meta.per_replica_inputs
        for value in graph.inputs:
            if value.name in per_replica and value.shape:
                value.shape = (BatchDim(self.batch), *value.shape[1:])
        for value in graph.initializers.values():
            provenance = elements(value.meta.get("batch"))
            if provenance:
                value.const_value = evaluate(np.asarray(value.const_value), provenance, self.batch)
        graph.meta.batch = self.batch

    def _reinfer(self, graph: Graph) -> None:
        for node in graph.nodes:
            try:
                types = node_opdef(node).infer(node, len(node.outputs))
            except GraphError as err:
                raise GraphError(self._where(node) + f": {err}") from None
            for out, (dtype, shape) in zip(node.outputs, types):
                if np.dtype(dtype) != out.dtype:
                    raise GraphError(self._where(node) + f": its output %{out.name} would become "
                                     f"{np.dtype(dtype).name} instead of {out.dtype.name}")
                out.shape = tuple(shape)

    def _where(self, node: object) -> str:
        source = getattr(node, "meta", {}).get("source")
        count = f" and {self.replicas} replica(s)" if self.replicas else ""
        return (f"cannot give per-replica batch {self.batch}{count} to node "
                f"{getattr(node, 'name', '?')} ({getattr(node, 'qualified_op', '?')}"
                f"{', traced at ' + source if source else ''})")
