"""Relax legalizations the tvm backend replaces: where TVM 0.27's own lowering is not ONNX's semantics.

Passed to ``relax.transform.LegalizeOps(customize_legalize_map=...)`` before
TVM's default legalization (:func:`legalize_overrides`):

* ``relax.max`` / ``relax.min`` of floats reduce from ``-inf`` / ``+inf``:
  TVM starts from the lowest / highest *finite* value, so the maximum of a row
  of ``-inf`` (a fully masked attention row) is ``-3.4e38`` and the maximum over
  an empty axis is ``-3.4e38`` where ONNX (and numpy's ``initial=-inf``) give
  ``-inf``.
* ``relax.max`` / ``relax.min`` of booleans reduce with ``or`` / ``and`` (from
  ``False`` / ``True``): TVM has no lowest boolean and fails to build them.

Integer reductions keep TVM's lowering (its identities are the integer type's
limits, as ONNX's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["legalize_overrides"]


def legalize_overrides() -> dict[str, Callable[[Any, Any], Any]]:
    """Op name -> legalization function, for ``LegalizeOps(customize_legalize_map=...)``."""
    return {"relax.max": _reduction("max"), "relax.min": _reduction("min")}


def _reduction(kind: str) -> Callable[[Any, Any], Any]:
    def legalize(bb: Any, call: Any) -> Any:
        from tvm import topi

        dtype = str(call.ty.dtype)
        x, axis, keepdims = call.args[0], call.attrs.axis, bool(call.attrs.keepdims)
        if not (dtype.startswith("float") or dtype == "bool"):
            return bb.call_te(topi.max if kind == "max" else topi.min, x, axis, keepdims)
        axes = None if axis is None else [int(a) for a in axis]
        return bb.call_te(_te_reduce, x, axes, keepdims, kind, primfunc_name_hint=kind)

    return legalize


def _te_reduce(x: Any, axis: list[int] | None, keepdims: bool, kind: str) -> Any:
    """``max``/``min`` over ``axis`` with ONNX's identities (see the module docstring)."""
    from tvm import te, tirx

    ndim = len(x.shape)
    if ndim == 0:
        return te.compute((), lambda: x(), name=f"{kind}_red")
    axes = sorted({a + ndim if a < 0 else a for a in axis}) if axis else list(range(ndim))
    dtype = str(x.dtype)
    if dtype == "bool":
        combine = tirx.Or if kind == "max" else tirx.And
        identity = tirx.const(kind == "min", "bool")
    else:
        combine = tirx.max if kind == "max" else tirx.min
        identity = tirx.const(float("-inf") if kind == "max" else float("inf"), dtype)
    reducer = te.comm_reducer(lambda a, b: combine(a, b), lambda t: identity, name=f"onnx_{kind}")
    reduce_axes = {d: te.reduce_axis((0, x.shape[d]), name=f"k{d}") for d in axes}
    shape = [1 if d in reduce_axes else x.shape[d] for d in range(ndim)] if keepdims else \
        [x.shape[d] for d in range(ndim) if d not in reduce_axes]

    def compute(*index: Any) -> Any:
        position = iter(index)
        full = []
        for d in range(ndim):
            if d in reduce_axes:
                full.append(reduce_axes[d].var)
                if keepdims:
                    next(position)
            else:
                full.append(next(position))
        return reducer(x[tuple(full)], axis=[reduce_axes[d] for d in axes])

    return te.compute(shape, compute, name=f"{kind}_red")
