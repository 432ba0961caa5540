"""OffsetReplicaIdsPass: number this worker's replicas among all workers' replicas.

Invariant established: no ``graphdist.ReplicaId`` node remains; each was
replaced by an int32 scalar initializer holding its replica's index in the
whole sync group, ``offset + local replica index`` (worker ``w`` of a
multi-worker job with ``k`` replicas per worker has ``offset = w * k``).

Cases:
* node annotated with ``node.replica`` or ``meta["replica"]``: that local index plus the offset;
* neither (cross-replica context): replica 0 of this worker, i.e. the offset;
* no ``ReplicaId`` node: unchanged.
"""

from __future__ import annotations

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph
from passes.base import PassBase, PassContext, PassResult

__all__ = ["OffsetReplicaIdsPass"]


class OffsetReplicaIdsPass(PassBase):
    """Replaces every ``graphdist.ReplicaId`` by its global index (an int32 constant).

    Args:
        offset: Global index of this worker's first replica.
    """

    def __init__(self, offset: int) -> None:
        self.offset = int(offset)

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        targets = graph.find_nodes("ReplicaId", GRAPHDIST_DOMAIN)
        for node in targets:
            local = node.replica if node.replica is not None else node.meta.get("replica", 0)
            index = self.offset + int(local or 0)
            constant = graph.add_initializer(f"replica_id_{index}", np.array(index, dtype=np.int32))
            graph.replace_all_uses_with(node.outputs[0], constant)
            graph.remove_node(node)
        return PassResult(graph, modified=bool(targets))
