"""``Strategy``: the tf.distribute programming model over traced graphs.

A strategy is configuration: devices, a replica count, where variables live,
and the :class:`~graphdist.compile.pipeline.PipelineConfig` from which the
passes that distribute a traced step are built (:meth:`Strategy.pipeline`).
``run`` traces the replica function once per input signature (through
:class:`graphdist.compile.function.Function`), rewrites, compiles and
executes it. Inside a trace (``gd.function``) the replica function is traced
once, as one replica, whatever the number of replicas: ``run`` returns
per-replica values standing for every replica's copy, and ``reduce`` /
``gather`` record cross-replica nodes (``graphdist.CrossReplicaReduce`` /
``CrossReplicaGather``) that the pipeline's passes turn into collectives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.compile.pipeline import Pipeline, PipelineConfig, build_pipeline
from graphdist.compile.step_io import new_variant
from graphdist.distribute.reduce_op import ReduceOp
from graphdist.distribute.replica_context import ReplicaContext, emit_cross_replica, new_group_key, replica_region
from graphdist.distribute.run_args import gradient_count, lists_as_arrays, warn_global_arrays
from graphdist.errors import AxisError, InvalidArgumentError
from graphdist.ir.placement import VariablePlacement, VariableSpec
from graphdist.runtime.devices import Device, parse_device, place_softly
from graphdist.trace import context
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import axis_tuple, call_user_function, current_trace
from graphdist.trace.values import DistributedValues, TracedPerReplica, ValueContext, regroup

__all__ = ["Strategy", "StrategyExtended", "get_strategy", "has_strategy", "experimental_set_strategy"]

logger = logging.getLogger(__name__)


class StrategyExtended:
    """Additional APIs for distribution-aware code (``strategy.extended``)."""

    def __init__(self, strategy: Strategy) -> None:
        self._strategy = strategy

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """Devices that run replicas, one per local replica."""
        return tuple(str(d) for d in self._strategy._devices)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """Devices that hold variables."""
        return tuple(str(d) for d in self._strategy._parameter_devices())

    def reduce_to(self, reduce_op: Any, value: Any, destinations: Any) -> Any:
        """Reduces ``value`` across replicas onto ``destinations`` (a device string,
        or a value whose device is taken).
        """
        self._check_destinations(destinations)
        return self._strategy.reduce(reduce_op, value, axis=None)

    def batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Sequence[tuple[Any, Any]]) -> list[Any]:
        """:meth:`reduce_to` for several ``(value, destinations)`` pairs."""
        return [self.reduce_to(reduce_op, value, dest) for value, dest in value_destination_pairs]

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Variables created in this block live where ``colocate_with_variable`` lives."""
        yield

    def variable_created_in_scope(self, v: Any) -> bool:
        """True when ``v`` was created inside this strategy's scope."""
        return getattr(v, "_strategy", None) is self._strategy

    def _check_destinations(self, destinations: Any) -> None:
        if isinstance(destinations, (str, Device)):
            parse_device(destinations)
        elif destinations is None:
            raise InvalidArgumentError("reduce_to: destinations must be a device string or a value, not None")


class Strategy:
    """A state and compute distribution policy on a list of devices.

    Subclasses set the devices and return their pass pipeline; the API below
    is shared. See ``shared/API.md`` for the contract.
    """

    _extended_cls = StrategyExtended

    def __init__(self, devices: Sequence[Any]) -> None:
        self._devices: tuple[Device, ...] = self._validate_devices(devices)
        self._extended = self._extended_cls(self)
        self._functions: dict[Any, Any] = {}

    @staticmethod
    def _validate_devices(devices: Sequence[Any]) -> tuple[Device, ...]:
        if isinstance(devices, (str, Device)):
            devices = [devices]
        if not isinstance(devices, (list, tuple)):
            raise InvalidArgumentError(f"devices must be a list of device strings, e.g. ['cpu:0', 'cpu:1'], got "
                                       f"{type(devices).__name__} {devices!r}")
        parsed = tuple(parse_device(d) for d in devices)
        if not parsed:
            raise InvalidArgumentError("devices must name at least one device, e.g. ['cpu:0']")
        duplicates = sorted({str(d) for d in parsed if parsed.count(d) > 1})
        if duplicates:
            raise InvalidArgumentError(f"devices lists {', '.join(duplicates)} more than once; name each device once")
        return place_softly(parsed)  # a missing GPU runs on a logical CPU device, or raises

    # ---------------------------------------------------------- properties
    @property
    def extended(self) -> StrategyExtended:
        """:class:`StrategyExtended` with additional methods."""
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """Number of replicas over which gradients are aggregated."""
        note_replica_count_read()
        return self._num_replicas()

    def _num_replicas(self) -> int:
        """``num_replicas_in_sync`` for graphdist's own use (not recorded as read by the step)."""
        return len(self._devices)

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver, ``None`` for single-worker strategies."""
        return None

    @property
    def name(self) -> str:
        """The strategy's name (its class name), as plans and messages show it."""
        return type(self).__name__

    @property
    def communicator(self) -> Any:
        """The communicator between this strategy's workers (``None``: one worker, nothing to communicate)."""
        return None

    def _num_local_replicas(self) -> int:
        """Replicas run by this process (``num_replicas_in_sync`` counts every worker's)."""
        return len(self._devices)

    def _parameter_devices(self) -> tuple[Device, ...]:
        return self._devices

    def _variable_class(self) -> type:
        """The class of variables created in this strategy's scope."""
        from graphdist.trace.variables import Variable

        return Variable

    def _create_variable(self, variable: Any) -> None:
        """Hook called for every variable created while this strategy is current.

        Single-device strategies place it on their parameter device; later
        strategies override this to mirror, centralise or shard variables.
        """
        variable._strategy = self
        variable._device = str(self._parameter_devices()[0])

    def _preferred_backend(self) -> str | None:
        """Backend this strategy's steps compile with when ``gd.function`` names none (``None``: the
        default, ``$GRAPHDIST_BACKEND`` or ``"ort"``). TPU-like cores need ``"tvm"``.
        """
        return self.pipeline_config().backend

    def pipeline_config(self) -> PipelineConfig:
        """What this strategy decides about distributing a traced step (data; see
        :mod:`graphdist.compile.pipeline`).
        """
        return PipelineConfig(devices=self.extended.worker_devices, strategy=self.name)

    def pipeline(self) -> Pipeline:
        """The passes that distribute a traced step for this strategy (built from :meth:`pipeline_config`)."""
        return build_pipeline(self.pipeline_config())

    def variable_placement(self, spec: VariableSpec, variable: Any = None) -> VariablePlacement:
        """Where a variable of a step lives under this strategy (data for the pipeline, the plan and its
        summary): a copy on every replica's device, or the one device. Part of the
        :class:`~graphdist.compile.target.CompileTarget` protocol, like :meth:`pipeline_config`,
        :meth:`value_placement`, :meth:`scope`, :attr:`name` and :attr:`communicator`.
        """
        devices = self.extended.worker_devices
        return VariablePlacement("mirrored" if len(devices) > 1 else "local", tuple(devices))

    def value_placement(self, spec: VariableSpec, value: Any) -> VariablePlacement:
        """Where a re-planned step's variable lives (its value comes from the plan, not a ``gd.Variable``)."""
        return self.variable_placement(spec)

    # -------------------------------------------------------------- scope
    @contextlib.contextmanager
    def scope(self) -> Iterator[Strategy]:
        """Makes this strategy current (``gd.get_strategy()``) in cross-replica context."""
        current = get_strategy()
        if current is not self and not isinstance(current, DefaultStrategy) and not isinstance(self, DefaultStrategy):
            raise InvalidArgumentError(
                f"cannot enter {type(self).__name__}.scope() inside {type(current).__name__}.scope(): "
                "mixing different strategies is not allowed; exit the other scope first"
            )
        with context.push_strategy(self):
            yield self

    def _ensure_scope(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if get_strategy() is self else self.scope()

    # ---------------------------------------------------------------- run
    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
            options: Any = None) -> Any:
        """Runs ``fn`` on every replica; returns its result structure with a
        :class:`PerReplica` at each leaf (a plain value with one replica).
        """
        if not callable(fn):
            raise InvalidArgumentError(f"run: fn must be callable, got {type(fn).__name__}")
        if not isinstance(args, (tuple, list)):
            raise InvalidArgumentError(f"run: args must be a tuple of arguments, got {type(args).__name__}; "
                                       "write args=(x,) for a single argument")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise InvalidArgumentError(f"run: kwargs must be a dict of keyword arguments, got "
                                       f"{type(kwargs).__name__}; e.g. kwargs={{'training': True}}")
        args, kwargs = lists_as_arrays(tuple(args), dict(kwargs) if kwargs else {})
        if current_trace() is None:
            # The Function enters this strategy's scope while it traces; running needs no scope.
            return self._function_for(fn)(*args, **kwargs)
        with self._ensure_scope():
            return self._run_traced(fn, tuple(args), kwargs)

    def _function_for(self, fn: Callable[..., Any]) -> Any:
        from graphdist.compile.function import Function

        key = (getattr(fn, "__func__", fn), id(getattr(fn, "__self__", None)))
        function = self._functions.get(key)
        if function is None:
            self._note_new_function(fn)
            def replica_step(*args: Any, **kwargs: Any) -> Any:
                return self.run(fn, args, kwargs)

            name = getattr(fn, "__name__", "replica_fn").strip("<>")
            function = Function(replica_step, name=name, strategy=self)
            self._functions[key] = function
        return function

    _MAX_FUNCTIONS = 256

    def _note_new_function(self, fn: Callable[..., Any]) -> None:
        """Bounds the cache and warns when fresh function objects keep arriving (a lambda in a loop)."""
        if len(self._functions) >= self._MAX_FUNCTIONS:
            self._functions.pop(next(iter(self._functions)))
        code = getattr(fn, "__code__", None)
        same_code = sum(1 for f, _ in self._functions if getattr(f, "__code__", None) is code) if code else 0
        if same_code and same_code % 8 == 0:
            logger.warning(
                "strategy.run received %d different function objects with the same code (%s:%s); each one is "
                "traced and compiled again. Define the function once outside the loop and pass it to run.",
                same_code + 1, code.co_filename, code.co_firstlineno)

    def _run_traced(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """Traces ``fn`` once, as one replica (once per shape when the replicas' arguments differ)."""
        ctx = current_trace()
        self._note_traced(ctx)
        count = self._num_local_replicas()
        groups = _replica_groups((args, kwargs), count)
        keys: list[str] = []  # the n-th collective call of every variant joins group n
        results: dict[int, Any] = {}
        gradients_before = gradient_count(ctx.graph)
        for replicas, (replica_args, replica_kwargs) in groups:
            variant = None if len(groups) == 1 else new_variant(ctx, replicas)
            replica_ctx = ReplicaContext(self, replicas, keys, variant)
            region = {"context": "replica"} if variant is None else {"context": "replica", "variant": variant}
            with ctx.region(**region), context.replica_scope(replica_ctx):
                result = call_user_function(fn, replica_args, replica_kwargs)
            results.update(dict.fromkeys(replicas, result))
        if count > 1 and gradient_count(ctx.graph) > gradients_before:
            warn_global_arrays(fn, args, kwargs, count)
        if count == 1:
            return results[0]
        try:
            return nest.map_structure(lambda *vs: TracedPerReplica(vs), *(results[r] for r in range(count)))
        except ValueError:
            kinds = ", ".join(f"replica {i}: {type(results[i]).__name__}" for i in range(count))
            raise InvalidArgumentError(
                f"{getattr(fn, '__name__', 'fn')} returned different structures on different replicas ({kinds}); "
                "every replica must return the same nest of values"
            ) from None

    def _note_traced(self, ctx: Any) -> None:
        """Records that the step being traced uses this strategy (its pipeline distributes the step)."""
        if self not in ctx.strategies:
            ctx.strategies.append(self)

    # ------------------------------------------------------------- reduce
    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """Reduces ``value`` across replicas (and along ``axis`` within each)."""
        op = ReduceOp.from_any(reduce_op)
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))):
            raise InvalidArgumentError(f"reduce: axis must be None or an int, got {axis!r}")
        if any(_is_traced(v) for v in nest.flatten(value)):
            _refuse_in_replica_context()
        if op is ReduceOp.SUM and self._num_local_replicas() > 1:
            _refuse_non_distributed_sum(value, self._num_local_replicas())
        with self._ensure_scope():
            if _is_traced(value):
                reduce_one = self._reduce_traced
            else:
                def reduce_one(op: ReduceOp, v: Any, axis: int | None) -> Any:
                    return _reduce_eager(op, self._local(v), axis)
            if isinstance(value, DistributedValues):
                return reduce_one(op, value, axis)
            return nest.map_structure(lambda v: reduce_one(op, v, axis), value)

    def _local(self, value: Any) -> tuple[Any, ...]:
        """Per-replica components; a plain value is the one component."""
        if isinstance(value, DistributedValues):
            return value.values
        if hasattr(value, "_replica_components"):
            return value._replica_components()
        return (value,)

    def _reduce_traced(self, op: ReduceOp, value: Any, axis: int | None) -> Any:
        """A ``CrossReplicaReduce`` of the replica value (of each variant's value); along ``axis`` each
        replica reduces its own part first, and a MEAN divides by the element count summed over replicas.
        """
        ctx = current_trace()
        self._note_traced(ctx)
        _refuse_in_replica_context()
        parts = _replica_parts(value)
        key = new_group_key("reduce")
        if axis is None:
            return emit_cross_replica("CrossReplicaReduce", parts, {"reduce_op": op.value, "group_key": key})
        partials, counts = [], []
        for part in parts:
            with ctx.region(**replica_region(part)):
                partial, count = _reduce_local(op, part, axis)
                partials.append(partial)
                if op is ReduceOp.MEAN:  # each replica's element count (its batch size: a recorded symbol)
                    counts.append(_as_replica_value(ctx, count, _count_dtype(partial)))
        cross_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        total = emit_cross_replica("CrossReplicaReduce", partials, {"reduce_op": cross_op.value, "group_key": key})
        if op is not ReduceOp.MEAN:
            return total
        count = emit_cross_replica("CrossReplicaReduce", counts, {"reduce_op": "SUM", "group_key": f"{key}.count"})
        return _divide_keep_dtype(total, count)

    # ------------------------------------------------------------- gather
    def gather(self, value: Any, axis: int) -> Any:
        """Concatenates ``value``'s per-replica components along ``axis``."""
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise InvalidArgumentError(f"gather: axis must be an int (the axis to concatenate the replicas' "
                                       f"values along), got {axis!r}")
        with self._ensure_scope():
            traced = _is_traced(value)
            components = _replica_parts(value) if traced else self._local(value)
            for component in components:
                if np.ndim(component) == 0:
                    raise InvalidArgumentError("gather: values must have rank >= 1 (scalars cannot be concatenated)")
                axis_tuple(axis, np.ndim(component), "gather axis")
            if traced:
                return self._gather_traced(components, axis)
            (normalized,) = axis_tuple(axis, np.ndim(components[0]), "gather axis")
            return np.concatenate([np.asarray(c) for c in components], axis=normalized)

    def _gather_traced(self, parts: Sequence[Any], axis: int) -> Any:
        self._note_traced(current_trace())
        (normalized,) = axis_tuple(axis, np.ndim(parts[0]), "gather axis")
        # Typed for every replica in sync (other workers' too); the cross-worker pass narrows the local group.
        attrs = {"axis": normalized, "num_replicas": self.num_replicas_in_sync, "group_key": new_group_key("gather")}
        return emit_cross_replica("CrossReplicaGather", parts, attrs)

    # ------------------------------------------------------- distributed values
    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The per-replica components of ``value`` as a tuple (``(value,)`` for a plain value).

        In traced code a per-replica result's components are ``graphdist.ReadReplica`` nodes: replica
        ``i``'s copy, wired once the replicas exist.
        """
        if isinstance(value, DistributedValues):
            return value.values
        if hasattr(value, "_replica_components"):
            return value._replica_components()
        leaves, treedef = nest.flatten(value, is_leaf=lambda v: isinstance(v, DistributedValues))
        if not any(isinstance(leaf, DistributedValues) for leaf in leaves):
            return (value,)
        per_replica = [[leaf.values[r] if isinstance(leaf, DistributedValues) else leaf for leaf in leaves]
                       for r in range(self._num_local_replicas())]
        return tuple(nest.unflatten(treedef, leaves_r) for leaves_r in per_replica)

    def experimental_distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Any:
        """Calls ``value_fn(ValueContext(i, n))`` for every replica ``i``."""
        if not callable(value_fn):
            raise InvalidArgumentError("value_fn must be callable with a ValueContext argument")
        count = self.num_replicas_in_sync
        return regroup([value_fn(ValueContext(i, count)) for i in range(count)])

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """Splits each global batch of ``dataset`` among the replicas (see
        :mod:`graphdist.distribute.input`); returns a ``DistributedDataset``.
        """
        from graphdist.distribute.input import distribute_dataset

        return distribute_dataset(self, dataset, options)

    def distribute_datasets_from_function(self, dataset_fn: Callable[[Any], Any], options: Any = None) -> Any:
        """Calls ``dataset_fn(InputContext)`` per worker; each step every replica
        dequeues one element (see :mod:`graphdist.distribute.input`).
        """
        from graphdist.distribute.input import distribute_datasets_from_function

        return distribute_datasets_from_function(self, dataset_fn, options)

    def __repr__(self) -> str:
        devices = ", ".join(self.extended.worker_devices)
        return f"{type(self).__name__}(devices=[{devices}])"


def note_replica_count_read() -> None:
    """Records, in the step being traced, that user code read ``num_replicas_in_sync`` (the number is
    then frozen into the graph, so the step cannot be re-planned for another replica count). Reads from
    graphdist's own code are not recorded.
    """
    ctx = current_trace()
    if ctx is None or not ctx.replicated:
        return
    caller = sys._getframe(2)
    if caller.f_code.co_filename.startswith(_PACKAGE_DIR):
        return
    location = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    reads = ctx.graph.meta.reads_num_replicas
    if location not in reads:
        reads.append(location)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_traced(value: Any) -> bool:
    if current_trace() is None:
        return False
    leaves, _ = nest.flatten(value, is_leaf=lambda v: isinstance(v, DistributedValues))
    for leaf in leaves:
        if isinstance(leaf, TracedPerReplica):
            parts = leaf.replica_values
        else:
            parts = leaf.values if isinstance(leaf, DistributedValues) else (leaf,)
        if any(isinstance(p, Tensor) for p in parts):
            return True
        if hasattr(leaf, "_replica_components"):
            return True  # a mirrored variable read in a trace
    return False


def _select_replica(structure: Any, replica: int, count: int) -> Any:
    def pick(leaf: Any) -> Any:
        if isinstance(leaf, DistributedValues):
            values = leaf.replica_values if isinstance(leaf, TracedPerReplica) else leaf.values
            if len(values) != count:
                raise InvalidArgumentError(
                    f"a distributed value has {len(values)} components but the strategy has {count} "
                    "replicas; create it with this strategy"
                )
            return values[replica]
        return leaf

    leaves, treedef = nest.flatten(structure, is_leaf=lambda v: isinstance(v, DistributedValues))
    return nest.unflatten(treedef, [pick(leaf) for leaf in leaves])


def _replica_groups(structure: Any, count: int) -> list[tuple[tuple[int, ...], Any]]:
    """Replicas whose arguments are the same traced values and constants, with those arguments.

    Usually one group (every replica reads the same traced inputs); a partial batch split
    unevenly gives one group per shape, each traced once.
    """
    groups: dict[Any, list[int]] = {}
    arguments: dict[Any, Any] = {}
    for replica in range(count):
        chosen = _select_replica(structure, replica, count)
        key = tuple(_identity(leaf) for leaf in nest.flatten(chosen)[0])
        groups.setdefault(key, []).append(replica)
        arguments.setdefault(key, chosen)
    return [(tuple(replicas), arguments[key]) for key, replicas in groups.items()]


def _identity(leaf: Any) -> Any:
    if isinstance(leaf, Tensor) or not _hashable(leaf):
        return ("object", id(leaf))
    return ("value", type(leaf), leaf)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return not isinstance(value, np.ndarray)


def _refuse_in_replica_context() -> None:
    """Traced ``strategy.reduce`` belongs to cross-replica code, not to the replica function."""
    if context.replica_stack() and context.replica_stack()[-1] is not context.CROSS_REPLICA:
        raise InvalidArgumentError("strategy.reduce was called inside strategy.run (replica context); call it "
                                   "on run's result in cross-replica code, or use "
                                   "gd.get_replica_context().all_reduce(...) inside the replica function")


def _refuse_non_distributed_sum(value: Any, replicas: int) -> None:
    """Raises for a SUM over replicas of a value that is not per replica, as TensorFlow does: every replica
    would add the same value (the Python number 0 is let through, as TF lets it).
    """
    leaves, _ = nest.flatten(value, is_leaf=lambda v: isinstance(v, DistributedValues))
    for leaf in leaves:
        distributed = isinstance(leaf, DistributedValues) or hasattr(leaf, "_replica_components")
        if distributed or (type(leaf) in (int, float) and leaf == 0):
            continue
        what = (f"traced tensor %{leaf.value.name}" if isinstance(leaf, Tensor)
                else f"a value of type {type(leaf).__name__}")
        raise InvalidArgumentError(
            f"reduce: {what} is not a distributed value, so it cannot be reduced with SUM over {replicas} replicas "
            "(each would add the same value). Reduce the PerReplica result of strategy.run, or use MEAN, MAX or "
            "MIN for a value every replica shares")


def _replica_parts(value: Any) -> list[Any]:
    """The distinct traced values standing for the replicas' components (one per variant)."""
    if isinstance(value, TracedPerReplica):
        parts: list[Any] = []
        for part in value.replica_values:
            if not any(part is p for p in parts):
                parts.append(part)
        return parts
    if isinstance(value, DistributedValues):
        return list(value.values)
    if hasattr(value, "_replica_components"):
        # A mirrored variable: every replica holds a copy, so every replica contributes one.
        from graphdist.trace.variables import read_variable

        ctx = current_trace()
        with ctx.region(context="replica"):
            return [ctx.emit1("Identity", [read_variable(value).value], name="replica_copy")]
    return [value]


def _as_replica_value(ctx: Any, number: Any, dtype: np.dtype) -> Any:
    """A number as a value of the current replica region (an ``Identity`` node), so that each replica
    contributes its own copy to a cross-replica reduction.
    """
    return ctx.emit1("Identity", [ctx.constant(number, dtype=dtype, name="count")], name="count")


def _count_dtype(partial: Any) -> np.dtype:
    dtype = np.dtype(partial.dtype) if hasattr(partial, "dtype") else np.result_type(partial)
    return dtype if dtype.kind in "fiu" else np.dtype(np.int64)


_NUMPY_REDUCERS = {ReduceOp.SUM: np.sum, ReduceOp.MEAN: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min}


def _check_axis(component: Any, axis: int) -> int:
    rank = np.ndim(component)
    if rank == 0:
        raise AxisError(f"reduce: axis={axis} was given but the value is a scalar; use axis=None")
    (normalized,) = axis_tuple(axis, rank, "reduce axis")
    return normalized


def _reduce_local(op: ReduceOp, component: Any, axis: int | None) -> tuple[Any, int]:
    """One replica's part of a reduce: along ``axis`` (and the element count)."""
    if axis is None:
        return component, 1
    normalized = _check_axis(component, axis)
    return _NUMPY_REDUCERS[op](component, axis=normalized), np.shape(component)[normalized]


def _divide_keep_dtype(total: Any, count: Any) -> Any:
    dtype = total.dtype if hasattr(total, "dtype") else np.result_type(total)
    if isinstance(count, Tensor):
        count = count.astype(dtype)
    if dtype.kind in "iu":
        return total // count
    return total / (count if isinstance(count, Tensor) else np.asarray(count, dtype=dtype))


def _reduce_eager(op: ReduceOp, components: Sequence[Any], axis: int | None) -> Any:
    shapes = {np.shape(c) for c in components}
    if axis is None and len(shapes) > 1:
        raise InvalidArgumentError(
            f"reduce with axis=None needs per-replica values of one shape, got {sorted(shapes)}; "
            "pass axis=0 to reduce along the batch dimension (e.g. for a partial last batch)"
        )
    partials, counts = zip(*(_reduce_local(op, np.asarray(c), axis) for c in components))
    stacked = np.stack([np.asarray(p) for p in partials])
    if op is ReduceOp.MAX:
        result = stacked.max(axis=0)
    elif op is ReduceOp.MIN:
        result = stacked.min(axis=0)
    else:
        result = stacked.sum(axis=0, dtype=stacked.dtype)
        if op is ReduceOp.MEAN:
            result = _divide_keep_dtype(result, sum(counts) if axis is not None else len(components))
    return result[()] if isinstance(result, np.ndarray) and result.ndim == 0 else result


# ------------------------------------------------------- current strategy
class DefaultStrategy(Strategy):
    """The no-op strategy current outside any scope: one replica on ``cpu:0``.

    A singleton: obtain it with :func:`get_strategy` outside any scope.
    """

    _instance: DefaultStrategy | None = None

    def __init__(self) -> None:
        if DefaultStrategy._instance is not None:
            raise InvalidArgumentError("the default strategy is a singleton; use gd.get_strategy() outside any scope")
        super().__init__(["cpu:0"])

    def _create_variable(self, variable: Any) -> None:
        variable._strategy = None  # the default strategy does not capture variables
        variable._device = str(self._devices[0])

    def __repr__(self) -> str:
        return "DefaultStrategy()"


def _default_strategy() -> DefaultStrategy:
    if DefaultStrategy._instance is None:
        DefaultStrategy._instance = DefaultStrategy()
    return DefaultStrategy._instance


def get_strategy() -> Strategy:
    """The current strategy: the innermost entered scope, else the default strategy."""
    stack = context.strategy_stack()
    return stack[-1] if stack else _default_strategy()


def has_strategy() -> bool:
    """True when a non-default strategy's scope is entered."""
    return not isinstance(get_strategy(), DefaultStrategy)


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Sets (or with ``None`` clears) a strategy current for the rest of the thread."""
    stack = context.strategy_stack()
    replicas = context.replica_stack()
    stack.clear()
    replicas.clear()
    if strategy is not None:
        stack.append(strategy)
        replicas.append(context.CROSS_REPLICA)
