"""Distributed values: one component per replica.

``PerReplica`` holds a value for each local replica (the result of
``strategy.run`` or of ``experimental_distribute_values_from_function``).
``ValueContext`` is what a ``value_fn`` receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DistributedValues", "PerReplica", "ValueContext", "regroup", "format_component"]


def format_component(value: Any) -> str:
    """Renders one component like TF renders a tensor: shape, dtype and data."""
    from graphdist.trace.tensor import Tensor

    if isinstance(value, Tensor):
        return repr(value)
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        return f"<shape={array.shape}, dtype={array.dtype.name}, numpy={np.array2string(array, separator=', ')}>"
    return repr(value)


class DistributedValues:
    """Base class of values with one component per replica."""

    __slots__ = ("_values",)

    def __init__(self, values: Sequence[Any]) -> None:
        self._values = tuple(values)

    @property
    def values(self) -> tuple[Any, ...]:
        """The per-replica components, in replica order."""
        return self._values

    def __len__(self) -> int:
        return len(self._values)

    def _repr_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        body = ",\n".join(f"  {i}: {format_component(v)}" for i, v in enumerate(self._values))
        return f"{self._repr_name()}:{{\n{body}\n}}"


class PerReplica(DistributedValues):
    """A value per replica, e.g. the result of ``strategy.run``."""

    __slots__ = ()


def regroup(values: Sequence[Any]) -> Any:
    """One replica's value as is; several as a :class:`PerReplica`."""
    return values[0] if len(values) == 1 else PerReplica(values)


@dataclass(frozen=True)
class ValueContext:
    """What ``experimental_distribute_values_from_function``'s ``value_fn`` receives.

    Attributes:
        replica_id_in_sync_group: This replica's index (Python int).
        num_replicas_in_sync: Number of replicas (Python int).
    """

    replica_id_in_sync_group: int = 0
    num_replicas_in_sync: int = 1
