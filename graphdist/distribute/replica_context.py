"""``ReplicaContext``: the strategy API available inside ``strategy.run``.

A replica function is traced once, as one replica, whatever the number of
replicas. Inside it ``all_reduce`` / ``all_gather`` record
``graphdist.ReplicaAllReduce`` / ``ReplicaAllGather`` nodes (the n-th call of
each traced variant shares a group key) and ``replica_id_in_sync_group`` a
``graphdist.ReplicaId`` node; the strategy's passes make the replicas and
turn these into collectives. ``merge_call`` runs ``merge_fn`` once, in
cross-replica context, with every replica-local value as a ``PerReplica``.
On concrete values with a single replica (the default replica context)
they act directly.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.distribute.reduce_op import ReduceOp
from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.trace import context
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import axis_tuple, current_trace
from graphdist.trace.values import TracedPerReplica

__all__ = ["ReplicaContext", "get_replica_context", "in_cross_replica_context", "emit_cross_replica",
           "new_group_key", "replica_region", "is_replica_value"]

_group_ids = itertools.count()


def new_group_key(kind: str) -> str:
    """A fresh key joining the replicas' copies of one cross-replica operation."""
    return f"{kind}{next(_group_ids)}"


def _tensor(value: Any) -> Any:
    from graphdist.trace.numpy_api import _as_tensor

    return _as_tensor(current_trace(), value)


def emit_replica_collective(op_type: str, value: Any, attrs: dict[str, Any]) -> Any:
    """Records a replica-context collective (``ReplicaAllReduce`` / ``ReplicaAllGather``) on ``value``."""
    ctx = current_trace()
    out = ctx.emit1(op_type, [_tensor(value).value], attrs, domain=GRAPHDIST_DOMAIN, name=op_type.lower())
    # Every replica must take part, even where its result is unused.
    out.value.producer.meta["side_effect"] = True
    return out


def emit_cross_replica(op_type: str, parts: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """Records a cross-replica reduce/gather of a replica value (one traced value per variant)."""
    ctx = current_trace()
    values = [_tensor(p).value for p in parts]
    with ctx.region(context="cross"):
        out = ctx.emit1(op_type, values, attrs, domain=GRAPHDIST_DOMAIN, name=op_type.lower())
    out.value.producer.meta["side_effect"] = True
    return out


def replica_region(value: Any) -> dict[str, Any]:
    """The trace region ``value`` was computed in: ``{"context": "replica"[, "variant": v]}``, or
    ``{"context": "cross"}`` for a value that is not per replica.
    """
    if isinstance(value, Tensor):
        producer = value.value.producer
        if producer is not None and producer.meta.get("context") == "replica":
            variant = producer.meta.get("variant")
            return {"context": "replica"} if variant is None else {"context": "replica", "variant": variant}
        if producer is None:
            per_replica = value.tracer.graph.meta.per_replica_inputs
            if value.value.name in per_replica:
                variant = per_replica[value.value.name]
                return {"context": "replica"} if variant is None else {"context": "replica", "variant": variant}
    return {"context": "cross"}


def is_replica_value(value: Any) -> bool:
    """True for a traced value that every replica computes for itself."""
    return replica_region(value)["context"] == "replica"


class ReplicaContext:
    """The replica context of a replica function (of the replicas traced together).

    Args:
        strategy: The strategy running the replicas.
        replicas: The replica index (eager), or the replicas traced together.
        group_keys: Keys shared by every variant's n-th collective call.
        variant: The trace variant of these replicas (``None``: every replica).

    Attributes:
        strategy: The strategy running this replica.
    """

    def __init__(self, strategy: Any, replicas: int | Sequence[int], group_keys: list[str] | None = None,
                 variant: str | None = None) -> None:
        self.strategy = strategy
        self._replicas = (replicas,) if isinstance(replicas, int) else tuple(replicas)
        self._variant = variant
        self._traced_id: Any = None
        # Collectives called in the same order on every replica share keys.
        self._group_keys = group_keys if group_keys is not None else []
        self._calls = 0

    @property
    def num_replicas_in_sync(self) -> int:
        """Number of replicas in sync (Python int)."""
        from graphdist.distribute.strategy import note_replica_count_read

        note_replica_count_read()
        return self.strategy._num_replicas()

    @property
    def replica_id_in_sync_group(self) -> Any:
        """This replica's index: a traced int32 scalar inside a trace, else ``np.int32``."""
        ctx = current_trace()
        if ctx is None:
            return np.int32(self._replicas[0])
        if self._traced_id is None or self._traced_id.tracer is not ctx:
            self._traced_id = ctx.emit1("ReplicaId", [], {}, domain=GRAPHDIST_DOMAIN, name="replica_id")
        return self._traced_id

    def _group_key(self, kind: str) -> str:
        # The n-th collective call of every variant belongs to group n.
        if self._calls == len(self._group_keys):
            self._group_keys.append(new_group_key(kind))
        key = self._group_keys[self._calls]
        self._calls += 1
        return key

    def all_reduce(self, reduce_op: Any, value: Any) -> Any:
        """Reduces ``value`` (a nest) across replicas; every replica gets the result."""
        op = ReduceOp.from_any(reduce_op)
        if current_trace() is None:
            return self._eager_single(value, "all_reduce")
        key = self._group_key("all_reduce")
        leaves, treedef = nest.flatten(value)
        reduced = [emit_replica_collective("ReplicaAllReduce", leaf, {"reduce_op": op.value,
                                                                      "group_key": f"{key}.{i}"})
                   for i, leaf in enumerate(leaves)]
        return nest.unflatten(treedef, reduced)

    def all_gather(self, value: Any, axis: int) -> Any:
        """Concatenates ``value`` (a nest) from all replicas along ``axis``."""
        if current_trace() is None:
            for leaf in nest.flatten(value)[0]:
                axis_tuple(axis, np.ndim(leaf), "all_gather axis")
            return self._eager_single(value, "all_gather")
        key = self._group_key("all_gather")
        leaves, treedef = nest.flatten(value)
        gathered = []
        for i, tensor in enumerate(leaves):
            (normalized,) = axis_tuple(axis, np.ndim(tensor), "all_gather axis")
            attrs = {"axis": normalized, "num_replicas": self.num_replicas_in_sync, "group_key": f"{key}.{i}"}
            gathered.append(emit_replica_collective("ReplicaAllGather", tensor, attrs))
        return nest.unflatten(treedef, gathered)

    def merge_call(self, merge_fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None) -> Any:
        """Calls ``merge_fn(strategy, *args, **kwargs)`` once, in cross-replica context.

        Values each replica computed for itself reach ``merge_fn`` as ``PerReplica`` (one component per
        replica, as in TensorFlow); every replica receives ``merge_fn``'s return value.

        Raises:
            NotImplementedError: The replicas were traced separately because their arguments had
                different shapes (an uneven partial batch): ``merge_fn`` would run once per shape.
        """
        kwargs = dict(kwargs or {})
        ctx = current_trace()
        if ctx is None:
            with context.push_strategy(self.strategy):
                return merge_fn(self.strategy, *args, **kwargs)
        count = self.strategy._num_local_replicas()
        if len(self._replicas) != count:
            raise NotImplementedError(
                "merge_call in a replica function whose replicas got arguments of different shapes (an uneven "
                f"partial batch: replicas {list(self._replicas)} were traced apart from the others) is not "
                "supported; give every replica the same shapes (dataset.batch(..., drop_remainder=True))")

        def per_replica(leaf: Any) -> Any:
            return TracedPerReplica((leaf,) * count) if count > 1 and is_replica_value(leaf) else leaf

        wrapped_args, wrapped_kwargs = nest.map_structure(per_replica, (tuple(args), kwargs))
        with ctx.region(context="cross"), context.push_strategy(self.strategy):
            return merge_fn(self.strategy, *wrapped_args, **wrapped_kwargs)

    def _eager_single(self, value: Any, what: str) -> Any:
        if self.num_replicas_in_sync != 1:
            raise InvalidArgumentError(
                f"ReplicaContext.{what} on concrete values needs a single replica; call it inside "
                "strategy.run, where it is traced"
            )
        return nest.map_structure(lambda v: np.array(v, copy=True), value)

    def __repr__(self) -> str:
        replica = self._replicas[0] if len(self._replicas) == 1 else list(self._replicas)
        return f"ReplicaContext(replica_id={replica}, num_replicas={self.num_replicas_in_sync})"


def get_replica_context() -> ReplicaContext | None:
    """The current replica context; ``None`` in cross-replica context.

    Outside any strategy scope this is the default strategy's replica context.
    """
    stack = context.replica_stack()
    if stack:
        top = stack[-1]
        return None if top is context.CROSS_REPLICA else top
    from graphdist.distribute.strategy import get_strategy

    return ReplicaContext(get_strategy(), 0)


def in_cross_replica_context() -> bool:
    """True inside a strategy's scope but outside ``strategy.run``."""
    stack = context.replica_stack()
    return bool(stack) and stack[-1] is context.CROSS_REPLICA
