"""Pass pipelines as configuration: a strategy describes itself, :func:`build_pipeline` makes the passes.

A strategy returns a :class:`PipelineConfig` (devices, replica counts, the
all-reduce algorithm, where variables live, workers, logical cores): plain
data, so a stored plan can be re-planned for another strategy by building
another pipeline over the same traced graph. :func:`build_pipeline` fills
the named slots of a :class:`Pipeline` in a fixed order; a slot a strategy
does not need stays empty. No pass branches on the strategy, and no
pipeline is made by searching and splicing another one.

Slots, in order (the passes each slot holds when filled), in three stages
(:data:`STAGES`): ``rebatched`` (the traced step given the configuration's
batch), ``rewritten`` (the distributed step, one graph) and ``partitioned``
(cut into device segments). Compilation keeps the graph each stage ends with
(:func:`graphdist.compile.build.compile_traced`):

=====================  ==================================================  ============================
slot                   passes                                               filled when
=====================  ==================================================  ============================
``rebatch``            ``RebatchPass``                                      ``rebatch`` (re-planning)
``accumulate``         ``AccumulateGradientsPass``                          ``accumulate_steps`` > 1
                       or ``SplitBatchChunksPass``                          ``deterministic_chunks``, not
                                                                            ``deterministic_whole_rows``
``differentiate``      ``AutodiffPass``, ``LowerStopGradientsPass``         always
``chunk_reductions``   ``ChunkBatchReductionsPass``                         ``deterministic_whole_rows``
                                                                            (``deterministic_config``)
``replicate``          ``ReplicatePass``                                    always (one replica too)
``variable_updates``   ``LowerVariableUpdatesPass``                         always
``parameter_servers``  ``PlacePSVariablesPass``                             ``parameter_servers``
``collectives``        ``InsertCollectivesPass``                            always
``shard_parameters``   ``ShardParametersPass``                              ``shard_parameters``
``shard_optimizer``    ``ShardOptimizerStatePass``                          ``shard_optimizer_state``
``balance_updates``    ``BalanceVariableUpdatesPass``                       ``replicas`` > 1, variables local,
                                                                            no ``layouts``
``single_readers``     ``LowerSingleReaderAllReducesPass``                  ``reduce_at_readers``, no packs
``central_storage``    ``PlaceVariablesPass``                               ``parameter_device``
``cross_worker``       ``InsertCrossWorkerCollectivesPass``                 ``multi_worker``
``lower_collectives``  ``LowerCollectivesPass``                             always
``bucketing``          ``BucketCollectivesPass``                            ``bucketing``
``lower_ops``          ``LowerOpsPass``                                     ``lowerings``
``deterministic``      ``LowerDeterministicReductionsPass``                 ``deterministic_chunks``
``logical_devices``    ``ShardLogicalDevicesPass``, ``PlaceLogicalDevicesPass``  ``logical_cores``
``layouts``            ``PropagateLayoutsPass``, ``LowerLayoutsPass``       ``layouts``
``cleanup``            ``FoldConstantsPass``, ``EliminateDeadNodesPass``    always
``limit_gathers``      ``LimitParameterGathersPass``                        ``shard_parameters``
``devices``            ``AssignDevicesPass``                                always
``index_checks``       ``LowerIndexChecksPass``                             always
``partition``          ``PartitionPass``                                    always
=====================  ==================================================  ============================

"Variables local": no ``parameter_device`` and no ``parameter_servers`` (there the updates run where the
variables live).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from graphdist.ir.layouts import MeshSpec
from graphdist.passes.accumulate_gradients import AccumulateGradientsPass
from graphdist.passes.assign_devices import AssignDevicesPass
from graphdist.passes.autodiff import AutodiffPass
from graphdist.passes.balance_variable_updates import BalanceVariableUpdatesPass
from graphdist.passes.base import PassBase, PassContext, check_order
from graphdist.passes.bucket_collectives import BucketCollectivesPass
from graphdist.passes.chunk_batch_reductions import ChunkBatchReductionsPass
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.fold_constants import FoldConstantsPass
from graphdist.passes.insert_collectives import InsertCollectivesPass
from graphdist.passes.insert_cross_worker_collectives import InsertCrossWorkerCollectivesPass
from graphdist.passes.limit_parameter_gathers import LimitParameterGathersPass
from graphdist.passes.lower_collectives import LowerCollectivesPass
from graphdist.passes.lower_deterministic_reductions import LowerDeterministicReductionsPass
from graphdist.passes.lower_index_checks import LowerIndexChecksPass
from graphdist.passes.lower_layouts import LowerLayoutsPass
from graphdist.passes.lower_ops import LowerOpsPass
from graphdist.passes.lower_single_reader_all_reduces import LowerSingleReaderAllReducesPass
from graphdist.passes.lower_stop_gradients import LowerStopGradientsPass
from graphdist.passes.lower_variable_updates import LowerVariableUpdatesPass
from graphdist.passes.partition import PartitionPass
from graphdist.passes.place_logical_devices import PlaceLogicalDevicesPass
from graphdist.passes.place_ps_variables import PlacePSVariablesPass
from graphdist.passes.place_variables import PlaceVariablesPass
from graphdist.passes.propagate_layouts import PropagateLayoutsPass
from graphdist.passes.rebatch import RebatchPass
from graphdist.passes.replicate import ReplicatePass
from graphdist.passes.shard_logical_devices import ShardLogicalDevicesPass
from graphdist.passes.shard_optimizer_state import ShardOptimizerStatePass
from graphdist.passes.shard_parameters import ShardParametersPass, normalise_variable_names
from graphdist.passes.split_batch_chunks import SplitBatchChunksPass, chunks_per_replica

__all__ = ["SLOTS", "STAGES", "PipelineConfig", "Pipeline", "build_pipeline", "deterministic_config", "pass_context"]

#: Stage name -> its slots, in order; each stage ends with a graph compilation keeps.
STAGES: dict[str, tuple[str, ...]] = {
    "rebatched": ("rebatch",),
    "rewritten": ("accumulate", "differentiate", "chunk_reductions", "replicate", "variable_updates",
                  "parameter_servers", "collectives", "shard_parameters", "shard_optimizer", "balance_updates",
                  "single_readers", "central_storage", "cross_worker", "lower_collectives", "bucketing",
                  "lower_ops", "deterministic", "logical_devices", "layouts", "cleanup", "limit_gathers", "devices",
                  "index_checks"),
    "partitioned": ("partition",),
}
SLOTS = tuple(slot for slots in STAGES.values() for slot in slots)


@dataclass(frozen=True)
class PipelineConfig:
    """What a strategy decides about rewriting a step (see the module docstring).

    Attributes:
        devices: This worker's replica devices, in replica order.
        replicas_in_sync: Replicas over all workers (default: ``len(devices)``).
        replica_offset: Global index of this worker's first replica.
        collective_attrs: Attributes of multi-participant all-reduces
            (``{"algorithm": "ring"}``, ``reduce_to_one`` with ``reduce_to_device``...).
        bucketing: ``BucketCollectivesPass`` options (``num_packs`` or ``bytes_per_pack``), or ``None``.
        lowerings: Op type -> registered graph lowering (``graphdist.passes.lowerings``) that ``LowerOpsPass``
            applies once the collectives are lowered, e.g. ``{"AllReduce": "reduce_scatter_all_gather"}``
            (``gd.ReduceScatterAllGather()``); ``None``: none. An unknown name fails when the pipeline is built.
        reduce_at_readers: Sum a gradient read by one replica on that replica instead of all-reducing
            it (``LowerSingleReaderAllReducesPass``): the strategy picks its reductions itself (no
            ``cross_device_ops`` was given) and no packs were asked for.
        shard_optimizer_state: ZeRO-1: each replica keeps and updates its 1/N slice of the optimizer
            slots (``ShardOptimizerStatePass``).
        shard_parameters: FSDP / ZeRO-3: names of the variables (``VariableSpec.name``, ``gd.Variable.name``
            without ``":0"``) each replica stores ``1/N`` of, gathered before use, their gradients
            reduce-scattered and their optimizer slots sharded (``ShardParametersPass``); ``()``: none.
            Filled from a layout map (a weight laid out over the batch axis); normalised to a sorted tuple.
        parameter_device: Central storage: the device holding every variable.
        parameter_servers: Variables live on ps tasks (``graph.meta.placement`` has the shards).
        multi_worker: ``{"num_workers", "comm_group", "algorithm"}`` of a
            multi-worker strategy (the cross-worker collectives), or ``None``.
        logical_cores: ``cores[replica][logical_device]`` of a TPU-like device assignment, or ``None``.
        accumulate_steps: Micro-batches each replica's batch is cut into, one update per step
            (``AccumulateGradientsPass``; ``gd.function(step, accumulate_steps=k)``).
        backend: Backend the strategy's steps compile with when ``gd.function`` names none.
        strategy: The strategy's name (for plans and messages).
        deterministic_chunks: Op determinism: the global batch is cut into this many chunks summed in one
            fixed tree (``SplitBatchChunksPass``, ``LowerDeterministicReductionsPass``); ``None``: off.
            Made by :func:`deterministic_config`, which also sets ``accumulate_steps`` to the chunks per replica.
        rebatch: ``RebatchPass`` options (``{"batch": per-replica batch or None, "replicas": replicas in sync}``)
            when a stored traced step is re-planned for another replica count (``graphdist.compile.replan``),
            or ``None``.
        deterministic_whole_rows: Op determinism computes row-wise ops on each replica's whole batch and only
            what mixes examples per chunk (``ChunkBatchReductionsPass``, after differentiation); ``False``:
            everything per chunk (``SplitBatchChunksPass``: one chunk's activations alive at a time; its sums
            are ``ReduceSum`` per chunk, not the same bits as the whole-rows form, so the two do not mix).
            :func:`deterministic_config` sets it.
        layouts: Tensor parallelism (``ModelParallelStrategy``): ``{"mesh": MeshSpec.to_json(), "variables":
            {uid: [mesh axis or None per dimension]}, "patterns": [(regex, layout), ...]}`` (patterns for the
            variables not listed by uid, e.g. a re-planned step's); each replica's computation is split over the mesh's
            non-batch axes (``PropagateLayoutsPass``, ``LowerLayoutsPass``). ``None``: off.
    """

    devices: tuple[str, ...] = ("cpu:0",)
    replicas_in_sync: int | None = None
    replica_offset: int = 0
    collective_attrs: Mapping[str, Any] | None = None
    bucketing: Mapping[str, Any] | None = None
    lowerings: Mapping[str, str] | None = None
    reduce_at_readers: bool = False
    shard_optimizer_state: bool = False
    shard_parameters: tuple[str, ...] = ()
    parameter_device: str | None = None
    parameter_servers: bool = False
    multi_worker: Mapping[str, Any] | None = None
    logical_cores: tuple[tuple[str, ...], ...] | None = None
    accumulate_steps: int = 1
    backend: str | None = None
    strategy: str = "OneDeviceStrategy"
    deterministic_chunks: int | None = None
    rebatch: Mapping[str, Any] | None = None
    deterministic_whole_rows: bool = False
    layouts: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_parameters", normalise_variable_names(self.shard_parameters))

    @property
    def replicas(self) -> int:
        """Local replicas."""
        return len(self.devices)

    @property
    def total_replicas(self) -> int:
        """Replicas over all workers."""
        return self.replicas_in_sync if self.replicas_in_sync is not None else len(self.devices)

    @property
    def num_workers(self) -> int:
        """Workers whose replicas are in sync."""
        return int(self.multi_worker.get("num_workers", 1)) if self.multi_worker else 1

    def replace(self, **changes: Any) -> PipelineConfig:
        """A copy with ``changes``."""
        return replace(self, **changes)


@dataclass
class Pipeline(Sequence[PassBase]):
    """Named slots of passes, run in :data:`SLOTS` order; a sequence of its passes.

    Attributes:
        config: The configuration it was built from.
        slots: Slot name -> passes (empty when the strategy does not need it).
    """

    config: PipelineConfig
    slots: dict[str, list[PassBase]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_order(self.passes())  # a pass placed before one it needs fails here, when the pipeline is built

    def passes(self) -> list[PassBase]:
        """Every pass, in slot order."""
        return [p for slot in SLOTS for p in self.slots.get(slot, [])]

    def stage(self, name: str) -> list[PassBase]:
        """The passes of stage ``name`` (see :data:`STAGES`), in slot order."""
        if name not in STAGES:
            raise KeyError(f"unknown pipeline stage {name!r}; the stages are {', '.join(STAGES)}")
        return [p for slot in STAGES[name] for p in self.slots.get(slot, [])]

    def with_slot(self, slot: str, *passes: PassBase) -> Pipeline:
        """A copy with ``slot`` holding ``passes`` (an unknown slot is an error, not a silent no-op)."""
        if slot not in SLOTS:
            raise KeyError(f"unknown pipeline slot {slot!r}; the slots are {', '.join(SLOTS)}")
        return Pipeline(self.config, {**self.slots, slot: list(passes)})

    def describe(self) -> str:
        """One line per filled slot: ``slot: Pass(args), ...``."""
        return "\n".join(f"{slot}: {', '.join(repr(p) for p in self.slots[slot])}"
                         for slot in SLOTS if self.slots.get(slot))

    def __iter__(self) -> Iterator[PassBase]:
        return iter(self.passes())

    def __len__(self) -> int:
        return len(self.passes())

    def __getitem__(self, index: Any) -> Any:
        return self.passes()[index]


def build_pipeline(config: PipelineConfig) -> Pipeline:
    """The passes that rewrite a traced step as ``config`` says."""
    slots: dict[str, list[PassBase]] = {
        "differentiate": [AutodiffPass(), LowerStopGradientsPass()],
        "replicate": [ReplicatePass(config.replicas, config.replica_offset, config.total_replicas)],
        "variable_updates": [LowerVariableUpdatesPass()],
        "collectives": [InsertCollectivesPass(config.num_workers)],
        "lower_collectives": [LowerCollectivesPass(dict(config.collective_attrs or {"algorithm": "ring"}))],
        "cleanup": [FoldConstantsPass(), EliminateDeadNodesPass()],
        "devices": [AssignDevicesPass()],
        # Index checks become run-time assertions once the replicas and devices exist.
        "index_checks": [LowerIndexChecksPass()],
        "partition": [PartitionPass()],
    }
    if config.rebatch is not None:
        slots["rebatch"] = [RebatchPass(config.rebatch.get("batch"), config.rebatch.get("replicas"))]
    if config.deterministic_chunks and config.deterministic_whole_rows:
        slots["chunk_reductions"] = [ChunkBatchReductionsPass(config.deterministic_chunks, config.total_replicas)]
        slots["deterministic"] = [LowerDeterministicReductionsPass()]
    elif config.deterministic_chunks:
        slots["accumulate"] = [SplitBatchChunksPass(config.deterministic_chunks, config.total_replicas)]
        slots["deterministic"] = [LowerDeterministicReductionsPass()]
    elif config.accumulate_steps > 1:
        slots["accumulate"] = [AccumulateGradientsPass(config.accumulate_steps)]
    if config.shard_parameters:
        workers = dict(config.multi_worker or {})
        slots["shard_parameters"] = [ShardParametersPass(
            config.shard_parameters, config.num_workers, config.replica_offset // max(config.replicas, 1),
            str(workers.get("comm_group", "")))]
        slots["limit_gathers"] = [LimitParameterGathersPass()]  # one layer's gathered weights at a time
    if config.shard_optimizer_state:
        workers = dict(config.multi_worker or {})
        slots["shard_optimizer"] = [ShardOptimizerStatePass(
            config.num_workers, config.replica_offset // max(config.replicas, 1), str(workers.get("comm_group", "")))]
    if config.replicas > 1 and config.parameter_device is None and not config.parameter_servers \
            and not config.layouts:  # the layout passes split each replica's update over its devices
        slots["balance_updates"] = [BalanceVariableUpdatesPass()]
        if config.reduce_at_readers and not config.bucketing:
            slots["single_readers"] = [LowerSingleReaderAllReducesPass()]
    if config.parameter_servers:
        slots["parameter_servers"] = [PlacePSVariablesPass()]
    if config.parameter_device is not None:
        slots["central_storage"] = [PlaceVariablesPass(config.parameter_device)]
    if config.multi_worker:
        options = config.multi_worker
        slots["cross_worker"] = [InsertCrossWorkerCollectivesPass(int(options.get("num_workers", 1)),
                                                                  str(options.get("comm_group", "")),
                                                                  str(options.get("algorithm", "auto")))]
    if config.bucketing:
        slots["bucketing"] = [BucketCollectivesPass(**dict(config.bucketing))]
    if config.lowerings:
        slots["lower_ops"] = [LowerOpsPass(dict(config.lowerings))]
    if config.logical_cores:
        cores = [list(c) for c in config.logical_cores]
        slots["logical_devices"] = [ShardLogicalDevicesPass(cores), PlaceLogicalDevicesPass(cores)]
    if config.layouts:
        mesh = MeshSpec.from_json(config.layouts["mesh"])
        slots["layouts"] = [PropagateLayoutsPass(mesh, config.layouts.get("variables", {}),
                                                 config.layouts.get("patterns", ())), LowerLayoutsPass()]
    return Pipeline(config, slots)


def pass_context(config: PipelineConfig, **settings: Any) -> PassContext:
    """The ``PassContext`` the passes of ``config``'s pipeline run with.

    The one place where compilation hands devices to the passes: they come from ``config``, as the replica
    counts of the pipeline's passes do (:func:`build_pipeline`), so the two cannot disagree.

    Args:
        config: The configuration the pipeline was built from.
        **settings: The other ``PassContext`` fields (``options``, ``dump_dir``, ``check``).
    """
    return PassContext(devices=tuple(config.devices), **settings)


def deterministic_config(config: PipelineConfig, chunks: int, accumulate_steps: int = 1) -> PipelineConfig:
    """``config`` with op determinism: ``chunks`` chunks of the global batch, ``chunks / replicas`` per replica.

    Args:
        config: The strategy's configuration.
        chunks: Chunks of the global batch (``enable_op_determinism(chunks)``).
        accumulate_steps: The micro-batches the step asked for (``gd.function(accumulate_steps=k)``): every
            replica already computes its chunks one after the other, so ``k`` must divide them, and the
            chunks are the micro-batches.

    Raises:
        NotImplementedError: What op determinism does not cover (asynchronous parameter servers, TPU cores,
            a sharded optimizer state, tensor parallelism), named with what to do instead.
        GraphError: The replica count or ``accumulate_steps`` does not fit the chunks.
    """
    from graphdist.errors import GraphError

    refused = [(config.parameter_servers, f"{config.strategy} applies its updates asynchronously on the "
                                          "parameter servers, in the order the workers' pushes arrive"),
               (bool(config.logical_cores), f"{config.strategy} compiles whole programs for TPU-like cores, "
                                            "whose reductions graphdist does not order"),
               (config.shard_optimizer_state, "a sharded optimizer state (ZeRO-1) reduce-scatters the gradients "
                                              "in the ring's order"),
               (bool(config.shard_parameters), "sharded parameters (FSDP) reduce-scatter the gradients in the "
                                               "ring's order"),
               (bool(config.lowerings), "lowered all-reduces (reduce-scatter + all-gather) add in the ring's "
                                        "order"),
               (bool(config.layouts), f"{config.strategy} splits matrix products over devices and adds their "
                                      "partial sums in another order than one device")]
    for refuse, why in refused:
        if refuse:
            raise NotImplementedError(f"op determinism (gd.config.experimental.enable_op_determinism()) is not "
                                      f"available here: {why}. Use OneDeviceStrategy, MirroredStrategy, "
                                      "CentralStorageStrategy or MultiWorkerMirroredStrategy, or "
                                      "disable_op_determinism()")
    per_replica = chunks_per_replica(chunks, config.total_replicas)
    if per_replica % accumulate_steps:
        raise GraphError(f"accumulate_steps={accumulate_steps} does not divide the {per_replica} chunks each of "
                         f"{config.total_replicas} replica(s) computes under op determinism ({chunks} chunks of "
                         "the global batch, computed one after the other: they are the micro-batches); use an "
                         f"accumulate_steps dividing {per_replica}, or enable_op_determinism(chunks=N) with more")
    # Whole rows with accumulate_steps too: the chunked sums then take one form on every replica count (the
    # per-chunk SplitBatchChunksPass sums with ReduceSum, whose bits change with the shape it is batched at).
    return config.replace(deterministic_chunks=chunks, accumulate_steps=per_replica, deterministic_whole_rows=True)
