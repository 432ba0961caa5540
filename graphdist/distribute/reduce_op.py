"""``ReduceOp``: how values are combined across replicas."""

from __future__ import annotations

import enum
from typing import Any

from graphdist.errors import InvalidArgumentError

__all__ = ["ReduceOp"]


class ReduceOp(enum.Enum):
    """Indicates how a set of values should be reduced (``SUM``, ``MEAN``, ``MAX``, ``MIN``).

    Strings are accepted wherever a ``ReduceOp`` is: ``"SUM"``, ``"sum"``, ``"mean"``...
    """

    SUM = "SUM"
    MEAN = "MEAN"
    MAX = "MAX"
    MIN = "MIN"

    @classmethod
    def from_any(cls, value: Any, argument: str = "reduce_op") -> ReduceOp:
        """Converts a ``ReduceOp`` or a case-insensitive string.

        Raises:
            InvalidArgumentError: ``value`` names no reduce op.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise InvalidArgumentError(
            f"{argument}={value!r} is not a valid reduce op; use gd.ReduceOp.SUM, MEAN, MAX or MIN "
            "(or the strings 'SUM', 'MEAN', 'MAX', 'MIN', any case)"
        )
