"""RebatchPass: give a traced step another per-replica batch size.

Re-planning a step for another replica count on the same global batch
changes every replica's batch: ``G / N`` rows become ``G / N'``. The traced
graph records the per-replica batch it was traced with
(``graph.meta["batch"]``), which inputs carry it (``meta["per_replica_inputs"]``,
first dimension) and which constants were computed from it
(``value.meta["batch"]``, see :mod:`graphdist.ir.batch`).

Invariant established: ``graph.meta["batch"]`` is the new size; every
per-replica input's first dimension is it; every constant recorded as
``scale * B + offset`` holds that value for the new ``B``; every node's
outputs have the types its shape rule gives for the new inputs.

Cases:

* the size already in place: unchanged;
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
from passes.base import PassBase, PassContext, PassResult

__all__ = ["RebatchPass"]


class RebatchPass(PassBase):
    """Sets the per-replica batch size of a traced step.

    Args:
        batch: The new per-replica batch size.
    """

    def __init__(self, batch: int) -> None:
        if int(batch) < 1:
            raise GraphError(f"RebatchPass needs a positive batch size, got {batch}")
        self.batch = int(batch)

    def __repr__(self) -> str:
        return f"{self.name}(batch={self.batch})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        current = graph.meta.get("batch")
        if graph.meta.get("replica_variants") or current is None:
            how = "with uneven per-replica shapes" if graph.meta.get("replica_variants") else \
                "without per-replica inputs"
            raise GraphError(f"graph {graph.name!r} has no single per-replica batch size (it was traced {how}); it "
                             "cannot be given another one")
        if int(current) == self.batch:
            return PassResult(graph, modified=False)
        per_replica = graph.meta.get("per_replica_inputs", {})
        for value in graph.inputs:
            if value.name in per_replica and value.shape:
                value.shape = (BatchDim(self.batch), *value.shape[1:])
        for value in graph.initializers.values():
            provenance = elements(value.meta.get("batch"))
            if provenance:
                value.const_value = evaluate(np.asarray(value.const_value), provenance, self.batch)
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
        graph.meta["batch"] = self.batch
        return PassResult(graph, modified=True)

    def _where(self, node: object) -> str:
        source = getattr(node, "meta", {}).get("source")
        return (f"cannot give per-replica batch {self.batch} to node {getattr(node, 'name', '?')} "
                f"({getattr(node, 'qualified_op', '?')}{', traced at ' + source if source else ''})")
