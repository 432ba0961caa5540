"""TPUStrategy on simulated TPU-like cores: the resolver and device assignment, the seeds' logical
device example, model parallelism (split == unsplit), training == one device, whole-step
compilation only, and the errors the seeds describe."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.passes.base import PassContext, PassManager
from graphdist.passes.shard_logical_devices import ShardLogicalDevicesPass


def tpu_strategy(replicas: int, cores_per_replica: int = 1, cores: int | None = None) -> gd.TPUStrategy:
    resolver = gd.cluster_resolver.TPUClusterResolver(tpu=f"local[{cores or replicas * cores_per_replica}]")
    topology = gd.tpu.experimental.initialize_tpu_system(resolver)
    assignment = gd.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, cores_per_replica], num_replicas=replicas)
    return gd.TPUStrategy(resolver, experimental_device_assignment=assignment)


def test_resolver_topology_and_assignment() -> None:
    resolver = gd.cluster_resolver.TPUClusterResolver(tpu="")
    assert resolver.num_accelerators() == {"TPU": 8} and resolver.simulated
    topology = gd.tpu.experimental.initialize_tpu_system(resolver)
    assert topology.mesh_shape == [1, 1, 4, 2]
    assignment = gd.tpu.experimental.DeviceAssignment.build(topology, computation_shape=[1, 1, 1, 2], num_replicas=4)
    assert (assignment.num_replicas, assignment.num_cores_per_replica) == (4, 2)
    assert assignment.cores() == [["tpu:0", "tpu:1"], ["tpu:2", "tpu:3"], ["tpu:4", "tpu:5"], ["tpu:6", "tpu:7"]]
    strategy = gd.TPUStrategy(resolver, experimental_device_assignment=assignment)
    assert strategy.num_replicas_in_sync == 4
    assert strategy.extended.worker_devices == ("tpu:0", "tpu:2", "tpu:4", "tpu:6")
    assert gd.experimental.TPUStrategy is gd.TPUStrategy
    gd.config.experimental_connect_to_cluster(resolver)  # accepted: the cores are in this process


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"computation_shape": [1, 1, 3, 1]}, "does not tile the mesh"),
    ({"computation_shape": [1, 2]}, "must have 4 positive entries"),
    ({"computation_shape": [1, 1, 1, 2], "num_replicas": 5}, "does not fit"),
])
def test_bad_device_assignments(kwargs: dict, message: str) -> None:
    topology = gd.tpu.experimental.initialize_tpu_system(gd.cluster_resolver.TPUClusterResolver("local[8]"))
    with pytest.raises(ValueError, match=message):
        gd.tpu.experimental.DeviceAssignment.build(topology, **kwargs)


def test_remote_tpu_is_not_supported() -> None:
    with pytest.raises(NotImplementedError, match="local\\[N\\]"):
        gd.cluster_resolver.TPUClusterResolver(tpu="grpc://10.0.0.2:8470")


def test_seeds_logical_device_example() -> None:
    """multi-worker-mirrored-strategy.txt: 2 logical devices and 4 replicas, output assigned to logical device 0."""
    resolver = gd.cluster_resolver.TPUClusterResolver(tpu='')
    topology = gd.tpu.experimental.initialize_tpu_system(resolver)
    device_assignment = gd.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, 2], num_replicas=4)
    strategy = gd.TPUStrategy(resolver, experimental_device_assignment=device_assignment)
    inputs = gd.data.Dataset.from_tensor_slices(np.arange(32, dtype=np.float32).reshape(8, 4)).batch(8)
    iterator = iter(strategy.experimental_distribute_dataset(inputs))

    @gd.function
    def step(batch):
        def step_fn(inputs):
            output = np.add(inputs, inputs)
            # Add operation will be executed on logical device 0.
            output = strategy.experimental_assign_to_logical_device(output, 0)
            return output
        return strategy.run(step_fn, args=(batch,))

    result = strategy.experimental_local_results(step(next(iterator)))
    expected = np.arange(32, dtype=np.float32).reshape(8, 4) * 2
    np.testing.assert_array_equal(np.concatenate(result), expected)


def test_assign_to_logical_device_places_the_producer() -> None:
    strategy = tpu_strategy(replicas=2, cores_per_replica=2)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)

    @gd.function
    def step(batch):
        def step_fn(inputs):
            hidden = strategy.experimental_assign_to_logical_device(np.tanh(inputs), 1)
            return hidden * 2
        return strategy.run(step_fn, args=(batch,))

    dist = strategy.experimental_distribute_values_from_function(lambda ctx: x[2 * ctx.replica_id_in_sync_group:][:2])
    concrete = step.get_concrete_function(dist)
    placed = {(n.op_type, n.device) for n in concrete.graph("partitioned").nodes}
    assert {("Tanh", "tpu:1"), ("Tanh", "tpu:3"), ("Mul", "tpu:0"), ("Mul", "tpu:2")} <= placed
    assert any(n.op_type == "Transfer" for n in concrete.graph("partitioned").nodes)  # logical device 1 -> 0
    got = strategy.experimental_local_results(step(dist))
    np.testing.assert_allclose(np.concatenate(got), np.tanh(x) * 2, rtol=1e-6)


def test_invalid_logical_device_id_raises_value_error() -> None:
    strategy = tpu_strategy(replicas=2, cores_per_replica=2)

    @gd.function
    def step(batch):
        return strategy.run(lambda v: strategy.experimental_assign_to_logical_device(v + 1, 2), args=(batch,))

    with pytest.raises(ValueError, match="not consistent with the total number of partitions"):
        step(np.ones((4, 2), np.float32))


def test_eager_run_is_refused() -> None:
    strategy = tpu_strategy(replicas=2)
    with pytest.raises(gd.PlanError, match="inside a gd.function"):
        strategy.run(lambda v: v + 1, args=(np.ones(2, np.float32),))


def _mlp_step(strategy, split: list[int] | None, kernel1, kernel2):
    with strategy.scope():
        w1 = gd.Variable(kernel1, name="w1")
        w2 = gd.Variable(kernel2, name="w2")
        optimizer = gd.optimizers.SGD(0.1)

    def step_fn(x, y):
        with gd.GradientTape() as tape:
            hidden = x @ w1
            if split is not None:  # model parallelism: the hidden layer tiled over the logical devices
                hidden = strategy.experimental_split_to_logical_devices(hidden, split)
            logits = np.maximum(hidden, 0) @ w2
            loss = gd.nn.compute_average_loss(gd.nn.sparse_softmax_cross_entropy(y, logits), global_batch_size=16)
        grads = tape.gradient(loss, [w1, w2])
        optimizer.apply_gradients(zip(grads, [w1, w2]))
        return loss

    @gd.function
    def train(x, y):
        return strategy.reduce(gd.ReduceOp.SUM, strategy.run(step_fn, args=(x, y)), axis=None)

    return train, (w1, w2)


def _data(steps: int = 3):
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 5, 16)) for _ in range(steps)]


@pytest.mark.parametrize("split", [[2, 1], [1, 2]])
def test_split_replica_equals_unsplit_and_one_device(split: list[int]) -> None:
    """Two replicas x two logical devices with the hidden layer split == the same on one device."""
    rng = np.random.default_rng(0)
    k1, k2 = rng.standard_normal((12, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    results = {}
    for name, strategy, parts in (("one", gd.OneDeviceStrategy("cpu:0"), None),
                                  ("tpu_split", tpu_strategy(replicas=2, cores_per_replica=2), split)):
        train, variables = _mlp_step(strategy, parts, k1, k2)
        losses = []
        for x, y in _data():
            batch = x if name == "one" else strategy.experimental_distribute_values_from_function(
                lambda ctx, x=x: x[8 * ctx.replica_id_in_sync_group:][:8])
            labels = y if name == "one" else strategy.experimental_distribute_values_from_function(
                lambda ctx, y=y: y[8 * ctx.replica_id_in_sync_group:][:8])
            losses.append(float(train(batch, labels)))
        results[name] = (losses, [v.numpy() for v in variables])
        if name == "tpu_split":
            concrete = train.get_concrete_function(batch, labels)
            devices = {n.device for n in concrete.graph("partitioned").nodes if n.op_type in ("Relu", "Max", "MatMul")}
            assert {"tpu:0", "tpu:1", "tpu:2", "tpu:3"} <= devices  # the split layer runs on every logical core
            assert not concrete.graph("rewritten").find_nodes("SplitToLogicalDevices", GRAPHDIST_DOMAIN)
    np.testing.assert_allclose(results["tpu_split"][0], results["one"][0], rtol=1e-5)
    for got, want in zip(results["tpu_split"][1], results["one"][1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_split_partition_must_match_logical_devices() -> None:
    strategy = tpu_strategy(replicas=1, cores_per_replica=2)

    @gd.function
    def step(batch):
        return strategy.run(lambda v: strategy.experimental_split_to_logical_devices(v, [2, 2]), args=(batch,))

    with pytest.raises(ValueError, match="their product must be 2"):
        step(np.ones((4, 4), np.float32))

    @gd.function
    def uneven(batch):
        return strategy.run(lambda v: strategy.experimental_split_to_logical_devices(v, [2, 1]), args=(batch,))

    with pytest.raises(ValueError, match="divide the tensor's shape"):
        uneven(np.ones((3, 4), np.float32))


def test_training_on_tpu_replicas_equals_one_device() -> None:
    rng = np.random.default_rng(1)
    k1, k2 = rng.standard_normal((12, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    finals = []
    for strategy in (gd.OneDeviceStrategy("cpu:0"), tpu_strategy(replicas=4)):
        train, variables = _mlp_step(strategy, None, k1, k2)
        dataset = gd.data.Dataset.from_tensor_slices(tuple(np.concatenate(a) for a in zip(*_data()))).batch(16)
        for x, y in strategy.experimental_distribute_dataset(dataset):
            train(x, y)
        finals.append([v.numpy() for v in variables])
    for got, want in zip(*finals[::-1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_shard_pass_is_idempotent_and_keeps_numerics() -> None:
    """Before/after on a hand-traced graph: the rewrite computes the same values; a second run changes nothing."""
    strategy = tpu_strategy(replicas=1, cores_per_replica=2)
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)

    @gd.function
    def step(batch):
        return strategy.run(lambda v: np.exp(strategy.experimental_split_to_logical_devices(v, [1, 2])) * 3,
                            args=(batch,))

    concrete = step.get_concrete_function(x)
    rewritten = concrete.graph("rewritten")
    ctx = PassContext(devices=("tpu:0",))
    again = PassManager([ShardLogicalDevicesPass(strategy.device_assignment.cores())]).run(rewritten.copy(), ctx)
    assert not again.modified
    assert sum(n.op_type == "Exp" for n in rewritten.nodes) == 2  # one per logical device
    np.testing.assert_allclose(step(x), np.exp(x) * 3, rtol=1e-6)


def test_bad_tpu_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="tpu must be a string such as 'local\\[8\\]'"):
        gd.cluster_resolver.TPUClusterResolver(tpu=5)
    with pytest.raises(ValueError, match="at least one core"):
        gd.cluster_resolver.TPUClusterResolver(tpu="local[0]")
    with pytest.raises(ValueError, match="cluster_resolver must be a gd.cluster_resolver.TPUClusterResolver"):
        gd.TPUStrategy(cluster_resolver="local[2]")
    resolver = gd.cluster_resolver.TPUClusterResolver("local[2]")
    with pytest.raises(ValueError, match="experimental_device_assignment must be a DeviceAssignment"):
        gd.TPUStrategy(resolver, experimental_device_assignment=[1, 1, 1, 2])
    topology = gd.tpu.experimental.initialize_tpu_system(resolver)
    with pytest.raises(NotImplementedError, match="computation_stride"):
        gd.tpu.experimental.DeviceAssignment.build(topology, computation_stride=[1, 1, 1, 2])
    with pytest.raises(ValueError, match="expected a cluster resolver"):
        gd.config.experimental_connect_to_cluster("tpu")
