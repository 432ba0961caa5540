"""Signature keys of traces specialised on argument values (inputs that decide shapes or control flow).

A trace that used an argument's value as a constant
(:meth:`graphdist.trace.tracer.TraceContext.specialise`) is valid for that
value only: its cache key is the call's signature plus the dtype, shape and
bytes of those arguments, as ``torch.compile`` guards on a value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist import nest
from graphdist.compile.step_io import is_distributed

__all__ = ["guarded_key", "is_guarded", "signature_of_key", "short_value", "specialised_to_json",
           "specialised_from_json"]


def guarded_key(key: Any, guard: tuple[int, ...], args: tuple, kwargs: dict) -> Any:
    """``key`` extended by the dtype, shape and bytes of the argument leaves at positions ``guard``."""
    leaves, _ = nest.flatten((args, kwargs), is_leaf=is_distributed)
    values = []
    for index in guard:
        value = np.asarray(leaves[index]) if index < len(leaves) else None
        if value is None or value.dtype == object:
            values.append((index, None))
        else:
            values.append((index, value.dtype.str, value.shape, value.tobytes()))
    return (key, "values", tuple(values))


def is_guarded(key: Any) -> bool:
    """Whether ``key`` is a signature extended by argument values."""
    return isinstance(key, tuple) and len(key) == 3 and key[1] == "values"


def short_value(value: np.ndarray) -> str:
    """A value printed for a message: at most 60 characters."""
    text = np.array2string(np.asarray(value), threshold=8, separator=", ")
    return text if len(text) <= 60 else text[:57] + "..."


def signature_of_key(key: Any) -> Any:
    """The plain signature (treedef, leaf signatures) of a key, guarded or not."""
    return key[0] if is_guarded(key) else key


def specialised_to_json(specialised: dict[str, tuple[str, np.ndarray]] | None) -> dict[str, Any]:
    """The inputs a trace specialised on (``graph.meta.specialised``: name -> (argument, value)), for
    ``plan.json``.
    """
    return {name: {"argument": hint, "dtype": np.asarray(value).dtype.str, "value": np.asarray(value).tolist()}
            for name, (hint, value) in (specialised or {}).items()}


def specialised_from_json(section: dict[str, Any] | None) -> dict[str, tuple[str, np.ndarray]]:
    """The inverse of :func:`specialised_to_json`."""
    return {name: (str(entry["argument"]), np.asarray(entry["value"], dtype=entry["dtype"]))
            for name, entry in (section or {}).items()}
