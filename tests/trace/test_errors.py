"""What the tracer refuses, and how it says so.

Every mistake in traced code raises a graphdist exception (``gd.TracingError``,
or ``gd.AxisError`` for axes) whose message names the call, argument or shape
involved and says how to fix the code.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import graphdist as gd
from graphdist.trace.numpy_api import supported_functions, supported_ufuncs

X = np.ones((3, 4), np.float32)
XI = np.ones((3, 4), np.int32)


def trace_error(fn, *args, error: type[Exception] = gd.TracingError, match: str | None = None) -> str:
    """Traces ``fn`` expecting ``error``; returns its message."""
    with pytest.raises(error, match=match) as info:
        gd.trace(fn, *args)
    assert isinstance(info.value, gd.GraphdistError)
    return str(info.value)


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (lambda x: np.linalg.norm(x), "np.linalg.norm"),
        (lambda x: np.sort(x), "np.sort"),
        (lambda x: np.cumsum(x, axis=0), "np.cumsum"),
        (lambda x: np.einsum("ij->j", x), "np.einsum"),
    ],
    ids=["linalg.norm", "sort", "cumsum", "einsum"],
)
def test_unsupported_function_names_it_and_lists_supported(fn, name) -> None:
    message = trace_error(fn, X, match=re.escape(f"{name} is not supported"))
    for supported in ("sum", "concatenate", "where", "reshape"):
        assert supported in message
    assert set(supported_functions()) <= set(re.findall(r"\w+", message))
    assert "supported ufuncs" in message


def test_unsupported_ufunc_lists_supported_ufuncs() -> None:
    message = trace_error(lambda x: np.arctan2(x, x), X, match="np.arctan2 is not supported")
    assert set(supported_ufuncs()) <= set(re.findall(r"\w+", message))


def test_ufunc_method_and_out_are_refused() -> None:
    trace_error(lambda x: np.add.reduce(x), X, match=r"np\.add\.reduce .*np\.sum")
    trace_error(lambda x: np.exp(x, out=x), X, match=r"out=.*immutable")
    trace_error(lambda x: np.sum(x, out=x), X, match=r"out=")


def test_unsupported_ndarray_method_is_a_tracing_error() -> None:
    message = trace_error(lambda x: x.cumsum(), X, match=r"ndarray\.cumsum is not supported")
    assert "reshape" in message and "astype" in message
    seen = {}
    gd.trace(lambda x: seen.update(has=hasattr(x, "cumsum")) or x, X)
    assert seen == {"has": False}


def test_if_on_tensor_suggests_np_where() -> None:
    def fn(x):
        if x > 0:
            return x
        return -x

    message = trace_error(fn, X, match=r"control flow")
    assert "np.where" in message and "bool[3,4]" in message


def test_while_and_boolean_operators_on_tensors() -> None:
    trace_error(lambda x: x and x, X, match="np.where")
    trace_error(lambda x: x if (x > 0).all() else -x, X, match="np.where")


@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (lambda x: len(x), r"len\(\).*x\.shape\[0\]"),
        (lambda x: [row for row in x], r"Iterating.*x\[i\]"),
        (lambda x: float(x), r"float\(\).*astype"),
        (lambda x: int(x), r"int\(\).*astype"),
        (lambda x: np.asarray(x), r"np\.asarray"),
        (lambda x: np.array(x), r"np\.asarray\(\)/np\.array\(\)"),
        (lambda x: x.item(), r"\.item\(\)"),
        (lambda x: x.tolist(), r"\.tolist\(\)"),
        (lambda x: range(x), r"Python index or int"),
    ],
    ids=["len", "iter", "float", "int", "asarray", "array", "item", "tolist", "index"],
)
def test_tensor_refuses_to_become_concrete(fn, pattern) -> None:
    message = trace_error(fn, X, match=pattern)
    assert "%arg0 (float32[3,4])" in message


def test_boolean_mask_indexing() -> None:
    trace_error(lambda x: x[x > 0], X, match=r"boolean mask.*np\.where")
    trace_error(lambda x: x[np.ones((3, 4), bool)], X, match=r"boolean mask.*np\.where")


def test_item_assignment() -> None:
    def fn(x):
        x[0] = 1
        return x

    trace_error(fn, X, match=r"item assignment.*immutable.*np\.where")


def test_one_argument_where() -> None:
    trace_error(lambda x: np.where(x > 0), X, match=r"np\.where\(condition\).*three-argument")


@pytest.mark.parametrize(
    ("fn", "what", "axis", "rank"),
    [
        (lambda x: np.sum(x, axis=2), "np.sum", 2, 2),
        (lambda x: np.mean(x, axis=-3), "np.mean", -3, 2),
        (lambda x: x.max(axis=(0, 5)), "np.max", 5, 2),
        (lambda x: np.concatenate([x, x], axis=2), "np.concatenate", 2, 2),
        (lambda x: np.expand_dims(x, 3), "np.expand_dims", 3, 3),
        (lambda x: np.stack([x, x], axis=-4), "np.stack", -4, 3),
        (lambda x: np.argmax(x, axis=2), "np.argmax", 2, 2),
        (lambda x: np.moveaxis(x, 5, 0), "np.moveaxis", 5, 2),
        (lambda x: np.squeeze(x, 4), "np.squeeze", 4, 2),
        (lambda x: np.split(x, 2, axis=2), "np.split", 2, 2),
    ],
    ids=["sum", "mean", "max-tuple", "concatenate", "expand_dims", "stack", "argmax", "moveaxis", "squeeze",
         "split"],
)
def test_axis_out_of_range(fn, what, axis, rank) -> None:
    message = trace_error(fn, X, error=gd.AxisError, match=re.escape(what))
    assert f"axis {axis} " in message and f"rank {rank}" in message
    with pytest.raises(ValueError):
        gd.trace(fn, X)


def test_axis_on_a_scalar() -> None:
    message = trace_error(lambda x: np.sum(x.sum(), axis=0), X, error=gd.AxisError, match="np.sum axis 0")
    assert "rank 0" in message


def test_symbolic_reshape_misuse() -> None:
    spec = gd.TensorSpec((None, 4), np.float32)
    trace_error(lambda x: x.reshape(4, x.shape[0]), spec, match=r"symbolic dimension 'arg0_d0' can only stay")
    trace_error(lambda x: x.reshape(-1), spec, match=r"symbolic dimensions must be kept")
    trace_error(lambda x: x[1:], spec, match=r"cannot slice symbolic dimension")
    trace_error(lambda x: x.size, spec, match=r"symbolic shape")


def test_axis_error_is_value_error_and_tracing_error() -> None:
    assert issubclass(gd.AxisError, ValueError) and issubclass(gd.AxisError, gd.TracingError)
    trace_error(lambda x: np.sum(x, axis=(1, -1)), X, error=gd.AxisError, match="repeats an axis")
    trace_error(lambda x: np.transpose(x, (0, 0)), X, error=gd.AxisError, match="not a permutation")


def test_wrong_arity_names_the_signature() -> None:
    message = trace_error(lambda x, y: x, X, match=re.escape("<lambda>(x, y)"))
    assert "1 positional argument" in message and "'y'" in message

    def step(a, b=1, *, c):
        return a

    trace_error(step, X, match=re.escape("step(a, b=1, *, c)"))


def test_matmul_inner_dimension_mismatch_names_shapes() -> None:
    message = trace_error(lambda x: x @ x, X, match="inner dimensions differ")
    assert "float32[3,4] @ float32[3,4]" in message


def test_broadcast_failure_names_shapes() -> None:
    message = trace_error(lambda x: x + np.ones(3, np.float32), X, match="cannot be broadcast")
    assert "(3, 4)" in message and "(3,)" in message
    trace_error(lambda x: np.broadcast_to(x, (1, 4)), X, match=r"broadcast_to.*\(3, 4\).*\(1, 4\)")


@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (lambda x: x.reshape(5, 3), r"cannot reshape float32\[3,4\] into \(5, 3\)"),
        (lambda x: x[3], r"index 3 is out of bounds for axis 0 with size 3"),
        (lambda x: x[0, 0, 0], r"too many indices for a tensor of rank 2"),
        (lambda x: x[[0, 7]], r"index 7 is out of bounds"),
        (lambda x: x[[0], [1]], r"more than one integer array"),
        (lambda x: x["a"], r"unsupported index 'a'"),
        (lambda x: np.squeeze(x, 0), r"axis 0 of shape \(3, 4\)"),
        (lambda x: np.stack([x, x.T]), r"same shape.*\(3, 4\), \(4, 3\)"),
        (lambda x: np.split(x, 2), r"equal division \(3 into 2\)"),
        (lambda x: np.concatenate([x, x[None]]), r"same rank"),
        (lambda x: x.astype(str), r"cannot cast traced tensor %arg0"),
        (lambda x: x.astype("nope"), r"'nope' is not a numpy dtype"),
        (lambda x: np.round(x.astype(np.int32), -1), r"decimals=-1"),
        (lambda x: np.reshape(x, (12,), order="F"), r"order='C'"),
        (lambda x: x.reshape(-2, 6), r"invalid dimension -2"),
        (lambda x: np.take(x, [0], axis=0, mode="wrap"), r"mode='wrap'"),
        (lambda x: np.split(x, [3, 1], axis=1), r"must be increasing"),
        (lambda x: np.var(x, where=x > 0), r"np\.var\(\.\.\., where="),
        (lambda x: np.concatenate([x.sum(), x.sum()]), r"zero-dimensional"),
        (lambda x: np.moveaxis(x, (0, 1), 0), r"same number of elements"),
    ],
    ids=["reshape", "index", "too-many-indices", "index-list", "two-arrays", "string-index", "squeeze", "stack",
         "split", "concat-rank", "astype-str", "astype-unknown", "round-decimals", "reshape-order", "reshape-dim",
         "take-mode", "split-order", "var-where", "concat-scalars", "moveaxis-lengths"],
)
def test_shape_and_argument_errors(fn, pattern) -> None:
    trace_error(fn, X, match=pattern)


def test_leaked_tensor_from_earlier_trace() -> None:
    leaked = []
    gd.trace(lambda x: leaked.append(x) or x * 2, X)
    trace_error(lambda x: x + leaked[0], X, match=r"belongs to another trace.*pass it as an argument")
    trace_error(lambda x: leaked[0] * 2, X, match=r"belongs to another trace")
    trace_error(lambda x: (x, leaked[0]), X, match=r"belongs to another trace")
    trace_error(lambda x: x[leaked[0].astype(np.int64)], X, match=r"belongs to another trace")
    with pytest.raises(gd.TracingError, match="after its trace finished"):
        leaked[0] + 1
    with pytest.raises(gd.TracingError, match="after its trace finished"):
        np.sum(leaked[0])


def test_leaked_tensor_leaves_earlier_graph_untouched() -> None:
    leaked = []
    first = gd.trace(lambda x: leaked.append(x) or x * 2, X)
    before = len(first.nodes)
    with pytest.raises(gd.TracingError):
        gd.trace(lambda x: leaked[0] - 1, X)
    assert len(first.nodes) == before


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + "a",
        lambda x: "a" * x,
        lambda x: x == "a",
        lambda x: np.where(x > 0, x, "a"),
        lambda x: np.clip(x, "a", None),
        lambda x: np.concatenate([x, np.array([["a"] * 4])]),
    ],
    ids=["add", "rmul", "eq", "where", "clip", "concatenate"],
)
def test_strings_as_operands(fn) -> None:
    message = trace_error(fn, X)
    assert "str" in message or "<U" in message


def test_python_int_too_large_for_dtype() -> None:
    trace_error(lambda x: x + 2**40, XI, match=r"does not fit a int32 operand.*astype\(np\.int64\)")


def test_negative_integer_power() -> None:
    trace_error(lambda x: x**-1, XI, match=r"negative integer powers.*x \*\* -1\.0")
    with pytest.raises(ValueError, match="negative integer powers"):
        XI**-1  # numpy says the same


def test_bitwise_ops_on_integers() -> None:
    trace_error(lambda x: x & x, XI, match=r"bool tensors only.*\(x > 0\) & \(y > 0\)")
    trace_error(lambda x: ~x, XI, match="bool tensors only")


def test_floor_divide_on_bools_or_bad_dtype() -> None:
    trace_error(lambda x: x - x, np.ones(3, bool), match="np.subtract")


def test_non_callable_and_bad_outputs() -> None:
    with pytest.raises(gd.TracingError, match="fn must be callable"):
        gd.trace(3, X)
    trace_error(lambda x: object(), X, match="output 0 of the traced function is a object")
    trace_error(lambda x: (x, "label"), X, match="output 1 of the traced function is a str")


def test_functions_outside_a_trace_are_plain_numpy() -> None:
    # Nothing is traced here, so numpy runs as usual.
    assert np.sum(X) == 12.0
