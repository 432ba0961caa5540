"""``ReplicaContext``: the strategy API available inside ``strategy.run``.

Inside a traced replica function, ``all_reduce``/``all_gather`` emit
``graphdist.AllReduce``/``graphdist.AllGather`` nodes (one per replica, joined
by a group key) and ``replica_id_in_sync_group`` emits a ``graphdist.ReplicaId``
node; the strategy's pipeline lowers them. On concrete values with a single
replica (the default replica context) they act directly.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.distribute.reduce_op import ReduceOp
from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.trace import context
from graphdist.trace.tracer import axis_tuple, current_trace

__all__ = ["ReplicaContext", "get_replica_context", "in_cross_replica_context", "emit_collective"]

_group_ids = itertools.count()


def new_group_key(kind: str) -> str:
    """A fresh key joining the per-replica nodes of one collective."""
    return f"{kind}{next(_group_ids)}"


def emit_collective(op_type: str, tensor: Any, attrs: dict[str, Any]) -> Any:
    """Emits one replica's collective node on a traced tensor (or constant)."""
    from graphdist.trace.numpy_api import _as_tensor

    ctx = current_trace()
    tensor = _as_tensor(ctx, tensor)
    out = ctx.emit1(op_type, [tensor.value], attrs, domain=GRAPHDIST_DOMAIN, name=op_type.lower())
    # Every member of a collective group must run, even where its result is unused.
    out.value.producer.meta["side_effect"] = True
    return out


class ReplicaContext:
    """The replica context of one replica of a strategy.

    Attributes:
        strategy: The strategy running this replica.
    """

    def __init__(self, strategy: Any, replica_id: int, group_keys: Any = None) -> None:
        self.strategy = strategy
        self._replica_id = replica_id
        self._traced_id = None
        # Collectives called in the same order on every replica share keys.
        self._group_keys = group_keys if group_keys is not None else []
        self._calls = 0

    @property
    def num_replicas_in_sync(self) -> int:
        """Number of replicas in sync (Python int)."""
        return self.strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> Any:
        """This replica's index: a traced int32 scalar inside a trace, else ``np.int32``."""
        ctx = current_trace()
        if ctx is None:
            return np.int32(self._replica_id)
        if self._traced_id is None or self._traced_id.tracer is not ctx:
            self._traced_id = ctx.emit1("ReplicaId", [], {}, domain=GRAPHDIST_DOMAIN, name="replica_id")
        return self._traced_id

    def _group_key(self, kind: str) -> str:
        # The n-th collective call of every replica belongs to group n.
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
        reduced = [emit_collective("AllReduce", leaf, {"reduce_op": op.value, "group_size": self.num_replicas_in_sync,
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
            attrs = {"axis": normalized, "group_size": self.num_replicas_in_sync, "group_key": f"{key}.{i}"}
            gathered.append(emit_collective("AllGather", tensor, attrs))
        return nest.unflatten(treedef, gathered)

    def merge_call(self, merge_fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None) -> Any:
        """Calls ``merge_fn(strategy, *args, **kwargs)`` in cross-replica context."""
        with context.push_strategy(self.strategy):
            return merge_fn(self.strategy, *args, **(kwargs or {}))

    def _eager_single(self, value: Any, what: str) -> Any:
        if self.num_replicas_in_sync != 1:
            raise InvalidArgumentError(
                f"ReplicaContext.{what} on concrete values needs a single replica; call it inside "
                "strategy.run, where it is traced"
            )
        return nest.map_structure(lambda v: np.array(v, copy=True), value)

    def __repr__(self) -> str:
        return f"ReplicaContext(replica_id={self._replica_id}, num_replicas={self.num_replicas_in_sync})"


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
