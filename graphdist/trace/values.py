"""Distributed values: one component per replica.

``PerReplica`` holds a value for each local replica (the result of
``strategy.run`` or of ``experimental_distribute_values_from_function``).
``ValueContext`` is what a ``value_fn`` receives.

In traced code a step is traced as one replica, so a per-replica value is
:class:`TracedPerReplica`: one traced value stands for every replica's copy
(one per *variant* when the replicas' arguments had different shapes). Its
``values`` are built on demand as ``graphdist.ReadReplica`` nodes, replica
``i``'s copy, which ``ReplicatePass`` wires once the replicas exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError

__all__ = ["DistributedValues", "PerReplica", "TracedPerReplica", "ValueContext", "regroup", "format_component"]


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
        if not isinstance(values, (list, tuple)):
            raise InvalidArgumentError(f"{type(self).__name__} takes a list or tuple with one value per replica, "
                                       f"got {type(values).__name__}")
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


class TracedPerReplica(PerReplica):
    """A per-replica value in traced code: the traced value of each replica (shared by the
    replicas of one variant), with ``values`` made on demand as ``ReadReplica`` nodes.

    Args:
        replica_values: One entry per local replica: the replica's traced value
            (the same object for every replica of a variant), or a Python value.
    """

    __slots__ = ("_replica_values", "_reads")

    def __init__(self, replica_values: Sequence[Any]) -> None:
        super().__init__(())
        self._replica_values = tuple(replica_values)
        self._reads: dict[int, Any] = {}

    @property
    def replica_values(self) -> tuple[Any, ...]:
        """The traced value each replica computes (not a per-replica component: see :attr:`values`)."""
        return self._replica_values

    @property
    def values(self) -> tuple[Any, ...]:
        """Replica ``i``'s copy of the value, for every ``i`` (``graphdist.ReadReplica`` nodes)."""
        return tuple(self.component(i) for i in range(len(self._replica_values)))

    def component(self, replica: int) -> Any:
        """Replica ``replica``'s copy: a ``ReadReplica`` node on a traced value, else the value."""
        value = self._replica_values[replica]
        if not hasattr(value, "tracer"):
            return value
        read = self._reads.get(replica)
        if read is None:
            from graphdist.ir.graph import GRAPHDIST_DOMAIN

            with value.tracer.region(context="cross"):  # a replica's component is read in cross-replica code
                read = value.tracer.emit1("ReadReplica", [value.value], {"replica": replica},
                                          domain=GRAPHDIST_DOMAIN, name=f"read_replica_{replica}")
            self._reads[replica] = read
        return read

    def __len__(self) -> int:
        return len(self._replica_values)

    def _repr_name(self) -> str:
        return "PerReplica"


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
