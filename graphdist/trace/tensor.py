"""The traced tensor proxy.

A :class:`Tensor` stands for a value in a graph being traced. numpy operators,
ufuncs (``__array_ufunc__``) and functions (``__array_function__``) on it are
recorded as graph nodes. It refuses to become concrete (``bool``, ``len``,
iteration, ``float``, ``np.asarray``) because its data does not exist yet;
the error says how to rewrite the code.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from graphdist.errors import TracingError
from graphdist.ir.graph import Value
from graphdist.trace import numpy_api as npa
from graphdist.trace.tracer import TraceContext

__all__ = ["Tensor", "UnsupportedAttributeError"]


class UnsupportedAttributeError(TracingError, AttributeError):
    """An ``ndarray`` attribute or method that traced tensors do not provide.

    Also an ``AttributeError``, so ``hasattr``/``getattr(x, name, default)`` keep working.
    """


def _concrete_error(tensor: Tensor, what: str, fix: str) -> TracingError:
    return TracingError(
        f"{what} needs the value of traced tensor %{tensor.value.name} ({tensor.value.type_str()}), which "
        f"does not exist while the function is traced into a graph. {fix}"
    )


def _numpy_caller() -> str | None:
    """The name of the numpy function the user called that asks for a concrete array (``full`` for
    ``np.full``, whose ``copyto`` would otherwise be blamed), or ``None`` for a direct ``np.asarray``.
    """
    frame = sys._getframe(2)
    name = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not (module == "numpy" or module.startswith("numpy.")):
            break
        if not frame.f_code.co_name.startswith("_"):
            name = frame.f_code.co_name
        frame = frame.f_back
    return name


class Tensor:
    """Proxy for a graph value during tracing.

    Attributes:
        value: The :class:`~graphdist.ir.Value` it stands for.
        tracer: The :class:`~graphdist.trace.tracer.TraceContext` that owns it.
    """

    __slots__ = ("value", "tracer")
    __array_priority__ = 1000

    def __init__(self, value: Value, tracer: TraceContext) -> None:
        self.value = value
        self.tracer = tracer

    # ----------------------------------------------------------- metadata
    @property
    def shape(self) -> tuple[int | str, ...]:
        """Static shape (symbolic dimensions are strings)."""
        return self.value.shape

    @property
    def dtype(self) -> np.dtype:
        """Numpy dtype."""
        return self.value.dtype

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return self.value.rank

    @property
    def size(self) -> int:
        """Number of elements (static shapes only)."""
        if not self.value.is_static:
            raise TracingError(f"tensor %{self.value.name} has symbolic shape {self.shape}; its size is unknown")
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        """Transpose (all axes reversed)."""
        return npa.transpose(self)

    @property
    def mT(self) -> Tensor:  # noqa: N802 - numpy's name
        """Transpose of the last two axes."""
        return np.swapaxes(self, -1, -2)

    def __repr__(self) -> str:
        return f"Tensor(%{self.value.name}, shape={self.shape}, dtype={self.dtype})"

    def __getattr__(self, name: str) -> Any:
        # Only called for names the class does not define.
        if name.startswith("__") or name in Tensor.__slots__:
            raise AttributeError(name)
        public = sorted(n for n in dir(Tensor) if not n.startswith("_"))
        raise UnsupportedAttributeError(
            f"ndarray.{name} is not supported on traced tensors. Supported attributes and methods: "
            f"{', '.join(public)}; numpy functions (np.*) on tensors are listed in the error of an "
            "unsupported np call"
        )

    __hash__ = object.__hash__  # __eq__ builds a graph node, so hash by identity

    # --------------------------------------------------- numpy protocols
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if any(getattr(x, "_graphdist_variable", False) for x in inputs):
            return NotImplemented  # gd.Variable's handler reads the variable, then dispatches again
        return npa.apply_ufunc(ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if any(getattr(t, "_graphdist_variable", False) for t in types):
            return NotImplemented
        return npa.apply_function(func, args, kwargs)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        caller = _numpy_caller()
        if caller == "full":
            raise _concrete_error(
                self, "np.full(shape, fill_value) with a traced fill_value",
                "np.full makes a concrete array, so its fill value must be a number; write "
                "np.broadcast_to(fill_value, shape) (or np.zeros(shape, dtype) + fill_value), which is traced.",
            )
        what = f"np.{caller}() on a traced tensor (numpy converts it to a concrete array)" if caller else \
            "np.asarray()/np.array() on a traced tensor"
        raise _concrete_error(
            self, what,
            "Use numpy functions on the tensor directly (they are recorded into the graph); to get "
            "data, return the tensor from the function and read the result.",
        )

    # ------------------------------------------------- refuse concreteness
    def __bool__(self) -> bool:
        raise _concrete_error(
            self, "Python control flow (if/while/and/or/assert) on a tensor",
            "Data-dependent branches cannot be traced: use np.where(cond, a, b) to select values, or "
            "compute the condition outside the traced function and pass it in as a Python bool.",
        )

    def __len__(self) -> int:
        raise _concrete_error(self, "len()", "Use x.shape[0], which is a static Python int.")

    def __iter__(self) -> Any:
        raise _concrete_error(
            self, "Iterating over a tensor",
            "Index with static ints (x[i] for i in range(x.shape[0])) or use np.split / np.moveaxis.",
        )

    def __index__(self) -> int:
        raise _concrete_error(self, "Using a tensor as a Python index or int", "Keep indices as Python ints.")

    def __int__(self) -> int:
        raise _concrete_error(self, "int()", "Use x.astype(np.int64) to convert inside the graph.")

    def __float__(self) -> float:
        raise _concrete_error(self, "float()", "Use x.astype(np.float32) to convert inside the graph.")

    def __complex__(self) -> complex:
        raise _concrete_error(self, "complex()", "Complex numbers are not supported in traced code.")

    def item(self, *args: Any) -> Any:
        """Refused: the value does not exist during tracing."""
        raise _concrete_error(self, ".item()", "Return the tensor from the function and read the result.")

    def tolist(self) -> Any:
        """Refused: the value does not exist during tracing."""
        raise _concrete_error(self, ".tolist()", "Return the tensor from the function and read the result.")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TracingError(
            f"item assignment on traced tensor %{self.value.name} is not supported: traced tensors are "
            "immutable. Build the result with np.where(mask, new, x) or np.concatenate instead."
        )

    # -------------------------------------------------------- operators
    def __add__(self, other: Any) -> Tensor: return np.add(self, other)
    def __radd__(self, other: Any) -> Tensor: return np.add(other, self)
    def __sub__(self, other: Any) -> Tensor: return np.subtract(self, other)
    def __rsub__(self, other: Any) -> Tensor: return np.subtract(other, self)
    def __mul__(self, other: Any) -> Tensor: return np.multiply(self, other)
    def __rmul__(self, other: Any) -> Tensor: return np.multiply(other, self)
    def __truediv__(self, other: Any) -> Tensor: return np.true_divide(self, other)
    def __rtruediv__(self, other: Any) -> Tensor: return np.true_divide(other, self)
    def __floordiv__(self, other: Any) -> Tensor: return np.floor_divide(self, other)
    def __rfloordiv__(self, other: Any) -> Tensor: return np.floor_divide(other, self)
    def __mod__(self, other: Any) -> Tensor: return np.remainder(self, other)
    def __rmod__(self, other: Any) -> Tensor: return np.remainder(other, self)
    def __pow__(self, other: Any) -> Tensor: return np.power(self, other)
    def __rpow__(self, other: Any) -> Tensor: return np.power(other, self)
    def __matmul__(self, other: Any) -> Tensor: return np.matmul(self, other)
    def __rmatmul__(self, other: Any) -> Tensor: return np.matmul(other, self)
    def __neg__(self) -> Tensor: return np.negative(self)
    def __pos__(self) -> Tensor: return np.positive(self)
    def __abs__(self) -> Tensor: return np.absolute(self)
    def __round__(self, ndigits: int | None = None) -> Tensor: return np.round(self, ndigits or 0)
    def __eq__(self, other: Any) -> Tensor: return np.equal(self, other)  # type: ignore[override]
    def __ne__(self, other: Any) -> Tensor: return np.not_equal(self, other)  # type: ignore[override]
    def __lt__(self, other: Any) -> Tensor: return np.less(self, other)
    def __le__(self, other: Any) -> Tensor: return np.less_equal(self, other)
    def __gt__(self, other: Any) -> Tensor: return np.greater(self, other)
    def __ge__(self, other: Any) -> Tensor: return np.greater_equal(self, other)

    def _logical(self, other: Any, ufunc: np.ufunc, symbol: str) -> Tensor:
        if self.dtype != np.bool_ or (isinstance(other, Tensor) and other.dtype != np.bool_):
            raise TracingError(f"'{symbol}' is supported on bool tensors only in traced code (bitwise ops on "
                               "integers are not); compare first, e.g. (x > 0) & (y > 0)")
        return ufunc(self, other)

    def __and__(self, other: Any) -> Tensor: return self._logical(other, np.logical_and, "&")
    def __rand__(self, other: Any) -> Tensor: return self._logical(other, np.logical_and, "&")
    def __or__(self, other: Any) -> Tensor: return self._logical(other, np.logical_or, "|")
    def __ror__(self, other: Any) -> Tensor: return self._logical(other, np.logical_or, "|")
    def __xor__(self, other: Any) -> Tensor: return self._logical(other, np.logical_xor, "^")
    def __rxor__(self, other: Any) -> Tensor: return self._logical(other, np.logical_xor, "^")

    def __invert__(self) -> Tensor:
        if self.dtype != np.bool_:
            raise TracingError("'~' is supported on bool tensors only in traced code")
        return np.logical_not(self)

    def __getitem__(self, key: Any) -> Tensor:
        return npa.getitem(self, key)

    # ---------------------------------------------------- ndarray methods
    def reshape(self, *shape: Any, order: str = "C") -> Tensor:
        """Like ``ndarray.reshape`` (accepts a tuple or separate ints)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return npa.reshape(self, shape, order)

    def transpose(self, *axes: Any) -> Tensor:
        """Like ``ndarray.transpose``."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return npa.transpose(self, axes or None)

    def astype(self, dtype: Any, copy: bool = True) -> Tensor:
        """Like ``ndarray.astype``: a ``Cast`` node (none when dtypes match)."""
        return npa.cast_tensor(self, dtype)

    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.sum``."""
        return np.sum(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.mean``."""
        return np.mean(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.max``."""
        return np.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.min``."""
        return np.min(self, axis=axis, keepdims=keepdims)

    def prod(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.prod``."""
        return np.prod(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def var(self, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.var``."""
        return np.var(self, axis=axis, ddof=ddof, keepdims=keepdims)

    def std(self, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.std``."""
        return np.std(self, axis=axis, ddof=ddof, keepdims=keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.all``."""
        return np.all(self, axis=axis, keepdims=keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.any``."""
        return np.any(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.argmax``."""
        return np.argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Like ``ndarray.argmin``."""
        return np.argmin(self, axis=axis, keepdims=keepdims)

    def squeeze(self, axis: Any = None) -> Tensor:
        """Like ``ndarray.squeeze``."""
        return np.squeeze(self, axis=axis)

    def flatten(self) -> Tensor:
        """Like ``ndarray.flatten`` (row-major)."""
        return npa.reshape(self, (-1,))

    ravel = flatten

    def clip(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - numpy's names
        """Like ``ndarray.clip``."""
        return np.clip(self, min, max)

    def dot(self, other: Any) -> Tensor:
        """Like ``ndarray.dot``."""
        return np.dot(self, other)

    def swapaxes(self, axis1: int, axis2: int) -> Tensor:
        """Like ``ndarray.swapaxes``."""
        return np.swapaxes(self, axis1, axis2)

    def copy(self) -> Tensor:
        """Tensors are immutable; a copy is the same value."""
        return self
