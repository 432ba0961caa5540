"""Run-time range checks of traced integer arguments (class labels, indices, ids).

Eagerly graphdist checks index arguments with numpy before using them; in
traced code their values exist only when the compiled step runs, so
:func:`check_indices` records a ``graphdist.CheckIndices`` node (see
:mod:`graphdist.ir.check_ops`): the compiled step then raises
``gd.InvalidArgumentError`` naming the argument and its range when a value
is out of it, on every backend and for every replica. Graphs of
``gd.trace`` (not compiled by graphdist's pipeline) get no check node, so
they stay plain ONNX that any runtime loads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN

__all__ = ["CLASS_LABEL_DTYPES", "check_indices", "check_class_labels", "check_label_dtype"]

#: Integer dtypes class labels may have in traced code: those whose run-time range check (``ReduceMin`` /
#: ``ReduceMax``) and one-hot comparison (``Equal``) every backend runs. ONNX Runtime 1.31 has no CPU kernel
#: of ``ReduceMin`` for uint32 / uint64 and rejects int16 / uint16 in ``ReduceMax``.
CLASS_LABEL_DTYPES: tuple[str, ...] = ("int8", "uint8", "int32", "int64")


def check_indices(ctx: Any, indices: Any, low: int, high: int, *, op: str, argument: str, hint: str = "") -> Any:
    """Records a run-time check that the traced integer tensor ``indices`` lies in ``[low, high)``.

    Args:
        ctx: The trace context.
        indices: A traced integer tensor.
        low: Smallest valid value.
        high: One past the largest valid value.
        op: What uses the values (``"np.take"``), for the message.
        argument: The argument's name (``"labels"``), for the message.
        hint: Where the range comes from (``"logits.shape[-1] = 10 classes"``).

    Returns:
        The checked indices (equal to ``indices`` where in range, ``0`` elsewhere): read them instead of
        ``indices`` where an out-of-range value would read outside a buffer (a ``Gather``). In a graph
        that graphdist's pass pipeline does not compile (``gd.trace``: a backend may be given it
        directly), ``indices`` itself, unchecked.
    """
    if not ctx.replicated:
        return indices
    attrs = {"low": int(low), "high": int(high), "op": op, "argument": argument, "hint": hint}
    checked = ctx.emit1("CheckIndices", [indices.value], attrs, domain=GRAPHDIST_DOMAIN, name=f"check_{argument}")
    checked.value.producer.meta["side_effect"] = True  # kept when nothing reads the checked values
    return checked


def check_class_labels(labels: Any, classes: Any, op: str, hint: str | None = None) -> None:
    """Checks class ``labels`` against ``[0, classes)``: now for arrays, when the step runs for traced ones.

    Args:
        labels: Integer class labels (an array or a traced tensor).
        classes: The number of classes (a symbolic count is not checked).
        op: What uses the labels, for the message.
        hint: Where ``classes`` comes from, for the message.

    Raises:
        InvalidArgumentError: Concrete labels out of range.
    """
    from graphdist.ir.check_ops import bounds_of, in_range, range_error
    from graphdist.trace.tensor import Tensor

    hint = hint or f"{classes} classes: the last axis of the predictions"
    if isinstance(labels, Tensor):
        if isinstance(classes, (int, np.integer)):
            check_indices(labels.tracer, labels, 0, int(classes), op=op, argument="labels", hint=hint)
        return
    labels = np.asarray(labels)
    if labels.size and isinstance(classes, (int, np.integer)):
        bounds = bounds_of(labels)
        if not in_range(bounds, 0, int(classes)):
            raise range_error({"low": 0, "high": int(classes), "op": op, "argument": "labels", "hint": hint}, bounds,
                              traced=False)


def check_label_dtype(labels: Any, op: str) -> None:
    """Refuses class ``labels`` (an array or a traced tensor) whose dtype is not one of :data:`CLASS_LABEL_DTYPES`.

    Raises:
        InvalidArgumentError: Naming ``op``, the dtype, the supported ones and the fix.
    """
    dtype = np.dtype(labels.dtype)
    if dtype.kind in "iu" and dtype.name not in CLASS_LABEL_DTYPES:
        raise InvalidArgumentError(f"{op}: labels of dtype {dtype.name} are not supported; class labels must be "
                                   f"{', '.join(CLASS_LABEL_DTYPES[:-1])} or {CLASS_LABEL_DTYPES[-1]} (what every "
                                   "backend's label check runs): pass labels.astype(np.int64)")
