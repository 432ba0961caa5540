"""``gd.function``: trace, rewrite, partition and compile a step, cached per input signature.

A :class:`Function` wraps a Python step. On a call it computes the input
signature (array shapes and dtypes, Python constants, distributed-value
structure); the first call with a signature traces the step once, as one
replica (including any ``strategy.run`` / ``strategy.reduce`` inside it),
runs the pass pipeline the strategy's configuration builds (which makes the
replicas, collectives and placement), partitions the graph into a
:class:`~graphdist.compile.plan.Plan` and compiles it. Later calls with the
same signature only execute. This module knows strategies only through
the :class:`~graphdist.compile.target.CompileTarget` protocol (their
:class:`~graphdist.compile.pipeline.PipelineConfig`, variable placement and
communicator), and variables through their public storage methods.

Threads: concurrent first calls of one signature trace and compile it once
(a lock per signature), and a step holds the locks of its variables while
it reads them, runs and writes its updates back, so concurrent steps on
shared variables lose no update. Compiled signatures are kept in a
least-recently-used cache of ``max_signatures`` entries per function
(default :data:`DEFAULT_MAX_SIGNATURES`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from graphdist import nest, stats
from graphdist.compile.build import compile_traced
from graphdist.compile.gc_pause import paused_gc
from graphdist.compile.guards import guarded_key, is_guarded, short_value
from graphdist.compile.interface import Resolved, StepInterface, rebuild_results, result_value
from graphdist.compile.pipeline import PipelineConfig, build_pipeline, deterministic_config
from graphdist.compile.step_io import is_distributed, make_inputs, per_replica_batch, result_leaf, specs_of
from graphdist.compile.target import Communicator, CompileTarget
from graphdist.errors import InvalidArgumentError, TracingError
from graphdist.ir.graph import Graph
from graphdist.ir.placement import PlacementSpec, VariablePlacement
from graphdist.passes.shard_optimizer_state import REPLICA_PARTS_OPTION
from graphdist.runtime import determinism
from graphdist.trace.tracer import TensorSpec, TraceContext, call_user_function, current_trace
from graphdist.trace.values import DistributedValues
from graphdist.trace.variables import Variable, VariableLocks, WorkerShard, read_variable

__all__ = ["function", "Function", "ConcreteFunction", "DEFAULT_MAX_SIGNATURES"]

logger = logging.getLogger(__name__)

STAGES = ("traced", "rewritten", "partitioned")

#: Compiled signatures a ``gd.function`` keeps by default (least recently used ones are dropped).
DEFAULT_MAX_SIGNATURES = 64


def _is_dataset(value: Any) -> bool:
    # Datasets and distributed datasets/iterators mark themselves (this module is below them).
    return bool(getattr(type(value), "_graphdist_dataset", False))


def _leaf_signature(leaf: Any, arrays: list[Any]) -> Any:
    """Signature entry of one argument leaf; appends the arrays it feeds."""
    if isinstance(leaf, np.ndarray):
        arrays.append(leaf)
        return (leaf.shape, leaf.dtype.str)
    if isinstance(leaf, np.generic):
        arrays.append(np.asarray(leaf))
        return ((), leaf.dtype.str)
    if isinstance(leaf, TensorSpec):
        arrays.append(leaf)
        return (leaf.shape, leaf.dtype.str)
    if isinstance(leaf, DistributedValues):
        return ("per_replica", tuple(_leaf_signature(v, arrays) for v in leaf.values))
    if isinstance(leaf, Variable):
        return ("variable", id(leaf))
    if _is_dataset(leaf):
        raise InvalidArgumentError(
            f"a {type(leaf).__name__} was passed to a gd.function step: a traced step cannot loop over a "
            "dataset (the loop would be unrolled once at trace time and replay the first epoch). Iterate in "
            "Python and pass one element per call: `for x in dist_dataset: step(x)`"
        )
    try:
        hash(leaf)
    except TypeError:
        return ("object", id(leaf))
    return ("const", type(leaf), leaf)


_ARRAY_ARGS_TREEDEFS: dict[int, Any] = {}


def _describe_leaf(leaf: Any) -> str:
    if isinstance(leaf, tuple) and len(leaf) == 2 and isinstance(leaf[1], str):
        return f"{np.dtype(leaf[1]).name}{list(leaf[0])}"
    if isinstance(leaf, tuple) and leaf and leaf[0] == "const":
        return repr(leaf[2])
    if isinstance(leaf, tuple) and len(leaf) == 2 and leaf[0] == "per_replica":
        return "PerReplica(" + ", ".join(_describe_leaf(part) for part in leaf[1]) + ")"
    return str(leaf[0])


def _describe(key: Any) -> str:
    """Readable form of a signature key: the array leaves' shapes and dtypes (per replica for
    distributed values), constants by value, and the values of specialised arguments.
    """
    if is_guarded(key):
        values = ", ".join(f"argument {v[0]} = {short_value(np.frombuffer(v[3], v[1]).reshape(v[2]))}"
                           for v in key[2] if len(v) == 4)
        return f"{_describe(key[0])} with {values}"
    return "(" + ", ".join(_describe_leaf(leaf) for leaf in key[1]) + ")"


def signature_of(args: tuple, kwargs: dict) -> tuple[Any, list[Any]]:
    """The cache key of a call and the arrays it feeds (in input order)."""
    if not kwargs and all(type(a) is np.ndarray for a in args):
        # Fast path for the common call (positional arrays only); same key as the general path.
        treedef = _ARRAY_ARGS_TREEDEFS.get(len(args))
        if treedef is None:
            treedef = _ARRAY_ARGS_TREEDEFS[len(args)] = nest.flatten((tuple(args), {}), is_leaf=is_distributed)[1]
        return (treedef, tuple((a.shape, a.dtype.str) for a in args)), list(args)
    leaves, treedef = nest.flatten((args, kwargs), is_leaf=is_distributed)
    arrays: list[Any] = []
    key = (treedef, tuple(_leaf_signature(leaf, arrays) for leaf in leaves))
    return key, arrays


def _store_worker_shards(name: str, graph: Graph, by_uid: dict[str, Variable],
                         strategy: CompileTarget | None) -> dict[str, WorkerShard]:
    """Makes each variable the plan stores in per-replica parts (ZeRO-1 slots, see
    :mod:`graphdist.passes.shard_optimizer_state`) keep only those parts: across workers only this worker's.

    Returns:
        The layout of each such variable, by uid.

    Raises:
        InvalidArgumentError: The step reads whole a variable another step sharded across workers.
    """
    layouts = {uid: layout for uid, layout in graph.meta.sharded_state.items() if "parts" in layout}
    for uid, variable in by_uid.items():
        shard = variable.worker_shard
        if shard is not None and shard.workers > 1 and uid not in layouts:
            raise InvalidArgumentError(
                f"{name}: variable {variable.name} is sharded across workers (ZeRO-1: each worker stores its chunk), "
                "and this step reads it whole; read it eagerly (variable.numpy() on every worker gathers it) or "
                "compile the step under the strategy that shards it")
    if not layouts:
        return {}
    communicator = strategy.communicator if strategy is not None else None
    if communicator is None and any(int(layout.get("workers", 1)) > 1 for layout in layouts.values()):
        raise InvalidArgumentError(f"{name}: the plan shards optimizer state across workers, but its strategy "
                                   f"{_target_name(strategy)} has no communicator between them")
    stored: dict[str, WorkerShard] = {}
    for uid, layout in layouts.items():
        variable = by_uid[uid]
        workers = int(layout.get("workers", 1))
        local = int(layout.get("local", layout["replicas"]))
        if workers > 1:
            gather = functools.partial(_gather_chunks, communicator, f"gather {variable.name}")
            shard = WorkerShard(tuple(variable.shape), workers, int(layout["worker"]), int(layout["shard"]), gather,
                                local)
        else:
            blocks = layout.get("blocks")  # tensor parallelism: each part a block (LowerLayoutsPass)
            shard = WorkerShard(tuple(variable.shape), 1, 0, int(layout["shard"]), local=local,
                                blocks=None if blocks is None else tuple(tuple(tuple(d) for d in b) for b in blocks))
        variable.store_in_parts(shard)
        stored[uid] = shard
    return stored


def _gather_chunks(communicator: Communicator, label: str, chunk: np.ndarray) -> np.ndarray:
    return communicator.all_gather(chunk, 0, name=label)


class ConcreteFunction:
    """One traced and compiled specialisation of a :class:`Function`.

    Attributes:
        plan: The compiled :class:`~graphdist.compile.plan.Plan`.
        strategy: The strategy whose configuration rewrote the step (``None``: the default).
        config: That configuration.
        interface: How the call's arguments and results map to the traced graph.
    """

    def __init__(self, name: str, graphs: dict[str, Graph], plan: Any, strategy: CompileTarget | None,
                 interface: StepInterface,
                 resolved: Resolved, variables: dict[str, Variable], config: PipelineConfig,
                 output_treedef: Any) -> None:
        self.name = name
        self._graphs = graphs
        self.plan = plan
        self.strategy = strategy
        self.config = config
        self.interface = interface
        self.resolved = resolved
        self._signature: Any = None  # set by Function once cached
        self._function: Any = None  # the Function that traced it, and the arguments' specs (set by Function)
        self._example: tuple[tuple, dict] | None = None
        self._batch_args = False  # its plain array arguments are one replica's batch (set by Function)
        self._rebatch: dict[str, Any] | None = None
        rewritten = graphs["rewritten"]
        self._input_names = resolved.input_names
        self._output_treedef, self._output_counts = output_treedef, resolved.counts
        self._plain_outputs = all(c is None for c in self._output_counts)
        # Variables are fed from their current values and written back after the step.
        self._variable_feeds = list(variables.items())
        self._locks = VariableLocks(variables.values())
        by_uid = {v.uid: v for v in variables.values()}
        self._updates = [(out, by_uid[uid]) for out, uid in rewritten.meta.variable_updates]
        self._shards = _store_worker_shards(name, rewritten, by_uid, strategy)
        self._num_results = len(rewritten.outputs) - len(self._updates)
        self._arrange_feeds(rewritten)
        if plan is not None:
            plan._owner = weakref.ref(self)  # plan.export() exports through this function

    def _arrange_feeds(self, rewritten: Graph) -> None:
        """Which plan inputs each variable feeds and which outputs it takes back: a variable stored in
        per-replica parts (``sharded_state[uid]["parts"]``) feeds each part to its own input and takes one
        write-back per part (its ``variable_updates`` entries, in replica order); any other variable one
        input and one write-back.
        """
        layouts = {uid: layout for uid, layout in rewritten.meta.sharded_state.items()
                   if "parts" in layout}
        self._whole_feeds: list[tuple[str, Variable]] = []
        self._part_feeds: list[tuple[list[str], Variable, WorkerShard]] = []
        for name, variable in self._variable_feeds:
            if variable.uid in layouts:
                self._part_feeds.append((list(layouts[variable.uid]["parts"]), variable, self._shards[variable.uid]))
            else:
                self._whole_feeds.append((name, variable))
        self._whole_updates: list[tuple[int, Variable]] = []
        parts: dict[str, tuple[Variable, list[int]]] = {}
        for index, (_, variable) in enumerate(self._updates):
            if variable.uid in layouts:
                parts.setdefault(variable.uid, (variable, []))[1].append(index)
            else:
                self._whole_updates.append((index, variable))
        self._part_updates = list(parts.values())

    def _whole_storage_build(self) -> tuple[dict[str, Graph], Any, Resolved]:
        """This step built again with every variable fed and written back as one array (ZeRO-1 slots
        sliced and joined inside the plan), for a plan directory, which stores each variable whole.

        Returns:
            ``(graphs, compiled plan, resolved interface)`` as :func:`compile_traced` gives them.
        """
        traced = self.graph("traced")
        placement = _placement(self.strategy, traced, dict(self._variable_feeds))
        return compile_traced(traced, self.interface, build_pipeline(self.config), placement, self.plan.backend_name)

    @property
    def variables(self) -> list[Variable]:
        """Variables the step reads or updates."""
        return [v for _, v in self._variable_feeds]

    def graph(self, stage: str = "traced") -> Graph:
        """The step's graph at ``stage``: ``"traced"``, ``"rewritten"`` or ``"partitioned"``."""
        if stage not in self._graphs:
            raise InvalidArgumentError(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}")
        return self._graphs[stage]

    def call_flat(self, arrays: list[Any]) -> Any:
        """Runs the plan on the flat input arrays and rebuilds the output structure."""
        feeds = dict(zip(self._input_names, arrays))
        with self._locks:  # read, run and write back as one step for other threads
            for name, variable in self._whole_feeds:
                # Stored in parts (by a ZeRO-1 step) and read whole here: joined (in one process only).
                feeds[name] = variable.whole_value()
            for names, variable, shard in self._part_feeds:
                if variable.worker_shard is not shard:  # another step split it another way (one process)
                    variable.store_in_parts(shard)
                feeds.update(zip(names, variable.stored_value()))
            outputs = self.plan.run(feeds)
            updates = outputs[self._num_results:]
            for index, variable in self._whole_updates:
                variable.write_back(updates[index])
            for variable, indices in self._part_updates:
                variable.write_back_parts([updates[i] for i in indices])
        if self._updates:
            outputs = outputs[: self._num_results]
        outputs = [result_value(out) for out in outputs]
        if self._plain_outputs:
            return nest.unflatten(self._output_treedef, outputs)
        return rebuild_results(outputs, self._output_counts, self._output_treedef)

    def export(self, directory: Any, *, overwrite: bool = False) -> str:
        """Writes the plan, the step's interface and the variables' current values to ``directory``.

        The directory (see :mod:`graphdist.compile.export`) is written
        atomically; ``gd.load_plan(directory)`` runs it without this code.

        Returns:
            The directory's absolute path.
        """
        from graphdist.compile.export import export_concrete

        return export_concrete(self, directory, overwrite=overwrite)

    def replan(self, strategy: CompileTarget, *, backend: str | None = None) -> Any:
        """A plan of this step for ``strategy`` (another strategy or device count), made by the strategy's
        passes from the traced graph, with the variables' current values and no tracing.

        Called on the same global batch it trains exactly like this step. See
        :func:`graphdist.compile.replan.replan` for what can be re-planned.

        Returns:
            A :class:`~graphdist.compile.loaded.LoadedPlan`, called like this step (per-replica
            arguments take the new strategy's replicas, or a global batch); ``.export(dir)`` writes it.
        """
        from graphdist.compile.replan import replan
        from graphdist.compile.step import record_of_concrete

        return replan(record_of_concrete(self, check=False), strategy, backend=backend,
                      plan_backend=self.plan.backend_name, checker=lambda: self._rebatch_check())

    def _rebatch_check(self) -> dict[str, Any]:
        from graphdist.compile.step import check_rebatch

        if self._rebatch is None:
            self._rebatch = check_rebatch(self)
        return self._rebatch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, arrays = signature_of(args, kwargs)
        if is_guarded(self._signature):
            key = guarded_key(key, tuple(v[0] for v in self._signature[2]), args, kwargs)
        if key != self._signature:
            raise InvalidArgumentError(
                f"{self.name}: this concrete function was traced for {_describe(self._signature)}, got "
                f"{_describe(key)}; call the gd.function itself to trace the new signature"
            )
        return self.call_flat(arrays)

    def __repr__(self) -> str:
        return f"<ConcreteFunction {self.name} inputs={len(self._input_names)} plan={self.plan!r}>"


class Function:
    """A step function compiled per input signature (see :func:`function`)."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, backend: str | None = None,
                 strategy: CompileTarget | None = None, max_signatures: int | None = None,
                 accumulate_steps: int = 1) -> None:
        if not callable(fn):
            raise InvalidArgumentError(f"gd.function needs a callable, got {type(fn).__name__}")
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentError(f"gd.function: name must be a string, got {type(name).__name__} {name!r}")
        self._fn = fn
        self._name = name or getattr(fn, "__name__", "function").strip("<>") or "function"
        self._backend = backend
        self._strategy = strategy
        self._max_signatures = _check_max_signatures(max_signatures)
        self._accumulate_steps = _check_accumulate_steps(accumulate_steps)
        self._concrete: OrderedDict[Any, ConcreteFunction] = OrderedDict()
        self._lock = threading.Lock()  # guards the cache and the per-signature locks
        self._building: dict[Any, threading.Lock] = {}
        self._traces = 0
        self._warned_eviction = False
        #: Per signature key: the argument leaves whose values its traces specialised on (TraceContext.specialise).
        self._guards: dict[Any, tuple[int, ...]] = {}
        self._specialisations: dict[Any, int] = {}  # per signature key: values traced so far
        self._warned_values = False
        functools.update_wrapper(self, fn, updated=())

    @property
    def python_function(self) -> Callable[..., Any]:
        """The wrapped Python function."""
        return self._fn

    @property
    def accumulate_steps(self) -> int:
        """Micro-batches each replica's batch is cut into per step (1: no gradient accumulation)."""
        return self._accumulate_steps

    @property
    def max_signatures(self) -> int:
        """How many compiled signatures this function keeps (least recently used ones are dropped)."""
        return self._max_signatures

    def _with_backend(self, backend: str) -> Function:
        """The same step compiled by ``backend`` (a new function: nothing traced is shared)."""
        return Function(self._fn, name=self._name, backend=backend, strategy=self._strategy,
                        max_signatures=self._max_signatures, accumulate_steps=self._accumulate_steps)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_trace() is not None:
            # Called from code being traced: inline, as nested tf.functions are.
            with _strategy_scope(self._strategy):
                return self._fn(*args, **kwargs)
        key, arrays = signature_of(args, kwargs)
        key = self._guarded(key, args, kwargs)
        concrete = self._cached(key) or self._build_once(key, args, kwargs)
        return concrete.call_flat(arrays)

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> ConcreteFunction:
        """The specialisation for these example arguments (arrays or ``gd.TensorSpec``)."""
        key, _ = signature_of(args, kwargs)
        key = self._guarded(key, args, kwargs)
        return self._cached(key) or self._build_once(key, args, kwargs)

    def _guarded(self, key: Any, args: tuple, kwargs: dict) -> Any:
        """``key`` with the values of the arguments earlier traces of it specialised on (shape-deciding inputs)."""
        guard = self._guards.get(key)
        return key if guard is None else guarded_key(key, guard, args, kwargs)

    def experimental_get_tracing_count(self) -> int:
        """How many times the step has been traced (a signature dropped from the cache and called
        again is traced again).
        """
        return self._traces

    def cached_signatures(self) -> int:
        """How many compiled signatures the cache holds now (at most :attr:`max_signatures`)."""
        with self._lock:
            return len(self._concrete)

    # -------------------------------------------------------------- cache
    def _cached(self, key: Any) -> ConcreteFunction | None:
        with self._lock:
            concrete = self._concrete.get(key)
            if concrete is not None:
                self._concrete.move_to_end(key)
            return concrete

    def _build_once(self, key: Any, args: tuple, kwargs: dict) -> ConcreteFunction:
        """Traces and compiles ``key`` unless another thread is doing it (then waits for its result)."""
        with self._lock:
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:
            concrete = self._cached(key)
            if concrete is None:
                try:
                    with paused_gc():  # a build makes millions of objects and frees none (see gc_pause)
                        concrete = self._build(key, args, kwargs)
                finally:
                    with self._lock:
                        self._building.pop(key, None)
        return concrete

    def _remember(self, key: Any, concrete: ConcreteFunction) -> None:
        with self._lock:
            self._concrete[key] = concrete
            self._traces += 1
            evicted = []
            while len(self._concrete) > self._max_signatures:
                evicted.append(self._concrete.popitem(last=False)[0])
            warn = bool(evicted) and not self._warned_eviction
            self._warned_eviction = self._warned_eviction or warn
            # A trace for the 5th value of a specialised input has its own warning (_specialised_key).
            retraced = self._traces == RETRACE_WARNING_AFTER and not (
                is_guarded(key) and self._specialisations.get(key[0], 0) >= RETRACE_WARNING_AFTER)
        if retraced:
            # As tf.function: many traces of one function usually mean shapes or Python values that vary.
            logger.warning("gd.function %s has been traced %d times, once per new input signature (shapes, dtypes "
                           "and Python values of the arguments), and every trace compiles again. Pass arrays in "
                           "place of Python numbers, keep batch shapes fixed (drop_remainder=True, or pad), or "
                           "give a gd.TensorSpec example; the latest signature: %s",
                           self._name, self._traces, _describe(key))
        if warn:
            logger.warning("gd.function %s has been called with more than %d input signatures; the least recently "
                           "used compiled plans are dropped (and traced again if called again). Give it "
                           "max_signatures=N to keep more, or pass shapes that repeat (pad or bucket them)",
                           self._name, self._max_signatures)

    # -------------------------------------------------------------- build
    def _build(self, key: Any, args: tuple, kwargs: dict) -> ConcreteFunction:
        traced, interface, variables, strategies, treedef = self._trace(args, kwargs)
        key = self._specialised_key(key, traced, args, kwargs)
        strategy = _strategy_of_remote_variables(self._name, self._pick_strategy(*strategies), variables)
        config = strategy.pipeline_config() if strategy is not None else PipelineConfig()
        batch_args = False
        chunks = determinism.chunks()
        if chunks is not None and strategy is not None:
            # The chunks of the global batch are each replica's micro-batches. A step that uses no strategy
            # (plain arrays, no scope) distributes nothing: it is not cut.
            config = deterministic_config(config, chunks, self._accumulate_steps)
        elif self._accumulate_steps > 1:
            config = config.replace(accumulate_steps=self._accumulate_steps)
        if config.accumulate_steps > 1:
            batch_args = config.replicas == 1 and traced.meta.batch is None
            if batch_args:  # one local replica: its array arguments are its batch (a distributed dataset's element)
                traced, interface, variables, strategies, treedef = self._trace(args, kwargs, count=False,
                                                                                batch_args=True)
            label = (f"op determinism ({config.deterministic_chunks} chunks of the global batch, "
                     f"{config.accumulate_steps} per replica)" if config.deterministic_chunks
                     else f"accumulate_steps={config.accumulate_steps}")
            self._check_micro_batches(traced, args, kwargs, batch_args, config.accumulate_steps, label)
        pipeline = build_pipeline(config)
        placement = _placement(strategy, traced, variables)
        # A ConcreteFunction feeds and writes back a ZeRO-1 slot in per-replica parts (WorkerShard).
        graphs, plan, resolved = compile_traced(traced, interface, pipeline, placement,
                                                self._backend or config.backend, {REPLICA_PARTS_OPTION: True})
        concrete = ConcreteFunction(self._name, graphs, plan, strategy, interface, resolved, variables, config,
                                    treedef)
        concrete._signature = key
        concrete._batch_args = batch_args
        concrete._function, concrete._example = self, specs_of(args, kwargs)
        self._remember(key, concrete)
        logger.info("compiled %s for signature #%d: %d nodes, %d segment(s)", self._name, self._traces,
                    len(graphs["partitioned"].nodes), len(plan.segments))
        return concrete

    def _specialised_key(self, key: Any, traced: Graph, args: tuple, kwargs: dict) -> Any:
        """The cache key of a trace that specialised on argument values: the signature plus those values."""
        specialised = traced.meta.specialised or {}
        if not specialised:
            return key
        base = key[0] if is_guarded(key) else key
        leaves = sorted(int(hint.removeprefix("arg")) for hint, _ in specialised.values())
        with self._lock:
            guard = self._guards[base] = tuple(sorted(set(self._guards.get(base, ())) | set(leaves)))
            count = self._specialisations[base] = self._specialisations.get(base, 0) + 1
            warn = count == RETRACE_WARNING_AFTER and not self._warned_values
            self._warned_values = self._warned_values or warn
        described = ", ".join(f"argument {hint.removeprefix('arg')} = {short_value(value)}"
                              for hint, value in specialised.values())
        if count > 1:
            logger.info("gd.function %s traced again for a new value of an input that decides shapes or control "
                        "flow (%s)", self._name, described)
        if warn:
            logger.warning("gd.function %s has been traced for %d different values of an input that decides shapes "
                           "or control flow, and every trace compiles again (latest: %s). Such an input is a "
                           "constant of the compiled step: keep its value fixed between calls, or make it a "
                           "constant of the step (close over a numpy value instead of passing it)",
                           self._name, count, described)
        return guarded_key(base, guard, args, kwargs)

    def _check_micro_batches(self, traced: Graph, args: tuple, kwargs: dict, batch_args: bool, steps: int,
                             label: str) -> None:
        """Refuses micro-batches (``accumulate_steps``, op determinism's chunks) for a step whose graph would not
        follow a smaller batch.
        """
        from graphdist.compile.step import check_batch_follows

        batch = traced.meta.batch
        reads = traced.meta.reads_num_replicas or []
        if reads:
            raise TracingError(
                f"{self._name}: {label} counts the micro-batches as replicas, but the step read "
                f"num_replicas_in_sync while it was traced (at {', '.join(reads[:3])}), which freezes the replica "
                "count into its graph; let the step not depend on it (gd.nn.compute_average_loss without "
                "global_batch_size counts the replicas and micro-batches itself)")
        if batch is None or traced.meta.replica_variants or int(batch) % steps:
            return  # AccumulateGradientsPass says what is wrong with the batch
        check = check_batch_follows(self, specs_of(args, kwargs), traced, int(batch) // steps, batch_args=batch_args)
        if not check["verified"]:
            raise TracingError(f"{self._name}: {label} runs the step on micro-batches of "
                               f"{int(batch) // steps} rows, and {check['reason']}; compute shapes from x.shape "
                               "(reshape(x.shape[0], -1)), not from Python numbers")

    def _pick_strategy(self, used: list[CompileTarget], scope: CompileTarget | None) -> CompileTarget | None:
        """The strategy the step compiles under: the one whose ``run`` / ``reduce`` / ``gather`` it called
        (``used``, as the trace recorded them), else this function's own, else the one whose scope the trace
        ran in (``scope``), else none (one device, nothing distributed).
        """
        if len(used) > 1:
            names = ", ".join(_target_name(s) for s in used)
            raise NotImplementedError(f"a step may use one strategy; {self._name} uses {names}")
        if used:
            return used[0]
        if self._strategy is not None:
            return self._strategy
        return scope if isinstance(scope, CompileTarget) else None

    def _trace(self, args: tuple, kwargs: dict, count: bool = True,
               batch_args: bool = False) -> tuple[Graph, StepInterface, dict[str, Variable],
                                                  tuple[list[Any], Any], Any]:
        """Traces the step once; returns ``(graph, interface, variables, (strategies used, scope's strategy),
        result treedef)``.
        """
        ctx = TraceContext(self._name)
        ctx.replicated = True  # the strategy's pipeline makes the replicas
        with ctx.activate():
            proxy_args, proxy_kwargs, feeds = make_inputs(ctx, args, kwargs, batch_args)
            with _strategy_scope(self._strategy), _NumpyRandomWatch(self._name):
                result = call_user_function(self._fn, proxy_args, proxy_kwargs)
            result = nest.map_structure(lambda v: read_variable(v) if isinstance(v, Variable) else v, result)
            leaves, treedef = nest.flatten(result, is_leaf=is_distributed)
            flat: list[Any] = []
            results = [result_leaf(ctx, leaf, flat) for leaf in leaves]
            ctx.set_outputs(flat)
        ctx.graph.meta.batch = per_replica_batch(ctx.graph)
        if ctx.specialised:
            ctx.graph.meta.specialised = dict(ctx.specialised)
        if count:
            stats.increment("traces")
        strategies = (list(ctx.strategies), ctx.scope_strategy)
        return ctx.graph, StepInterface(feeds, results), dict(ctx.variables), strategies, treedef

    def __repr__(self) -> str:
        return f"<graphdist.Function {self._name} signatures={self.cached_signatures()}>"


class _NumpyRandomWatch:
    """Warns when numpy's global random state moved while a step was traced: its draws were made once, in
    Python, and are frozen into the graph as constants (every call replays the same "noise").
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> _NumpyRandomWatch:
        self._before = np.random.get_state(legacy=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        after, before = np.random.get_state(legacy=False), self._before
        moved = (after["state"]["pos"] != before["state"]["pos"] or after["has_gauss"] != before["has_gauss"]
                 or not np.array_equal(after["state"]["key"], before["state"]["key"]))
        if moved and exc[0] is None:
            logger.warning(
                "np.random was called while gd.function %s was traced: its draws were made once, at trace time, "
                "and those the step computes with are constants of the compiled step, the same at every call "
                "(initial values of variables created there are fine). Draw random "
                "numbers in the step with gd.random.Generator (g = gd.random.Generator.from_seed(1) outside the "
                "step, g.normal(shape) inside it), or draw them in Python and pass them as an argument",
                self._name)


def _strategy_of_remote_variables(name: str, strategy: CompileTarget | None,
                                  variables: dict[str, Variable]) -> CompileTarget | None:
    """The strategy a step must compile under when it touches variables that live outside this process:
    theirs (only its passes pull and push them), where the step itself names none; a step that names another
    one, or mixes the remote variables of two strategies, is refused (its updates would be lost).
    """
    owners = {id(v.distribute_strategy): v.distribute_strategy for v in variables.values() if v.lives_remotely}
    if not owners:
        return strategy
    remote = ", ".join(sorted(v.name for v in variables.values() if v.lives_remotely)[:3])
    if len(owners) > 1:
        raise InvalidArgumentError(f"{name}: the step uses variables of {len(owners)} different parameter-server "
                                   f"strategies ({remote}); a step runs under one strategy")
    owner = next(iter(owners.values()))
    if strategy is None or strategy is owner:
        return owner
    raise InvalidArgumentError(
        f"{name}: variable(s) {remote} live on the parameter servers of {_target_name(owner)}, but the step runs "
        f"under {_target_name(strategy)}, whose plan cannot pull or push them (the updates would be lost); run "
        "the step under the variables' strategy (its scope, or its strategy.run)")


def _placement(strategy: CompileTarget | None, traced: Graph, variables: dict[str, Variable]) -> PlacementSpec:
    """Where each variable of the step lives, as the strategy decides (data, not objects)."""
    spec = PlacementSpec()
    for name, variable_spec in traced.meta.variables:
        variable = variables.get(name)
        if strategy is not None:
            spec.variables[variable_spec.uid] = strategy.variable_placement(variable_spec, variable)
        else:
            spec.variables[variable_spec.uid] = VariablePlacement("local", (variable.device or "cpu:0",)
                                                                   if variable is not None else ("cpu:0",))
    return spec


def _strategy_scope(strategy: CompileTarget | None) -> AbstractContextManager[Any]:
    # Entering the scope of the strategy that is current already only stacks it again (no change).
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def _target_name(strategy: Any) -> str:
    """A strategy's name for messages (its ``name``; the class name of an object that is no strategy)."""
    return strategy.name if isinstance(strategy, CompileTarget) else type(strategy).__name__


#: A function traced this many times gets one warning (tf.function warns after 5 retraces too).
RETRACE_WARNING_AFTER = 5


def _check_accumulate_steps(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"gd.function: accumulate_steps must be a positive int (micro-batches per "
                                   f"update), got {value!r}; leave it out (1) for one pass over the whole batch")
    return int(value)


def _check_max_signatures(value: Any) -> int:
    if value is None:
        return DEFAULT_MAX_SIGNATURES
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"gd.function: max_signatures must be a positive int (compiled input signatures "
                                   f"kept), got {value!r}; leave it out for the default "
                                   f"({DEFAULT_MAX_SIGNATURES})")
    return int(value)


def function(fn: Callable[..., Any] | None = None, *, backend: str | None = None,
             name: str | None = None, max_signatures: int | None = None, accumulate_steps: int = 1) -> Any:
    """Compiles a step function (like ``tf.function``); usable with or without arguments.

    Args:
        fn: The step. It may call ``strategy.run``, ``strategy.reduce`` and
            ``strategy.gather``; everything is traced into one graph and plan.
        backend: ``"ort"`` (default), ``"reference"`` or ``"tvm"``; default
            from ``GRAPHDIST_BACKEND``.
        name: Name of the graphs and plan.
        max_signatures: Compiled input signatures kept in memory (default
            :data:`DEFAULT_MAX_SIGNATURES`, 64); the least recently used
            one is dropped past it and traced again if called again.
        accumulate_steps: Gradient accumulation: each replica's batch is cut
            into this many micro-batches, the forward and backward passes run
            once per micro-batch, and their gradients are summed before the
            one update of the step, which equals the update of the whole
            batch (the loss scaled by the global batch, as
            ``gd.nn.compute_average_loss`` does). The batch is the per-replica
            arguments (with one replica per process: every array argument);
            it must divide evenly. See :mod:`graphdist.passes.accumulate_gradients`.

    Returns:
        A :class:`Function` (or a decorator making one when ``fn`` is None).

    Raises:
        InvalidArgumentError: ``fn`` is not callable, or ``max_signatures`` or ``accumulate_steps`` is not
            a positive int.
    """
    if fn is None:
        _check_max_signatures(max_signatures)
        _check_accumulate_steps(accumulate_steps)
        return lambda f: Function(f, name=name, backend=backend, max_signatures=max_signatures,
                                  accumulate_steps=accumulate_steps)
    return Function(fn, name=name, backend=backend, max_signatures=max_signatures, accumulate_steps=accumulate_steps)
