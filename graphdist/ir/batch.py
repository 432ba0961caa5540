"""The per-replica batch size as a symbol: what lets a traced step be re-planned for another replica count.

A step traced for ``N`` replicas of a global batch ``G`` sees per-replica
batches of ``B = G / N`` rows; re-planned for ``N'`` replicas it must compute
on ``G / N'`` rows. Shapes follow by re-running the shape rules, but numbers
the step computed from ``B`` (``x.reshape(x.shape[0], -1)``, ``x.shape[0] * 2``)
were frozen into constants. :class:`BatchDim` is the int the tracer hands
out for ``B``: it behaves exactly like ``B`` and remembers ``scale * B +
offset`` through ``+``, ``-`` and ``*`` by ints. When such a number becomes
a constant (:func:`record`), the constant remembers it in
``value.meta["batch"]`` (one ``(scale, offset)`` or ``None`` per element), and
``RebatchPass`` recomputes it for the new ``B``.

Anything else done with ``B`` (``int(B)``, ``B // 2``, ``float(B)``, numpy on a
tuple of dims) yields a plain number and is not re-batched; the exporter
checks a step by tracing it again at another batch size and comparing, so
such a step is refused by re-planning rather than silently wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["BatchDim", "affine", "record", "elements", "evaluate", "with_batch"]


class BatchDim(int):
    """An int equal to ``scale * B + offset`` for the per-replica batch size ``B``."""

    scale: int
    offset: int

    def __new__(cls, value: int, scale: int = 1, offset: int = 0) -> BatchDim:
        dim = super().__new__(cls, int(value))
        dim.scale, dim.offset = int(scale), int(offset)
        return dim

    def __add__(self, other: Any) -> Any:
        if isinstance(other, BatchDim):
            return BatchDim(int(self) + int(other), self.scale + other.scale, self.offset + other.offset)
        if isinstance(other, int) and not isinstance(other, bool):
            return BatchDim(int(self) + other, self.scale, self.offset + other)
        return int(self) + other

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, BatchDim):
            return BatchDim(int(self) - int(other), self.scale - other.scale, self.offset - other.offset)
        if isinstance(other, int) and not isinstance(other, bool):
            return BatchDim(int(self) - other, self.scale, self.offset - other)
        return int(self) - other

    def __rsub__(self, other: Any) -> Any:
        if isinstance(other, int) and not isinstance(other, bool):
            return BatchDim(other - int(self), -self.scale, other - self.offset)
        return other - int(self)

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, int) and not isinstance(other, (bool, BatchDim)):
            return BatchDim(int(self) * other, self.scale * other, self.offset * other)
        # B * B is not affine: a plain number (int.__mul__ directly, so Python does not try other.__rmul__).
        return int(self) * int(other) if isinstance(other, BatchDim) else int(self) * other

    __rmul__ = __mul__

    def __neg__(self) -> Any:
        return BatchDim(-int(self), -self.scale, -self.offset)

    def __repr__(self) -> str:
        return repr(int(self))

    def __reduce__(self) -> Any:
        return (BatchDim, (int(self), self.scale, self.offset))


def affine(value: Any) -> tuple[int, int] | None:
    """``(scale, offset)`` of a :class:`BatchDim`, else ``None``."""
    return (value.scale, value.offset) if isinstance(value, BatchDim) else None


def record(value: Any) -> list[tuple[int, int] | None] | None:
    """The provenance of a Python number or flat sequence of numbers about to become a constant, or
    ``None`` when no element comes from the batch size.
    """
    if isinstance(value, BatchDim):
        return [affine(value)]
    if isinstance(value, (list, tuple)) and any(isinstance(v, BatchDim) for v in value):
        return [affine(v) for v in value]
    return None


def elements(meta: Any) -> list[tuple[int, int] | None] | None:
    """A constant's recorded provenance (``value.meta["batch"]``), normalised."""
    if not meta:
        return None
    return [None if item is None else (int(item[0]), int(item[1])) for item in meta]


def evaluate(array: np.ndarray, provenance: Sequence[tuple[int, int] | None], batch: int) -> np.ndarray:
    """``array`` with every recorded element recomputed for ``batch``."""
    flat = np.array(array, copy=True).reshape(-1)
    for index, item in enumerate(provenance):
        if item is not None:
            flat[index] = item[0] * batch + item[1]
    return flat.reshape(np.shape(array))


def with_batch(values: Sequence[Any], provenance: Sequence[tuple[int, int] | None] | None) -> list[Any]:
    """Integers of a constant's elements, as :class:`BatchDim` where the provenance says so
    (shape rules that read a constant, like Reshape's, keep the symbol in the shapes they make).
    """
    if not provenance or len(provenance) != len(values):
        return [int(v) for v in values]
    return [int(v) if item is None else BatchDim(int(v), *item) for v, item in zip(values, provenance)]
