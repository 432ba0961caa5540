"""TPU-like accelerators: ``TPUClusterResolver``, topology, ``DeviceAssignment`` and ``TPUStrategy``.

A TPU-like system here is a mesh of ``tpu:N`` cores. No such hardware exists
on the machines graphdist runs on today, so the cores are **simulated on the
host**: each core is a device of the scheduler (its own thread and share of
the host's cores), every program is compiled by TVM (backend ``"tvm"``, the
``tpu`` target builds host code with the CPU schedules), and collectives
between cores run on the local communicator. ``TPUClusterResolver`` says so
(``simulated`` is ``True`` and a log line tells it once).

The mesh of ``local[N]`` is ``[1, 1, N // 2, 2]`` (two cores per chip, as
TPU v3/v4 hosts) for even ``N``, else ``[1, 1, N, 1]``. A
``DeviceAssignment`` tiles it with a ``computation_shape`` (cores per
replica along each mesh axis); replica ``r``'s logical core ``l`` is
``tpu:(r * cores_per_replica + l)``.

``TPUStrategy`` is ``MirroredStrategy`` on the replicas' first logical cores
(synchronous, mirrored variables, all-reduce along the mesh) plus:

* whole-step compilation only: ``strategy.run`` outside a ``gd.function``
  raises (the seeds: "Eager mode ... not supported for TPUStrategy");
* logical devices: ``experimental_assign_to_logical_device`` and
  ``experimental_split_to_logical_devices`` annotate values; the passes
  ``PlaceLogicalDevicesPass`` and ``ShardLogicalDevicesPass`` place and split
  the computation, and ``PartitionPass`` inserts the transfers between
  logical cores (model parallelism inside a replica).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist.compile.pipeline import PipelineConfig
from graphdist.distribute.cross_device_ops import NcclAllReduce
from graphdist.distribute.strategy import Strategy
from graphdist.distribute.variables import MirroredVariable
from graphdist.errors import ClusterConfigError, InvalidArgumentError, PlanError
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.ir.placement_ops import LOGICAL_DEVICE, SPLIT_TO_LOGICAL_DEVICES
from graphdist.trace.tracer import current_trace

__all__ = [
    "DEFAULT_LOCAL_CORES",
    "DeviceAssignment",
    "TPUClusterResolver",
    "UnsupportedTPUError",
    "TPUStrategy",
    "Topology",
    "initialize_tpu_system",
]

logger = logging.getLogger(__name__)

#: Cores of ``TPUClusterResolver()`` / ``tpu=""`` (a v3-8-like host).
DEFAULT_LOCAL_CORES = 8
_LOCAL = re.compile(r"^\s*local(?:\[(\d+)\])?\s*$", re.IGNORECASE)
_told_simulated = False


class UnsupportedTPUError(ClusterConfigError, NotImplementedError):
    """A TPU other than this host's simulated cores was asked for (a ``grpc://`` address, a Cloud TPU name)."""


class TPUClusterResolver:
    """Locates the TPU-like cores: ``tpu="local[N]"`` is N cores on this host.

    ``tpu=None`` or ``""`` (as in Colab) means ``local[8]``. Remote TPU
    addresses (``grpc://...``, names of Cloud TPUs) are not supported: there is
    no TPU service to reach.

    Attributes:
        num_cores: Cores of the mesh.
        simulated: ``True``: the cores are simulated on the host (no TPU-like hardware here).
        task_type: ``"worker"``.
        task_id: ``0``.
    """

    def __init__(self, tpu: str | None = None, zone: str | None = None, project: str | None = None) -> None:
        global _told_simulated
        spec = "" if tpu is None else tpu
        if not isinstance(spec, str):
            raise InvalidArgumentError(f"TPUClusterResolver: tpu must be a string such as 'local[8]', got "
                                       f"{type(tpu).__name__}")
        match = _LOCAL.match(spec) if spec.strip() else None
        if spec.strip() and match is None:
            raise UnsupportedTPUError(
                f"TPUClusterResolver(tpu={tpu!r}): only local[N], '' and None are supported here (N TPU-like cores "
                "simulated on this host; '' and None mean local[8]); remote TPUs (grpc://..., Cloud TPU names) "
                "cannot be reached: there is no TPU service to connect to")
        cores = int(match.group(1)) if match is not None and match.group(1) else DEFAULT_LOCAL_CORES
        if cores < 1:
            raise InvalidArgumentError(f"TPUClusterResolver(tpu={tpu!r}): a mesh needs at least one core")
        self.num_cores = cores
        self.simulated = True
        self.task_type = "worker"
        self.task_id = 0
        self.zone, self.project = zone, project
        if not _told_simulated:
            logger.info("TPU-like cores: %d simulated on the host (no TPU-like hardware on this machine)", cores)
            _told_simulated = True

    def master(self) -> str:
        """``"local"``: the cores are in this process."""
        return "local"

    def cluster_spec(self) -> dict[str, list[str]]:
        """One worker (this host)."""
        return {"worker": ["localhost"]}

    def num_accelerators(self) -> dict[str, int]:
        """``{"TPU": num_cores}``."""
        return {"TPU": self.num_cores}

    def devices(self) -> list[str]:
        """``["tpu:0", ..., "tpu:N-1"]``."""
        return [f"tpu:{i}" for i in range(self.num_cores)]

    def __repr__(self) -> str:
        return f"TPUClusterResolver(tpu='local[{self.num_cores}]', simulated=True)"


class Topology:
    """The mesh of a TPU-like system.

    Attributes:
        mesh_shape: ``[x, y, z, cores_per_chip]``.
        num_tasks: Hosts (1).
        num_tpus_per_task: Cores per host.
    """

    def __init__(self, mesh_shape: Sequence[int]) -> None:
        self.mesh_shape = [int(d) for d in mesh_shape]
        self.num_tasks = 1
        self.num_tpus_per_task = int(np.prod(self.mesh_shape))

    @property
    def device_coordinates(self) -> np.ndarray:
        """``[1, cores, 4]``: each core's mesh coordinates, in core order."""
        coords = np.array(list(np.ndindex(*self.mesh_shape)), dtype=np.int32)
        return coords.reshape(1, -1, len(self.mesh_shape))

    def __repr__(self) -> str:
        return f"Topology(mesh_shape={self.mesh_shape})"


def _mesh_for(cores: int) -> list[int]:
    return [1, 1, cores // 2, 2] if cores % 2 == 0 else [1, 1, cores, 1]


def initialize_tpu_system(cluster_resolver: TPUClusterResolver | None = None) -> Topology:
    """Initializes the (simulated) TPU-like system and returns its topology."""
    resolver = cluster_resolver if cluster_resolver is not None else TPUClusterResolver()
    if not isinstance(resolver, TPUClusterResolver):
        raise InvalidArgumentError(f"initialize_tpu_system: cluster_resolver must be a TPUClusterResolver, got "
                                   f"{type(resolver).__name__}")
    return Topology(_mesh_for(resolver.num_cores))


class DeviceAssignment:
    """Which mesh cores run which replica's logical cores.

    Build it with :meth:`build`. Attributes follow ``tf.tpu.experimental.DeviceAssignment``.

    Attributes:
        topology: The mesh.
        num_replicas: Replicas.
        num_cores_per_replica: Logical cores of each replica.
        computation_shape: Cores of one replica along each mesh axis.
    """

    def __init__(self, topology: Topology, computation_shape: Sequence[int], num_replicas: int) -> None:
        self.topology = topology
        self.computation_shape = [int(d) for d in computation_shape]
        self.num_replicas = int(num_replicas)
        self.num_cores_per_replica = int(np.prod(self.computation_shape))

    @classmethod
    def build(cls, topology: Topology, computation_shape: Sequence[int] | None = None,
              computation_stride: Sequence[int] | None = None, num_replicas: int | None = None) -> DeviceAssignment:
        """Tiles ``topology``'s mesh with replicas of ``computation_shape`` cores.

        Args:
            topology: From :func:`initialize_tpu_system`.
            computation_shape: Cores per replica along each mesh axis (default one core).
            computation_stride: Only the default (1s) is supported.
            num_replicas: Replicas (default: as many as fit).

        Raises:
            ValueError: The shape does not fit the mesh, or too many replicas are asked for.
        """
        mesh = topology.mesh_shape
        shape = [1] * len(mesh) if computation_shape is None else [int(d) for d in computation_shape]
        if len(shape) != len(mesh) or any(d < 1 for d in shape):
            raise InvalidArgumentError(f"computation_shape {shape} must have {len(mesh)} positive entries "
                                       f"(one per mesh axis of {mesh})")
        if any(m % d for m, d in zip(mesh, shape)):
            raise InvalidArgumentError(f"computation_shape {shape} does not tile the mesh {mesh}: each entry must "
                                       "divide the mesh's size along that axis")
        if computation_stride is not None and any(int(s) != 1 for s in computation_stride):
            raise NotImplementedError("DeviceAssignment.build: only computation_stride of ones is supported")
        fit = int(np.prod(mesh)) // int(np.prod(shape))
        replicas = fit if num_replicas is None else int(num_replicas)
        if not 1 <= replicas <= fit:
            raise InvalidArgumentError(f"num_replicas={num_replicas} does not fit: the mesh {mesh} holds {fit} "
                                       f"replicas of computation_shape {shape}")
        return cls(topology, shape, replicas)

    def tpu_device(self, replica: int = 0, logical_core: int = 0) -> str:
        """The device running ``logical_core`` of ``replica``."""
        return f"tpu:{replica * self.num_cores_per_replica + logical_core}"

    def cores(self) -> list[list[str]]:
        """``cores()[replica][logical_core]`` -> device."""
        return [[self.tpu_device(r, c) for c in range(self.num_cores_per_replica)] for r in range(self.num_replicas)]

    def __repr__(self) -> str:
        return (f"DeviceAssignment(num_replicas={self.num_replicas}, "
                f"num_cores_per_replica={self.num_cores_per_replica}, computation_shape={self.computation_shape})")


class TPUStrategy(Strategy):
    """Synchronous training on TPU-like cores, compiled whole by TVM (see the module docstring).

    Args:
        cluster_resolver: A :class:`TPUClusterResolver` (default ``local[8]``).
        experimental_device_assignment: A :class:`DeviceAssignment` (default one core per replica,
            every core a replica). ``device_assignment`` is accepted as its alias.
        experimental_spmd_xla_partitioning: Accepted for compatibility; graphdist's splitting is
            always per logical device.
    """

    def __init__(self, cluster_resolver: TPUClusterResolver | None = None,
                 experimental_device_assignment: DeviceAssignment | None = None,
                 experimental_spmd_xla_partitioning: bool = False,
                 device_assignment: DeviceAssignment | None = None) -> None:
        resolver = cluster_resolver if cluster_resolver is not None else TPUClusterResolver()
        if not isinstance(resolver, TPUClusterResolver):
            raise InvalidArgumentError(f"TPUStrategy: cluster_resolver must be a gd.cluster_resolver."
                                       f"TPUClusterResolver, got {type(resolver).__name__}")
        assignment = experimental_device_assignment or device_assignment
        if assignment is None:
            assignment = DeviceAssignment.build(initialize_tpu_system(resolver))
        if not isinstance(assignment, DeviceAssignment):
            raise InvalidArgumentError(f"TPUStrategy: experimental_device_assignment must be a DeviceAssignment "
                                       f"(DeviceAssignment.build(topology, ...)), got {type(assignment).__name__}")
        if assignment.num_replicas * assignment.num_cores_per_replica > resolver.num_cores:
            raise InvalidArgumentError(f"{assignment!r} needs more cores than the resolver's {resolver.num_cores}")
        self._resolver = resolver
        self._device_assignment = assignment
        super().__init__([assignment.tpu_device(r, 0) for r in range(assignment.num_replicas)])
        self._cross_device_ops = NcclAllReduce()  # a ring along the mesh
        logger.info("Using TPUStrategy: %d replicas x %d logical cores (simulated on the host)",
                    assignment.num_replicas, assignment.num_cores_per_replica)

    @property
    def cluster_resolver(self) -> TPUClusterResolver:
        """The resolver given (or the default ``local[8]`` one)."""
        return self._resolver

    @property
    def device_assignment(self) -> DeviceAssignment:
        """Which cores run which replica's logical cores."""
        return self._device_assignment

    def pipeline_config(self) -> PipelineConfig:
        """The synchronous pipeline (a ring along the mesh) plus the device assignment's logical cores,
        compiled whole by TVM.
        """
        return PipelineConfig(devices=self.extended.worker_devices, strategy=type(self).__name__,
                              collective_attrs=self._cross_device_ops.collective_attrs(),
                              logical_cores=tuple(tuple(c) for c in self._device_assignment.cores()), backend="tvm")

    def _variable_class(self) -> type:
        return MirroredVariable

    def run(self, fn: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
            options: Any = None) -> Any:
        """Runs ``fn`` on every replica, inside a ``gd.function`` only (whole-step compilation)."""
        if current_trace() is None:
            raise PlanError(
                "TPUStrategy compiles whole steps: strategy.run must be called inside a gd.function "
                "(eager mode is not supported for TPUStrategy). Wrap the step: "
                "`@gd.function\ndef train_step(x): return strategy.run(step_fn, args=(x,))`")
        return super().run(fn, args, kwargs, options)

    # ------------------------------------------------------- logical devices
    def _check_logical_device(self, logical_device_id: Any) -> int:
        cores = self._device_assignment.num_cores_per_replica
        if isinstance(logical_device_id, bool) or not isinstance(logical_device_id, (int, np.integer)) \
                or not 0 <= int(logical_device_id) < cores:
            raise InvalidArgumentError(
                f"logical_device_id {logical_device_id!r} is not consistent with the total number of partitions "
                f"specified by the device assignment ({cores} logical device(s) per replica: ids 0 to {cores - 1})")
        return int(logical_device_id)

    def experimental_assign_to_logical_device(self, tensor: Any, logical_device_id: int) -> Any:
        """Annotates ``tensor`` to be computed on logical device ``logical_device_id`` of its replica.

        Returns:
            A value identical to ``tensor``.

        Raises:
            ValueError: The id is not below the device assignment's logical devices per replica.
        """
        logical = self._check_logical_device(logical_device_id)
        return _annotate(tensor, LOGICAL_DEVICE, {"logical_device": logical})

    def experimental_split_to_logical_devices(self, tensor: Any, partition_dimensions: Sequence[int]) -> Any:
        """Annotates ``tensor`` to be tiled over the replica's logical devices.

        Args:
            tensor: A traced value with a static shape.
            partition_dimensions: Tiles along each dimension; their product must equal the
                logical devices per replica, and each must divide its dimension.

        Raises:
            ValueError: The partition does not match the tensor or the device assignment.
        """
        cores = self._device_assignment.num_cores_per_replica
        parts = [int(p) for p in partition_dimensions]
        shape = tuple(getattr(tensor, "shape", np.shape(tensor)))
        if len(parts) != len(shape) or any(p < 1 for p in parts):
            raise InvalidArgumentError(f"partition_dimensions {parts} must have one positive entry per dimension "
                                       f"of the tensor (shape {shape})")
        if int(np.prod(parts)) != cores:
            raise InvalidArgumentError(f"partition_dimensions {parts} make {int(np.prod(parts))} tiles but each "
                                       f"replica has {cores} logical device(s); their product must be {cores}")
        if any(not isinstance(d, int) or d % p for d, p in zip(shape, parts)):
            raise InvalidArgumentError(f"partition_dimensions {parts} do not divide the tensor's shape {shape} "
                                       "evenly; each dimension must be static and divisible by its entry")
        return _annotate(tensor, SPLIT_TO_LOGICAL_DEVICES, {"partition_dimensions": parts})

    def experimental_replicate_to_logical_devices(self, tensor: Any) -> Any:
        """Annotates ``tensor`` to be replicated on every logical device: values are read where needed,
        so this returns ``tensor`` unchanged.
        """
        return tensor

    def __repr__(self) -> str:
        return f"TPUStrategy({self._resolver!r}, {self._device_assignment!r})"


def _annotate(tensor: Any, op_type: str, attrs: dict[str, Any]) -> Any:
    """Emits the annotation on a traced tensor; a concrete value has nothing to place."""
    ctx = current_trace()
    from graphdist.trace.tensor import Tensor

    if ctx is None or not isinstance(tensor, Tensor):
        return tensor
    (out,) = ctx.emit(op_type, [tensor.value], attrs, domain=GRAPHDIST_DOMAIN)
    return out
