"""``ReduceOp``: how values are combined across replicas."""

from __future__ import annotations

import difflib
import enum
from typing import Any

from graphdist.errors import InvalidArgumentError

__all__ = ["ReduceOp"]


class _UnknownReduceOpError(InvalidArgumentError, AttributeError):
    """``gd.ReduceOp.NAME`` with a NAME that is no reduce op (an ``AttributeError`` too, for ``hasattr``)."""


class _ReduceOpMeta(enum.EnumMeta):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        close = difflib.get_close_matches(name.upper(), list(cls.__members__), n=1)
        hint = f"did you mean gd.ReduceOp.{close[0]}? " if close else ""
        raise _UnknownReduceOpError(f"gd.ReduceOp.{name} does not exist; {hint}the reduce ops are "
                                    f"{', '.join(f'gd.ReduceOp.{m}' for m in cls.__members__)}")


class ReduceOp(enum.Enum, metaclass=_ReduceOpMeta):
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
        close = difflib.get_close_matches(value.upper(), list(cls.__members__), n=1) if isinstance(value, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InvalidArgumentError(
            f"{argument}={value!r} is not a valid reduce op; {hint}use gd.ReduceOp.SUM, MEAN, MAX or MIN "
            "(or the strings 'SUM', 'MEAN', 'MAX', 'MIN', any case)"
        )
