"""Variables of the strategies that mirror them: :class:`MirroredVariable`.

A mirrored variable is one logical value with a copy per replica
(``MirroredStrategy``, ``MultiWorkerMirroredStrategy``, ``TPUStrategy``);
:class:`~graphdist.trace.variables.Variable` is the plain kind, defined with
the tracer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.trace.variables import Variable, is_variable, read_variable

__all__ = ["Variable", "MirroredVariable", "read_variable", "is_variable"]


class _ReplicaCopy:
    """One replica's view of a mirrored variable (for reprs and local results)."""

    def __init__(self, variable: Variable, replica: int) -> None:
        self._variable = variable
        self._replica = replica

    @property
    def name(self) -> str:
        base = self._variable._name
        return f"{base}:0" if self._replica == 0 else f"{base}/replica_{self._replica}:0"

    @property
    def device(self) -> str | None:
        devices = getattr(self._variable._strategy, "extended", None)
        return devices.worker_devices[self._replica] if devices is not None else None

    def numpy(self) -> np.ndarray:
        return self._variable.numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._variable.numpy(), dtype=dtype)

    def __eq__(self, other: Any) -> Any:
        return np.asarray(self) == other

    def __repr__(self) -> str:
        v = self._variable
        if v.worker_shard is not None:  # stored in parts (ZeRO-1): the variable says how
            return repr(v)
        value = str(v._value[()]) if v.ndim == 0 else np.array2string(v._value, separator=", ")
        return f"<gd.Variable '{self.name}' shape={v.shape} dtype={v.dtype.name}, numpy={value}>"


class MirroredVariable(Variable):
    """A variable with a copy on every replica's device (``MirroredStrategy``).

    In one process the copies share one buffer: every replica applies the same
    all-reduced update, so they stay equal by construction. ``values`` lists
    the per-replica copies; reading and assigning work inside and outside the
    strategy's scope.
    """

    def _replica_components(self) -> tuple[_ReplicaCopy, ...]:
        count = self._strategy._num_local_replicas() if self._strategy is not None else 1
        return tuple(_ReplicaCopy(self, r) for r in range(count))

    @property
    def values(self) -> tuple[_ReplicaCopy, ...]:
        """The per-replica copies."""
        return self._replica_components()

    def __repr__(self) -> str:
        body = ",\n".join(f"  {i}: {c!r}" for i, c in enumerate(self._replica_components()))
        return f"MirroredVariable:{{\n{body}\n}}"
