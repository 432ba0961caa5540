"""Replica ops of the ``graphdist`` domain: what a step traced as one replica says about the others.

A step is traced once, as one replica, whatever the strategy; these ops
stand for everything that depends on the other replicas, so the traced
graph holds no group size, device or communication. ``ReplicatePass``
makes the replicas and materialises the first three;
``InsertCollectivesPass`` turns the last four into collective groups.

* ``ReplicaId() -> int32``: this replica's index among the replicas in sync;
* ``NumReplicas() -> int32``: the number of replicas in sync;
* ``ReadReplica(x) -> x`` (``replica``): in cross-replica code, replica
  ``replica``'s copy of the replica value ``x`` (``PerReplica.values[i]``);
* ``ReplicaAllReduce(x) -> x`` (``reduce_op``, ``group_key``): in a replica,
  the reduction of every replica's ``x`` (``ReplicaContext.all_reduce``, the
  optimizer's gradient aggregation);
* ``ReplicaAllGather(x) -> y`` (``axis``, ``group_key``, ``num_replicas``): in a
  replica, every replica's ``x`` concatenated along ``axis``; ``num_replicas``
  (the replicas in sync the step was traced for) gives ``y``'s shape;
* ``CrossReplicaReduce(x, ...) -> x`` (``reduce_op``, ``group_key``): in
  cross-replica code, the reduction of a replica value over the replicas
  (``strategy.reduce``); after replication its inputs are the replicas' copies;
* ``CrossReplicaGather(x, ...) -> y`` (``axis``, ``group_key``, ``num_replicas``):
  the same for ``strategy.gather``.

Nodes traced inside ``strategy.run`` carry ``meta["context"] == "replica"``
(:func:`is_replica_node`), and ``meta["variant"]`` when the replicas'
arguments had different shapes and were traced once per shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.comm_ops import _REDUCERS, gathered
from graphdist.ir.gradients import GradBuilder, register_gradient
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node, Value
from graphdist.ir.ops import OpDef, TypeList, _unary, register_op

__all__ = ["CROSS_REPLICA_OPS", "REPLICA_COLLECTIVES", "is_replica_node", "register_replica_ops"]

#: Cross-replica-context ops whose inputs become every replica's copy.
CROSS_REPLICA_OPS = frozenset({"CrossReplicaReduce", "CrossReplicaGather"})
#: Replica-context ops joined across replicas by ``group_key``.
REPLICA_COLLECTIVES = frozenset({"ReplicaAllReduce", "ReplicaAllGather"})


def is_replica_node(node: Node) -> bool:
    """True for nodes traced inside ``strategy.run`` (one copy per replica after ``ReplicatePass``)."""
    return node.meta.get("context") == "replica"


def _scalar_int32(node: Node, _: int | None) -> TypeList:
    return [(np.dtype(np.int32), ())]


def _reduced(node: Node, _: int | None) -> TypeList:
    values = [v for v in node.inputs if v is not None]
    if not values:
        raise GraphError(f"{node.op_type} ({node.name}) needs at least one input")
    first = values[0]
    for other in values[1:]:
        if other.dtype != first.dtype or other.shape != first.shape:
            raise GraphError(f"{node.op_type} {node.attrs.get('group_key', node.name)} reduces values of different "
                             f"types ({first.type_str()} and {other.type_str()}); per-replica values reduced together "
                             "must match (pad or slice them to one shape first)")
    return [(first.dtype, first.shape)]


def _reference_reduce(*values: np.ndarray, reduce_op: str = "SUM", **_: Any) -> tuple[np.ndarray]:
    total = values[0]
    for other in values[1:]:
        total = _REDUCERS[reduce_op](total, other)
    if reduce_op == "MEAN" and len(values) > 1:
        total = total // len(values) if total.dtype.kind in "iu" else (total / len(values)).astype(total.dtype)
    return (np.array(total, copy=True),)


def _reference_gather(*values: np.ndarray, axis: int = 0, **_: Any) -> tuple[np.ndarray]:
    return (np.concatenate(values, axis=axis),)


def _reference_identity(value: np.ndarray, **_: Any) -> tuple[np.ndarray]:
    return (value,)


def register_replica_ops() -> None:
    """Registers the replica ops (and their gradient rules) in the OpDef registry."""
    register_op(OpDef("ReplicaId", GRAPHDIST_DOMAIN, _scalar_int32,
                      reference=lambda replica=0, **_: (np.array(replica, np.int32),),
                      doc="The replica's index in its sync group (int32 scalar)."))
    register_op(OpDef("NumReplicas", GRAPHDIST_DOMAIN, _scalar_int32,
                      reference=lambda **_: (np.array(1, np.int32),),
                      doc="The number of replicas in sync (int32 scalar)."))
    register_op(OpDef("ReadReplica", GRAPHDIST_DOMAIN, _unary(), reference=_reference_identity,
                      doc="In cross-replica code: one replica's copy of a replica value.", attrs={"replica": 0}))
    register_op(OpDef("ReplicaAllReduce", GRAPHDIST_DOMAIN, _unary(), reference=_reference_identity,
                      doc="In a replica: the reduction of every replica's value.",
                      attrs={"reduce_op": "SUM", "group_key": ""}))
    register_op(OpDef("ReplicaAllGather", GRAPHDIST_DOMAIN, gathered("num_replicas"), reference=_reference_identity,
                      doc="In a replica: every replica's value concatenated along `axis`.",
                      attrs={"axis": 0, "group_key": "", "num_replicas": 1}))
    register_op(OpDef("CrossReplicaReduce", GRAPHDIST_DOMAIN, _reduced, reference=_reference_reduce,
                      doc="In cross-replica code: a replica value reduced over the replicas.",
                      attrs={"reduce_op": "SUM", "group_key": ""}))
    register_op(OpDef("CrossReplicaGather", GRAPHDIST_DOMAIN, gathered("num_replicas"), reference=_reference_gather,
                      doc="In cross-replica code: a replica value concatenated over the replicas.",
                      attrs={"axis": 0, "group_key": "", "num_replicas": 1}))
    register_gradient("ReplicaAllReduce", GRAPHDIST_DOMAIN)(_replica_all_reduce_gradient)


def _replica_all_reduce_gradient(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    """SUM/MEAN all-reduce: every replica's input reaches every replica's output, so the input's
    gradient is the same all-reduce of the output gradients (a new group, ``<key>.grad``).
    """
    op = str(node.attrs.get("reduce_op", "SUM")).upper()
    if op not in ("SUM", "MEAN"):
        raise GraphError(f"no gradient for a {op} all-reduce ({node.name}); only SUM and MEAN are differentiable")
    attrs = dict(node.attrs)
    attrs["group_key"] = f"{attrs.get('group_key') or node.name}.grad"
    out = b.op("ReplicaAllReduce", [g[0]], attrs, domain=GRAPHDIST_DOMAIN)[0]
    out.producer.meta["side_effect"] = True  # every replica must take part
    return [out]


register_replica_ops()
