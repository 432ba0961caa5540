"""``ParameterServerStrategy``: asynchronous training with variables on ps tasks.

This follows the seed's (``tf.compat.v1``) parameter server strategy: every
worker runs the same program independently; ps tasks run the built-in
server (:class:`graphdist.runtime.ps_server.Server`, started by
``graphdist launch --ps M``).

* **Placement**: variables created in the scope are assigned to ps tasks
  round-robin in creation order; a ``variable_partitioner``
  (:class:`FixedShardsPartitioner`, :class:`MinSizePartitioner`,
  :class:`MaxSizePartitioner`) splits large ones along axis 0 into shards,
  each shard on the next ps task. Every shard lives on exactly one ps.
* **Steps**: :class:`graphdist.passes.place_ps_variables.PlacePSVariablesPass` makes
  the step pull every variable it reads from its ps at the start
  (``graphdist.PSPull``) and push its update at the end
  (``graphdist.PSPush``): the update pushed is the new value minus the
  pulled one (``-learning_rate * gradient`` for SGD), and the ps adds it to
  its copy as it arrives, so workers proceed asynchronously.
* **Replicas**: a worker's local devices run in sync, like
  ``MirroredStrategy`` (the optimizer all-reduces their gradients and one
  update per worker is pushed); ``num_replicas_in_sync`` is the number of
  local replicas. Ops that run once per step (the optimizer's
  ``iterations``, the global step) run once per worker step (their update
  is pushed once, from the worker's first device): the ps's step count is
  the total over all workers.
* **Data**: each worker iterates its own input (shard it by worker with
  ``dataset.shard(num_workers, worker_index)`` for disjoint data;
  :meth:`ParameterServerStrategy.worker_index` / ``num_workers``).

Not implemented: TF2's ``ClusterCoordinator`` (``schedule`` / ``join``,
where one coordinator dispatches functions to workers) raises
``NotImplementedError`` (:mod:`graphdist.distribute.coordinator`); reading a variable eagerly pulls it from its ps.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist.compile.pipeline import PipelineConfig
from graphdist.distribute.cluster import ClusterResolver
from graphdist.distribute.coordinator import ClusterCoordinator  # noqa: F401  (its former home)
from graphdist.distribute.cross_device_ops import NcclAllReduce
from graphdist.distribute.strategy import Strategy, StrategyExtended
from graphdist.errors import ClusterConfigError, InvalidArgumentError
from graphdist.ir.placement import Shard, VariablePlacement, VariableSpec
from graphdist.runtime.devices import num_gpus
from graphdist.runtime.ps_server import shared_client
from graphdist.trace.variables import Variable

__all__ = [
    "ParameterServerStrategy",
    "PSVariable",
    "FixedShardsPartitioner",
    "MinSizePartitioner",
    "MaxSizePartitioner",
]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------ partitioners
class _Partitioner:
    """A ``variable_partitioner``: ``partitioner(shape, dtype) -> [shards along axis 0, 1, 1, ...]``."""

    def _shards(self, shape: Sequence[int], dtype: Any) -> int:
        raise NotImplementedError

    def __call__(self, shape: Sequence[int], dtype: Any) -> list[int]:
        shape = tuple(int(d) for d in shape)
        if not shape:
            return []
        count = max(1, min(self._shards(shape, np.dtype(dtype)), shape[0]))
        return [count] + [1] * (len(shape) - 1)


class FixedShardsPartitioner(_Partitioner):
    """Splits every variable into ``num_shards`` shards along axis 0 (fewer if it has fewer rows).

    Raises:
        InvalidArgumentError: ``num_shards`` is not an int >= 1.
    """

    def __init__(self, num_shards: int) -> None:
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise InvalidArgumentError(f"FixedShardsPartitioner: num_shards must be an int >= 1, got {num_shards!r}")
        self.num_shards = num_shards

    def _shards(self, shape: Sequence[int], dtype: Any) -> int:
        return self.num_shards


class MinSizePartitioner(_Partitioner):
    """As many shards as keep each at least ``min_shard_bytes``, at most ``max_shards``."""

    def __init__(self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16) -> None:
        for label, value in (("min_shard_bytes", min_shard_bytes), ("max_shards", max_shards)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"MinSizePartitioner: {label} must be an int >= 1, got {value!r}")
        self.min_shard_bytes, self.max_shards = min_shard_bytes, max_shards

    def _shards(self, shape: Sequence[int], dtype: Any) -> int:
        total = int(np.prod(shape)) * dtype.itemsize
        return max(1, min(self.max_shards, total // self.min_shard_bytes))


class MaxSizePartitioner(_Partitioner):
    """As few shards as keep each at most ``max_shard_bytes`` (at most ``max_shards`` when given)."""

    def __init__(self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16) -> None:
        if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
            raise InvalidArgumentError(f"MaxSizePartitioner: max_shard_bytes must be an int >= 1, got "
                                       f"{max_shard_bytes!r}")
        self.max_shard_bytes, self.max_shards = max_shard_bytes, max_shards

    def _shards(self, shape: Sequence[int], dtype: Any) -> int:
        total = int(np.prod(shape)) * dtype.itemsize
        count = -(-total // self.max_shard_bytes)
        return min(count, self.max_shards) if self.max_shards else count


# ------------------------------------------------------------ variables
class PSVariable(Variable):
    """A variable stored on parameter servers (one ps per shard).

    The worker keeps a cache of the last value it pulled or that its push
    returned; :meth:`numpy` pulls the current value, ``assign`` writes it on
    the ps tasks.
    """

    _ps_shards: list[Shard]
    _lives_remotely = True

    @property
    def shards(self) -> list[Shard]:
        """Where the variable lives: one :class:`Shard` per ps placement."""
        return list(self._ps_shards)

    def numpy(self) -> np.ndarray:
        """The current value on the ps tasks."""
        self._value = self._strategy._pull(self)
        return super().numpy()

    def assign(self, value: Any, read_value: bool = True) -> Any:
        """Sets the value (on the ps tasks when not traced)."""
        from graphdist.trace.tracer import current_trace

        result = super().assign(value, read_value)
        if current_trace() is None and getattr(self, "_ps_shards", None):
            self._strategy._assign(self, self._value)
        return result


# ------------------------------------------------------------ strategy
class ParameterServerExtended(StrategyExtended):
    """``strategy.extended`` of :class:`ParameterServerStrategy`."""

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The ps tasks' devices."""
        spec = self._strategy._spec
        return tuple(f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in spec.task_indices("ps"))

    @property
    def should_checkpoint(self) -> bool:
        """True on the chief (or worker 0 without a chief)."""
        return self._strategy._is_chief


class ParameterServerStrategy(Strategy):
    """Asynchronous data parallelism: variables on ps tasks, workers pull and push.

    Args:
        cluster_resolver: The cluster (default: ``GRAPHDIST_CONFIG`` / ``TF_CONFIG``).
        variable_partitioner: Shards variables along axis 0 (``None``: no sharding).
        devices: This worker's devices (default: the resolver's
            ``local_devices``, else every GPU, else ``["cpu:0"]``).

    Raises:
        ClusterConfigError: The cluster has no ps or worker tasks, or this
            process is a ps task (ps tasks run ``gd.Server``).
        InvalidArgumentError: ``variable_partitioner`` is not callable.
    """

    _extended_cls = ParameterServerExtended

    def __init__(self, cluster_resolver: ClusterResolver | None = None, variable_partitioner: Any = None,
                 devices: Sequence[Any] | None = None) -> None:
        from graphdist.distribute.multi_worker import default_cluster_resolver

        resolver = cluster_resolver if cluster_resolver is not None else default_cluster_resolver()
        spec = resolver.cluster_spec()
        if "ps" not in spec.jobs:
            raise ClusterConfigError(
                "ParameterServerStrategy needs ps tasks in the cluster (GRAPHDIST_CONFIG / TF_CONFIG 'cluster' with a "
                "'ps' job); start the job with graphdist launch --workers N --ps M")
        if spec.num_tasks("worker") + spec.num_tasks("chief") == 0:
            raise ClusterConfigError("ParameterServerStrategy needs at least one worker task in the cluster")
        if resolver.task_type not in ("chief", "worker"):
            raise ClusterConfigError(
                f"this task is {resolver.task_type!r}; ParameterServerStrategy runs on chief and worker tasks, "
                "ps tasks run the built-in server (python -m graphdist.runtime.ps_server, started by graphdist launch)")
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise InvalidArgumentError(f"variable_partitioner must be callable(shape, dtype), e.g. "
                                       f"gd.FixedShardsPartitioner(2), got {variable_partitioner!r}")
        if devices is None:
            devices = resolver.local_devices or [f"cuda:{i}" for i in range(num_gpus())] or ["cpu:0"]
        super().__init__(devices)
        self._resolver = resolver
        self._spec = spec
        self._partitioner = variable_partitioner
        self._ps_tasks = spec.task_indices("ps")
        self._next_ps = itertools.count()
        self._keys: dict[str, int] = {}
        self._client = shared_client(spec, resolver.task_type, resolver.task_id)
        workers = [(job, i) for job in ("chief", "worker") if job in spec.jobs for i in spec.task_indices(job)]
        self._num_workers = len(workers)
        self._worker_index = workers.index((resolver.task_type, resolver.task_id))
        self._is_chief = resolver.task_type == "chief" or ("chief" not in spec.jobs and self._worker_index == 0)
        logger.info("ParameterServerStrategy: %s %d, %d ps task(s), local devices %s", resolver.task_type,
                    resolver.task_id, len(self._ps_tasks), self.extended.worker_devices)

    @property
    def cluster_resolver(self) -> ClusterResolver:
        """The resolver the cluster came from."""
        return self._resolver

    @property
    def num_workers(self) -> int:
        """Number of worker tasks (chief included)."""
        return self._num_workers

    @property
    def worker_index(self) -> int:
        """This worker's index among the workers (chief first), for sharding input."""
        return self._worker_index

    # ------------------------------------------------------------ variables
    def _variable_class(self) -> type:
        return PSVariable

    def _create_variable(self, variable: Any) -> None:
        variable._strategy = self
        shape = variable.shape
        counts = self._partitioner(shape, variable.dtype) if (self._partitioner is not None and shape) else []
        count = int(counts[0]) if counts else 1
        base = self._unique_key(variable._name)
        rows = shape[0] if shape else 1
        shards = []
        for index in range(count):
            start, stop = index * rows // count, (index + 1) * rows // count
            ps = self._ps_tasks[next(self._next_ps) % len(self._ps_tasks)]
            shards.append(Shard(ps, base if count == 1 else f"{base}/part_{index}", start, stop))
        variable._ps_shards = shards
        variable._device = ",".join(sorted({f"/job:ps/replica:0/task:{s.ps}/device:CPU:0" for s in shards}))
        value = variable._value
        parts = [self._client.request("create", s.ps, s.key, self._part(value, s, count), self._part(value, s, count))
                 for s in shards]
        variable._value = self._join(parts, count, value)

    def _unique_key(self, name: str) -> str:
        # Workers create variables in the same order, so the n-th variable called `name` gets the same key.
        seen = self._keys.get(name, 0)
        self._keys[name] = seen + 1
        return name if seen == 0 else f"{name}_{seen}"

    @staticmethod
    def _part(value: np.ndarray, shard: Shard, count: int) -> np.ndarray:
        return value if count == 1 else np.ascontiguousarray(value[shard.start: shard.stop])

    @staticmethod
    def _join(parts: list[np.ndarray], count: int, like: np.ndarray) -> np.ndarray:
        return parts[0] if count == 1 else np.concatenate(parts, axis=0).astype(like.dtype, copy=False)

    def _pull(self, variable: PSVariable) -> np.ndarray:
        count = len(variable._ps_shards)
        parts = [self._client.request("pull", s.ps, s.key, self._part(variable._value, s, count))
                 for s in variable._ps_shards]
        return self._join(parts, count, variable._value)

    def _assign(self, variable: PSVariable, value: np.ndarray) -> None:
        count = len(variable._ps_shards)
        for s in variable._ps_shards:
            part = self._part(value, s, count)
            self._client.request("assign", s.ps, s.key, part, part)

    # ------------------------------------------------------------- pipeline
    def pipeline_config(self) -> PipelineConfig:
        """The synchronous pipeline of the local replicas, with variables read and updated through the
        ps tasks (``PlacePSVariablesPass`` reads the shards from the graph's placement spec).
        """
        return PipelineConfig(devices=self.extended.worker_devices, strategy=type(self).__name__,
                              collective_attrs=NcclAllReduce().collective_attrs(), parameter_servers=True)

    def variable_placement(self, spec: VariableSpec, variable: Any = None) -> VariablePlacement:
        """The shards the variable was created with on the ps tasks."""
        shards = getattr(variable, "_ps_shards", None)
        if not shards:
            raise ClusterConfigError(
                f"variable {spec.name!r} was not created in this ParameterServerStrategy's scope, so it has no "
                "place on the parameter servers; create it inside strategy.scope()")
        devices = tuple(sorted({f"/job:ps/replica:0/task:{s.ps}/device:CPU:0" for s in shards}))
        return VariablePlacement("ps", devices, tuple(shards))

    def value_placement(self, spec: VariableSpec, value: Any) -> VariablePlacement:
        """A re-planned step's variable is created on the ps tasks (with the plan's value), like one made in
        the scope: every worker re-plans the same plan, so the n-th variable gets the same shards everywhere.
        """
        with self.scope():
            variable = Variable(value, name=spec.name, trainable=spec.trainable)
        return self.variable_placement(spec, variable)

    def __repr__(self) -> str:
        return (f"ParameterServerStrategy({self._resolver.task_type} {self._resolver.task_id}, "
                f"ps={len(self._ps_tasks)}, devices={list(self.extended.worker_devices)})")


