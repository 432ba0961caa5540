"""``gd.random.Generator``: random numbers drawn inside compiled steps, as ``tf.random.Generator`` draws them.

``np.random`` called in a ``gd.function`` runs once, while the step is traced, and its numbers become
constants of the graph: every call would give the same "noise". A :class:`Generator` instead records the
draw in the graph: its state is a ``gd.Variable`` (a key and a counter) that every draw reads and advances,
so each call of a step gives new numbers, each replica draws its own stream (the replica's index is mixed
into the counter), and a checkpoint that holds the generator restores it to the same point of its stream.

The numbers come from a counter-based generator: element ``i`` of a draw is a hash of (key, counter,
replica, ``i``) in 32-bit integer arithmetic (``lowbias32``, C. Wellons' integer hash, applied twice),
the same computation eagerly (numpy) and in a compiled step (ONNX ``Mul``/``Add``/``BitShift``/
``BitwiseXor`` on uint32), so an eager draw and a traced draw from the same state agree. Uniform floats
take the top 24 bits; normals use the Box-Muller transform. The streams are not TensorFlow's (Philox):
the same seed gives other numbers than in TF.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.trace import context
from graphdist.trace.numpy_api import _as_tensor, cast_tensor
from graphdist.trace.tracer import current_trace
from graphdist.trace.variables import Variable, read_variable

__all__ = ["Generator", "get_global_generator", "set_global_generator"]

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_REPLICA_STEP = 0x85EBCA6B
_TWO_POW_24 = np.float32(1.0 / (1 << 24))


class _NumpyOps:
    """uint32 arithmetic on numpy arrays (wrapping, as ONNX Runtime's)."""

    @staticmethod
    def const(value: int) -> np.ndarray:
        return np.asarray(value & _MASK32, np.uint32)

    @staticmethod
    def array(value: np.ndarray) -> np.ndarray:
        return value

    @staticmethod
    def xor(a: Any, b: Any) -> Any:
        return np.bitwise_xor(a, b)

    @staticmethod
    def shr(a: Any, bits: int) -> Any:
        return np.right_shift(a, np.uint32(bits))

    @staticmethod
    def mul(a: Any, b: Any) -> Any:
        with np.errstate(over="ignore"):
            return np.multiply(a, b, dtype=np.uint32)

    @staticmethod
    def add(a: Any, b: Any) -> Any:
        with np.errstate(over="ignore"):
            return np.add(a, b, dtype=np.uint32)

    @staticmethod
    def to_uint32(a: Any) -> Any:
        return (np.asarray(a).astype(np.int64) & _MASK32).astype(np.uint32)


class _TracedOps:
    """The same operations recorded in the graph being traced."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def _emit(self, op: str, a: Any, b: Any, **attrs: Any) -> Any:
        inputs = [_as_tensor(self._ctx, a).value, _as_tensor(self._ctx, b).value]
        return self._ctx.emit1(op, inputs, attrs or {}, name="random")

    def const(self, value: int) -> Any:
        return _as_tensor(self._ctx, np.asarray(value & _MASK32, np.uint32))

    def array(self, value: np.ndarray) -> Any:
        return _as_tensor(self._ctx, value)

    def xor(self, a: Any, b: Any) -> Any:
        return self._emit("BitwiseXor", a, b)

    def shr(self, a: Any, bits: int) -> Any:
        return self._emit("BitShift", a, np.asarray(bits, np.uint32), direction="RIGHT")

    def mul(self, a: Any, b: Any) -> Any:
        return self._emit("Mul", a, b)

    def add(self, a: Any, b: Any) -> Any:
        return self._emit("Add", a, b)

    def to_uint32(self, a: Any) -> Any:
        # int64 -> uint32 keeps the low 32 bits (ONNX Cast wraps integers).
        return cast_tensor(_as_tensor(self._ctx, a), np.uint32)


def _mix(ops: Any, x: Any) -> Any:
    """lowbias32: a 32-bit integer hash with low bias (every output bit depends on every input bit)."""
    x = ops.xor(x, ops.shr(x, 16))
    x = ops.mul(x, ops.const(0x7FEB352D))
    x = ops.xor(x, ops.shr(x, 15))
    x = ops.mul(x, ops.const(0x846CA68B))
    return ops.xor(x, ops.shr(x, 16))


def _bits(ops: Any, key: Any, counter: Any, replica: Any, count: int) -> Any:
    """``count`` uint32 words of the stream at (key, counter, replica)."""
    base = _mix(ops, ops.xor(ops.to_uint32(key), _mix(ops, ops.add(ops.to_uint32(counter), ops.const(_GOLDEN)))))
    base = _mix(ops, ops.add(base, ops.mul(ops.add(ops.to_uint32(replica), ops.const(1)), ops.const(_REPLICA_STEP))))
    words = ops.add(ops.mul(ops.array(np.arange(count, dtype=np.uint32)), ops.const(_GOLDEN)), base)
    return _mix(ops, _mix(ops, words))


def _unit_floats(ops: Any, words: Any, offset: int) -> Any:
    """Floats in [offset * 2**-24, 1 + (offset - 1) * 2**-24] from the top 24 bits of each word."""
    top = ops.shr(words, 8)
    if offset:
        top = ops.add(top, ops.const(offset))
    floats = top.astype(np.float32) if isinstance(ops, _NumpyOps) else cast_tensor(top, np.float32)
    return floats * _TWO_POW_24


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, Sequence) or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                                  and d >= 0 for d in shape):
        raise InvalidArgumentError(f"Generator.{what}: shape must be a tuple of non-negative ints (e.g. (4, 3) or "
                                   f"x.shape), got {shape!r}")
    return tuple(int(d) for d in shape)


def _check_float_dtype(dtype: Any, what: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise InvalidArgumentError(f"Generator.{what}: dtype must be a floating-point type, got {dtype}")
    return dtype


def _seed_key(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InvalidArgumentError(f"Generator.from_seed: seed must be an int, got {type(seed).__name__} {seed!r}")
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    low, high = _NumpyOps.const(seed), _NumpyOps.const(seed >> 32)
    return int(_mix(_NumpyOps, np.bitwise_xor(low, _mix(_NumpyOps, high))))


class Generator:
    """A random-number generator whose draws are recorded in compiled steps (like ``tf.random.Generator``).

    Create it with :meth:`from_seed` or :meth:`from_non_deterministic_state` (under ``strategy.scope()``
    when the steps that draw run under that strategy), then call :meth:`normal` or :meth:`uniform` in
    eager code, in a ``gd.function`` or in ``strategy.run``. Every draw advances the state, so each call
    gives new numbers; inside ``strategy.run`` each replica draws from its own stream. Its state is a
    ``gd.Variable`` (:attr:`state`): ``gd.train.Checkpoint(generator=g)`` saves it, and a restore
    continues the same stream.
    """

    def __init__(self, state: Any) -> None:
        if not isinstance(state, Variable):
            state = np.asarray(state)
            if state.shape != (2,) or state.dtype.kind not in "iu":
                raise InvalidArgumentError("Generator: state must be two integers (key, counter); create a generator "
                                           "with gd.random.Generator.from_seed(seed)")
            state = Variable(state.astype(np.int64), name="generator_state", trainable=False)
        self._state = state

    @classmethod
    def from_seed(cls, seed: int, alg: Any = None) -> Generator:
        """A generator whose stream is fixed by ``seed`` (``alg`` is accepted for TF's signature)."""
        return cls(np.array([_seed_key(seed), 0], np.int64))

    @classmethod
    def from_non_deterministic_state(cls, alg: Any = None) -> Generator:
        """A generator seeded from the operating system's entropy (``os.urandom``)."""
        return cls.from_seed(int.from_bytes(os.urandom(8), "little"))

    @property
    def state(self) -> Variable:
        """The ``int64[2]`` variable (key, counter) every draw reads and advances."""
        return self._state

    @property
    def variables(self) -> list[Variable]:
        """``[state]``: what a checkpoint of the generator saves."""
        return [self._state]

    def reset_from_seed(self, seed: int) -> None:
        """Restarts the stream of ``seed`` (as :meth:`from_seed` would)."""
        self._state.assign(np.array([_seed_key(seed), 0], np.int64))

    def skip(self, delta: int) -> None:
        """Advances the stream by ``delta`` draws."""
        self._state.assign(np.asarray(self._state.numpy()) + np.array([0, int(delta)], np.int64))

    # -------------------------------------------------------------- draws
    def normal(self, shape: Any, mean: float = 0.0, stddev: float = 1.0, dtype: Any = np.float32) -> Any:
        """Normally distributed numbers of ``shape`` (Box-Muller on two uniform words per number)."""
        shape, dtype = _check_shape(shape, "normal"), _check_float_dtype(dtype, "normal")
        size = int(np.prod(shape, dtype=np.int64))
        ops, words = self._draw(2 * size)
        first, second = words[:size], words[size:]
        radius = np.sqrt(np.float32(-2.0) * np.log(_unit_floats(ops, first, 1)))
        angle = _unit_floats(ops, second, 0) * np.float32(2 * np.pi)
        values = (radius * np.cos(angle)).reshape(shape)
        return self._finish(values * np.float32(stddev) + np.float32(mean), dtype)

    def uniform(self, shape: Any, minval: Any = 0, maxval: Any = None, dtype: Any = np.float32) -> Any:
        """Uniform numbers in ``[minval, maxval)`` (floats: ``maxval`` defaults to 1; ints need ``maxval``)."""
        shape, dtype = _check_shape(shape, "uniform"), np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64))
        if dtype.kind in "iu":
            if maxval is None or not int(maxval) > int(minval):
                raise InvalidArgumentError(f"Generator.uniform: an integer dtype ({dtype}) needs maxval > minval, got "
                                           f"minval={minval!r}, maxval={maxval!r}")
            span = int(maxval) - int(minval)
            if span > _MASK32:
                raise InvalidArgumentError(f"Generator.uniform: maxval - minval must be below 2**32, got {span}")
            ops, words = self._draw(size)
            if isinstance(ops, _NumpyOps):
                values = (words.astype(np.int64) % span + int(minval)).astype(dtype)
                return values.reshape(shape)
            wide = cast_tensor(words, np.int64)
            return cast_tensor((wide % np.int64(span) + np.int64(minval)).reshape(shape), dtype)
        dtype = _check_float_dtype(dtype, "uniform")
        maxval = 1.0 if maxval is None else maxval
        ops, words = self._draw(size)
        values = _unit_floats(ops, words, 0).reshape(shape)
        return self._finish(values * np.float32(float(maxval) - float(minval)) + np.float32(minval), dtype)

    def _finish(self, values: Any, dtype: np.dtype) -> Any:
        if current_trace() is None:
            return np.asarray(values).astype(dtype)
        return cast_tensor(values, dtype) if dtype != np.float32 else values

    def _draw(self, count: int) -> tuple[Any, Any]:
        """``count`` words of this replica's stream at the current counter; advances the counter."""
        ctx = current_trace()
        if ctx is None:
            with self._state._lock:
                key, counter = (int(v) for v in self._state.numpy())
                self._state.assign(np.array([key, counter + 1], np.int64))
            return _NumpyOps(), _bits(_NumpyOps(), np.int64(key), np.int64(counter), 0, count)
        state = read_variable(self._state)
        key, counter = state[0], state[1]
        self._state.assign(state + np.array([0, 1], np.int64))
        ops = _TracedOps(ctx)
        return ops, _bits(ops, key, counter, _replica_id(ctx), count)

    def __repr__(self) -> str:
        return f"<gd.random.Generator state={self._state.numpy().tolist()}>"


def _replica_id(ctx: Any) -> Any:
    """This replica's index in a replica function being traced, else 0."""
    stack = context.replica_stack()
    if stack and stack[-1] is not context.CROSS_REPLICA:
        return ctx.emit1("ReplicaId", [], {}, domain=GRAPHDIST_DOMAIN, name="replica_id")
    return 0


_global: Generator | None = None


def get_global_generator() -> Generator:
    """The process's generator (created from a non-deterministic seed on first use), as TF's."""
    global _global
    if _global is None:
        _global = Generator.from_non_deterministic_state()
    return _global


def set_global_generator(generator: Generator) -> None:
    """Replaces the process's generator."""
    global _global
    if not isinstance(generator, Generator):
        raise InvalidArgumentError(f"set_global_generator: expected a gd.random.Generator, got "
                                   f"{type(generator).__name__}")
    _global = generator
