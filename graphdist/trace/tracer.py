"""The trace context: records ops emitted by :class:`~graphdist.trace.tensor.Tensor`
proxies into a :class:`~graphdist.ir.Graph`.

``trace(fn, *example_args)`` turns a numpy-style function into a graph: arrays
(and :class:`TensorSpec`) in the example arguments become graph inputs, other
Python values become constants, Python control flow is unrolled, and the
returned structure becomes the graph outputs (``graph.meta.output_tree``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist import nest, stats
from graphdist.errors import AxisError, GraphError, TracingError
from graphdist.ir import batch
from graphdist.ir.graph import ONNX_DOMAIN, Graph, Value
from graphdist.ir.ops import normalize_axis
from graphdist.trace import context

__all__ = [
    "TraceContext",
    "TensorSpec",
    "trace",
    "current_trace",
    "is_tracing",
    "flatten_inputs",
]

logger = logging.getLogger(__name__)

_state = threading.local()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SMALL_CONSTANT = 64  # constants up to this many elements are deduplicated by value


@dataclass(frozen=True)
class TensorSpec:
    """Describes a traced input without data (like ``tf.TensorSpec``).

    ``None`` in ``shape`` makes that dimension symbolic.
    """

    shape: tuple[int | None, ...]
    dtype: Any = np.float32
    name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))


def current_trace() -> TraceContext | None:
    """The innermost active trace context of this thread, or ``None``."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def is_tracing() -> bool:
    """True while a function is being traced in this thread."""
    return current_trace() is not None


def _user_location() -> str | None:
    """``file:line`` of the innermost frame outside graphdist (for messages)."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIR) and "numpy" not in filename:
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class TraceContext:
    """Records ops into ``graph`` while active (see :meth:`activate`).

    Attributes:
        graph: The graph being built.
        regions: Stack of region annotations (``{"context": "replica", ...}``)
            copied into ``node.meta`` of every node emitted inside them.
    """

    def __init__(self, name: str = "traced") -> None:
        self.graph = Graph(name, stage="traced")
        self.regions: list[dict[str, Any]] = []
        self._constants: dict[Any, Value] = {}
        self._captured: dict[int, tuple[Any, Value]] = {}
        #: Variable objects read by the step, by input name (the graph holds their specs only).
        self.variables: dict[str, Any] = {}
        #: Per variable (by id): its input and latest assigns (see graphdist.trace.variables).
        self.variable_state: dict[int, Any] = {}
        #: Strategies whose ``run`` / ``reduce`` / ``gather`` the step called.
        self.strategies: list[Any] = []
        #: The strategy whose scope was entered when the trace began (``None`` outside every scope): a step
        #: that calls no strategy compiles under it. Compilation reads it here, never from the thread-local
        #: scope stack.
        self.scope_strategy: Any = context.current_strategy()
        #: True when a pass pipeline makes the replicas of this trace (``gd.function``): the number of
        #: replicas is then a ``graphdist.NumReplicas`` node, not a constant.
        self.replicated = False
        #: Concrete values of graph inputs fed by arrays of the call being traced, by input name, with the
        #: argument they came from (see :meth:`specialise`).
        self.input_values: dict[str, tuple[str, np.ndarray]] = {}
        #: The inputs whose values the step used as constants (:meth:`specialise`): name -> (argument, value).
        self.specialised: dict[str, tuple[str, np.ndarray]] = {}
        self._sequence = itertools.count()

    def next_sequence(self) -> int:
        """A number larger than every earlier one (orders assigns within the trace)."""
        return next(self._sequence)

    @contextlib.contextmanager
    def activate(self) -> Iterator[TraceContext]:
        """Makes this context current for the calling thread."""
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()

    @contextlib.contextmanager
    def region(self, **annotations: Any) -> Iterator[None]:
        """Annotates every node emitted inside the block with ``annotations``."""
        self.regions.append(annotations)
        try:
            yield
        finally:
            self.regions.pop()

    # ------------------------------------------------------------ values
    def input(self, name: str, dtype: Any, shape: Sequence[int | str]) -> Any:
        """Adds a graph input and returns its proxy."""
        from graphdist.trace.tensor import Tensor

        return Tensor(self.graph.add_input(name, dtype, shape), self)

    def specialise(self, value: Value) -> np.ndarray | None:
        """The value ``value`` holds in the call being traced, if the trace can know it, as a constant.

        A constant gives its value. A graph input fed by an array of the call gives that array, and the
        input is recorded as specialised (:attr:`specialised`): the traced graph is then valid only for
        that value, so ``gd.function`` keys its cache on it and traces again for a new one (as
        ``torch.compile`` guards on a value, or JAX on a static argument).

        Returns:
            The value, or ``None`` when it is computed by the step or the argument was a ``TensorSpec``.
        """
        if value.const_value is not None:
            return np.asarray(value.const_value)
        known = self.input_values.get(value.name) if value.producer is None else None
        if known is None:
            return None
        self.specialised[value.name] = known
        return known[1]

    def constant(self, value: Any, dtype: Any = None, name: str = "const", provenance: Any = None) -> Value:
        """Lifts a Python or numpy value into an initializer (deduplicated).

        Numbers computed from the per-replica batch size (:class:`graphdist.ir.batch.BatchDim`) are
        recorded in the initializer's ``meta["batch"]``; ``provenance`` gives that record for a value
        that no longer carries it (a constant being cast).
        """
        array = np.asarray(value, dtype=dtype)
        if array.dtype == object or array.dtype.kind in "USV":
            raise TracingError(
                f"cannot use a value of type {type(value).__name__} (dtype {array.dtype}) in traced "
                "code: only numbers, booleans and numeric arrays can become graph constants"
            )
        if isinstance(value, np.ndarray) and value.size > _SMALL_CONSTANT:
            # Captured arrays (weights): one initializer per array object.
            hit = self._captured.get(id(value))
            if hit is not None and hit[0] is value and hit[1].dtype == array.dtype:
                return hit[1]
            const = self.graph.add_initializer(name, array)
            self._captured[id(value)] = (value, const)
            return const
        provenance = provenance if provenance is not None else batch.record(value)
        key = (array.dtype.str, array.shape, array.tobytes(), str(provenance)) if array.size <= _SMALL_CONSTANT \
            else None
        if key is not None and key in self._constants:
            return self._constants[key]
        const = self.graph.add_initializer(name, array)
        if provenance is not None and len(provenance) == array.size:
            const.meta["batch"] = provenance
        if key is not None:
            self._constants[key] = const
        return const

    def int64s(self, values: Sequence[int], name: str = "axes") -> Value:
        """An int64 1-D constant (axes, shapes, Slice bounds)."""
        values = list(values)
        array = np.asarray(values, dtype=np.int64).reshape(-1)
        provenance = batch.record(values)
        if provenance is None:
            return self.constant(array, name=name)
        return self.constant(values, dtype=np.int64, name=name)

    # --------------------------------------------------------------- ops
    def emit(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = ONNX_DOMAIN,
        num_outputs: int | None = None,
        name: str | None = None,
    ) -> list[Any]:
        """Appends one node and returns proxies of its outputs."""
        from graphdist.trace.tensor import Tensor

        try:
            node = self.graph.add_node(op_type, inputs, attrs, domain=domain, num_outputs=num_outputs, name=name)
        except GraphError as err:
            where = _user_location()
            raise TracingError(f"{err}" + (f" (at {where})" if where else "")) from None
        for region in self.regions:
            node.meta.update(region)
        location = _user_location()
        if location:
            node.meta["source"] = location
        return [Tensor(out, self) for out in node.outputs]

    def emit1(self, op_type: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None,
              **kwargs: Any) -> Any:
        """Like :meth:`emit` for single-output ops."""
        return self.emit(op_type, inputs, attrs, **kwargs)[0]

    # ----------------------------------------------------------- outputs
    def set_outputs(self, result: Any) -> None:
        """Makes the leaves of ``result`` the graph outputs.

        Non-tensor leaves become constants; every output gets its own
        ``Identity`` node when it is an input, a constant or repeated, so that
        output names are unique and produced by a node.
        """
        from graphdist.trace.tensor import Tensor

        leaves, treedef = nest.flatten(result)
        outputs: list[Value] = []
        seen: set[int] = set()
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                self.check_owned(leaf)
                value = leaf.value
            else:
                value = self.constant(_as_output_constant(leaf, index), name=f"output_{index}")
            if value.producer is None or id(value) in seen:
                value = self.graph.add_node("Identity", [value], name="output").outputs[0]
            seen.add(id(value))
            outputs.append(value)
        self.graph.outputs = outputs
        self.graph.meta.output_tree = treedef

    def check_owned(self, tensor: Any) -> None:
        """Raises when ``tensor`` belongs to another (finished) trace."""
        if tensor.tracer is not self:
            raise TracingError(
                f"tensor %{tensor.value.name} belongs to another trace (it escaped from an earlier "
                "traced function, e.g. stored in a global or a closure); pass it as an argument instead"
            )


def _as_output_constant(leaf: Any, index: int) -> np.ndarray:
    try:
        array = np.asarray(leaf)
    except Exception as err:  # noqa: BLE001 - arbitrary user objects
        raise TracingError(f"output {index} of the traced function is a {type(leaf).__name__}, not a tensor") from err
    if array.dtype == object or array.dtype.kind in "USV":
        raise TracingError(
            f"output {index} of the traced function is a {type(leaf).__name__}; traced functions "
            "may return tensors, numbers and nested tuples/lists/dicts of them"
        )
    return array


def _is_array_leaf(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, TensorSpec))


def flatten_inputs(ctx: TraceContext, args: Sequence[Any], kwargs: dict[str, Any] | None = None,
                   names: Sequence[str] | None = None) -> tuple[tuple, dict]:
    """Replaces arrays and TensorSpecs in ``(args, kwargs)`` by graph inputs.

    Python scalars and other leaves stay Python values (they become constants
    when an op uses them). Returns the arguments to call the function with.
    """
    kwargs = kwargs or {}
    leaves, treedef = nest.flatten((tuple(args), kwargs))
    proxies = []
    for index, leaf in enumerate(leaves):
        if _is_array_leaf(leaf):
            hint = names[index] if names and index < len(names) else f"arg{index}"
            if isinstance(leaf, TensorSpec):
                shape = tuple(f"{hint}_d{i}" if d is None else d for i, d in enumerate(leaf.shape))
                proxies.append(ctx.input(leaf.name or hint, leaf.dtype, shape))
            else:
                proxies.append(ctx.input(hint, leaf.dtype, np.shape(leaf)))
        else:
            proxies.append(leaf)
    new_args, new_kwargs = nest.unflatten(treedef, proxies)
    return new_args, new_kwargs


def trace(fn: Callable[..., Any], *example_args: Any, name: str | None = None, **example_kwargs: Any) -> Graph:
    """Traces ``fn`` on example arguments into a graph (no strategy involved).

    Args:
        fn: A numpy-style function.
        *example_args: Arrays (or :class:`TensorSpec`) that become graph inputs;
            other values are baked in as constants.
        name: Graph name (default: the function's name).
        **example_kwargs: Keyword arguments, treated like ``example_args``.

    Returns:
        The traced graph (stage ``"traced"``).

    Raises:
        TracingError: ``fn`` does something a trace cannot represent.
    """
    if not callable(fn):
        raise TracingError(f"trace: fn must be callable, got {type(fn).__name__}")
    ctx = TraceContext(name or getattr(fn, "__name__", "traced").strip("<>") or "traced")
    with ctx.activate():
        args, kwargs = flatten_inputs(ctx, example_args, example_kwargs)
        result = call_user_function(fn, args, kwargs)
        ctx.set_outputs(result)
    stats.increment("traces")
    logger.debug("traced %s: %d nodes", ctx.graph.name, len(ctx.graph.nodes))
    return ctx.graph


def call_user_function(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Calls ``fn``, turning an arity mismatch into a clear TracingError."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as err:
            fn_name = getattr(fn, "__qualname__", repr(fn))
            raise TracingError(
                f"{fn_name}{signature} cannot be called with {len(args)} positional argument(s)"
                f"{' and keywords ' + ', '.join(kwargs) if kwargs else ''}: {err}. Pass args=(...) "
                "matching the function's parameters"
            ) from None
    return fn(*args, **kwargs)


def axis_tuple(axis: Any, rank: int, what: str = "axis") -> tuple[int, ...] | None:
    """Normalises an ``axis`` argument (None, int or tuple) to sorted non-negative ints."""
    if axis is None:
        return None
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    try:
        normalized = [normalize_axis(int(a), rank, what) for a in axes]
    except GraphError as err:
        raise AxisError(str(err)) from None
    except (TypeError, ValueError):  # int("x")
        raise TracingError(f"{what} must be an int or a tuple of ints, got {axis!r}") from None
    if len(set(normalized)) != len(normalized):
        raise AxisError(f"{what} {axis!r} repeats an axis")
    return tuple(sorted(normalized))
