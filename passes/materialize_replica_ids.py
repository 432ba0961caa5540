"""MaterializeReplicaIdsPass: replace ``graphdist.ReplicaId`` by constants.

Invariant established: no ``ReplicaId`` node remains; each was replaced by an
int32 scalar initializer holding its replica's index.

Cases:
* node annotated with ``node.replica`` (after replication): that index;
* node annotated with ``meta["replica"]`` (traced inside ``strategy.run``): that index;
* neither (replica context of the default strategy): 0.
"""

from __future__ import annotations

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph
from passes.base import PassBase, PassContext, PassResult

__all__ = ["MaterializeReplicaIdsPass"]


class MaterializeReplicaIdsPass(PassBase):
    """Replaces every ``graphdist.ReplicaId`` node by an int32 constant."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        targets = graph.find_nodes("ReplicaId", GRAPHDIST_DOMAIN)
        for node in targets:
            replica = node.replica if node.replica is not None else node.meta.get("replica", 0)
            constant = graph.add_initializer(f"replica_id_{replica}", np.array(replica, dtype=np.int32))
            graph.replace_all_uses_with(node.outputs[0], constant)
            graph.remove_node(node)
        return PassResult(graph, modified=bool(targets))
