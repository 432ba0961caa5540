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
* Every reduction (``sum``, ``prod``, ``max``, ``min``, ``mean``,
  ``variance``, ``std``) whose reduced extent is not a known positive
  constant returns its identity where that extent is zero at run time. A TIR
  reduction block initialises its output *inside* its first reduction
  iteration, so over an empty axis it writes nothing: the output is whatever
  the allocator left in memory (``-4.15e+02, 4.58e-41, nan`` seen on an AMD
  host, right values by luck on an Intel one). TVM's own lowering fills a
  constant zero extent for ``sum`` and ``prod`` only, and not a symbolic one,
  which is what the ONNX frontend makes of a ``0`` dimension.

Reductions over known positive extents keep TVM's lowering (the hand-written
schedules match it); integer ``max``/``min`` keep TVM's identities (the integer
type's limits, as ONNX's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["legalize_overrides"]

#: ONNX's value of each reduction over an empty set (``mean`` and its kin: 0 / 0).
_IDENTITIES: dict[str, float] = {
    "sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf"),
    "mean": float("nan"), "variance": float("nan"), "std": float("nan"),
}


def legalize_overrides() -> dict[str, Callable[[Any, Any], Any]]:
    """Op name -> legalization function, for ``LegalizeOps(customize_legalize_map=...)``."""
    return {f"relax.{kind}": _reduction(kind) for kind in _IDENTITIES}


def _reduction(kind: str) -> Callable[[Any, Any], Any]:
    def legalize(bb: Any, call: Any) -> Any:
        from tvm.relax.transform.legalize_ops.statistical import _te_mean, _te_variance

        dtype = str(call.ty.dtype)
        x, axis, keepdims = call.args[0], call.attrs.axis, bool(call.attrs.keepdims)
        axes = None if axis is None else [int(a) for a in axis]
        ndim = len(x.ty.shape.values)
        reduced = _normalised(axes, ndim)
        may_be_empty = not all(_known_positive(x.ty.shape.values[d]) for d in reduced)
        onnx_max_min = kind in ("max", "min") and (dtype.startswith("float") or dtype == "bool")
        if not (may_be_empty or onnx_max_min):
            return None  # TVM's own lowering is right
        compute = {
            "mean": _te_mean, "variance": _te_variance,
            "std": lambda t, a, k: _topi().sqrt(_te_variance(t, a, k)),
        }.get(kind) or (lambda t, a, k: _te_reduce(t, a, k, kind, onnx_max_min))

        if not may_be_empty:
            return bb.call_te(compute, x, axes, keepdims, primfunc_name_hint=kind)

        def guarded(t: Any) -> Any:
            return _empty_guard(compute(t, axes, keepdims), t, reduced, kind)

        return bb.call_te(guarded, x, primfunc_name_hint=kind)

    return _with_default(legalize)


def _with_default(legalize: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``legalize``, falling back to TVM's registered legalization where it returns ``None``."""
    def call(bb: Any, call_node: Any) -> Any:
        lowered = legalize(bb, call_node)
        if lowered is not None:
            return lowered
        from tvm import ir

        return ir.Op.get(call_node.op.name).get_attr("FLegalize")(bb, call_node)

    return call


def _topi() -> Any:
    from tvm import topi

    return topi


def _normalised(axes: list[int] | None, ndim: int) -> list[int]:
    return sorted({a + ndim if a < 0 else a for a in axes}) if axes else list(range(ndim))


def _known_positive(extent: Any) -> bool:
    from tvm import tirx

    return isinstance(extent, tirx.IntImm) and int(extent) > 0


def _empty_guard(result: Any, x: Any, reduced: list[int], kind: str) -> Any:
    """``result``, or ``kind``'s identity wherever the reduced extent of ``x`` is zero (run-time test)."""
    from tvm import te, tirx

    extent = tirx.const(1, "int64")
    for d in reduced:
        extent = extent * tirx.Cast("int64", x.shape[d])
    dtype = str(result.dtype)
    identity = _identity(kind, dtype)
    if not result.shape:
        return te.compute((), lambda: tirx.if_then_else(extent == 0, identity, result()), name=f"{kind}_onnx")
    return te.compute(result.shape, lambda *i: tirx.if_then_else(extent == 0, identity, result(*i)),
                      name=f"{kind}_onnx")


def _identity(kind: str, dtype: str) -> Any:
    from tvm import tirx

    if dtype == "bool":
        return tirx.const(kind in ("min", "prod"), "bool")
    value = _IDENTITIES[kind]
    if dtype.startswith(("int", "uint")):
        if kind in ("max", "min"):
            return tirx.max_value(dtype) if kind == "min" else tirx.min_value(dtype)
        return tirx.const(int(value) if value == value else 0, dtype)
    return tirx.const(value, dtype)


def _te_reduce(x: Any, axis: list[int] | None, keepdims: bool, kind: str, onnx_max_min: bool) -> Any:
    """``kind`` over ``axis``: TVM's topi reduction, or for float/bool ``max``/``min`` ONNX's identities."""
    if not onnx_max_min:
        return getattr(_topi(), kind)(x, axis, keepdims)
    from tvm import te, tirx

    ndim = len(x.shape)
    if ndim == 0:
        return te.compute((), lambda: x(), name=f"{kind}_red")
    axes = _normalised(axis, ndim)
    dtype = str(x.dtype)
    if dtype == "bool":
        combine = tirx.Or if kind == "max" else tirx.And
    else:
        combine = tirx.max if kind == "max" else tirx.min
    identity = _identity(kind, dtype)
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
