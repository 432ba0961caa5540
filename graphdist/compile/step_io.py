"""How a ``gd.function``'s arguments become graph inputs, and its results graph outputs, while it is traced.

Array leaves become graph inputs; a per-replica value gets one input per
distinct component shape (a *replica variant* when the replicas' shapes
differ); the step's results become outputs, per-replica ones one output per
distinct replica value. :mod:`graphdist.compile.function` calls these while
tracing; the strategies register variants through :func:`new_variant`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist import nest
from graphdist.compile.interface import ArgumentFeed, ResultLeaf
from graphdist.errors import TracingError
from graphdist.ir.batch import BatchDim
from graphdist.ir.graph import Graph
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import TensorSpec, TraceContext
from graphdist.trace.values import DistributedValues, PerReplica, TracedPerReplica

__all__ = ["is_distributed", "make_inputs", "specs_of", "per_replica_batch", "new_variant", "result_leaf"]


def is_distributed(value: Any) -> bool:
    """True for a distributed value (a leaf of the argument tree, not a container to flatten)."""
    return isinstance(value, DistributedValues)


def make_inputs(ctx: TraceContext, args: tuple, kwargs: dict,
                 batch_args: bool = False) -> tuple[tuple, dict, list[ArgumentFeed]]:
    """Graph inputs for every array leaf; a per-replica leaf gets one input per distinct component shape.
    With ``batch_args`` (one replica, gradient accumulation), array leaves of rank >= 1 are the one
    replica's batch: per-replica inputs fed by the array itself.
    """
    leaves, treedef = nest.flatten((args, kwargs), is_leaf=is_distributed)
    feeds: list[ArgumentFeed] = []

    def make(leaf: Any, hint: str) -> Any:
        if isinstance(leaf, (np.ndarray, np.generic, TensorSpec)):
            batch = batch_args and len(np.shape(leaf) if not isinstance(leaf, TensorSpec) else leaf.shape) > 0
            proxy = _input(ctx, leaf, hint, per_replica=batch)
            if batch:
                ctx.graph.meta.per_replica_inputs[proxy.value.name] = None
            elif not isinstance(leaf, TensorSpec):  # the step may specialise on its value (TraceContext.specialise)
                ctx.input_values[proxy.value.name] = (hint, np.asarray(leaf))
            feeds.append(ArgumentFeed("tensor", (proxy.value.name,)))
            return proxy
        if isinstance(leaf, DistributedValues):
            replica_values, names = _per_replica_inputs(ctx, leaf.values, hint)
            feeds.append(ArgumentFeed("per_replica", tuple(names)))
            return TracedPerReplica(replica_values)
        feeds.append(ArgumentFeed("none"))
        return leaf

    proxies = [make(leaf, f"arg{i}") for i, leaf in enumerate(leaves)]
    new_args, new_kwargs = nest.unflatten(treedef, proxies)
    return new_args, new_kwargs, feeds


def _input(ctx: TraceContext, leaf: Any, hint: str, per_replica: bool = False) -> Any:
    spec = leaf if isinstance(leaf, TensorSpec) else TensorSpec(np.shape(leaf), np.asarray(leaf).dtype)
    if any(d is None for d in spec.shape):
        raise TracingError(f"input {hint}: symbolic dimensions are not supported by gd.function yet; "
                           "give a full static shape")
    shape = tuple(spec.shape)
    if per_replica and shape:
        # The per-replica batch size: a symbol the step's constants remember (graphdist.ir.batch).
        shape = (BatchDim(shape[0]), *shape[1:])
    return ctx.input(spec.name or hint, spec.dtype, shape)


def _per_replica_inputs(ctx: TraceContext, components: tuple[Any, ...], hint: str) -> tuple[list[Any], list[Any]]:
    """One input per distinct (shape, dtype) among the array components; a variant per group when they differ."""
    groups: dict[Any, list[int]] = {}
    for replica, component in enumerate(components):
        if isinstance(component, (np.ndarray, np.generic, TensorSpec)):
            spec = component if isinstance(component, TensorSpec) else np.asarray(component)
            groups.setdefault((tuple(spec.shape), np.dtype(spec.dtype).str), []).append(replica)
    values: list[Any] = list(components)
    names: list[Any] = [None] * len(components)
    per_replica = ctx.graph.meta.per_replica_inputs
    for replicas in groups.values():
        proxy = _input(ctx, components[replicas[0]], hint, per_replica=True)
        per_replica[proxy.value.name] = None if len(replicas) == len(components) else new_variant(ctx, replicas)
        for replica in replicas:
            values[replica], names[replica] = proxy, proxy.value.name
    return values, names


def specs_of(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with every array (per-replica components too) replaced by its ``TensorSpec``, kept
    to trace the step again (``graphdist.compile.step.check_rebatch``) without holding its data.
    """
    def spec(leaf: Any) -> Any:
        if isinstance(leaf, (np.ndarray, np.generic)):
            return TensorSpec(np.shape(leaf), np.asarray(leaf).dtype)
        if isinstance(leaf, DistributedValues) and not isinstance(leaf, TracedPerReplica):
            return PerReplica(tuple(spec(v) for v in leaf.values))
        return leaf

    leaves, treedef = nest.flatten((tuple(args), dict(kwargs)), is_leaf=is_distributed)
    new_args, new_kwargs = nest.unflatten(treedef, [spec(leaf) for leaf in leaves])
    return tuple(new_args), dict(new_kwargs)


def per_replica_batch(graph: Graph) -> int | None:
    """The per-replica batch size every per-replica input shares (their first dimension), or ``None``
    (no per-replica input, a scalar one, or replicas of different batch sizes).
    """
    per_replica = graph.meta.per_replica_inputs
    if not per_replica or graph.meta.replica_variants:
        return None
    sizes = {v.shape[0] if v.shape else None for v in graph.inputs if v.name in per_replica}
    return int(sizes.pop()) if len(sizes) == 1 and None not in sizes else None


def new_variant(ctx: TraceContext, replicas: list[int] | tuple[int, ...]) -> str:
    """Registers a replica variant (replicas traced together because their arguments had one shape)."""
    variants = ctx.graph.meta.replica_variants
    for key, members in variants.items():
        if list(members) == list(replicas):
            return key
    key = f"v{len(variants) + 1}"
    variants[key] = list(replicas)
    return key


def result_leaf(ctx: TraceContext, leaf: Any, flat: list[Any]) -> ResultLeaf:
    """Appends ``leaf``'s values to the traced outputs ``flat``; says how the result is rebuilt."""
    if isinstance(leaf, TracedPerReplica) and all(isinstance(v, Tensor) for v in leaf.replica_values):
        positions: dict[int, int] = {}
        per_replica = ctx.graph.meta.per_replica_outputs
        outputs = []
        for value in leaf.replica_values:
            if id(value) not in positions:
                positions[id(value)] = len(flat)
                members = [r for r, v in enumerate(leaf.replica_values) if v is value]
                variant = None if len(members) == len(leaf) else new_variant(ctx, members)
                per_replica[len(flat)] = variant
                flat.append(_replica_output(ctx, value, variant, flat))
            outputs.append(positions[id(value)])
        return ResultLeaf("per_replica", tuple(outputs))
    if isinstance(leaf, DistributedValues):
        start = len(flat)
        flat.extend(leaf.values)
        return ResultLeaf("components", tuple(range(start, len(flat))))
    flat.append(leaf)
    return ResultLeaf("plain", (len(flat) - 1,))


def _replica_output(ctx: TraceContext, value: Tensor, variant: str | None, flat: list[Any]) -> Tensor:
    """``value`` as a replica output: a per-replica input, or a value already output, gets an
    ``Identity`` in the replica region (each output needs its own node, and each replica's copy its own).
    """
    if value.value.producer is not None and not any(f is value for f in flat):
        return value
    region = {"context": "replica"} if variant is None else {"context": "replica", "variant": variant}
    with ctx.region(**region):
        return ctx.emit1("Identity", [value.value], name="output")
