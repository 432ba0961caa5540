"""``gd.function``: trace, rewrite, partition and compile a step, cached per input signature.

A :class:`Function` wraps a Python step. On a call it computes the input
signature (array shapes and dtypes, Python constants, distributed-value
structure); the first call with a signature traces the step (including any
``strategy.run`` / ``strategy.reduce`` inside it), runs the strategy's pass
pipeline, partitions the graph into a :class:`~graphdist.compile.plan.Plan`
and compiles it. Later calls with the same signature only execute.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from graphdist import nest, stats
from graphdist.errors import InvalidArgumentError, TracingError
from graphdist.ir.graph import Graph
from graphdist.trace.tracer import TensorSpec, TraceContext, call_user_function, current_trace
from graphdist.trace.values import DistributedValues, PerReplica
from graphdist.trace.variables import Variable, read_variable

__all__ = ["function", "Function", "ConcreteFunction"]

logger = logging.getLogger(__name__)

STAGES = ("traced", "rewritten", "partitioned")


def _is_distributed(value: Any) -> bool:
    return isinstance(value, DistributedValues)


def _is_dataset(value: Any) -> bool:
    from graphdist.data.dataset import Dataset
    from graphdist.distribute.input import DistributedDataset, DistributedIterator

    return isinstance(value, (Dataset, DistributedDataset, DistributedIterator))


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


def _describe(key: Any) -> str:
    """Readable form of a signature key: the array leaves' shapes and dtypes."""
    parts = []
    for leaf in key[1]:
        if isinstance(leaf, tuple) and len(leaf) == 2 and isinstance(leaf[1], str):
            parts.append(f"{np.dtype(leaf[1]).name}{list(leaf[0])}")
        elif isinstance(leaf, tuple) and leaf and leaf[0] == "const":
            parts.append(repr(leaf[2]))
        else:
            parts.append(str(leaf[0]))
    return "(" + ", ".join(parts) + ")"


def signature_of(args: tuple, kwargs: dict) -> tuple[Any, list[Any]]:
    """The cache key of a call and the arrays it feeds (in input order)."""
    if not kwargs and all(type(a) is np.ndarray for a in args):
        # Fast path for the common call (positional arrays only); same key as the general path.
        treedef = _ARRAY_ARGS_TREEDEFS.get(len(args))
        if treedef is None:
            treedef = _ARRAY_ARGS_TREEDEFS[len(args)] = nest.flatten((tuple(args), {}), is_leaf=_is_distributed)[1]
        return (treedef, tuple((a.shape, a.dtype.str) for a in args)), list(args)
    leaves, treedef = nest.flatten((args, kwargs), is_leaf=_is_distributed)
    arrays: list[Any] = []
    key = (treedef, tuple(_leaf_signature(leaf, arrays) for leaf in leaves))
    return key, arrays


class ConcreteFunction:
    """One traced and compiled specialisation of a :class:`Function`.

    Attributes:
        plan: The compiled :class:`~graphdist.compile.plan.Plan`.
        strategy: The strategy whose pipeline rewrote the step.
    """

    def __init__(self, name: str, graphs: dict[str, Graph], plan: Any, strategy: Any,
                 input_names: list[str], output_spec: tuple[Any, list[int | None]]) -> None:
        self.name = name
        self._graphs = graphs
        self.plan = plan
        self.strategy = strategy
        self._input_names = input_names
        self._signature: Any = None  # set by Function once cached
        self._output_treedef, self._output_counts = output_spec
        self._plain_outputs = all(c is None for c in self._output_counts)
        rewritten = graphs["rewritten"]
        # Variables are fed from their current values and written back after the step.
        self._variable_feeds = list(graphs["traced"].meta.get("variables", []))
        self._updates = list(rewritten.meta.get("variable_updates", []))
        self._num_results = len(rewritten.outputs) - len(self._updates)
        if plan is not None:
            plan._owner = weakref.ref(self)  # plan.export() exports through this function

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
        for name, variable in self._variable_feeds:
            feeds[name] = variable._value
        outputs = self.plan.run(feeds)
        if self._updates:
            for (_, variable), value in zip(self._updates, outputs[self._num_results:]):
                variable._write(value)
            outputs = outputs[: self._num_results]
        outputs = [out[()] if out.ndim == 0 else out for out in outputs]
        if self._plain_outputs:
            return nest.unflatten(self._output_treedef, outputs)
        leaves, position = [], 0
        for count in self._output_counts:
            if count is None:
                leaves.append(outputs[position])
                position += 1
            else:
                leaves.append(PerReplica(outputs[position: position + count]))
                position += count
        return nest.unflatten(self._output_treedef, leaves)

    def export(self, directory: Any, *, overwrite: bool = False) -> str:
        """Writes the plan, the step's interface and the variables' current values to ``directory``.

        The directory (see :mod:`graphdist.compile.export`) is written
        atomically; ``gd.load_plan(directory)`` runs it without this code.

        Returns:
            The directory's absolute path.
        """
        from graphdist.compile.export import export_concrete

        return export_concrete(self, directory, overwrite=overwrite)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, arrays = signature_of(args, kwargs)
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
                 strategy: Any = None) -> None:
        if not callable(fn):
            raise InvalidArgumentError(f"gd.function needs a callable, got {type(fn).__name__}")
        self._fn = fn
        self._name = name or getattr(fn, "__name__", "function").strip("<>") or "function"
        self._backend = backend
        self._strategy = strategy
        self._concrete: dict[Any, ConcreteFunction] = {}
        functools.update_wrapper(self, fn, updated=())

    @property
    def python_function(self) -> Callable[..., Any]:
        """The wrapped Python function."""
        return self._fn

    def _with_backend(self, backend: str) -> Function:
        """The same step compiled by ``backend`` (a new function: nothing traced is shared)."""
        return Function(self._fn, name=self._name, backend=backend, strategy=self._strategy)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_trace() is not None:
            # Called from code being traced: inline, as nested tf.functions are.
            with _strategy_scope(self._strategy):
                return self._fn(*args, **kwargs)
        key, arrays = signature_of(args, kwargs)
        concrete = self._concrete.get(key)
        if concrete is None:
            concrete = self._build(key, args, kwargs)
        return concrete.call_flat(arrays)

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> ConcreteFunction:
        """The specialisation for these example arguments (arrays or ``gd.TensorSpec``)."""
        key, _ = signature_of(args, kwargs)
        return self._concrete.get(key) or self._build(key, args, kwargs)

    def experimental_get_tracing_count(self) -> int:
        """How many signatures have been traced."""
        return len(self._concrete)

    # -------------------------------------------------------------- build
    def _build(self, key: Any, args: tuple, kwargs: dict) -> ConcreteFunction:
        from graphdist.backends import get_backend
        from graphdist.compile.plan import Plan
        from graphdist.distribute.strategy import get_strategy
        from passes.base import PassContext, PassManager
        from passes.partition import PartitionPass

        traced, input_names, output_spec = self._trace(args, kwargs)
        strategy = self._pick_strategy(traced) or get_strategy()
        ctx = PassContext(devices=tuple(strategy.extended.worker_devices))
        rewritten = PassManager(strategy.pipeline()).run(traced.copy(), ctx).graph
        partitioned = PassManager([PartitionPass()]).run(rewritten.copy(), ctx).graph
        plan = Plan.from_graph(partitioned).compile(get_backend(self._backend or strategy._preferred_backend()))
        graphs = {"traced": traced, "rewritten": rewritten, "partitioned": partitioned}
        concrete = ConcreteFunction(self._name, graphs, plan, strategy, input_names, output_spec)
        concrete._signature = key
        self._concrete[key] = concrete
        logger.info("compiled %s for signature #%d: %d nodes, %d segment(s)", self._name, len(self._concrete),
                    len(partitioned.nodes), len(plan.segments))
        return concrete

    def _pick_strategy(self, graph: Graph) -> Any:
        strategies = graph.meta.get("strategies", [])
        if len(strategies) > 1:
            names = ", ".join(type(s).__name__ for s in strategies)
            raise NotImplementedError(f"a step may use one strategy; {self._name} uses {names}")
        return strategies[0] if strategies else self._strategy

    def _trace(self, args: tuple, kwargs: dict) -> tuple[Graph, list[str], tuple[Any, list[int | None]]]:
        ctx = TraceContext(self._name)
        with ctx.activate():
            proxy_args, proxy_kwargs, input_names = _make_inputs(ctx, args, kwargs)
            with _strategy_scope(self._strategy):
                result = call_user_function(self._fn, proxy_args, proxy_kwargs)
            result = nest.map_structure(lambda v: read_variable(v) if isinstance(v, Variable) else v, result)
            leaves, treedef = nest.flatten(result, is_leaf=_is_distributed)
            counts = [len(leaf.values) if _is_distributed(leaf) else None for leaf in leaves]
            flat = [v for leaf in leaves for v in (leaf.values if _is_distributed(leaf) else (leaf,))]
            ctx.set_outputs(flat)
        stats.increment("traces")
        return ctx.graph, input_names, (treedef, counts)

    def __repr__(self) -> str:
        return f"<graphdist.Function {self._name} signatures={len(self._concrete)}>"


def _strategy_scope(strategy: Any) -> Any:
    import contextlib

    from graphdist.distribute.strategy import get_strategy

    if strategy is None or get_strategy() is strategy:
        return contextlib.nullcontext()
    return strategy.scope()


def _make_inputs(ctx: TraceContext, args: tuple, kwargs: dict) -> tuple[tuple, dict, list[str]]:
    """Graph inputs for every array leaf (per-replica components included)."""
    leaves, treedef = nest.flatten((args, kwargs), is_leaf=_is_distributed)
    names: list[str] = []

    def make(leaf: Any, hint: str) -> Any:
        if isinstance(leaf, (np.ndarray, np.generic, TensorSpec)):
            spec = leaf if isinstance(leaf, TensorSpec) else TensorSpec(np.shape(leaf), np.asarray(leaf).dtype)
            if any(d is None for d in spec.shape):
                raise TracingError(f"input {hint}: symbolic dimensions are not supported by gd.function yet; "
                                   "give a full static shape")
            proxy = ctx.input(spec.name or hint, spec.dtype, spec.shape)
            names.append(proxy.value.name)
            return proxy
        if isinstance(leaf, DistributedValues):
            return type(leaf)([make(v, f"{hint}_r{i}") for i, v in enumerate(leaf.values)])
        return leaf

    proxies = [make(leaf, f"arg{i}") for i, leaf in enumerate(leaves)]
    new_args, new_kwargs = nest.unflatten(treedef, proxies)
    return new_args, new_kwargs, names


def function(fn: Callable[..., Any] | None = None, *, backend: str | None = None,
             name: str | None = None) -> Any:
    """Compiles a step function (like ``tf.function``); usable with or without arguments.

    Args:
        fn: The step. It may call ``strategy.run``, ``strategy.reduce`` and
            ``strategy.gather``; everything is traced into one graph and plan.
        backend: ``"ort"`` (default), ``"reference"`` or ``"tvm"``; default
            from ``GRAPHDIST_BACKEND``.
        name: Name of the graphs and plan.

    Returns:
        A :class:`Function` (or a decorator making one when ``fn`` is None).
    """
    if fn is None:
        return lambda f: Function(f, name=name, backend=backend)
    return Function(fn, name=name, backend=backend)
