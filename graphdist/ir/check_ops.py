"""Run-time checks of the ``graphdist`` domain: index arguments that must lie in a range.

A compiled step cannot raise from inside ONNX Runtime or TVM, and an index
out of range gives no error there: a one-hot row of zeros (a loss of 0), a
backend error with noise on stderr, or a read past a buffer. So traced code
marks every integer argument whose range only the data decides (class
labels, ``np.take`` indices, integer-array indices, embedding ids) with

* ``CheckIndices(indices) -> checked`` (``low``, ``high``, ``op``,
  ``argument``, ``hint``): ``checked`` equals ``indices`` where
  ``low <= i < high`` and is ``0`` elsewhere, so that a consumer never reads
  out of bounds; the node has a side effect (it is kept when ``checked`` is
  unused). ``LowerIndexChecksPass`` expands it into ONNX ops (the range's
  ``[min, max]`` and the masked indices) plus
* ``AssertInRange(bounds) -> bounds`` (``low``, ``high``, ``op``,
  ``argument``, ``hint``, ``replica``): run by the runtime between
  segments, like a communication task (it is one of
  :data:`~graphdist.ir.comm_ops.COMMUNICATION_OPS`): the scheduler raises
  :func:`range_error` after the step when ``bounds`` leaves the range.

Both references raise the same error, so a graph evaluated by
``onnx.reference`` behaves like a compiled plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import GraphError, InvalidArgumentError
from graphdist.ir.gradients import GradBuilder, register_gradient
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node, Value
from graphdist.ir.ops import OpDef, TypeList, register_op

__all__ = ["CHECK_ATTRS", "range_error", "bounds_of", "in_range", "register_check_ops"]

#: Attributes shared by both ops (defaults).
CHECK_ATTRS: dict[str, Any] = {"low": 0, "high": 0, "op": "", "argument": "indices", "hint": ""}


def bounds_of(indices: np.ndarray) -> np.ndarray:
    """``[min, max]`` of ``indices`` as int64 (``[int64 max, int64 min]`` when there are none)."""
    flat = np.asarray(indices).reshape(-1).astype(np.int64)
    if not flat.size:
        return np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)
    return np.array([flat.min(), flat.max()], np.int64)


def in_range(bounds: np.ndarray, low: int, high: int) -> bool:
    """Whether a ``[min, max]`` pair lies in ``[low, high)`` (``min > max``: no values, in range)."""
    return bool(bounds[0] > bounds[1] or (bounds[0] >= low and bounds[1] < high))


def range_error(attrs: dict[str, Any], bounds: np.ndarray, replica: int | None = None,
                traced: bool = True) -> InvalidArgumentError:
    """The error for an argument whose values ``bounds`` (``[min, max]``) left ``[low, high)``.

    Args:
        attrs: The check's attributes (``low``, ``high``, ``op``, ``argument``, ``hint``).
        bounds: The values' ``[min, max]``.
        replica: The replica whose values they are (``None``: not named).
        traced: Whether a compiled step found them (else an eager call).
    """
    low, high = int(attrs.get("low", 0)), int(attrs.get("high", 0))
    op, argument, hint = attrs.get("op") or "a traced step", attrs.get("argument") or "indices", attrs.get("hint")
    where = f" (replica {replica})" if replica is not None else ""
    fix = f"Fix the {argument} given to the step (checked when the compiled step ran)" if traced else \
        f"Fix the {argument}"
    return InvalidArgumentError(f"{op}: {argument} must be in [{low}, {high}){f' ({hint})' if hint else ''}; got "
                                f"values from {int(bounds[0])} to {int(bounds[1])}{where}. {fix}")


def _attrs(node_attrs: dict[str, Any]) -> dict[str, Any]:
    return {**CHECK_ATTRS, **node_attrs}


def _infer_check(node: Node, _: int | None) -> TypeList:
    indices = node.inputs[0] if node.inputs else None
    if indices is None or indices.dtype.kind not in "iu":
        got = "nothing" if indices is None else indices.type_str()
        raise GraphError(f"CheckIndices ({node.name}) needs one integer input, got {got}")
    return [(indices.dtype, indices.shape)]


def _infer_assert(node: Node, _: int | None) -> TypeList:
    bounds = node.inputs[0] if node.inputs else None
    if bounds is None or bounds.dtype != np.int64 or tuple(bounds.shape) != (2,):
        got = "nothing" if bounds is None else bounds.type_str()
        raise GraphError(f"AssertInRange ({node.name}) needs an int64[2] input ([min, max]), got {got}")
    return [(bounds.dtype, bounds.shape)]


def _reference_check(indices: np.ndarray, **attrs: Any) -> tuple[np.ndarray]:
    attrs = _attrs(attrs)
    bounds = bounds_of(indices)
    if not in_range(bounds, int(attrs["low"]), int(attrs["high"])):
        raise range_error(attrs, bounds)
    return (np.array(indices, copy=True),)


def _reference_assert(bounds: np.ndarray, **attrs: Any) -> tuple[np.ndarray]:
    attrs = _attrs(attrs)
    if not in_range(bounds, int(attrs["low"]), int(attrs["high"])):
        replica = int(attrs.get("replica", -1))
        raise range_error(attrs, bounds, replica if replica >= 0 else None)
    return (np.array(bounds, copy=True),)


def register_check_ops() -> None:
    """Registers ``CheckIndices`` and ``AssertInRange`` (and ``CheckIndices``' zero gradient)."""
    register_op(OpDef("CheckIndices", GRAPHDIST_DOMAIN, _infer_check, reference=_reference_check,
                      doc="Integer indices checked against [low, high) when the step runs; out-of-range "
                          "entries read as 0.", attrs=dict(CHECK_ATTRS)))
    register_op(OpDef("AssertInRange", GRAPHDIST_DOMAIN, _infer_assert, reference=_reference_assert,
                      doc="Run-time assertion that [min, max] lies in [low, high) (run by the scheduler).",
                      attrs={**CHECK_ATTRS, "replica": -1}))


register_check_ops()


@register_gradient("CheckIndices", GRAPHDIST_DOMAIN)
def _no_gradient(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [None]  # integer indices
