"""Replica ops of the ``graphdist`` domain: what a traced step knows about its replicas.

* ``ReplicaId() -> int32 scalar``: this replica's index in its sync group.
"""

from __future__ import annotations

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node
from graphdist.ir.ops import OpDef, TypeList, register_op

__all__ = ["register_replica_ops"]


def _infer_replica_id(node: Node, _: int | None) -> TypeList:
    return [(np.dtype(np.int32), ())]


def register_replica_ops() -> None:
    """Registers the replica ops in the OpDef registry."""
    register_op(OpDef("ReplicaId", GRAPHDIST_DOMAIN, _infer_replica_id,
                      reference=lambda replica=0, **_: (np.array(replica, np.int32),),
                      doc="The replica's index in its sync group (int32 scalar)."))


register_replica_ops()
