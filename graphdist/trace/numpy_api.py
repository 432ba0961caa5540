"""numpy semantics for traced tensors: ufuncs, functions and indexing.

Each supported ufunc or function maps to ONNX ops with numpy's dtype rules
(``ufunc.resolve_dtypes``, NEP 50 weak Python scalars) so a traced function
returns what plain numpy would. Anything unsupported raises
:class:`~graphdist.errors.TracingError` naming the call and listing what is
supported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphdist.errors import AxisError, GraphError, TracingError
from graphdist.ir.batch import BatchDim
from graphdist.ir.graph import Value
from graphdist.ir.ops import broadcast_shapes, onnx_dtype
from graphdist.trace.checks import check_indices
from graphdist.trace.tracer import TraceContext, axis_tuple, current_trace

__all__ = [
    "apply_ufunc",
    "apply_function",
    "getitem",
    "reshape",
    "transpose",
    "reduce",
    "cast_tensor",
    "supported_functions",
    "supported_ufuncs",
]

INT64_MIN = np.iinfo(np.int64).min


# ------------------------------------------------------------- operands
def _is_tensor(x: Any) -> bool:
    from graphdist.trace.tensor import Tensor

    return isinstance(x, Tensor)


def _context(*operands: Any) -> TraceContext:
    """The active trace; every tensor among ``operands`` must belong to it."""
    ctx = current_trace()
    for op in operands:
        if not _is_tensor(op):
            continue
        if ctx is None:
            raise TracingError(
                f"traced tensor %{op.value.name} was used after its trace finished (it escaped from a "
                "traced function, e.g. stored in a global or a closure); return it from the function instead"
            )
        ctx.check_owned(op)
    if ctx is None:
        raise TracingError("numpy functions on traced tensors can only be called while a function is traced")
    return ctx


def _dtype_token(x: Any) -> Any:
    """What ``ufunc.resolve_dtypes`` should see for an operand."""
    if _is_tensor(x):
        return x.dtype
    if isinstance(x, np.generic):
        return x.dtype  # numpy scalars are strongly typed, even np.float64 (a float subclass)
    if isinstance(x, bool):
        return np.dtype(np.bool_)
    if isinstance(x, BatchDim):
        return int  # the per-replica batch size is a weak Python int
    if isinstance(x, (int, float, complex)):
        return type(x)  # weak Python scalar (NEP 50)
    return np.asarray(x).dtype


def _value(ctx: TraceContext, x: Any, dtype: np.dtype) -> Value:
    """The graph value of operand ``x`` converted to ``dtype``."""
    if _is_tensor(x):
        return _cast(ctx, x.value, dtype)
    if isinstance(x, BatchDim):
        return ctx.constant(x, dtype=dtype)  # keeps the batch size's provenance
    try:
        array = np.asarray(x, dtype=dtype) if not isinstance(x, np.ndarray) else x.astype(dtype, copy=False)
    except OverflowError as err:
        raise TracingError(f"the constant {x!r} does not fit a {dtype} operand ({err}); cast the tensor to a "
                           "wider dtype first, e.g. x.astype(np.int64)") from None
    except (TypeError, ValueError) as err:
        raise TracingError(f"cannot use {type(x).__name__} {x!r} as a {dtype} operand in traced code") from err
    return ctx.constant(array if isinstance(x, np.ndarray) and x.dtype == dtype else array)


def _cast(ctx: TraceContext, value: Value, dtype: Any) -> Value:
    dtype = np.dtype(dtype)
    if value.dtype == dtype:
        return value
    if value.const_value is not None:
        return ctx.constant(value.const_value.astype(dtype), provenance=value.meta.get("batch"))
    return ctx.emit1("Cast", [value], {"to": onnx_dtype(dtype)}).value


def _wrap(ctx: TraceContext, value: Value) -> Any:
    from graphdist.trace.tensor import Tensor

    return Tensor(value, ctx)


def cast_tensor(x: Any, dtype: Any) -> Any:
    """``x.astype(dtype)`` for a traced tensor."""
    ctx = _context(x)
    try:
        dtype = np.dtype(dtype)
    except TypeError as err:
        raise TracingError(f"astype: {dtype!r} is not a numpy dtype") from err
    if dtype.kind not in "biuf":
        raise TracingError(f"astype: cannot cast traced tensor %{x.value.name} to {dtype}; traced code supports "
                           "bool, integer and floating point dtypes only")
    return _wrap(ctx, _cast(ctx, x.value, dtype))


def _resolve(ufunc: np.ufunc, operands: Sequence[Any]) -> tuple[np.dtype, ...]:
    tokens = tuple(_dtype_token(x) for x in operands) + (None,) * ufunc.nout
    try:
        return ufunc.resolve_dtypes(tokens)
    except (TypeError, np.exceptions.DTypePromotionError) as err:
        kinds = ", ".join(str(t) for t in tokens[: ufunc.nin])
        raise TracingError(f"np.{ufunc.__name__} does not support operands of type {kinds}: {err}") from None


def _result_dtype(*operands: Any, what: str = "operands") -> np.dtype:
    """``np.result_type`` of traced and concrete operands (Python scalars weak, NEP 50)."""
    tokens = []
    for x in operands:
        if _is_tensor(x) or isinstance(x, np.generic):
            tokens.append(x.dtype)
        elif isinstance(x, (bool, int, float, complex)):
            tokens.append(x)  # a Python scalar value is weak in np.result_type
        else:
            tokens.append(np.asarray(x).dtype)
    kinds = ", ".join(str(x.dtype) if _is_tensor(x) else type(x).__name__ for x in operands)
    try:
        dtype = np.result_type(*tokens)
    except (TypeError, np.exceptions.DTypePromotionError) as err:
        raise TracingError(f"{what}: cannot combine operands of types {kinds}: {err}") from None
    if dtype.kind not in "biuf":
        raise TracingError(f"{what}: operands of types {kinds} give dtype {dtype}; traced code supports "
                           "bool, integer and floating point values only")
    return dtype


# ---------------------------------------------------------------- ufuncs
_BINARY = {
    np.add: "Add", np.subtract: "Sub", np.multiply: "Mul", np.true_divide: "Div", np.power: "Pow",
    np.maximum: "Max", np.minimum: "Min", np.equal: "Equal", np.less: "Less", np.greater: "Greater",
    np.less_equal: "LessOrEqual", np.greater_equal: "GreaterOrEqual", np.matmul: "MatMul",
}
_LOGICAL = {np.logical_and: "And", np.logical_or: "Or", np.logical_xor: "Xor"}
_UNARY = {
    np.negative: "Neg", np.positive: "Identity", np.absolute: "Abs", np.exp: "Exp", np.log: "Log",
    np.sqrt: "Sqrt", np.tanh: "Tanh", np.sin: "Sin", np.cos: "Cos", np.floor: "Floor", np.ceil: "Ceil",
    np.sign: "Sign", np.reciprocal: "Reciprocal", np.isnan: "IsNaN", np.isinf: "IsInf", np.rint: "Round",
}


#: numpy's arithmetic on bools is logic; ONNX arithmetic ops reject bool tensors.
_BOOL_OPS = {"Add": "Or", "Mul": "And", "Max": "Or", "Min": "And"}
#: ONNX ordering comparisons reject bool tensors; they compare them as integers.
_ORDERINGS = frozenset({"Less", "Greater", "LessOrEqual", "GreaterOrEqual"})


def _binary(op_type: str) -> Callable[[TraceContext, np.ufunc, Sequence[Any]], Any]:
    def emit(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
        in_a, in_b, _ = _resolve(ufunc, operands)
        if op_type == "Pow" and in_b.kind == "i" and not _is_tensor(operands[1]) and np.any(
                np.asarray(operands[1]) < 0):
            raise TracingError("np.power: integers to negative integer powers are not allowed (as in numpy); "
                               "use a float exponent, e.g. x ** -1.0")
        a, b = _value(ctx, operands[0], in_a), _value(ctx, operands[1], in_b)
        if in_a == np.bool_ and in_b == np.bool_:
            if op_type in _BOOL_OPS:
                return ctx.emit1(_BOOL_OPS[op_type], [a, b])
            if op_type in _ORDERINGS:
                a, b = _cast(ctx, a, np.int32), _cast(ctx, b, np.int32)
        return ctx.emit1(op_type, [a, b])

    return emit


#: Unary ops ONNX defines for floating point inputs only, and what numpy does on integers.
_INT_IDENTITY = frozenset({"Floor", "Ceil", "Round"})  # numpy keeps integers as they are
_INT_AS_FLOAT = frozenset({"IsNaN", "IsInf"})  # an integer is never nan or inf


def _unary(op_type: str) -> Callable[[TraceContext, np.ufunc, Sequence[Any]], Any]:
    def emit(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
        in_dtype, _ = _resolve(ufunc, operands)
        x = _value(ctx, operands[0], in_dtype)
        if in_dtype == np.bool_ and op_type == "Abs":
            return _wrap(ctx, x)  # |True| is True
        if in_dtype.kind in "biu":
            if op_type in _INT_IDENTITY:
                return _wrap(ctx, x)
            if op_type in _INT_AS_FLOAT:
                x = _cast(ctx, x, np.float64)
            elif op_type == "Reciprocal":
                return ctx.emit1("Div", [ctx.constant(np.ones((), in_dtype)), x])
        return ctx.emit1(op_type, [x])

    return emit


def _logical(op_type: str) -> Callable[[TraceContext, np.ufunc, Sequence[Any]], Any]:
    def emit(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
        boolean = np.dtype(np.bool_)
        return ctx.emit1(op_type, [_value(ctx, x, boolean) for x in operands])

    return emit


def _not_equal(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
    equal = _binary("Equal")(ctx, np.equal, operands)
    return ctx.emit1("Not", [equal.value])


def _logical_not(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
    return ctx.emit1("Not", [_value(ctx, operands[0], np.dtype(np.bool_))])


def _square(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
    in_dtype, _ = _resolve(ufunc, operands)
    x = _value(ctx, operands[0], in_dtype)
    return ctx.emit1("Mul", [x, x])


def _log1p(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
    in_dtype, _ = _resolve(ufunc, operands)
    x = _value(ctx, operands[0], in_dtype)
    return ctx.emit1("Log", [ctx.emit1("Add", [x, ctx.constant(np.ones((), in_dtype))]).value])


def _expm1(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
    in_dtype, _ = _resolve(ufunc, operands)
    x = _value(ctx, operands[0], in_dtype)
    return ctx.emit1("Sub", [ctx.emit1("Exp", [x]).value, ctx.constant(np.ones((), in_dtype))])


def _floor_divide(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
    in_a, in_b, _ = _resolve(ufunc, operands)
    a, b = _value(ctx, operands[0], in_a), _value(ctx, operands[1], in_b)
    if in_a.kind in "iu":
        # ONNX integer Div truncates toward zero; numpy floors. a - (a mod b) is an exact
        # multiple of b (Mod with fmod=0 takes the divisor's sign, as numpy does).
        remainder = ctx.emit1("Mod", [a, b], {"fmod": 0}).value
        return ctx.emit1("Div", [ctx.emit1("Sub", [a, remainder]).value, b])
    if in_a.kind != "f":
        raise TracingError(f"np.floor_divide (//) does not support {in_a} operands in traced code")
    return ctx.emit1("Floor", [ctx.emit1("Div", [a, b]).value])


def _remainder(ctx: TraceContext, ufunc: np.ufunc, operands: Sequence[Any]) -> Any:
    in_a, in_b, _ = _resolve(ufunc, operands)
    a, b = _value(ctx, operands[0], in_a), _value(ctx, operands[1], in_b)
    if in_a.kind in "iu":
        return ctx.emit1("Mod", [a, b], {"fmod": 0})  # Python/numpy sign convention
    floored = ctx.emit1("Floor", [ctx.emit1("Div", [a, b]).value])
    return ctx.emit1("Sub", [a, ctx.emit1("Mul", [floored.value, b]).value])


_UFUNCS: dict[np.ufunc, Callable[[TraceContext, np.ufunc, Sequence[Any]], Any]] = {
    **{u: _binary(op) for u, op in _BINARY.items()},
    **{u: _unary(op) for u, op in _UNARY.items()},
    **{u: _logical(op) for u, op in _LOGICAL.items()},
    np.not_equal: _not_equal,
    np.logical_not: _logical_not,
    np.square: _square,
    np.log1p: _log1p,
    np.expm1: _expm1,
    np.floor_divide: _floor_divide,
    np.remainder: _remainder,
}


def supported_ufuncs() -> list[str]:
    """Names of the numpy ufuncs traced code may call."""
    return sorted(u.__name__ for u in _UFUNCS)


def apply_ufunc(ufunc: np.ufunc, method: str, *operands: Any, **kwargs: Any) -> Any:
    """Implements ``Tensor.__array_ufunc__``."""
    name = f"np.{ufunc.__name__}"
    if method != "__call__":
        raise TracingError(
            f"{name}.{method} is not supported in traced code; use the function form "
            f"(np.sum, np.max, ...) instead"
        )
    if kwargs.get("out") is not None:
        raise TracingError(f"{name}(..., out=...) cannot be traced: tensors are immutable; use the return value")
    if kwargs.get("where", True) is not True:
        raise TracingError(f"{name}(..., where=...) is not supported in traced code; use np.where on the result")
    unknown = set(kwargs) - {"out", "where", "dtype", "casting"}
    if unknown:
        raise TracingError(f"{name}: keyword(s) {sorted(unknown)} are not supported in traced code")
    rule = _UFUNCS.get(ufunc)
    if rule is None:
        raise TracingError(
            f"{name} is not supported in traced code. Supported ufuncs: {', '.join(supported_ufuncs())}"
        )
    ctx = _context(*operands)
    result = rule(ctx, ufunc, operands)
    if kwargs.get("dtype") is not None:
        result = cast_tensor(result, kwargs["dtype"])
    return result


# ------------------------------------------------------------ reductions
def reduce(op_type: str, x: Any, axis: Any = None, keepdims: bool = False, dtype: Any = None,
           what: str = "reduce") -> Any:
    """numpy-style reduction (``np.sum``/``mean``/``max``/``min``/``prod``)."""
    ctx = _context(x)
    x = _as_tensor(ctx, x)
    value = x.value
    if dtype is not None:
        value = _cast(ctx, value, dtype)
    elif op_type in ("ReduceSum", "ReduceProd") and value.dtype.kind in "biu":
        value = _cast(ctx, value, np.int64 if value.dtype.kind in "bi" else np.uint64)  # numpy widens
    elif op_type == "ReduceMean" and value.dtype.kind in "biu":
        value = _cast(ctx, value, np.float64)
    elif value.dtype == np.bool_:
        value = _cast(ctx, value, np.int64)
    axes = axis_tuple(axis, value.rank, f"np.{what} axis")
    if axes == ():
        return _wrap(ctx, value)
    axes_input = [] if axes is None else [ctx.int64s(axes)]
    attrs = {"keepdims": int(bool(keepdims))}
    result = ctx.emit1(op_type, [value, *axes_input], attrs)
    if x.dtype == np.bool_ and op_type in ("ReduceMax", "ReduceMin"):
        result = cast_tensor(result, np.bool_)
    elif value.dtype.kind == "f" and op_type in ("ReduceMax", "ReduceMin"):
        # numpy propagates NaN; ONNX Runtime's ReduceMax/ReduceMin skip it. The sum of the NaN
        # entries is NaN when there is one and 0 otherwise; subtracting it keeps -0.0 intact.
        nans = ctx.emit1("Where", [ctx.emit1("IsNaN", [value]).value, value,
                                   ctx.constant(np.zeros((), value.dtype))]).value
        nan_sum = ctx.emit1("ReduceSum", [nans, *axes_input], attrs).value
        result = ctx.emit1("Sub", [result.value, nan_sum])
    return result


def _arg_reduce(op_type: str) -> Callable[..., Any]:
    def emit(a: Any, axis: int | None = None, out: Any = None, keepdims: bool = False) -> Any:
        _no_out(out, op_type)
        ctx = _context(a)
        value = a.value
        if axis is None:
            value = reshape(_wrap(ctx, value), (-1,)).value
            axis = 0
        (axis,) = axis_tuple(axis, value.rank, f"np.{op_type.lower()} axis")
        attrs = {"axis": axis, "keepdims": int(bool(keepdims))}
        result = ctx.emit1(op_type, [value], attrs)
        if value.dtype.kind == "f":
            # numpy returns the first NaN's index; ONNX Runtime skips NaNs. ArgMax of the NaN
            # mask finds the first NaN, used where the axis has one.
            is_nan = ctx.emit1("IsNaN", [value]).value
            mask = ctx.emit1("Cast", [is_nan], {"to": onnx_dtype(value.dtype)}).value
            first_nan = ctx.emit1("ArgMax", [mask], attrs).value
            any_nan = ctx.emit1("ReduceMax", [mask, ctx.int64s([axis])], {"keepdims": attrs["keepdims"]}).value
            has_nan = ctx.emit1("Cast", [any_nan], {"to": onnx_dtype(np.bool_)}).value
            result = ctx.emit1("Where", [has_nan, first_nan, result.value])
        if keepdims and a.ndim != value.rank:  # flattened: numpy keeps all dims as 1
            result = reshape(result, (1,) * a.ndim)
        return result

    return emit


def _no_out(out: Any, name: str) -> None:
    if out is not None:
        raise TracingError(f"np.{name}(..., out=...) cannot be traced: tensors are immutable; use the return value")


def _reduction(op_type: str, what: str) -> Callable[..., Any]:
    def emit(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False,
             **kwargs: Any) -> Any:
        _no_out(out, what)
        for key in ("initial", "where"):
            if kwargs.get(key, np._NoValue) is not np._NoValue:
                raise TracingError(f"np.{what}(..., {key}=...) is not supported in traced code")
        return reduce(op_type, a, axis, keepdims, dtype, what)

    return emit


def _minmax(op_type: str, what: str) -> Callable[..., Any]:
    def emit(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, **kwargs: Any) -> Any:
        _no_out(out, what)
        if kwargs.get("initial", np._NoValue) is not np._NoValue or kwargs.get("where", np._NoValue) is not np._NoValue:
            raise TracingError(f"np.{what}(..., initial=/where=) is not supported in traced code")
        return reduce(op_type, a, axis, keepdims, None, what)

    return emit


def _logical_reduction(op_type: str, what: str) -> Callable[..., Any]:
    def emit(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, **kwargs: Any) -> Any:
        _no_out(out, what)
        if kwargs.get("where", np._NoValue) is not np._NoValue:
            raise TracingError(f"np.{what}(..., where=) is not supported in traced code")
        ctx = _context(a)
        return reduce(op_type, cast_tensor(_as_tensor(ctx, a), np.bool_), axis, keepdims, None, what)

    return emit


def _var(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0, keepdims: bool = False,
         **kwargs: Any) -> Any:
    _no_out(out, "var")
    for key in ("where", "mean"):
        if kwargs.get(key, np._NoValue) is not np._NoValue:
            raise TracingError(f"np.var(..., {key}=...) / np.std(..., {key}=...) is not supported in traced code")
    correction = kwargs.get("correction", np._NoValue)
    if correction is not np._NoValue:
        ddof = correction
    ctx = _context(a)
    x = _as_tensor(ctx, a)
    axes = axis_tuple(axis, x.ndim, "np.var axis")
    if x.dtype.kind in "biu":
        x = cast_tensor(x, np.float64)
    if dtype is not None:
        x = cast_tensor(x, dtype)
    centred = x - reduce("ReduceMean", x, axes, True)
    if ddof == 0:
        return reduce("ReduceMean", centred * centred, axes, keepdims)
    dims = [x.shape[i] for i in (axes if axes is not None else range(x.ndim))]
    if not all(isinstance(d, int) for d in dims):
        raise TracingError(f"np.var/np.std with ddof={ddof} over symbolic dimensions {dims} is not supported")
    count = int(np.prod(dims, dtype=np.int64))
    total = reduce("ReduceSum", centred * centred, axes, keepdims)
    return total / np.asarray(max(count - ddof, 0), dtype=x.dtype)


def _std(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0, keepdims: bool = False,
         **kwargs: Any) -> Any:
    _no_out(out, "std")
    return np.sqrt(_var(a, axis, dtype, None, ddof, keepdims, **kwargs))


# ----------------------------------------------------------- reshaping
def _as_tensor(ctx: TraceContext, x: Any) -> Any:
    if _is_tensor(x):
        return x
    if isinstance(x, BatchDim):
        return _wrap(ctx, ctx.constant(x))  # keeps the batch size's provenance
    array = np.asarray(x)
    return _wrap(ctx, ctx.constant(array))


def reshape(a: Any, shape: Any, order: str = "C", **kwargs: Any) -> Any:
    """``np.reshape`` / ``Tensor.reshape``."""
    if "newshape" in kwargs:
        shape = kwargs.pop("newshape")
    if order != "C":
        raise TracingError(f"np.reshape(order={order!r}) is not supported in traced code; only order='C'")
    ctx = _context(a)
    a = _as_tensor(ctx, a)
    dims = (shape,) if isinstance(shape, (int, np.integer, str)) else tuple(shape)
    if any(_is_tensor(d) for d in dims):
        raise TracingError("np.reshape: the new shape must be static Python ints, not traced values")
    target = []
    for position, d in enumerate(dims):
        if isinstance(d, str):
            # A symbolic dimension (from x.shape) kept in place: ONNX copies it with a 0.
            if position >= a.ndim or a.shape[position] != d:
                raise TracingError(
                    f"np.reshape: symbolic dimension {d!r} can only stay at its position in {a.shape}; "
                    "use -1 for the dimension that absorbs it"
                )
            target.append(0)
        else:
            if int(d) < -1:
                raise TracingError(f"np.reshape: invalid dimension {d} in {tuple(dims)}; sizes must be >= 0 or -1")
            target.append(d if isinstance(d, BatchDim) else int(d))  # keep the batch size's provenance
    literal_zero = any(d == 0 and not isinstance(dims[i], str) for i, d in enumerate(target))
    if literal_zero and any(isinstance(d, str) for d in dims):
        raise TracingError(f"np.reshape: cannot mix size-0 and symbolic dimensions in {tuple(dims)}")
    attrs = {"allowzero": 1} if literal_zero else None
    return ctx.emit1("Reshape", [a.value, ctx.int64s(target, name="shape")], attrs)


def transpose(a: Any, axes: Any = None) -> Any:
    """``np.transpose`` / ``Tensor.transpose``."""
    ctx = _context(a)
    a = _as_tensor(ctx, a)
    if axes is None:
        perm = list(range(a.ndim))[::-1]
    else:
        perm = [int(p) % max(a.ndim, 1) if -a.ndim <= int(p) < a.ndim else int(p) for p in axes]
        if sorted(perm) != list(range(a.ndim)):
            raise AxisError(f"np.transpose: axes {tuple(axes)} are not a permutation of {a.ndim} axes")
    if perm == sorted(perm):
        return a  # nothing moves (rank 0 or 1, or the identity permutation)
    return ctx.emit1("Transpose", [a.value], {"perm": perm})


def _expand_dims(a: Any, axis: Any) -> Any:
    ctx = _context(a)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    normalized = axis_tuple(axes, a.ndim + len(axes), "np.expand_dims axis")
    return ctx.emit1("Unsqueeze", [a.value, ctx.int64s(normalized)])


def _squeeze(a: Any, axis: Any = None) -> Any:
    ctx = _context(a)
    if axis is None:
        axes = tuple(i for i, d in enumerate(a.shape) if d == 1)
    else:
        axes = axis_tuple(axis, a.ndim, "np.squeeze axis")
        bad = [i for i in axes if a.shape[i] != 1]
        if bad:
            raise TracingError(f"np.squeeze: cannot select axis {bad[0]} of shape {a.shape}: its size is not 1")
    if not axes:
        return a
    return ctx.emit1("Squeeze", [a.value, ctx.int64s(axes)])


def _concatenate(arrays: Sequence[Any], axis: int | None = 0, out: Any = None, dtype: Any = None,
                 casting: str = "same_kind") -> Any:
    _no_out(out, "concatenate")
    arrays = list(arrays)
    if not arrays:
        raise TracingError("np.concatenate needs at least one array")
    ctx = _context(*arrays)
    if axis is None:
        arrays = [reshape(_as_tensor(ctx, a), (-1,)) for a in arrays]
        axis = 0
    target = np.dtype(dtype) if dtype is not None else _result_dtype(*arrays, what="np.concatenate")
    values = [_value(ctx, a, target) for a in arrays]
    ranks = {v.rank for v in values}
    if ranks == {0}:
        raise TracingError("np.concatenate: zero-dimensional arrays cannot be concatenated; use np.stack")
    if len(ranks) != 1:
        shapes = [v.shape for v in values]
        raise TracingError(f"np.concatenate: all inputs must have the same rank, got shapes {shapes}")
    (axis,) = axis_tuple(axis, values[0].rank, "np.concatenate axis")
    return ctx.emit1("Concat", values, {"axis": axis})


def _stack(arrays: Sequence[Any], axis: int = 0, out: Any = None, dtype: Any = None, casting: str = "same_kind") -> Any:
    _no_out(out, "stack")
    arrays = list(arrays)
    if not arrays:
        raise TracingError("np.stack needs at least one array")
    ctx = _context(*arrays)
    target = np.dtype(dtype) if dtype is not None else _result_dtype(*arrays, what="np.stack")
    values = [_value(ctx, a, target) for a in arrays]
    shapes = {v.shape for v in values}
    if len(shapes) != 1:
        raise TracingError(f"np.stack: all inputs must have the same shape, got {[v.shape for v in values]}")
    (axis,) = axis_tuple(axis, values[0].rank + 1, "np.stack axis")
    expanded = [ctx.emit1("Unsqueeze", [v, ctx.int64s([axis])]).value for v in values]
    return ctx.emit1("Concat", expanded, {"axis": axis})


def _split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    ctx = _context(ary)
    (axis,) = axis_tuple(axis, ary.ndim, "np.split axis")
    size = ary.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or size % sections:
            raise TracingError(f"np.split: array split does not result in an equal division ({size} into {sections})")
        sizes = [size // sections] * sections
    else:
        indices = [int(i) for i in indices_or_sections]
        bounds = [0, *[min(i + size if i < 0 else i, size) for i in indices], size]
        if any(start > end for start, end in zip(bounds, bounds[1:])):
            raise TracingError(f"np.split: indices {indices} must be increasing in traced code (axis size {size})")
        sizes = [end - start for start, end in zip(bounds, bounds[1:])]
    return ctx.emit("Split", [ary.value, ctx.int64s(sizes, name="split")], {"axis": axis}, num_outputs=len(sizes))


def _where(condition: Any, x: Any = None, y: Any = None) -> Any:
    if x is None or y is None:
        raise TracingError(
            "np.where(condition) with one argument returns data-dependent indices and cannot be traced; "
            "use the three-argument form np.where(condition, x, y)"
        )
    ctx = _context(condition, x, y)
    cond = _value(ctx, condition, np.dtype(np.bool_))
    target = _result_dtype(x, y, what="np.where")
    return ctx.emit1("Where", [cond, _value(ctx, x, target), _value(ctx, y, target)])


def _clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, **kwargs: Any) -> Any:
    _no_out(out, "clip")
    a_min = kwargs.pop("min", a_min)
    a_max = kwargs.pop("max", a_max)
    ctx = _context(a, a_min, a_max)
    bounds = [b for b in (a_min, a_max) if b is not None]
    target = _result_dtype(a, *bounds, what="np.clip")
    x = _value(ctx, a, target)
    lower = None if a_min is None else _value(ctx, a_min, target)
    upper = None if a_max is None else _value(ctx, a_max, target)
    if (lower is not None and lower.rank) or (upper is not None and upper.rank):
        result = _wrap(ctx, x)
        if lower is not None:
            result = ctx.emit1("Max", [result.value, lower])
        if upper is not None:
            result = ctx.emit1("Min", [result.value, upper])
        return result
    return ctx.emit1("Clip", [x, lower, upper])


def _dot(a: Any, b: Any, out: Any = None) -> Any:
    _no_out(out, "dot")
    if np.ndim(a) > 2 or np.ndim(b) > 2:
        raise TracingError("np.dot on arrays of rank > 2 is not supported in traced code; use np.matmul (@)")
    if np.ndim(a) == 0 or np.ndim(b) == 0:
        # np.dot turns Python scalars into arrays: they are not weak as in a * b.
        def strong(v: Any) -> Any:
            return v if _is_tensor(v) or isinstance(v, np.ndarray) else np.asarray(v)

        return np.multiply(strong(a), strong(b))
    return np.matmul(a, b)


def _swapaxes(a: Any, axis1: int, axis2: int) -> Any:
    axes = axis_tuple((axis1,), a.ndim, "np.swapaxes axis1") + axis_tuple((axis2,), a.ndim, "np.swapaxes axis2")
    perm = list(range(a.ndim))
    perm[axes[0]], perm[axes[1]] = perm[axes[1]], perm[axes[0]]
    return transpose(a, perm)


def _axis_list(axis: Any, rank: int, what: str) -> list[int]:
    """Normalised axes in the order given (``axis_tuple`` sorts them)."""
    axes = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    normalized = [axis_tuple(a, rank, what)[0] for a in axes]
    if len(set(normalized)) != len(normalized):
        raise AxisError(f"{what} {axis!r} repeats an axis")
    return normalized


def _moveaxis(a: Any, source: Any, destination: Any) -> Any:
    sources = _axis_list(source, a.ndim, "np.moveaxis source axis")
    dests = _axis_list(destination, a.ndim, "np.moveaxis destination axis")
    if len(sources) != len(dests):
        raise AxisError(f"np.moveaxis: source {source!r} and destination {destination!r} must have the same "
                        "number of elements")
    order = [n for n in range(a.ndim) if n not in sources]
    for dest, src in sorted(zip(dests, sources)):
        order.insert(dest, src)
    return transpose(a, order)


def _broadcast_to(array: Any, shape: Any, subok: bool = False) -> Any:
    ctx = _context(array)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    x = _as_tensor(ctx, array)
    try:
        fits = len(x.shape) <= len(shape) and broadcast_shapes(x.shape, shape) == shape
    except GraphError:
        fits = False
    if not fits:  # ONNX Expand broadcasts both ways; numpy only stretches the input
        raise TracingError(f"np.broadcast_to: cannot broadcast a tensor of shape {x.shape} to shape {shape}")
    return ctx.emit1("Expand", [x.value, ctx.int64s(shape, name="shape")])


def _filled_like(fill: Any) -> Callable[..., Any]:
    def emit(a: Any, *args: Any, dtype: Any = None, shape: Any = None, **kwargs: Any) -> Any:
        value = args[0] if fill is None else fill
        ctx = _context(a)
        if not all(isinstance(d, int) for d in a.shape):
            raise TracingError("np.*_like needs a static shape in traced code")
        target = np.dtype(dtype) if dtype is not None else a.dtype
        return _wrap(ctx, ctx.constant(np.full(shape if shape is not None else a.shape, value, dtype=target)))

    return emit


def _take(a: Any, indices: Any, axis: int | None = None, out: Any = None, mode: str = "raise") -> Any:
    _no_out(out, "take")
    if mode != "raise":
        raise TracingError(f"np.take(mode={mode!r}) is not supported in traced code; only mode='raise'")
    ctx = _context(a, indices)
    if axis is None:
        a, axis = reshape(a, (-1,)), 0
    (axis,) = axis_tuple(axis, a.ndim, "np.take axis")
    return ctx.emit1("Gather", [a.value, _index_value(ctx, indices, a.shape[axis], "np.take")], {"axis": axis})


def _round(a: Any, decimals: int = 0, out: Any = None) -> Any:
    _no_out(out, "round")
    decimals = int(decimals)
    if decimals == 0 or (a.dtype.kind in "biu" and decimals > 0):
        return np.rint(a) if a.dtype.kind == "f" else a
    if a.dtype.kind != "f":
        raise TracingError(f"np.round(decimals={decimals}) on {a.dtype} tensors is not supported in traced code")
    scale = np.asarray(10.0 ** abs(decimals), a.dtype)  # numpy scales, rounds half to even, unscales
    if decimals > 0:
        return np.rint(a * scale) / scale
    return np.rint(a / scale) * scale


def _astype(x: Any, dtype: Any, copy: bool = True, **kwargs: Any) -> Any:
    return cast_tensor(x, dtype)


_FUNCTIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    np.sum: _reduction("ReduceSum", "sum"),
    np.prod: _reduction("ReduceProd", "prod"),
    np.mean: _reduction("ReduceMean", "mean"),
    np.max: _minmax("ReduceMax", "max"),
    np.amax: _minmax("ReduceMax", "max"),
    np.min: _minmax("ReduceMin", "min"),
    np.amin: _minmax("ReduceMin", "min"),
    np.all: _logical_reduction("ReduceMin", "all"),
    np.any: _logical_reduction("ReduceMax", "any"),
    np.argmax: _arg_reduce("ArgMax"),
    np.argmin: _arg_reduce("ArgMin"),
    np.var: _var,
    np.std: _std,
    np.reshape: reshape,
    np.transpose: transpose,
    np.expand_dims: _expand_dims,
    np.squeeze: _squeeze,
    np.concatenate: _concatenate,
    np.stack: _stack,
    np.split: _split,
    np.where: _where,
    np.clip: _clip,
    np.dot: _dot,
    np.swapaxes: _swapaxes,
    np.moveaxis: _moveaxis,
    np.broadcast_to: _broadcast_to,
    np.zeros_like: _filled_like(0),
    np.ones_like: _filled_like(1),
    np.full_like: _filled_like(None),
    np.take: _take,
    np.round: _round,
    np.around: _round,
    np.ravel: lambda a, order="C": reshape(a, (-1,), order),
    np.shape: lambda a: a.shape,
    np.ndim: lambda a: a.ndim,
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
    np.astype: _astype,
    np.result_type: lambda *operands: np.result_type(*(x.dtype if _is_tensor(x) else x for x in operands)),
}


def supported_functions() -> list[str]:
    """Names of the numpy functions traced code may call."""
    return sorted({f.__name__ for f in _FUNCTIONS})


def apply_function(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Implements ``Tensor.__array_function__``."""
    rule = _FUNCTIONS.get(func)
    if rule is None:
        module = getattr(func, "__module__", "numpy") or "numpy"
        qualified = ("np." + module[len("numpy."):] + "." if module.startswith("numpy.") and "core" not in module
                     and "_" not in module.split(".")[-1][:1] and module != "numpy" else "np.") + func.__name__
        raise TracingError(
            f"{qualified} is not supported in traced code. Supported numpy functions: "
            f"{', '.join(supported_functions())}; supported ufuncs: {', '.join(supported_ufuncs())}. "
            "Rewrite the call with these, or compute it outside the traced function and pass the result in"
        )
    try:
        inspect.signature(rule).bind(*args, **kwargs)
    except TypeError as err:
        raise TracingError(f"np.{func.__name__}: {err} (in traced code)") from None
    return rule(*args, **kwargs)


# -------------------------------------------------------------- indexing
_MASK_HINT = (
    "boolean mask indexing gives a data-dependent shape and cannot be traced; use "
    "np.where(mask, x, 0) or multiply by the mask instead"
)


def _index_value(ctx: TraceContext, index: Any, dim: Any, what: str) -> Value:
    if _is_tensor(index):
        if index.dtype == np.bool_:
            raise TracingError(f"x[mask] with traced bool tensor %{index.value.name}: {_MASK_HINT}")
        if index.dtype.kind not in "iu":
            raise TracingError(f"index tensors must be integers, got {index.dtype}; use .astype(np.int64)")
        value = _cast(ctx, index.value, np.int64)
        if not isinstance(dim, int):
            return value
        # Checked when the step runs (numpy's [-dim, dim)); the Gather reads 0 for bad entries, never past the axis.
        return check_indices(ctx, _wrap(ctx, value), -dim, dim, op=what, argument="indices",
                             hint=f"an axis of size {dim}").value
    try:
        array = np.asarray(index)
    except ValueError as err:
        raise TracingError(f"cannot use {index!r} as an index in traced code: {err}") from None
    if array.dtype == np.bool_:
        raise TracingError(_MASK_HINT)
    if array.dtype.kind not in "iu":
        raise TracingError(f"indices must be integers, got {array.dtype}")
    if isinstance(dim, int) and array.size and (array.max() >= dim or array.min() < -dim):
        raise TracingError(f"index {int(array.max() if array.max() >= dim else array.min())} is out of bounds "
                           f"for axis of size {dim}")
    return ctx.constant(array.astype(np.int64))


def _expand_key(key: Any, rank: int) -> list[Any]:
    key = list(key) if isinstance(key, tuple) else [key]
    ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
    if len(ellipses) > 1:
        raise TracingError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > rank:
        raise TracingError(f"too many indices for a tensor of rank {rank}: {consumed} given")
    if ellipses:
        at = ellipses[0]
        key[at: at + 1] = [slice(None)] * (rank - consumed)
    else:
        key += [slice(None)] * (rank - consumed)
    return key


def _is_advanced(k: Any) -> bool:
    return _is_tensor(k) or isinstance(k, (list, np.ndarray))


def _is_int(k: Any) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def getitem(x: Any, key: Any) -> Any:
    """Static indexing and slicing: ints, slices, ``None``, ``...`` and one integer
    array (or integer tensor) index, as numpy does.

    Ints are applied as size-1 slices squeezed away; the array index becomes a
    ``Gather``. As in numpy, when the array index and the ints are not all
    adjacent in the key (``x[0, :, idx]``), the index dimensions go first.
    """
    ctx = _context(x, *(key if isinstance(key, tuple) else (key,)))
    items = _expand_key(key, x.ndim)
    advanced = [i for i, k in enumerate(items) if _is_advanced(k)]
    if len(advanced) > 1:
        raise TracingError("indexing with more than one integer array is not supported in traced code; index in steps")
    starts, ends, axes, steps, squeeze = [], [], [], [], []
    dim_index = 0
    for k in items:
        if k is None:
            continue
        dim = x.shape[dim_index]
        if _is_int(k):
            k = int(k)
            if not isinstance(dim, int) or not -dim <= k < dim:
                raise TracingError(f"index {k} is out of bounds for axis {dim_index} with size {dim}")
            starts.append(k % dim), ends.append(k % dim + 1), axes.append(dim_index), steps.append(1)
            squeeze.append(dim_index)
        elif isinstance(k, slice):
            if k != slice(None):
                if not isinstance(dim, int):
                    raise TracingError(f"cannot slice symbolic dimension {dim!r} of axis {dim_index}")
                start, stop, step = k.indices(dim)
                if step < 0 and stop < 0:
                    stop = INT64_MIN
                starts.append(start), ends.append(stop), axes.append(dim_index), steps.append(step)
        elif not _is_advanced(k):
            raise TracingError(f"unsupported index {k!r} of type {type(k).__name__} in traced code")
        dim_index += 1
    value = x.value
    if axes:
        value = ctx.emit1("Slice", [value, ctx.int64s(starts, "starts"), ctx.int64s(ends, "ends"),
                                    ctx.int64s(axes, "axes"), ctx.int64s(steps, "steps")]).value
    index_rank, to_front = 0, False
    if advanced:
        position = advanced[0]
        axis = sum(1 for k in items[:position] if k is not None)
        indices = _index_value(ctx, items[position], value.shape[axis], "x[index]")
        index_rank = indices.rank
        value = ctx.emit1("Gather", [value, indices], {"axis": axis}).value
        # Gather replaced axis `axis` by the index's dims: later int axes moved.
        squeeze = [i + index_rank - 1 if i > axis else i for i in squeeze]
        combined = [i for i, k in enumerate(items) if _is_advanced(k) or _is_int(k)]
        to_front = combined != list(range(combined[0], combined[-1] + 1))
        at = axis - sum(1 for i in squeeze if i < axis)
    if squeeze:
        value = ctx.emit1("Squeeze", [value, ctx.int64s(squeeze)]).value
    if to_front and at:
        index_dims = list(range(at, at + index_rank))
        perm = index_dims + [d for d in range(value.rank) if d not in index_dims]
        value = ctx.emit1("Transpose", [value], {"perm": perm}).value
    inserted = _inserted_axes(items, index_rank, to_front)
    if inserted:
        value = ctx.emit1("Unsqueeze", [value, ctx.int64s(inserted)]).value
    return _wrap(ctx, value)


def _inserted_axes(items: list[Any], index_rank: int, to_front: bool) -> list[int]:
    """Output positions of ``None`` entries after ints are squeezed away."""
    positions, out = [], index_rank if to_front else 0
    for k in items:
        if k is None:
            positions.append(out)
            out += 1
        elif _is_int(k):
            continue
        elif _is_advanced(k):
            out += 0 if to_front else index_rank
        else:
            out += 1
    return positions
