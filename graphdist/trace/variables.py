"""``gd.Variable``: mutable state that traced steps read and update.

Eagerly a variable behaves like its numpy value. Inside a trace, reading it
makes it a graph input (``value.meta["variable"]``) fed from the variable's
current value on every call, and ``assign*`` records a
``graphdist.AssignVariable`` node; the runtime writes the new value back
after the step. Reads after an assign in the same step see the new value.

Creation goes through a creator hook: the innermost strategy whose scope is
entered (:func:`graphdist.trace.context.current_strategy`) picks the class
(``_variable_class()``, e.g. a mirrored variable) and places the new
variable (``_create_variable(variable)``). Without one, a variable is a plain
:class:`Variable` on ``cpu:0``. This module knows nothing else of strategies.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist.errors import GraphdistError, InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.runtime.buffers import aligned
from graphdist.trace import context

__all__ = ["Variable", "WorkerShard", "read_variable", "is_variable", "VariableLocks"]

#: Where a variable lives when no strategy places it.
DEFAULT_DEVICE = "cpu:0"

_ids = itertools.count()
_ids_lock = threading.Lock()


def _plain_list(value: Any) -> bool:
    """A (nested) list or tuple of Python/numpy scalars and strings (nothing traced inside)."""
    if not isinstance(value, (list, tuple)):
        return False
    return all(_plain_list(v) or isinstance(v, (str, bytes, int, float, complex, np.generic)) for v in value)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _next_id() -> int:
    with _ids_lock:
        return next(_ids)


def _initial_array(initial_value: Any, dtype: Any) -> np.ndarray:
    value = initial_value() if callable(initial_value) else initial_value
    if isinstance(value, Variable):
        value = value.numpy()
    if dtype is None and isinstance(value, float):
        dtype = np.float32  # like tf.Variable(1.)
    elif dtype is None and isinstance(value, bool):
        dtype = np.bool_
    elif dtype is None and isinstance(value, int):
        dtype = np.int32
    try:
        array = np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError) as err:
        raise InvalidArgumentError(
            f"Variable: initial_value {value!r} cannot become an array of dtype {dtype}") from err
    if array.dtype == object or array.dtype.kind in "USV":
        raise InvalidArgumentError(f"Variable: initial_value must be numeric, got dtype {array.dtype}")
    return aligned(array)


def _no_gather(stored: np.ndarray) -> np.ndarray:
    """The gather of a single worker: its own shards are all of them."""
    return stored


@dataclass(frozen=True)
class WorkerShard:
    """How a variable sharded over replicas (ZeRO-1 optimizer slots) is stored in this process.

    The value, flattened and zero-padded to ``chunk * local * workers``
    elements, is split into that many shards; local replica ``r`` of worker
    ``w`` owns shard ``r * workers + w``, and this process stores its
    ``local`` shards as ``local`` separate arrays (:meth:`parts`), one per
    local replica: a step feeds replica ``r`` its part and adopts the part
    it writes back, without slicing or concatenating. With one worker
    (``MirroredStrategy`` in one process) the parts are the whole value.

    Attributes:
        shape: The variable's (logical) shape.
        workers: Worker processes.
        worker: This process's index among them.
        chunk: Elements per shard.
        gather: All-gathers every worker's stored shards (a collective: every worker must call it;
            one worker's is the identity).
        local: Replicas (shards) per worker.
        blocks: Tensor parallelism (one worker): part ``i`` is the block
            ``value[start:stop, ...]`` of ``blocks[i]`` (one ``(start, stop)`` per
            dimension), stored in its own shape, instead of a flat chunk;
            ``chunk`` is then a block's element count.
    """

    shape: tuple[int, ...]
    workers: int
    worker: int
    chunk: int
    gather: Callable[[np.ndarray], np.ndarray] = _no_gather
    local: int = 1
    blocks: tuple[tuple[tuple[int, int], ...], ...] | None = None

    @property
    def size(self) -> int:
        """Elements of the whole value."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def stored(self) -> int:
        """Elements this process stores."""
        return self.chunk * self.local

    def same_layout(self, other: WorkerShard) -> bool:
        """Whether ``other`` splits the value into the same shards and this process keeps the same ones."""
        return (self.workers, self.worker, self.chunk, self.local, self.blocks) == (
            other.workers, other.worker, other.chunk, other.local, other.blocks)

    def part_shape(self, index: int) -> tuple[int, ...]:
        """The shape part ``index`` is stored in."""
        if self.blocks is None:
            return (self.chunk,)
        return tuple(stop - start for start, stop in self.blocks[index])

    def local_part(self, value: np.ndarray) -> np.ndarray:
        """This worker's shards of the whole ``value``, one after the other (a copy)."""
        flat = np.zeros(self.chunk * self.local * self.workers, value.dtype)
        flat[: self.size] = np.asarray(value).reshape(-1)
        shards = flat.reshape(self.local, self.workers, self.chunk)[:, self.worker, :]
        return aligned(np.ascontiguousarray(shards).reshape(-1))

    def parts(self, value: np.ndarray) -> tuple[np.ndarray, ...]:
        """This worker's shards of ``value`` as stored: one array of ``chunk`` elements per local replica.

        ``value`` is the whole value, or this worker's shards one after the other (``stored`` elements).
        """
        value = np.asarray(value)
        if self.blocks is not None:
            return tuple(aligned(np.ascontiguousarray(value[tuple(slice(a, b) for a, b in block)]))
                         for block in self.blocks)
        stored = value.reshape(-1) if value.shape == (self.stored,) != tuple(self.shape) else self.local_part(value)
        # Views of one fresh array where aligned (parts are replaced, never written in place), else copies.
        return tuple(aligned(stored[r * self.chunk:(r + 1) * self.chunk]) for r in range(self.local))

    def whole(self, stored: np.ndarray | tuple[np.ndarray, ...]) -> np.ndarray:
        """The whole value from every worker's stored shards (collective), a new array."""
        if self.blocks is not None:
            whole = np.empty(self.shape, np.asarray(stored[0]).dtype)
            for part, block in zip(stored, self.blocks):
                whole[tuple(slice(a, b) for a, b in block)] = part
            return whole
        if isinstance(stored, tuple):
            stored = np.concatenate(stored) if len(stored) > 1 else stored[0]
        gathered = np.asarray(self.gather(np.ascontiguousarray(stored)))
        flat = gathered.reshape(self.workers, self.local, self.chunk).transpose(1, 0, 2).reshape(-1)
        return np.array(flat[: self.size].reshape(self.shape), copy=True)


class Variable:
    """A mutable tensor (like ``tf.Variable``).

    Args:
        initial_value: Array-like (or a callable returning one).
        name: Name (default ``"Variable"``; like TF eager, names need not be unique:
            each variable also has a unique ``uid``).
        trainable: Whether optimizers and ``model.trainable_variables`` see it.
        dtype: numpy dtype; Python floats default to float32 as in TF.

    Compiled steps (``graphdist.compile``) reach the storage only through the public methods
    :meth:`whole_value`, :meth:`stored_value`, :attr:`worker_shard`, :meth:`store_in_parts`,
    :meth:`write_back`, :meth:`write_back_parts`, :attr:`distribute_strategy` and :attr:`lives_remotely`
    (holding the variable's lock, :class:`VariableLocks`, while they read and write back).
    """

    __array_priority__ = 1000
    _graphdist_variable = True  # lets traced tensors defer numpy dispatch to the variable
    #: The value lives outside this process (on parameter servers): a step that reads or updates it must be
    #: compiled by the strategy that created it (its passes pull and push), whatever scope is current.
    _lives_remotely = False
    #: Set when the value is stored in per-replica parts, ``_value`` then being the tuple of this process's
    #: parts (ZeRO-1 optimizer slots; across workers only this worker's shards).
    _worker_shard: WorkerShard | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Variable:
        creator = context.current_strategy()
        if cls is Variable and creator is not None:
            # The current strategy decides the kind (MirroredVariable under MirroredStrategy).
            cls = creator._variable_class()
        return super().__new__(cls)

    def __init__(self, initial_value: Any, name: str | None = None, trainable: bool = True,
                 dtype: Any = None) -> None:
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentError(f"Variable: name must be a string, got {type(name).__name__} {name!r}")
        self._value = _initial_array(initial_value, dtype)
        self._name = re.sub(r"[^A-Za-z0-9_./-]", "_", name or "Variable")
        number = _next_id()
        self.uid = f"{self._name}#{number}"
        # Steps hold the locks of their variables (in this order, so none deadlocks) while they read,
        # compute and write back: concurrent steps on shared variables lose no update.
        self._order = number
        self._lock = threading.RLock()
        self.trainable = bool(trainable)
        self._strategy: Any = None
        self._device: str | None = DEFAULT_DEVICE
        creator = context.current_strategy()
        if creator is not None:
            creator._create_variable(self)

    # ----------------------------------------------------------- metadata
    @property
    def name(self) -> str:
        """Unique name (TF style, with ``:0``)."""
        return f"{self._name}:0"

    @property
    def shape(self) -> tuple[int, ...]:
        """Static shape."""
        return self._worker_shard.shape if self._worker_shard is not None else self._value.shape

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype."""
        value = self._value
        return value[0].dtype if isinstance(value, tuple) else value.dtype

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def _stored_nbytes(self) -> int:
        """Bytes of the value this process stores (a variable stored in parts: its parts, padding included)."""
        value = self._value
        return sum(part.nbytes for part in value) if isinstance(value, tuple) else int(value.nbytes)

    @property
    def device(self) -> str | None:
        """Device the strategy placed it on."""
        return self._device

    def numpy(self) -> np.ndarray:
        """A copy of the current value (a numpy scalar for rank 0).

        A variable sharded across workers (ZeRO-1 optimizer slots) is gathered from every worker: a
        collective, so every worker must read it (the communicator's timeout ends a lone reader).
        """
        value = self.whole_value().copy()
        return value[()] if value.ndim == 0 else value

    def whole_value(self) -> np.ndarray:
        """The whole current value (joined from its parts, and gathered from the workers when only this
        worker's shards are stored here).
        """
        shard = self._worker_shard
        return self._value if shard is None else shard.whole(self._value)

    def store_in_parts(self, shard: WorkerShard) -> None:
        """Stores the value as ``shard``'s per-replica parts (ZeRO-1; across workers only this worker's).

        In one process a step sharding it another way (another replica count) re-splits the value.

        Raises:
            InvalidArgumentError: Across workers, the variable is stored in another layout already;
                or the layout's shape is not the variable's.
        """
        with self._lock:
            current = self._worker_shard
            if current is not None and current.same_layout(shard):
                return
            if current is not None and (current.workers > 1 or shard.workers > 1):
                raise InvalidArgumentError(
                    f"variable {self.name} is stored as worker {current.worker}'s shards of {current.workers} "
                    f"workers x {current.local} replicas, and a step wants worker {shard.worker}'s of "
                    f"{shard.workers} x {shard.local}; every step that updates it must shard it the same way "
                    "(the same strategy)")
            if tuple(shard.shape) != tuple(self.shape):
                raise InvalidArgumentError(f"variable {self.name} has shape {self.shape}, the shard layout "
                                           f"says {shard.shape}")
            self._value = shard.parts(self.whole_value())
            self._worker_shard = shard

    def stored_value(self) -> np.ndarray | tuple[np.ndarray, ...]:
        """The value as this process stores it: the array, or (stored in parts, see :meth:`store_in_parts`)
        this process's parts, in replica order. No copy: a compiled step feeds it as it is.
        """
        return self._value

    @property
    def worker_shard(self) -> WorkerShard | None:
        """The per-replica parts layout the value is stored in (ZeRO-1), or ``None`` when stored whole."""
        return self._worker_shard

    @property
    def distribute_strategy(self) -> Any:
        """The strategy the variable was created under (``None``: none; as ``tf.distribute``'s variables)."""
        return self._strategy

    @property
    def lives_remotely(self) -> bool:
        """The value lives outside this process (on parameter servers): a step that reads or updates it must
        be compiled by :attr:`distribute_strategy` (its passes pull and push), whatever scope is current.
        """
        return self._lives_remotely

    def _stored(self, array: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """``array`` (the whole value, or this worker's shards one after the other when stored in parts) as
        this process stores it.
        """
        shard = self._worker_shard
        if shard is None:
            return array
        if array.shape != tuple(shard.shape) and array.shape != (shard.stored,):
            raise InvalidArgumentError(f"update of {self.name} has shape {array.shape}, expected {shard.shape} "
                                       f"(or this worker's {shard.stored} elements)")
        return shard.parts(array)

    def value(self) -> Any:
        """The current value (traced read inside a trace)."""
        return read_variable(self)

    read_value = value

    # -------------------------------------------------------------- update
    def _checked(self, value: Any, what: str) -> Any:
        if isinstance(value, (str, bytes, np.ndarray)) or _plain_list(value):
            if np.asarray(value).dtype.kind in "USOV":
                raise InvalidArgumentError(
                    f"{self._name}.{what}({_short(value)}): variable {self.name} holds {self.dtype} numbers, and "
                    f"the new value is not numeric (numpy reads it as {np.asarray(value).dtype}); assign numbers of "
                    f"shape {self.shape}, e.g. np.asarray(...).astype({self.dtype.name!r}) of parsed values")
        shape = tuple(np.shape(value))
        if shape != self.shape:
            raise InvalidArgumentError(
                f"{what}: variable {self.name} has shape {self.shape}, the new value has shape {shape}; "
                "a variable's shape cannot change"
            )
        return value

    def assign(self, value: Any, read_value: bool = True) -> Any:
        """Sets the value (recorded as an update inside a trace)."""
        from graphdist.trace.tracer import current_trace

        ctx = current_trace()
        if ctx is None:
            value = np.asarray(self._checked(value, "assign"))
            # Replace rather than write in place: an earlier array may be shared with a step's result.
            with self._lock:
                self._value = self._stored(aligned(value.astype(self.dtype, copy=True)))
            return self if read_value else None
        return _assign_traced(ctx, self, self._checked(value, "assign"))

    def assign_add(self, delta: Any, read_value: bool = True) -> Any:
        """Adds ``delta`` to the value (eagerly atomic with respect to steps and other threads)."""
        with self._lock:
            return self.assign(self._combined(np.add, delta, "assign_add"), read_value)

    def assign_sub(self, delta: Any, read_value: bool = True) -> Any:
        """Subtracts ``delta`` from the value (eagerly atomic with respect to steps and other threads)."""
        with self._lock:
            return self.assign(self._combined(np.subtract, delta, "assign_sub"), read_value)

    def _combined(self, ufunc: np.ufunc, delta: Any, what: str) -> Any:
        try:
            return ufunc(read_variable(self), delta).astype(self.dtype)
        except (ValueError, TypeError) as err:
            if isinstance(err, GraphdistError):
                raise
            raise InvalidArgumentError(f"{what}: delta of shape {tuple(np.shape(delta))} cannot be combined with "
                                       f"variable {self.name} of shape {self.shape} and dtype {self.dtype} ({err}); "
                                       "pass a number or an array of the variable's shape") from None

    def write_back(self, array: np.ndarray) -> None:
        """Stores a step's update (called by the runtime, which holds ``_lock``).

        A fresh array of the right type is adopted without a copy (the
        runtime hands over its output buffers); anything else is copied.
        A variable stored in parts takes the whole value (or this worker's
        shards one after the other) and splits it.
        """
        dtype = self.dtype
        if not (type(array) is np.ndarray and array.dtype == dtype and array.flags.c_contiguous
                and array.flags.writeable):
            array = aligned(np.array(array, dtype=dtype, order="C", copy=True))
        if self._worker_shard is not None:
            self._value = self._stored(array)
            return
        if array.shape != self._value.shape:
            raise InvalidArgumentError(f"update of {self.name} has shape {array.shape}, expected {self.shape}")
        self._value = array

    def write_back_parts(self, parts: list[np.ndarray]) -> None:
        """Stores a step's update of a variable stored in parts: one new part per local replica, adopted
        without a copy when fresh arrays of the right type (called by the runtime, which holds ``_lock``).

        Raises:
            InvalidArgumentError: The variable is not stored in parts, or a part has the wrong size.
        """
        shard = self._worker_shard
        if shard is None or len(parts) != shard.local:
            raise InvalidArgumentError(f"variable {self.name}: a step wrote back {len(parts)} part(s), and it is "
                                       f"stored {'whole' if shard is None else f'in {shard.local} part(s)'}")
        dtype = self.dtype
        stored = []
        for part in parts:
            if not (type(part) is np.ndarray and part.dtype == dtype and part.flags.c_contiguous
                    and part.flags.writeable):
                part = aligned(np.array(part, dtype=dtype, order="C", copy=True))
            expected = shard.part_shape(len(stored))
            if part.shape != expected:
                raise InvalidArgumentError(f"update of a part of {self.name} has shape {part.shape}, expected "
                                           f"{expected}")
            stored.append(part)
        self._value = tuple(stored)

    # ------------------------------------------------------ numpy protocols
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        from graphdist.trace.tracer import current_trace

        if current_trace() is not None:
            return np.asarray(read_variable(self), dtype=dtype)  # raises the tracer's clear error
        value = self.whole_value()
        return value if dtype is None else value.astype(dtype)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        inputs = tuple(read_variable(x) if isinstance(x, Variable) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        from graphdist import nest

        args, kwargs = nest.map_structure(lambda v: read_variable(v) if isinstance(v, Variable) else v,
                                          (tuple(args), dict(kwargs)))
        return func(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # ndarray/Tensor methods (reshape, sum, T, mean...) act on the current value.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(read_variable(self), name)

    def __getitem__(self, key: Any) -> Any:
        return read_variable(self)[key]

    def __repr__(self) -> str:
        shard = self._worker_shard
        if shard is not None and shard.workers > 1:  # printing must not start a collective
            return (f"<gd.Variable '{self.name}' shape={self.shape} dtype={self.dtype.name}, sharded over "
                    f"{shard.workers} workers (this one keeps {shard.stored} elements)>")
        if shard is not None:
            value = np.array2string(self.whole_value(), separator=", ")
            return (f"<gd.Variable '{self.name}' shape={self.shape} dtype={self.dtype.name}, numpy={value}, "
                    f"stored in {shard.local} parts>")
        value = str(self._value[()]) if self.ndim == 0 else np.array2string(self._value, separator=", ")
        return f"<gd.Variable '{self.name}' shape={self.shape} dtype={self.dtype.name}, numpy={value}>"

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        return bool(read_variable(self))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d variable")
        return self.shape[0]


def _binary(ufunc: np.ufunc, reverse: bool = False) -> Any:
    def method(self: Variable, other: Any) -> Any:
        return ufunc(other, read_variable(self)) if reverse else ufunc(read_variable(self), other)

    return method


for _name, _ufunc in {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
                      "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "matmul": np.matmul}.items():
    setattr(Variable, f"__{_name}__", _binary(_ufunc))
    setattr(Variable, f"__r{_name}__", _binary(_ufunc, reverse=True))
for _name, _ufunc in {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                      "eq": np.equal, "ne": np.not_equal}.items():
    setattr(Variable, f"__{_name}__", _binary(_ufunc))
Variable.__neg__ = lambda self: np.negative(read_variable(self))
Variable.__pos__ = lambda self: np.positive(read_variable(self))
Variable.__abs__ = lambda self: np.absolute(read_variable(self))


class VariableLocks:
    """A context manager holding the locks of ``variables`` (deduplicated, taken in creation order, so
    that two steps never wait for each other's locks) over a step's read, compute and write back.

    Args:
        variables: The step's variables.
    """

    __slots__ = ("_locks",)

    def __init__(self, variables: Any) -> None:
        unique = {id(v): v for v in variables}
        self._locks = [v._lock for v in sorted(unique.values(), key=lambda v: v._order)]

    def __enter__(self) -> None:
        taken = 0
        try:
            for lock in self._locks:
                lock.acquire()
                taken += 1
        except BaseException:  # e.g. KeyboardInterrupt between two acquires
            for lock in reversed(self._locks[:taken]):
                lock.release()
            raise

    def __exit__(self, *exc: Any) -> None:
        for lock in reversed(self._locks):
            lock.release()


def is_variable(value: Any) -> bool:
    """True for :class:`Variable` objects."""
    return isinstance(value, Variable)


def read_variable(variable: Variable) -> Any:
    """The variable's value: its array eagerly, a traced tensor inside a trace.

    Inside a trace the first read makes the variable a graph input
    (``value.meta["variable"]`` and ``graph.meta.variables`` hold its
    :class:`~graphdist.ir.placement.VariableSpec`; the trace keeps the object
    in ``ctx.variables``). Later reads see the latest value assigned in the
    same context: a replica sees its own assigns and those made in
    cross-replica code before; cross-replica code sees its own and those of
    replica 0 (every replica of a sync strategy assigns the same value).
    """
    from graphdist.trace.tracer import current_trace

    ctx = current_trace()
    if ctx is None:
        return variable.whole_value()
    state = _state(ctx, variable)
    region = _region_key(ctx)
    candidates = [state.cross] if region is None else [state.replicas.get(region), state.cross]
    if region is None:
        candidates += [v for k, v in state.replicas.items() if _covers_first_replica(ctx, k)]
    latest = max((c for c in candidates if c is not None), key=lambda c: c[0], default=None)
    return latest[1] if latest is not None else state.input


class _VariableState:
    """What a trace knows of one variable: its input and the latest assigns, per context."""

    __slots__ = ("input", "cross", "replicas")

    def __init__(self, input_tensor: Any) -> None:
        self.input = input_tensor
        self.cross: tuple[int, Any] | None = None
        self.replicas: dict[Any, tuple[int, Any]] = {}


def _state(ctx: Any, variable: Variable) -> _VariableState:
    state = ctx.variable_state.get(id(variable))
    if state is None:
        from graphdist.ir.placement import VariableSpec

        spec = VariableSpec.of(variable)
        with ctx.region(context="cross"):
            tensor = ctx.input(variable._name, variable.dtype, variable.shape)
        tensor.value.meta["variable"] = spec
        ctx.graph.meta.variables.append((tensor.value.name, spec))
        ctx.variables[tensor.value.name] = variable
        state = ctx.variable_state[id(variable)] = _VariableState(tensor)
    return state


def _region_key(ctx: Any) -> Any:
    """``None`` in cross-replica code, else ``("replica", variant)``."""
    for region in reversed(ctx.regions):
        context = region.get("context")
        if context == "replica":
            return ("replica", region.get("variant"))
        if context is not None:
            return None
    return None


def _covers_first_replica(ctx: Any, key: Any) -> bool:
    variant = key[1]
    return variant is None or 0 in ctx.graph.meta.replica_variants.get(variant, ())


def _assign_traced(ctx: Any, variable: Variable, value: Any) -> Any:
    from graphdist.trace.numpy_api import _as_tensor, cast_tensor

    read_variable(variable)  # the variable is an input of the step even if never read
    tensor = cast_tensor(_as_tensor(ctx, value), variable.dtype)
    node_out = ctx.emit1("AssignVariable", [tensor.value], {"variable": variable.uid},
                         domain=GRAPHDIST_DOMAIN, name="assign")
    node_out.value.producer.meta["side_effect"] = True
    state = _state(ctx, variable)
    entry = (ctx.next_sequence(), node_out)
    region = _region_key(ctx)
    if region is None:
        state.cross = entry
    else:
        state.replicas[region] = entry
    return node_out
