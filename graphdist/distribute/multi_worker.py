"""``MultiWorkerMirroredStrategy``: synchronous data parallelism across processes.

Each worker (an MPI rank started by ``graphdist launch`` or ``mpiexec``)
runs the same program on its local devices, like ``MirroredStrategy``; its
pipeline configuration is the synchronous one with two differences:

* ``ReplicatePass`` numbers the local replicas among all workers'
  (``replica_offset``: ``replica_id_in_sync_group`` is global);
* :class:`graphdist.passes.insert_cross_worker_collectives.InsertCrossWorkerCollectivesPass`
  (the ``cross_worker`` slot) follows every local all-reduce / all-gather
  group with a cross-worker one (hierarchical reduction: the local devices
  first, then the workers through MPI, :mod:`graphdist.runtime.comm.mpi`).

Variables are :class:`~graphdist.distribute.variables.MirroredVariable` objects:
every worker holds its own copy, initialised from worker 0's value (a
broadcast at creation, as tf.distribute does) and updated by every worker
with the same all-reduced gradients, so the copies stay equal.

Input: ``experimental_distribute_dataset`` shards each global batch across
workers by data: worker ``w`` of ``W`` with ``k`` replicas each gets the
slices of replicas ``w*k .. w*k+k-1`` (non-overlapping; together the whole
global batch). ``distribute_datasets_from_function`` passes
``InputContext(num_input_pipelines=W, input_pipeline_id=w, ...)``.

Without a cluster (no ``GRAPHDIST_CONFIG`` / ``TF_CONFIG``, not under MPI)
it trains on the local devices alone, like TensorFlow's single-worker mode.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.compile.pipeline import PipelineConfig
from graphdist.distribute.cluster import (
    ClusterResolver,
    MPIClusterResolver,
    TFConfigClusterResolver,
    task_rank,
)
from graphdist.distribute.cross_device_ops import NcclAllReduce
from graphdist.distribute.reduce_op import ReduceOp
from graphdist.distribute.strategy import (
    Strategy,
    StrategyExtended,
    _check_axis,
    _divide_keep_dtype,
    _is_traced,
    note_replica_count_read,
)
from graphdist.distribute.variables import MirroredVariable
from graphdist.errors import ClusterConfigError, InvalidArgumentError
from graphdist.runtime import rendezvous
from graphdist.runtime.devices import num_gpus
from graphdist.runtime.launch_status import launch_dir
from graphdist.trace.values import DistributedValues, ValueContext, regroup

__all__ = ["MultiWorkerMirroredStrategy", "CommunicationImplementation", "CollectiveCommunication",
           "CommunicationOptions"]

logger = logging.getLogger(__name__)

_groups = itertools.count()


class CommunicationImplementation(enum.Enum):
    """Cross-worker collective implementation.

    * ``AUTO``: MPI's all-reduce (MPICH picks the algorithm by message size);
    * ``RING``: reduce-scatter then all-gather through MPI (the ring
      all-reduce's structure; bitwise equal results on every worker);
    * ``NCCL``: NCCL between GPUs (needs GPUs; not implemented yet).
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


CollectiveCommunication = CommunicationImplementation


class CommunicationOptions:
    """How the collectives between workers run, like ``tf.distribute.experimental.CommunicationOptions``.

    Given to ``gd.MultiWorkerMirroredStrategy(communication_options=...)``.

    Args:
        bytes_per_pack: Gradient bucketing across workers: the gradients'
            all-reduces are packed (concatenated, reduced as one buffer, split
            again) into packs of at most this many bytes each, in the order the
            backward pass produces the gradients, so each pack is one MPI
            all-reduce (:class:`graphdist.passes.bucket_collectives.BucketCollectivesPass`).
            With ``GRAPHDIST_OVERLAP=1`` each device's backward pass is also cut
            at the packs, so a pack's MPI all-reduce runs while the earlier
            layers' backward pass computes. ``0`` (the default): one all-reduce
            per gradient. (TensorFlow reads ``0`` as "decide automatically" and
            packs everything into one pack; here it means no packing, as
            ``gd.NcclAllReduce(bytes_per_pack=0)`` does.)
        timeout_seconds: Seconds a collective between workers may wait before
            it fails with ``gd.CollectiveTimeoutError`` naming the ranks it waited
            for; ``None`` (the default): ``GRAPHDIST_COLLECTIVE_TIMEOUT``, else 300.
        implementation: A :class:`CommunicationImplementation` (or its name),
            default ``AUTO``.

    Raises:
        InvalidArgumentError: ``bytes_per_pack`` is not a non-negative int,
            ``timeout_seconds`` is not a positive number, or ``implementation``
            is unknown.
    """

    def __init__(self, bytes_per_pack: int = 0, timeout_seconds: float | None = None,
                 implementation: Any = CommunicationImplementation.AUTO) -> None:
        if (isinstance(bytes_per_pack, (bool, np.bool_)) or not isinstance(bytes_per_pack, (int, np.integer))
                or bytes_per_pack < 0):
            raise InvalidArgumentError(f"CommunicationOptions: bytes_per_pack must be a non-negative int (bytes per "
                                       f"gradient pack; 0 turns packing off), got {bytes_per_pack!r}")
        if timeout_seconds is not None and (
                isinstance(timeout_seconds, (bool, np.bool_)) or not isinstance(timeout_seconds, (int, float))
                or not np.isfinite(timeout_seconds) or timeout_seconds <= 0):
            raise InvalidArgumentError(f"CommunicationOptions: timeout_seconds must be a positive number of seconds "
                                       f"or None, got {timeout_seconds!r}")
        self.bytes_per_pack = int(bytes_per_pack)
        self.timeout_seconds = None if timeout_seconds is None else float(timeout_seconds)
        self.implementation = _implementation(implementation, "CommunicationOptions: implementation")

    def bucketing(self) -> dict[str, int] | None:
        """Arguments of ``BucketCollectivesPass`` (``None``: no packing)."""
        return {"bytes_per_pack": self.bytes_per_pack} if self.bytes_per_pack else None

    def __repr__(self) -> str:
        return (f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, timeout_seconds={self.timeout_seconds}, "
                f"implementation={self.implementation.name})")


class MultiWorkerExtended(StrategyExtended):
    """``strategy.extended`` of :class:`MultiWorkerMirroredStrategy`."""

    @property
    def should_checkpoint(self) -> bool:
        """True on the chief (the worker that writes checkpoints)."""
        return self._strategy._is_chief

    @property
    def should_save_summary(self) -> bool:
        """True on the chief."""
        return self._strategy._is_chief

    @property
    def experimental_should_init(self) -> bool:
        """Every worker initialises its variables (from worker 0's values)."""
        return True

    def _in_multi_worker_mode(self) -> bool:
        return self._strategy._num_workers > 1


def default_cluster_resolver() -> ClusterResolver:
    """``TFConfigClusterResolver`` when a config variable is set, else the MPI ranks when
    started by ``mpiexec`` with several processes, else an empty cluster.
    """
    if os.environ.get("GRAPHDIST_CONFIG", "").strip() or os.environ.get("TF_CONFIG", "").strip():
        return TFConfigClusterResolver()
    if int(os.environ.get("PMI_SIZE", "1") or 1) > 1:
        return MPIClusterResolver()
    return TFConfigClusterResolver()


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous training on several workers, each with one or more devices.

    Args:
        communication: A :class:`CommunicationImplementation` (or its name).
        communication_options: A :class:`CommunicationOptions`:
            ``bytes_per_pack`` packs the gradients' all-reduces into buckets,
            one MPI all-reduce each (overlapping the backward pass with
            ``GRAPHDIST_OVERLAP=1``), ``timeout_seconds`` bounds every wait
            between workers, ``implementation`` is ``communication``'s
            alternative spelling (TensorFlow's).
        cluster_resolver: Where the cluster and this worker's role come from;
            default: ``GRAPHDIST_CONFIG`` / ``TF_CONFIG``, else the MPI ranks.
        devices: This worker's devices (default: the resolver's
            ``local_devices``, else every GPU, else ``["cpu:0"]``).
        shard_optimizer_state: ZeRO-1 across the workers: each replica
            updates ``1/num_replicas_in_sync`` of every variable and each
            worker process keeps only its replicas' shards of every optimizer
            slot (gradients reduce-scattered, new weights all-gathered,
            locally and through MPI). Reading
            a sharded slot eagerly (``numpy()``, ``gd.Checkpoint.save``)
            gathers it, a collective: every worker must do it. With one
            worker it shards over the local devices, like
            ``gd.MirroredStrategy(devices, cross_device_ops=gd.NcclAllReduce(shard_optimizer_state=True))``.

    Raises:
        ClusterConfigError: The cluster lists ps tasks (use
            ``ParameterServerStrategy``), this task is not a chief/worker, or
            the MPI job does not match the cluster.
        InvalidArgumentError: ``communication`` is unknown, or ``NCCL`` without GPUs;
            ``communication_options`` is not a :class:`CommunicationOptions`, or
            names another implementation than ``communication``.
        NotImplementedError: ``NCCL`` with GPUs (no NCCL communicator yet).
    """

    _extended_cls = MultiWorkerExtended

    def __init__(self, communication: Any = CommunicationImplementation.AUTO,
                 cluster_resolver: ClusterResolver | None = None, devices: Sequence[Any] | None = None,
                 communication_options: CommunicationOptions | None = None,
                 shard_optimizer_state: bool = False) -> None:
        self._shard_optimizer_state = bool(shard_optimizer_state)
        self._communication = _communication(communication, communication_options)
        self._options = communication_options if communication_options is not None else CommunicationOptions()
        resolver = cluster_resolver if cluster_resolver is not None else default_cluster_resolver()
        self._resolver = resolver
        spec = resolver.cluster_spec()
        if "ps" in spec.jobs:
            raise ClusterConfigError(
                f"the cluster lists {spec.num_tasks('ps')} ps task(s), but MultiWorkerMirroredStrategy is synchronous "
                "and has no parameter servers; remove 'ps' from the cluster or use gd.ParameterServerStrategy")
        task_type = resolver.task_type
        if spec and task_type is None:
            raise ClusterConfigError("the cluster config has no 'task' (type and index of this process); add "
                                     '"task": {"type": "worker", "index": N}')
        workers = spec.num_tasks("chief") + spec.num_tasks("worker")
        in_sync = task_type in (None, "chief", "worker")
        if task_type == "evaluator":
            logger.info("evaluator task: MultiWorkerMirroredStrategy runs on this task's devices alone")
        self._num_workers = workers if (in_sync and workers > 1) else 1
        self._worker_index = task_rank(spec, task_type, resolver.task_id) if self._num_workers > 1 else 0
        self._is_chief = _is_chief(spec, task_type, resolver.task_id)
        if devices is None:
            devices = resolver.local_devices or [f"cuda:{i}" for i in range(num_gpus())] or ["cpu:0"]
        super().__init__(devices)
        self._cross_device_ops = NcclAllReduce()
        self._group = f"multi_worker{next(_groups)}"
        self._comm = self._connect(spec) if self._num_workers > 1 else None
        logger.info("MultiWorkerMirroredStrategy: worker %d of %d, local devices %s, communication %s",
                    self._worker_index, self._num_workers, self.extended.worker_devices, self._communication.name)

    # ------------------------------------------------------------ cluster
    def _connect(self, spec: Any) -> Any:
        from graphdist.runtime.comm.mpi import MPICommunicator, register_group, world
        from graphdist.runtime.comm.mpi_world import task_ended

        comm = world(spec, self._resolver.task_type, self._resolver.task_id)
        size, rank = comm.Get_size(), comm.Get_rank()
        if size != self._num_workers:
            raise ClusterConfigError(
                f"the cluster has {self._num_workers} workers (chief and worker tasks) but this MPI job has {size} "
                f"process(es); start one process per worker: graphdist launch --workers {self._num_workers} -- ...")
        if rank != self._worker_index:
            raise ClusterConfigError(
                f"this process is MPI rank {rank} but its config says {self._resolver.task_type} "
                f"{self._resolver.task_id} (rank {self._worker_index}: chief first, then workers by index); "
                "give each process the config of its own rank (graphdist launch does)")
        names = [_rank_name(spec, r) for r in range(size)]
        # The world's ranks are the job's tasks (checked above): a collective ends at once when a peer ended.
        communicator = MPICommunicator(comm, rank_names=names, timeout=self._options.timeout_seconds,
                                       ended=task_ended)
        register_group(self._group, lambda: communicator)
        _abort_job_on_uncaught_exception(comm)
        return communicator

    @property
    def cluster_resolver(self) -> ClusterResolver:
        """The resolver the cluster came from."""
        return self._resolver

    @property
    def communicator(self) -> Any:
        """The MPI communicator between the workers (``None`` with one worker)."""
        return self._comm

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas over all workers."""
        note_replica_count_read()
        return self._num_replicas()

    def _num_replicas(self) -> int:
        return self._num_workers * len(self._devices)

    def _num_local_replicas(self) -> int:
        return len(self._devices)

    def _input_workers(self) -> tuple[int, int]:
        return self._num_workers, self._worker_index

    # ------------------------------------------------------------ variables
    def _variable_class(self) -> type:
        return MirroredVariable

    def _create_variable(self, variable: Any) -> None:
        super()._create_variable(variable)
        if self._comm is not None:
            # Every worker starts from worker 0's value (random initialisers differ per process).
            variable._value = self._comm.broadcast(np.array(variable._value, copy=True), root=0,
                                                   name=f"initial value of {variable._name}")

    # ------------------------------------------------------------- pipeline
    def pipeline_config(self) -> PipelineConfig:
        """The synchronous pipeline with global replica ids and cross-worker collectives (gradient packs
        across the workers with ``communication_options.bytes_per_pack``).
        """
        algorithm = "ring" if self._communication is CommunicationImplementation.RING else "auto"
        return PipelineConfig(devices=self.extended.worker_devices, strategy=type(self).__name__,
                              replicas_in_sync=self.num_replicas_in_sync,
                              replica_offset=self._worker_index * len(self._devices),
                              collective_attrs=self._cross_device_ops.collective_attrs(),
                              bucketing=self._options.bucketing(),
                              shard_optimizer_state=self._shard_optimizer_state,
                              multi_worker={"num_workers": self._num_workers, "comm_group": self._group,
                                            "algorithm": algorithm})

    # ------------------------------------------------------ cross-replica API
    def experimental_distribute_values_from_function(self, value_fn: Any) -> Any:
        """Calls ``value_fn(ValueContext(i, n))`` for this worker's replicas (global ``i``)."""
        if not callable(value_fn):
            raise InvalidArgumentError("value_fn must be callable with a ValueContext argument")
        first = self._worker_index * len(self._devices)
        return regroup([value_fn(ValueContext(first + i, self.num_replicas_in_sync))
                        for i in range(len(self._devices))])

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """Reduces ``value`` over every replica of every worker."""
        if self._comm is None or _is_traced(value):
            return super().reduce(reduce_op, value, axis)
        op = ReduceOp.from_any(reduce_op)
        if isinstance(value, DistributedValues):
            return self._reduce_eager_global(op, value, axis)
        return nest.map_structure(lambda v: self._reduce_eager_global(op, v, axis), value)

    def _reduce_eager_global(self, op: ReduceOp, value: Any, axis: int | None) -> Any:
        if op is ReduceOp.MEAN and axis is not None:
            local_sum = super().reduce(ReduceOp.SUM, value, axis)
            count = sum(np.shape(c)[_check_axis(c, axis)] for c in self._local(value))
            total = self._comm.all_reduce(np.asarray(local_sum), "SUM", name="reduce")
            counts = self._comm.all_reduce(np.array(count, np.int64), "SUM", name="reduce count")
            return _scalar(_divide_keep_dtype(total, int(counts)))
        local = super().reduce(op, value, axis)
        return _scalar(self._comm.all_reduce(np.asarray(local), op.value, name="reduce"))

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenates every replica's component of ``value`` along ``axis`` (worker-major order)."""
        local = super().gather(value, axis)
        if self._comm is None or _is_traced(value):
            return local
        return self._comm.all_gather(np.asarray(local), axis, name="gather")

    def __repr__(self) -> str:
        return (f"MultiWorkerMirroredStrategy(worker={self._worker_index}/{self._num_workers}, "
                f"devices={list(self.extended.worker_devices)}, communication={self._communication.name})")


def _abort_job_on_uncaught_exception(comm: Any) -> None:
    """Makes an uncaught exception end the whole job at once.

    The other workers would otherwise wait in the next collective until the
    timeout (300 s by default) before failing. Under ``graphdist launch``
    the process just ends (skipping ``MPI_Finalize``, whose barrier would
    wait for the others): its rank wrapper reports the exit and the launcher
    stops the other ranks, naming this one (a ``KeyboardInterrupt`` ends it
    by ``SIGINT``, so it is named as interrupted). Under a plain ``mpiexec``
    it calls ``MPI_Abort``. A process killed without an exception is noticed
    by ``graphdist launch`` the same way (by the others' timeouts under a
    plain ``mpiexec``).
    """
    previous = sys.excepthook
    if getattr(previous, "_graphdist_abort", False):
        return

    def hook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        previous(kind, value, traceback)
        joined = rendezvous.current()
        if joined is not None:  # a job of tasks started on their own: tell the others, then end
            first_line = (str(value).strip().splitlines() or [""])[0]
            joined.announce_failure(f"{kind.__name__}: {first_line}")
            _end_this_process(interrupted=issubclass(kind, KeyboardInterrupt))
        if launch_dir() is not None:
            _end_this_process(interrupted=issubclass(kind, KeyboardInterrupt))
        if issubclass(kind, KeyboardInterrupt):
            return
        rank = comm.Get_rank()
        sys.stderr.write(f"graphdist: uncaught {kind.__name__} on MPI rank {rank}: ending the job "
                         "(MPI_Abort) so the other workers do not wait for it\n")
        sys.stderr.flush()
        sys.stdout.flush()
        _wait_until_output_is_read()
        comm.Abort(1)

    hook._graphdist_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _end_this_process(interrupted: bool) -> None:
    """Ends this rank now, by ``SIGINT`` when it was interrupted, else with status 1 (no ``MPI_Finalize``)."""
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)  # the signal arrives meanwhile
    os._exit(1)


def _wait_until_output_is_read(limit_s: float = 5.0) -> None:
    """Waits (at most ``limit_s``) until whoever reads this process's stdout and stderr pipes has read them.

    MPI_Abort (under a plain ``mpiexec``) kills every process of the job at
    once: without this wait the traceback's last lines, still in the pipe to
    ``mpiexec``, would be lost. Streams that are not pipes (a terminal, a
    file) are not waited for.
    """
    import fcntl
    import stat
    import termios
    from array import array

    pipes = []
    for fd in (1, 2):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(fd)
        except OSError:
            continue
    deadline = time.monotonic() + limit_s
    unread = array("i", [0])
    while pipes and time.monotonic() < deadline:
        try:
            pending = 0
            for fd in pipes:
                fcntl.ioctl(fd, termios.FIONREAD, unread)  # Linux answers on the write end too
                pending += unread[0]
        except OSError:
            return
        if pending == 0:
            time.sleep(0.05)  # the reader writes on what it read
            return
        time.sleep(0.01)


def _implementation(value: Any, label: str) -> CommunicationImplementation:
    """``value`` (an enum member or its name) as a :class:`CommunicationImplementation`."""
    found = value
    if isinstance(value, str):
        found = CommunicationImplementation.__members__.get(value.upper())
    if not isinstance(found, CommunicationImplementation):
        raise InvalidArgumentError(f"{label} must be gd.CommunicationImplementation.AUTO, RING or NCCL, got {value!r}")
    return found


def _communication(communication: Any, options: Any) -> CommunicationImplementation:
    """The implementation ``communication`` and ``communication_options`` ask for (both may name one)."""
    implementation = _implementation(communication, "communication")
    if options is not None:
        if not isinstance(options, CommunicationOptions):
            raise InvalidArgumentError(
                f"communication_options must be a gd.experimental.CommunicationOptions, got "
                f"{type(options).__name__} {options!r}; e.g. "
                "gd.experimental.CommunicationOptions(bytes_per_pack=4 << 20)")
        chosen = options.implementation
        if chosen is not CommunicationImplementation.AUTO:
            if implementation not in (CommunicationImplementation.AUTO, chosen):
                raise InvalidArgumentError(
                    f"communication={implementation.name} and communication_options.implementation={chosen.name} "
                    "disagree; give the implementation in one of them")
            implementation = chosen
    if implementation is CommunicationImplementation.NCCL:
        if num_gpus() == 0:
            raise InvalidArgumentError("communication=NCCL needs GPUs, and this machine has none; use "
                                       "CommunicationImplementation.AUTO or RING (MPI)")
        raise NotImplementedError("communication=NCCL between workers is not implemented yet; use "
                                  "CommunicationImplementation.AUTO or RING (MPI)")
    return implementation


def _is_chief(spec: Any, task_type: str | None, task_id: int | None) -> bool:
    if task_type is None or task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in spec.jobs


def _rank_name(spec: Any, rank: int) -> str:
    from graphdist.distribute.cluster import rank_task

    joined = rendezvous.current()
    if joined is not None:
        return joined.describe(rank)  # with the task's host
    job, index = rank_task(spec, rank)
    return f"{job} {index} (rank {rank})"


def _scalar(value: Any) -> Any:
    return value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
