"""Thread-local distribution context: the current strategy and replica context.

Mirrors tf.distribute: outside any ``strategy.scope()`` the default strategy
is current and the default replica context is active; inside a scope the
code is in cross-replica context (no replica context); inside the function
given to ``strategy.run`` a :class:`~graphdist.distribute.replica_context.ReplicaContext`
is active.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["strategy_stack", "current_strategy", "push_strategy", "replica_stack", "replica_scope", "CROSS_REPLICA"]

_local = threading.local()

#: Marker pushed on the replica stack when a scope enters cross-replica context.
CROSS_REPLICA = object()


def strategy_stack() -> list[Any]:
    """Strategies whose scope is entered in this thread (innermost last)."""
    stack = getattr(_local, "strategies", None)
    if stack is None:
        stack = _local.strategies = []
    return stack


def current_strategy() -> Any | None:
    """The innermost strategy whose scope is entered in this thread, or ``None`` outside every scope."""
    stack = strategy_stack()
    return stack[-1] if stack else None


def replica_stack() -> list[Any]:
    """Replica contexts (or :data:`CROSS_REPLICA`) in this thread (innermost last)."""
    stack = getattr(_local, "replicas", None)
    if stack is None:
        stack = _local.replicas = []
    return stack


@contextlib.contextmanager
def push_strategy(strategy: Any) -> Iterator[None]:
    """Makes ``strategy`` current and enters cross-replica context."""
    strategy_stack().append(strategy)
    replica_stack().append(CROSS_REPLICA)
    try:
        yield
    finally:
        replica_stack().pop()
        strategy_stack().pop()


@contextlib.contextmanager
def replica_scope(replica_context: Any) -> Iterator[None]:
    """Enters replica context ``replica_context``."""
    replica_stack().append(replica_context)
    try:
        yield
    finally:
        replica_stack().pop()
