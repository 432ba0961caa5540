"""Tensor parallelism with Keras 3's names: ``DeviceMesh``, ``LayoutMap``, ``ModelParallelStrategy``.

A :class:`DeviceMesh` arranges devices on named axes; a :class:`LayoutMap`
gives variables (by a regular expression on their names) one mesh axis, or
``None``, per dimension; :class:`ModelParallelStrategy` splits the batch over
``batch_dim_name`` (one replica per position on that axis, as
``MirroredStrategy`` does) and each replica's computation over the other
axes. ``with_sharding_constraint(x, layout)`` pins an activation's layout
inside traced code.

The step is traced once, as one replica, as for every strategy. The
strategy's pipeline adds :class:`~graphdist.passes.propagate_layouts.PropagateLayoutsPass`
(a layout for every value, gradients included, seeded by the variables' layouts)
and :class:`~graphdist.passes.lower_layouts.LowerLayoutsPass` (per-device
programs on local shapes, with the all-reduces, all-gathers, reduce-scatters
and slices the layouts need). See ``docs/model-parallel.md``.

A weight whose layout names the batch axis (and no other axis) is FSDP /
ZeRO-3: :class:`~graphdist.passes.shard_parameters.ShardParametersPass` stores
it in one shard per replica, gathers it before use, reduce-scatters its
gradient and keeps its optimizer state in shards; the layout passes see it
whole.

With several worker processes (``graphdist launch``, ``TF_CONFIG``) the batch
axis spans them: FSDP weights are sharded across the workers, the other axes
split each replica within its worker.

Not built yet (raises ``NotImplementedError`` where it is asked for): one
weight split over the batch axis and another axis.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from graphdist.compile.pipeline import PipelineConfig
from graphdist.distribute.cluster import task_rank
from graphdist.distribute.multi_worker import MultiWorkerExtended, MultiWorkerMirroredStrategy, default_cluster_resolver
from graphdist.distribute.strategy import Strategy, get_strategy
from graphdist.distribute.variables import MirroredVariable
from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph
from graphdist.ir.layouts import MeshSpec
from graphdist.ir.placement import VariablePlacement, VariableSpec, variable_specs
from graphdist.ir.placement_ops import SHARDING_CONSTRAINT
from graphdist.trace.tracer import current_trace

__all__ = ["DeviceMesh", "LayoutMap", "ModelParallelStrategy", "TensorLayout", "with_sharding_constraint"]

logger = logging.getLogger(__name__)

AxisLayout = tuple[str | None, ...]


class DeviceMesh:
    """Devices arranged on named axes (Keras 3's ``keras.distribution.DeviceMesh``).

    Args:
        shape: The mesh's size along each axis, e.g. ``(2, 2)``.
        axis_names: One name per axis, e.g. ``("batch", "model")``.
        devices: ``prod(shape)`` device strings, row-major over ``shape`` (default ``cpu:0`` ...).

    Raises:
        InvalidArgumentError: Sizes that are not positive integers, names that are not distinct strings
            or do not match ``shape``, or a device count other than the mesh's.
    """

    def __init__(self, shape: Sequence[int], axis_names: Sequence[str], devices: Sequence[Any] | None = None) -> None:
        sizes = tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in sizes):
            raise InvalidArgumentError(f"DeviceMesh: shape must be a tuple of positive integers such as (1, 2), "
                                       f"got {shape!r}")
        names = tuple(axis_names) if isinstance(axis_names, (list, tuple)) else (axis_names,)
        if len(names) != len(sizes) or any(not isinstance(n, str) or not n for n in names) \
                or len(set(names)) != len(names):
            raise InvalidArgumentError(f"DeviceMesh: axis_names must be {len(sizes)} distinct non-empty strings, one "
                                       f"per entry of shape {sizes}, got {axis_names!r}")
        count = int(np.prod(sizes))
        listed = [f"cpu:{i}" for i in range(count)] if devices is None else [str(d) for d in devices]
        if len(listed) != count:
            raise InvalidArgumentError(
                f"DeviceMesh: shape {sizes} needs {count} devices, devices lists {len(listed)} "
                f"({', '.join(listed) or 'none'}); give {count} devices or a shape whose product is {len(listed)}")
        self.shape = tuple(int(s) for s in sizes)
        self.axis_names = names
        self.devices = tuple(str(d) for d in Strategy._validate_devices(listed))

    def axis_size(self, axis: str) -> int:
        """The mesh's size along ``axis``."""
        return self.shape[self.axis_names.index(axis)]

    def __repr__(self) -> str:
        return f"DeviceMesh(shape={self.shape}, axis_names={self.axis_names}, devices={list(self.devices)})"


class TensorLayout:
    """One mesh axis (or ``None``) per dimension of a value (Keras 3's ``TensorLayout``).

    Args:
        axes: Axis names or ``None``, one per dimension.
        device_mesh: The mesh the names refer to (optional: checked when given).
    """

    def __init__(self, axes: Sequence[str | None], device_mesh: DeviceMesh | None = None) -> None:
        self.axes = _axes_tuple(axes, "TensorLayout axes")
        self.device_mesh = device_mesh
        if device_mesh is not None:
            _check_axis_names(self.axes, device_mesh, "TensorLayout")

    def __repr__(self) -> str:
        return f"TensorLayout(axes={self.axes})"


class LayoutMap:
    """Variable name patterns -> layouts (Keras 3's ``keras.distribution.LayoutMap``).

    ``layout_map["dense.*kernel"] = (None, "model")``: a variable whose name
    the regular expression matches (``re.search``; an exact name wins over
    patterns) gets one mesh axis, or ``None``, per dimension. A variable
    matching no pattern is replicated; one matching two patterns is an error.

    Args:
        device_mesh: The mesh the axis names refer to.
    """

    def __init__(self, device_mesh: DeviceMesh) -> None:
        if not isinstance(device_mesh, DeviceMesh):
            raise InvalidArgumentError(f"LayoutMap: device_mesh must be a gd.experimental.DeviceMesh, got "
                                       f"{type(device_mesh).__name__}")
        self.device_mesh = device_mesh
        self._layouts: dict[str, AxisLayout] = {}

    def __setitem__(self, pattern: str, layout: Any) -> None:
        if not isinstance(pattern, str):
            raise InvalidArgumentError(f"LayoutMap keys are variable name patterns (strings), got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as err:
            raise InvalidArgumentError(f"LayoutMap key {pattern!r} is not a valid regular expression ({err})") from None
        axes = layout.axes if isinstance(layout, TensorLayout) else _axes_tuple(layout, f"layout_map[{pattern!r}]")
        _check_axis_names(axes, self.device_mesh, f"layout_map[{pattern!r}]")
        self._layouts[pattern] = axes

    def __getitem__(self, name: str) -> AxisLayout | None:
        """The layout of the variable named ``name`` (``None``: no pattern matches, replicated).

        Raises:
            InvalidArgumentError: Two patterns match ``name`` (and neither is the exact name).
        """
        if name in self._layouts:
            return self._layouts[name]
        matches = [p for p in self._layouts if re.search(p, name)]
        if len(matches) > 1:
            raise InvalidArgumentError(f"variable {name!r} matches several LayoutMap patterns ({', '.join(matches)}); "
                                       "make the patterns exclusive or add the exact name as a key")
        return self._layouts[matches[0]] if matches else None

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._layouts

    def __iter__(self) -> Iterator[str]:
        return iter(self._layouts)

    def __len__(self) -> int:
        return len(self._layouts)

    def matching(self, name: str) -> list[str]:
        """The patterns that match ``name``."""
        return [p for p in self._layouts if p == name or re.search(p, name)]

    def __repr__(self) -> str:
        return f"LayoutMap({self.device_mesh!r}, {self._layouts})"


class ModelParallelStrategy(Strategy):
    """Batch over one mesh axis, each replica's computation split over the others by variable layouts.

    Args:
        layout_map: Which variables are split how (:class:`LayoutMap`); its mesh is the strategy's.
        batch_dim_name: The mesh axis the batch is split over (default: the mesh's first axis).
        device_mesh: The mesh, when no ``layout_map`` is given (every variable replicated).
        cluster_resolver: Where the cluster comes from (default: ``GRAPHDIST_CONFIG`` / ``TF_CONFIG``, else the
            MPI ranks, as for ``MultiWorkerMirroredStrategy``). With several workers the mesh is global: its
            batch axis spans the workers (worker ``w`` holds the devices of batch positions
            ``w * n / W ... (w + 1) * n / W - 1``, the other axes within it), weights split over the batch
            axis are FSDP across the workers, weights split over the other axes are split within each worker.

    Raises:
        InvalidArgumentError: No mesh, or ``batch_dim_name`` is not one of its axes; with several workers, a
            batch axis whose size is not a multiple of the worker count.
    """

    def __new__(cls, *args: Any, cluster_resolver: Any = None, **kwargs: Any) -> ModelParallelStrategy:
        # Several worker processes (TF_CONFIG / GRAPHDIST_CONFIG, or mpiexec): the batch axis spans the workers.
        if cls is ModelParallelStrategy and _worker_count(_resolver(cluster_resolver)) > 1:
            cls = _MultiWorkerModelParallelStrategy
        return super().__new__(cls)

    def __init__(self, layout_map: LayoutMap | None = None, batch_dim_name: str | None = None,
                 device_mesh: DeviceMesh | None = None, cluster_resolver: Any = None) -> None:
        self._init_mesh(layout_map, batch_dim_name, device_mesh)
        super().__init__([devices[0] for devices in self._spec.devices])
        logger.info("Using ModelParallelStrategy: mesh %s, batch over %r", self._mesh.shape, self._batch_dim_name)

    def _init_mesh(self, layout_map: LayoutMap | None, batch_dim_name: str | None,
                   device_mesh: DeviceMesh | None) -> None:
        if layout_map is not None and not isinstance(layout_map, LayoutMap):
            raise InvalidArgumentError(f"ModelParallelStrategy: layout_map must be a gd.experimental.LayoutMap, got "
                                       f"{type(layout_map).__name__}")
        mesh = layout_map.device_mesh if layout_map is not None else device_mesh
        if not isinstance(mesh, DeviceMesh):
            raise InvalidArgumentError("ModelParallelStrategy needs a mesh: give layout_map=gd.experimental.LayoutMap("
                                       "mesh) or device_mesh=gd.experimental.DeviceMesh(...)")
        batch = mesh.axis_names[0] if batch_dim_name is None else batch_dim_name
        if batch not in mesh.axis_names:
            raise InvalidArgumentError(f"ModelParallelStrategy: batch_dim_name {batch!r} is not an axis of the mesh "
                                       f"(axes: {', '.join(mesh.axis_names)}); name one of them")
        self._mesh = mesh
        self._layout_map = layout_map if layout_map is not None else LayoutMap(mesh)
        self._spec = MeshSpec.build(mesh.axis_names, mesh.shape, mesh.devices, batch)
        self._batch_dim_name = batch
        self._variables: list[weakref.ref] = []
        self._warned_patterns: set[str] = set()

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh."""
        return self._mesh

    @property
    def layout_map(self) -> LayoutMap:
        """The variable layouts."""
        return self._layout_map

    @property
    def batch_dim_name(self) -> str:
        """The mesh axis the batch is split over."""
        return self._batch_dim_name

    def _variable_class(self) -> type:
        return MirroredVariable

    def _create_variable(self, variable: Any) -> None:
        super()._create_variable(variable)
        self._variables.append(weakref.ref(variable))
        self._checked_layout(variable)  # a layout that cannot fit raises here, where the variable is made

    def variable_layout(self, variable: Any) -> AxisLayout:
        """The layout of ``variable``: its LayoutMap entry; an optimizer slot without one takes its variable's;
        else replicated.
        """
        return self._checked_layout(variable)

    def _checked_layout(self, variable: Any) -> AxisLayout:
        layout = self._layout_map[variable._name]
        primary = getattr(variable, "_slot_primary", None)
        if layout is None and primary is not None and tuple(primary.shape) == tuple(variable.shape):
            layout = self._layout_map[primary._name]
        if layout is None:
            return (None,) * len(variable.shape)
        _check_fits(variable, layout, self._mesh, self._batch_dim_name)
        if self._is_fsdp(layout) and any(axis not in (None, self._batch_dim_name) for axis in layout):
            raise NotImplementedError(
                f"variable {variable._name!r} is split over the batch axis {self._batch_dim_name!r} and over another "
                f"mesh axis (layout {layout}): FSDP over the batch axis and tensor parallelism over the other axes "
                "are not combined on one variable yet; split it over the batch axis alone (FSDP) or over the other "
                "axes alone")
        return layout

    def _is_fsdp(self, layout: AxisLayout) -> bool:
        """Whether ``layout`` shards a weight over the batch axis (FSDP / ZeRO-3)."""
        return self._mesh.axis_size(self._batch_dim_name) > 1 and self._batch_dim_name in layout

    def _sharded_parameters(self, variables: Sequence[Any]) -> tuple[str, ...]:
        """The names of the weights split over the batch axis: ``ShardParametersPass`` stores them in shards
        (their optimizer slots follow them there).
        """
        return tuple(v._name for v in variables
                     if getattr(v, "_slot_primary", None) is None and self._is_fsdp(self.variable_layout(v)))

    def stored_step_config(self, config: PipelineConfig, graph: Graph) -> PipelineConfig:
        """``config`` for re-planning a stored step (``graph``, traced), whose variables this strategy did not
        make: the FSDP weights are chosen by matching the layout map against the stored variables' names.

        A weight qualifies when its layout shards it over the batch axis and it is trainable or the step does
        not update it (an inference step's weights); an updated non-trainable variable (an optimizer slot, a
        moving statistic) follows its weight or stays replicated.
        """
        if config.shard_parameters:
            return config
        updated = {uid for _, uid in graph.meta.variable_updates} | {  # traced: updates are still nodes
            str(n.attrs.get("variable")) for n in graph.find_nodes("AssignVariable", GRAPHDIST_DOMAIN)}
        names = tuple(spec.name for _, spec in variable_specs(graph)
                      if (spec.trainable or spec.uid not in updated)
                      and self._is_fsdp(self._layout_map[spec.name] or ()))
        return config.replace(shard_parameters=names) if names else config

    def _tensor_layout(self, variable: Any) -> list[str | None]:
        """The layout the layout passes see: an FSDP weight is whole to them (gathered before use)."""
        layout = self.variable_layout(variable)
        return [None] * len(layout) if self._is_fsdp(layout) else list(layout)

    def _live_variables(self) -> list[Any]:
        alive = [v for v in (ref() for ref in self._variables) if v is not None]
        self._variables = [weakref.ref(v) for v in alive]
        return alive

    def _warn_unmatched_patterns(self, variables: Sequence[Any]) -> None:
        if not variables:  # a re-planned step: its variables are matched by name in the pass
            return
        for pattern in self._layout_map:
            if pattern in self._warned_patterns:
                continue
            if not any(pattern in self._layout_map.matching(v._name) for v in variables):
                self._warned_patterns.add(pattern)
                logger.warning("LayoutMap pattern %r matches none of the %d variable(s) of ModelParallelStrategy "
                               "(names: %s); check the pattern against the variables' names", pattern,
                               len(variables), ", ".join(sorted({v._name for v in variables})[:8]))

    def pipeline_config(self) -> PipelineConfig:
        """The synchronous pipeline over the batch axis's replicas plus the layout passes."""
        variables = self._live_variables()
        self._warn_unmatched_patterns(variables)
        layouts = {v.uid: self._tensor_layout(v) for v in variables}
        patterns = [(pattern, list(self._layout_map._layouts[pattern])) for pattern in self._layout_map
                    if not self._is_fsdp(self._layout_map._layouts[pattern])]
        return PipelineConfig(devices=self.extended.worker_devices, strategy=type(self).__name__,
                              collective_attrs={"algorithm": "ring"},
                              shard_parameters=self._sharded_parameters(variables),
                              layouts={"mesh": self._spec.to_json(), "variables": layouts, "patterns": patterns})

    def variable_placement(self, spec: VariableSpec, variable: Any = None) -> VariablePlacement:
        """Mirrored on every mesh device (a split variable's devices each use their block of it)."""
        devices = tuple(d for replica in self._spec.devices for d in replica)
        return VariablePlacement("mirrored" if len(devices) > 1 else "local", devices)

    def __repr__(self) -> str:
        return (f"ModelParallelStrategy(mesh={self._mesh.shape}, axis_names={self._mesh.axis_names}, "
                f"batch_dim_name={self._batch_dim_name!r})")


class _MultiWorkerModelParallelStrategy(ModelParallelStrategy, MultiWorkerMirroredStrategy):
    """``ModelParallelStrategy`` in a job of several worker processes (``ModelParallelStrategy(...)`` makes it).

    The mesh is global and its batch axis spans the workers: each worker runs the replicas of its block of
    batch positions, as ``MultiWorkerMirroredStrategy`` runs its local devices (global replica ids,
    cross-worker all-reduces through MPI), and a weight split over the batch axis is FSDP across every
    worker's replicas (``ShardParametersPass`` with the workers' communicator). The other axes stay within a
    worker (each worker holds whole batch positions, with all their devices): the layout passes split each
    replica over its devices on this worker's part of the mesh, as in one process. A model axis spanning
    workers cannot be expressed (a batch position's devices all belong to one worker).
    """

    _extended_cls = MultiWorkerExtended

    def __init__(self, layout_map: LayoutMap | None = None, batch_dim_name: str | None = None,
                 device_mesh: DeviceMesh | None = None, cluster_resolver: Any = None) -> None:
        self._init_mesh(layout_map, batch_dim_name, device_mesh)
        resolver = _resolver(cluster_resolver)
        workers = _worker_count(resolver)
        mesh, batch = self._mesh, self._batch_dim_name
        positions = mesh.axis_size(batch)
        if positions < workers:
            raise NotImplementedError(
                f"ModelParallelStrategy: the batch axis {batch!r} has {positions} position(s) for {workers} worker "
                "processes, so a model axis would span processes, which is not built yet (each worker holds whole "
                "batch positions with all their devices); give the batch axis at least one position per worker "
                f"(e.g. mesh shape ({workers}, ...)) and split the model within each worker, or use FSDP (a layout "
                "over the batch axis) to spread weights across the workers")
        if positions % workers:
            raise InvalidArgumentError(
                f"ModelParallelStrategy: the batch axis {batch!r} has {positions} positions, which {workers} worker "
                f"processes cannot share equally; give the mesh a batch axis of a multiple of {workers} (e.g. "
                f"{workers} for one device per worker)")
        per_worker = positions // workers
        rank = task_rank(resolver.cluster_spec(), resolver.task_type, resolver.task_id)
        mine = self._spec.devices[rank * per_worker:(rank + 1) * per_worker]  # per batch position: its devices
        shape = tuple(per_worker if name == batch else size for name, size in zip(mesh.axis_names, mesh.shape))
        self._local_spec = MeshSpec(mesh.axis_names, shape, batch, mine)
        local = [devices[0] for devices in mine]
        MultiWorkerMirroredStrategy.__init__(self, cluster_resolver=resolver, devices=local)
        logger.info("Using ModelParallelStrategy across %d workers: mesh %s, batch over %r, this worker's "
                    "devices %s", workers, mesh.shape, batch, local)

    @property
    def name(self) -> str:
        """``ModelParallelStrategy``, as plans and messages show it."""
        return "ModelParallelStrategy"

    def pipeline_config(self) -> PipelineConfig:
        """``MultiWorkerMirroredStrategy``'s pipeline with the FSDP weights stored in shards across the workers."""
        variables = self._live_variables()
        self._warn_unmatched_patterns(variables)
        config = MultiWorkerMirroredStrategy.pipeline_config(self).replace(
            strategy="ModelParallelStrategy", shard_parameters=self._sharded_parameters(variables))
        if all(size == 1 for name, size in zip(self._mesh.axis_names, self._mesh.shape)
               if name != self._batch_dim_name):
            return config  # nothing split within a replica: no layout passes
        layouts = {v.uid: self._tensor_layout(v) for v in variables}
        patterns = [(pattern, list(axes)) for pattern, axes in self._layout_map._layouts.items()
                    if not self._is_fsdp(axes)]
        # The layout passes see this worker's part of the mesh: its batch positions, each with its model devices.
        return config.replace(layouts={"mesh": self._local_spec.to_json(), "variables": layouts,
                                       "patterns": patterns})

    def variable_placement(self, spec: VariableSpec, variable: Any = None) -> VariablePlacement:
        """Mirrored on this worker's devices (FSDP weights: one shard per replica)."""
        return Strategy.variable_placement(self, spec, variable)

    def __repr__(self) -> str:
        return (f"ModelParallelStrategy(mesh={self._mesh.shape}, axis_names={self._mesh.axis_names}, "
                f"batch_dim_name={self._batch_dim_name!r}, worker={self._worker_index}/{self._num_workers})")


def _resolver(cluster_resolver: Any) -> Any:
    return cluster_resolver if cluster_resolver is not None else default_cluster_resolver()


def _worker_count(resolver: Any) -> int:
    """How many synchronous worker processes the cluster has (1 outside a cluster), as
    ``MultiWorkerMirroredStrategy`` counts them.
    """
    spec = resolver.cluster_spec()
    workers = spec.num_tasks("chief") + spec.num_tasks("worker")
    return workers if resolver.task_type in (None, "chief", "worker") and workers > 1 else 1


def with_sharding_constraint(x: Any, layout: Any) -> Any:
    """Pins the layout of ``x`` (JAX's name): one mesh axis, or ``None``, per dimension.

    Numerically the identity. Inside a step traced under :class:`ModelParallelStrategy` it is a
    ``graphdist.ShardingConstraint`` node the layout passes honour (resharding there if needed);
    under any other strategy, and outside a trace, it returns ``x`` unchanged.

    Raises:
        InvalidArgumentError: ``layout`` has another rank than ``x``, or names an axis the strategy's
            mesh lacks, or an axis does not divide its dimension.
    """
    axes = layout.axes if isinstance(layout, TensorLayout) else _axes_tuple(layout, "with_sharding_constraint layout")
    shape = tuple(getattr(x, "shape", np.shape(x)))
    if len(axes) != len(shape):
        raise InvalidArgumentError(f"with_sharding_constraint: layout {axes} has {len(axes)} entries but the value has "
                                   f"rank {len(shape)} (shape {shape}); give one mesh axis or None per dimension")
    strategy = get_strategy()
    ctx = current_trace()
    if not isinstance(strategy, ModelParallelStrategy):
        return x
    _check_axis_names(axes, strategy.device_mesh, "with_sharding_constraint layout")
    for dim, (size, axis) in enumerate(zip(shape, axes)):
        # The batch axis made the replicas: a traced value is already one replica's share of the batch.
        if axis not in (None, strategy.batch_dim_name) and isinstance(size, int) \
                and size % strategy.device_mesh.axis_size(axis):
            raise InvalidArgumentError(
                f"with_sharding_constraint: dimension {dim} (size {size}) is not divisible by mesh axis {axis!r} "
                f"(size {strategy.device_mesh.axis_size(axis)}); use a layout whose axis divides it, or None")
    from graphdist.trace.tensor import Tensor

    if ctx is None or not isinstance(x, Tensor):
        return x
    (out,) = ctx.emit(SHARDING_CONSTRAINT, [x.value], {"layout": [a or "" for a in axes]}, domain=GRAPHDIST_DOMAIN)
    return out


# ------------------------------------------------------------------ checks
def _axes_tuple(layout: Any, what: str) -> AxisLayout:
    if isinstance(layout, str) or layout is None:
        layout = (layout,)
    if not isinstance(layout, (list, tuple)) or any(a is not None and not isinstance(a, str) for a in layout):
        raise InvalidArgumentError(f"{what} must be a tuple with a mesh axis name or None per dimension, such as "
                                   f"(None, 'model'), got {layout!r}")
    return tuple(layout)


def _check_axis_names(axes: AxisLayout, mesh: DeviceMesh, what: str) -> None:
    unknown = [a for a in axes if a is not None and a not in mesh.axis_names]
    if unknown:
        raise InvalidArgumentError(f"{what} = {axes} names unknown mesh axis {unknown[0]!r}; the mesh's axes are "
                                   f"{', '.join(mesh.axis_names)}")
    named = [a for a in axes if a is not None]
    if len(set(named)) != len(named):
        raise InvalidArgumentError(f"{what} = {axes} uses a mesh axis on two dimensions; each axis may split one "
                                   "dimension")


def _check_fits(variable: Any, layout: AxisLayout, mesh: DeviceMesh, batch_axis: str | None = None) -> None:
    shape = tuple(variable.shape)
    if len(layout) != len(shape):
        raise InvalidArgumentError(
            f"variable {variable._name!r} has rank {len(shape)} (shape {shape}) but its layout {layout} has "
            f"{len(layout)} entries; give the LayoutMap one mesh axis or None per dimension of it")
    for dim, (size, axis) in enumerate(zip(shape, layout)):
        # A weight sharded over the batch axis (FSDP) is flattened and padded into equal shards: any size fits.
        if axis is not None and axis != batch_axis and size % mesh.axis_size(axis):
            raise InvalidArgumentError(
                f"variable {variable._name!r}: dimension {dim} (size {size}) is not divisible by mesh axis {axis!r} "
                f"(size {mesh.axis_size(axis)}); pad the dimension to a multiple of {mesh.axis_size(axis)}, or "
                "leave it None in the LayoutMap")
