"""Pass pipelines as configuration (graphdist.compile.pipeline): each strategy's ``pipeline_config()``
and ``pipeline()``, which slots are filled, in which order and with which arguments, ``with_slot``,
``describe()``, the config as plain data, and that no pass branches on a strategy.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import graphdist as gd
from graphdist.compile.pipeline import SLOTS, STAGES, Pipeline, PipelineConfig, build_pipeline
from graphdist.passes.eliminate_dead_nodes import EliminateDeadNodesPass
from graphdist.passes.fold_constants import FoldConstantsPass

TWO = ["cpu:0", "cpu:1"]
ALWAYS = ("differentiate", "replicate", "variable_updates", "collectives", "lower_collectives", "cleanup", "devices",
          "index_checks", "partition")
STRATEGY_NAMES = {"OneDeviceStrategy", "MirroredStrategy", "TPUStrategy", "ParameterServerStrategy",
                  "MultiWorkerMirroredStrategy", "CentralStorageStrategy"}
PASSES_DIR = Path(__file__).resolve().parents[2] / "graphdist" / "passes"


def _filled(pipeline: Pipeline) -> tuple[str, ...]:
    return tuple(slot for slot in SLOTS if pipeline.slots.get(slot))


def _with_extra(*extra: str) -> tuple[str, ...]:
    """ALWAYS plus ``extra``, in SLOTS order (worked out from the table, not from a built pipeline)."""
    return tuple(slot for slot in SLOTS if slot in ALWAYS or slot in extra)


def _only(pipeline: Pipeline, slot: str, index: int = 0):
    return pipeline.slots[slot][index]


def _as_data(pipeline: Pipeline) -> list[tuple[str, str, dict]]:
    return [(slot, type(p).__name__, vars(p)) for slot in SLOTS for p in pipeline.slots.get(slot, [])]


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRAPHDIST_CONFIG", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _tpu(computation_shape=None) -> gd.TPUStrategy:
    resolver = gd.cluster_resolver.TPUClusterResolver(tpu="local[2]")
    if computation_shape is None:
        return gd.TPUStrategy(resolver)
    topology = gd.tpu.experimental.initialize_tpu_system(resolver)
    assignment = gd.tpu.experimental.DeviceAssignment.build(topology, computation_shape=computation_shape)
    return gd.TPUStrategy(resolver, experimental_device_assignment=assignment)


def test_one_device_fills_the_always_slots_in_order() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    assert strategy.pipeline_config() == PipelineConfig(devices=("cpu:0",), strategy="OneDeviceStrategy")
    pipeline = strategy.pipeline()
    assert _filled(pipeline) == ALWAYS
    assert [type(p).__name__ for p in pipeline] == [
        "AutodiffPass", "LowerStopGradientsPass", "ReplicatePass", "LowerVariableUpdatesPass", "InsertCollectivesPass",
        "LowerCollectivesPass", "FoldConstantsPass", "EliminateDeadNodesPass", "AssignDevicesPass",
        "LowerIndexChecksPass", "PartitionPass"]
    assert len(pipeline) == 11 and type(pipeline[-1]).__name__ == "PartitionPass"
    replicate = _only(pipeline, "replicate")
    assert (replicate.replicas, replicate.offset, replicate.replicas_in_sync) == (1, 0, 1)
    assert _only(pipeline, "lower_collectives").collective_attrs == {"algorithm": "ring"}  # the default
    assert _only(pipeline, "collectives").num_workers == 1


def test_mirrored_with_nccl_packs() -> None:
    strategy = gd.MirroredStrategy(TWO, cross_device_ops=gd.NcclAllReduce(num_packs=2))
    assert strategy.pipeline_config() == PipelineConfig(
        devices=("cpu:0", "cpu:1"), collective_attrs={"algorithm": "ring"}, bucketing={"num_packs": 2},
        strategy="MirroredStrategy")
    pipeline = strategy.pipeline()
    assert _filled(pipeline) == _with_extra("balance_updates", "bucketing")
    replicate = _only(pipeline, "replicate")
    assert (replicate.replicas, replicate.offset, replicate.replicas_in_sync) == (2, 0, 2)
    bucketing = _only(pipeline, "bucketing")
    assert (bucketing.num_packs, bucketing.bytes_per_pack) == (2, None)
    names = [type(p).__name__ for p in pipeline]
    assert names.index("LowerCollectivesPass") + 1 == names.index("BucketCollectivesPass")


def test_mirrored_default_sums_gradients_at_their_readers() -> None:
    strategy = gd.MirroredStrategy(TWO)  # no cross_device_ops: graphdist picks
    config = strategy.pipeline_config()
    assert config.reduce_at_readers and config.collective_attrs == {"algorithm": "ring"} and config.bucketing is None
    pipeline = strategy.pipeline()
    assert _filled(pipeline) == _with_extra("balance_updates", "single_readers")
    assert type(_only(pipeline, "single_readers")).__name__ == "LowerSingleReaderAllReducesPass"
    names = [type(p).__name__ for p in pipeline]
    assert names.index("BalanceVariableUpdatesPass") + 1 == names.index("LowerSingleReaderAllReducesPass")
    # packs asked for keep the all-reduces (the overlap cut needs them)
    assert "single_readers" not in _filled(build_pipeline(config.replace(bucketing={"num_packs": 2})))
    assert not gd.MirroredStrategy(TWO, cross_device_ops=gd.NcclAllReduce()).pipeline_config().reduce_at_readers


def test_mirrored_with_hierarchical_copy() -> None:
    config = gd.MirroredStrategy(TWO, cross_device_ops=gd.HierarchicalCopyAllReduce()).pipeline_config()
    assert config.collective_attrs == {"algorithm": "hierarchical_copy"} and config.bucketing is None
    pipeline = build_pipeline(config)
    assert _filled(pipeline) == _with_extra("balance_updates")  # an explicit choice: every gradient all-reduced
    assert type(_only(pipeline, "balance_updates")).__name__ == "BalanceVariableUpdatesPass"
    assert _only(pipeline, "lower_collectives").collective_attrs == {"algorithm": "hierarchical_copy"}


@pytest.mark.parametrize(("parameter_device", "attrs"), [
    ("cpu:2", {"algorithm": "ring"}),  # a separate device: the replicas all-reduce among themselves
    ("cpu:1", {"algorithm": "reduce_to_one", "reduce_to_device": "cpu:1"}),  # one of them: reduce onto it
])
def test_central_storage_places_variables_on_the_parameter_device(parameter_device, attrs) -> None:
    config = gd.CentralStorageStrategy(TWO, parameter_device).pipeline_config()
    assert config == PipelineConfig(devices=("cpu:0", "cpu:1"), collective_attrs=attrs,
                                    parameter_device=parameter_device, strategy="CentralStorageStrategy")
    pipeline = build_pipeline(config)
    assert _filled(pipeline) == _with_extra("central_storage")
    assert _only(pipeline, "central_storage").parameter_device == parameter_device
    assert _only(pipeline, "lower_collectives").collective_attrs == attrs


def test_multi_worker_without_a_cluster_is_one_worker(no_cluster) -> None:
    strategy = gd.MultiWorkerMirroredStrategy(devices=TWO)
    config = strategy.pipeline_config()
    group = config.multi_worker["comm_group"]
    assert config == PipelineConfig(
        devices=("cpu:0", "cpu:1"), replicas_in_sync=2, replica_offset=0, collective_attrs={"algorithm": "ring"},
        multi_worker={"num_workers": 1, "comm_group": group, "algorithm": "auto"},
        strategy="MultiWorkerMirroredStrategy")
    assert group.startswith("multi_worker") and (config.num_workers, config.total_replicas) == (1, 2)
    pipeline = strategy.pipeline()
    assert _filled(pipeline) == _with_extra("balance_updates", "cross_worker")
    cross = _only(pipeline, "cross_worker")
    assert (cross.num_workers, cross.comm_group, cross.algorithm) == (1, group, "auto")


def test_a_two_worker_config_gives_global_replica_ids() -> None:
    config = PipelineConfig(devices=("cpu:0", "cpu:1"), replicas_in_sync=4, replica_offset=2,
                            multi_worker={"num_workers": 2, "comm_group": "g", "algorithm": "ring"})
    assert (config.replicas, config.total_replicas, config.num_workers) == (2, 4, 2)
    pipeline = build_pipeline(config)
    replicate = _only(pipeline, "replicate")
    assert (replicate.replicas, replicate.offset, replicate.replicas_in_sync) == (2, 2, 4)
    assert _only(pipeline, "collectives").num_workers == 2
    cross = _only(pipeline, "cross_worker")
    assert (cross.num_workers, cross.comm_group, cross.algorithm) == (2, "g", "ring")


def test_parameter_servers_and_bytes_per_pack() -> None:
    pipeline = build_pipeline(PipelineConfig(parameter_servers=True, bucketing={"bytes_per_pack": 1024}))
    assert _filled(pipeline) == _with_extra("parameter_servers", "bucketing")
    assert type(_only(pipeline, "parameter_servers")).__name__ == "PlacePSVariablesPass"
    assert (_only(pipeline, "bucketing").bytes_per_pack, _only(pipeline, "bucketing").num_packs) == (1024, None)


@pytest.mark.parametrize(("shape", "cores"), [
    (None, [["tpu:0"], ["tpu:1"]]),  # two replicas of one core
    ([1, 1, 1, 2], [["tpu:0", "tpu:1"]]),  # one replica of two logical cores
])
def test_tpu_adds_logical_devices(shape, cores) -> None:
    config = _tpu(shape).pipeline_config()
    assert config.devices == tuple(c[0] for c in cores) and config.backend == "tvm"
    assert config.logical_cores == tuple(tuple(c) for c in cores) and config.collective_attrs == {"algorithm": "ring"}
    pipeline = build_pipeline(config)
    assert _filled(pipeline) == _with_extra("logical_devices", *(("balance_updates",) if len(cores) > 1 else ()))
    shard, place = pipeline.slots["logical_devices"]
    assert (type(shard).__name__, type(place).__name__) == ("ShardLogicalDevicesPass", "PlaceLogicalDevicesPass")
    assert shard.cores == cores and place.cores == cores
    assert _only(pipeline, "replicate").replicas == len(cores)


def test_with_slot_replaces_one_slot_and_refuses_unknown_names() -> None:
    original = gd.MirroredStrategy(TWO).pipeline()
    before = _as_data(original)
    trimmed = original.with_slot("cleanup", EliminateDeadNodesPass())
    assert [type(p).__name__ for p in trimmed.slots["cleanup"]] == ["EliminateDeadNodesPass"]
    assert _as_data(original) == before and trimmed.config is original.config
    assert len(trimmed) == len(original) - 1
    first = original.with_slot("differentiate", FoldConstantsPass())  # inserted last, still run first
    assert isinstance(first[0], FoldConstantsPass)
    emptied = original.with_slot("balance_updates").with_slot("single_readers")
    assert _filled(emptied) == ALWAYS
    with pytest.raises(KeyError, match="unknown pipeline slot 'optimize'"):
        original.with_slot("optimize", FoldConstantsPass())


def test_stages_split_the_slots_where_compilation_keeps_a_graph() -> None:
    """``rebatched`` | ``rewritten`` | ``partitioned``: every slot in exactly one stage, in SLOTS order."""
    assert [slot for slots in STAGES.values() for slot in slots] == list(SLOTS)
    pipeline = gd.MirroredStrategy(TWO).pipeline()
    assert pipeline.stage("rebatched") == []
    assert [type(p).__name__ for p in pipeline.stage("partitioned")] == ["PartitionPass"]
    rewritten = [type(p).__name__ for p in pipeline.stage("rewritten")]
    assert rewritten[0] == "AutodiffPass" and rewritten[-2:] == ["AssignDevicesPass", "LowerIndexChecksPass"]
    assert [p for stage in STAGES for p in pipeline.stage(stage)] == list(pipeline)
    with pytest.raises(KeyError, match="unknown pipeline stage 'traced'"):
        pipeline.stage("traced")


@pytest.mark.parametrize("rebatch", [{"batch": 3, "replicas": 2}, {"batch": None, "replicas": 4}])
def test_rebatch_slot_is_filled_only_when_re_planning(rebatch) -> None:
    assert "rebatch" not in build_pipeline(PipelineConfig(devices=tuple(TWO))).slots
    pipeline = build_pipeline(PipelineConfig(devices=tuple(TWO), rebatch=rebatch))
    (rebatch_pass,) = pipeline.stage("rebatched")
    assert (type(rebatch_pass).__name__, rebatch_pass.batch, rebatch_pass.replicas) == (
        "RebatchPass", rebatch["batch"], rebatch["replicas"])
    assert pipeline[0] is rebatch_pass


def test_describe_lists_filled_slots_in_order() -> None:
    pipeline = gd.CentralStorageStrategy(TWO, "cpu:2").pipeline().with_slot("cleanup", FoldConstantsPass())
    lines = pipeline.describe().splitlines()
    assert [line.split(":")[0] for line in lines] == list(_with_extra("central_storage"))
    assert "replicate: ReplicatePass(replicas=2, offset=0, replicas_in_sync=2)" in lines
    assert "central_storage: PlaceVariablesPass(parameter_device='cpu:2')" in lines
    assert "cleanup: FoldConstantsPass()" in lines
    assert "differentiate: AutodiffPass(), LowerStopGradientsPass()" in lines


def test_describe_tells_all_reduce_algorithms_apart() -> None:
    ring = gd.MirroredStrategy(TWO, cross_device_ops=gd.NcclAllReduce()).pipeline().describe()
    tree = gd.MirroredStrategy(TWO, cross_device_ops=gd.HierarchicalCopyAllReduce()).pipeline().describe()
    assert ring != tree and "hierarchical_copy" in tree


def test_config_is_plain_data() -> None:
    config = gd.MirroredStrategy(TWO, cross_device_ops=gd.NcclAllReduce(num_packs=2)).pipeline_config()
    assert dataclasses.is_dataclass(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.devices = ("cpu:3",)
    plain = (str, int, bool, type(None))

    def is_plain(value) -> bool:
        if isinstance(value, (tuple, list)):
            return all(is_plain(v) for v in value)
        if isinstance(value, dict):
            return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
        return isinstance(value, plain)

    assert all(is_plain(getattr(config, f.name)) for f in dataclasses.fields(config))
    again = gd.MirroredStrategy(TWO, cross_device_ops=gd.NcclAllReduce(num_packs=2)).pipeline_config()
    assert again == config and _as_data(build_pipeline(again)) == _as_data(build_pipeline(config))
    assert config.replace(devices=("cpu:0",)).devices == ("cpu:0",) and config.devices == ("cpu:0", "cpu:1")
    pipeline = build_pipeline(config)
    _only(pipeline, "lower_collectives").collective_attrs["algorithm"] = "changed"  # passes hold copies
    assert config.collective_attrs == {"algorithm": "ring"}


def _strategy_mentions(source: str, filename: str) -> list[str]:
    """Names, attributes, imports and whole string constants of ``source`` equal to a strategy class name
    (a docstring or comment that merely mentions one is not a branch).
    """
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [part for alias in node.names for part in (alias.name.split(".")[-1], alias.asname) if part]
        found += [f"{filename}:{node.lineno} {name}" for name in names if name in STRATEGY_NAMES]
    return found


def test_the_strategy_check_sees_branches() -> None:
    probe = ('"""Used by MirroredStrategy."""\nfrom graphdist import TPUStrategy as T\n'
             'if isinstance(s, gd.CentralStorageStrategy) or kind == "OneDeviceStrategy" or MirroredStrategy:\n'
             '    pass  # not for ParameterServerStrategy\n')
    hits = sorted(hit.split(" ")[1] for hit in _strategy_mentions(probe, "probe.py"))
    assert hits == ["CentralStorageStrategy", "MirroredStrategy", "OneDeviceStrategy", "TPUStrategy"]


def test_no_pass_branches_on_a_strategy() -> None:
    files = sorted(PASSES_DIR.glob("*.py"))
    assert len(files) > 10 and any(f.name == "replicate.py" for f in files)
    assert [hit for path in files for hit in _strategy_mentions(path.read_text(), path.name)] == []
