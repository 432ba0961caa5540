"""CentralStorageStrategy: the seeds' examples with 2 and 4 compute devices, variables
on the parameter device, the plan's placement, and training equivalence with one
device on the same global batches."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import graphdist as gd
from graphdist.ir.comm_ops import is_communication
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


@pytest.fixture(params=[(2, "cpu:0"), (4, "cpu:0"), (2, "cpu:9")], ids=["2dev", "4dev", "2dev_cpu9"])
def strategy(request) -> gd.CentralStorageStrategy:
    replicas, parameter_device = request.param
    return gd.CentralStorageStrategy(_devices(replicas), parameter_device)


# ------------------------------------------------------------------ devices
def test_devices_and_defaults() -> None:
    strategy = gd.CentralStorageStrategy(["cpu:0", "/cpu:1"])
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1")
    assert strategy.extended.parameter_devices == ("cpu:0",)
    assert strategy.parameter_device == "cpu:0"
    assert strategy.num_replicas_in_sync == 2
    assert strategy.cluster_resolver is None
    assert repr(strategy) == "CentralStorageStrategy(compute_devices=['cpu:0', 'cpu:1'], parameter_device='cpu:0')"
    separate = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device="/device:CPU:9")
    assert separate.extended.parameter_devices == ("cpu:9",)
    default = gd.CentralStorageStrategy()
    gpus = [f"cuda:{i}" for i in range(gd.config.num_gpus())]
    assert default.extended.worker_devices == tuple(gpus or ["cpu:0"])
    assert default.extended.parameter_devices == ("cpu:0",)


def test_collective_algorithm_follows_the_parameter_device() -> None:
    on_worker = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:1")
    assert on_worker.cross_device_ops.collective_attrs() == {"algorithm": "reduce_to_one",
                                                             "reduce_to_device": "cpu:1"}
    separate = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:9")
    assert separate.cross_device_ops.collective_attrs() == {"algorithm": "ring"}


# ---------------------------------------------------------------- variables
def test_variables_are_single_copies_on_the_parameter_device(strategy) -> None:
    with strategy.scope():
        variable = gd.Variable(1.0)
    assert type(variable) is gd.Variable
    assert variable.device == strategy.parameter_device
    assert repr(variable) == "<gd.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"
    assert strategy.extended.variable_created_in_scope(variable)
    assert strategy.experimental_local_results(variable) == (variable,)
    variable.assign(3.0)  # outside the scope
    assert float(variable.numpy()) == 3.0
    outside = gd.Variable(1.0)
    assert not strategy.extended.variable_created_in_scope(outside)
    assert outside.device == "cpu:0"


def test_replicas_read_the_variable(strategy) -> None:
    with strategy.scope():
        scale = gd.Variable(np.array([1.0, 2.0, 3.0], np.float32), name="scale")
    n = strategy.num_replicas_in_sync
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(3, ctx.replica_id_in_sync_group, np.float32))
    result = strategy.run(lambda v: v * scale, args=(values,))
    for r, got in enumerate(strategy.experimental_local_results(result)):
        np.testing.assert_array_equal(got, np.array([1.0, 2.0, 3.0], np.float32) * r)
    assert len(result.values) == n


def test_assign_in_replica_of_an_all_reduced_value(strategy) -> None:
    with strategy.scope():
        total = gd.Variable(np.zeros(2, np.float32), name="total")
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(2, ctx.replica_id_in_sync_group + 1, np.float32))

    def step(v):
        total.assign_add(gd.get_replica_context().all_reduce("sum", v))
        return total.read_value()

    n = strategy.num_replicas_in_sync
    expected = np.full(2, n * (n + 1) / 2, np.float32)
    for k in (1, 2):
        result = strategy.run(step, args=(values,))
        np.testing.assert_array_equal(total.numpy(), expected * k)
        for got in strategy.experimental_local_results(result):
            np.testing.assert_array_equal(got, expected * k)




def test_distributed_dataset_example() -> None:
    strategy = gd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    dist_dataset = strategy.experimental_distribute_dataset(gd.data.Dataset.range(4).batch(2))
    result = [strategy.run(lambda x: x * 2, args=(x,)) for x in dist_dataset]
    assert [[v.tolist() for v in r.values] for r in result] == [[[0], [2]], [[4], [6]]]


def test_partial_batch_mean_uses_the_real_denominator() -> None:
    strategy = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:9")
    (x,) = list(strategy.experimental_distribute_dataset(gd.data.Dataset.range(6).batch(8)))
    per_replica = strategy.run(lambda v: v.astype(np.float32), args=(x,))
    assert strategy.reduce("MEAN", per_replica, axis=0) == 2.5


# --------------------------------------------------------------------- plan
def _concrete_train_step(strategy, optimizer_fn):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        model = MLP((8, 4, 3), seed=0, trainable=True)
        optimizer = optimizer_fn()
    step = model.make_train_step(optimizer, 2 * n)
    x = gd.PerReplica((np.ones((2, 8), np.float32),) * n)
    y = gd.PerReplica(tuple(np.array([0, r % 3]) for r in range(n)))
    return model, optimizer, strategy._function_for(step).get_concrete_function(x, y)


@pytest.mark.parametrize("parameter_device", ["cpu:0", "cpu:1", "cpu:9"])
@pytest.mark.parametrize("optimizer_fn", [lambda: gd.optimizers.SGD(0.1, momentum=0.9),
                                          lambda: gd.optimizers.Adam(0.01)], ids=["sgd", "adam"])
def test_plan_places_updates_on_the_parameter_device(parameter_device: str, optimizer_fn) -> None:
    strategy = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device)
    model, optimizer, concrete = _concrete_train_step(strategy, optimizer_fn)
    graph = concrete.graph("partitioned")
    gd.verify(graph)
    by_name = {out.name: node for node in graph.nodes for out in node.outputs}
    updates = graph.meta.variable_updates
    assert {uid for _, uid in updates} == {v.uid for v in [*model.trainable_variables, *optimizer.variables()]}
    placement = graph.meta.placement
    for name, uid in updates:
        assert placement[uid].kind == "central" and placement[uid].devices == (parameter_device,)
        assert by_name[name].device == parameter_device, f"update of {uid} computed elsewhere"
    # the optimizer math (everything after the all-reduce) runs on the parameter device
    math = [n for n in graph.nodes if not is_communication(n) and n.op_type in ("Sqrt", "Pow", "Sub")
            and n.replica is None]
    assert math and {n.device for n in math} == {parameter_device}
    # each compute device other than the parameter device receives each model variable by one
    # transfer; the optimizer's slots and step counter are read by the update only and never move
    workers = set(strategy.extended.worker_devices) - {parameter_device}
    reads = [(n.meta["variable_read"], n.device) for n in graph.nodes if n.meta.get("variable_read")]
    model_inputs = sorted(v._name for v in model.trainable_variables)
    assert sorted(reads) == sorted((name, device) for name in model_inputs for device in workers)
    plan = concrete.plan
    assert parameter_device in plan.devices
    reduces = [c for c in plan.comms if c.op == "AllReduce"]
    assert len(reduces) == len(model.trainable_variables)
    if parameter_device in strategy.extended.worker_devices:
        root = strategy.extended.worker_devices.index(parameter_device)
        assert all(c.attrs["algorithm"] == "reduce_to_one" and c.attrs["root"] == root for c in reduces)
    else:
        assert all(c.attrs["algorithm"] == "ring" for c in reduces)
    transfers = [n for n in graph.nodes if n.op_type == "Transfer"]
    # gradients reach the update: locally from the reduce-to-one root, else by one transfer per variable
    grads_in = [n for n in transfers if n.device == parameter_device]
    assert all(n.inputs[0].producer.op_type == "AllReduce" for n in grads_in)
    expected = 0 if parameter_device in strategy.extended.worker_devices else len(model.trainable_variables)
    assert len(grads_in) == expected
    segments = {s.name for s in plan.segments if s.device == parameter_device}
    assert segments and all(s.startswith(parameter_device.replace(":", "")) for s in segments)


# ----------------------------------------------------------- training
def _train(strategy, optimizer_fn, steps: int = 4, batch: int = 32) -> tuple[list[np.ndarray], list[float]]:
    data = digits()
    with strategy.scope():
        model = MLP((64, 32, 10), seed=0, trainable=True)
        optimizer = optimizer_fn()
    step = model.make_train_step(optimizer, batch)
    dataset = gd.data.Dataset.from_tensor_slices((data.x_train[: batch * steps], data.y_train[: batch * steps]))
    losses = []
    for x, y in strategy.experimental_distribute_dataset(dataset.batch(batch)):
        losses.append(float(strategy.reduce("SUM", strategy.run(step, args=(x, y)), axis=None)))
    return [v.numpy() for v in [*model.trainable_variables, *optimizer.variables()]], losses


_OPTIMIZERS = {"sgd_momentum": lambda: gd.optimizers.SGD(0.1, momentum=0.9),
               "adam": lambda: gd.optimizers.Adam(0.01)}


@functools.cache
def _one_device(optimizer: str) -> tuple[list[np.ndarray], list[float]]:
    return _train(gd.OneDeviceStrategy("cpu:0"), _OPTIMIZERS[optimizer])


@pytest.mark.parametrize("optimizer", sorted(_OPTIMIZERS))
@pytest.mark.parametrize("parameter_device", ["cpu:0", "cpu:9"])
@pytest.mark.parametrize("replicas", [2, 4])
def test_central_storage_training_equals_one_device(replicas: int, parameter_device: str, optimizer: str) -> None:
    expected, expected_losses = _one_device(optimizer)
    got, losses = _train(gd.CentralStorageStrategy(_devices(replicas), parameter_device), _OPTIMIZERS[optimizer])
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_one_compute_device_with_a_separate_parameter_device() -> None:
    strategy = gd.CentralStorageStrategy(["cpu:0"], "cpu:1")
    expected, expected_losses = _one_device("adam")
    got, losses = _train(strategy, _OPTIMIZERS["adam"])
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the backward pass stays on the compute device; only the optimizer step moves
    _, _, concrete = _concrete_train_step(strategy, _OPTIMIZERS["adam"])
    graph = concrete.graph("partitioned")
    assert {n.device for n in graph.nodes if n.op_type == "MatMul"} == {"cpu:0"}
    assert {n.device for n in graph.nodes if n.op_type == "Sqrt"} == {"cpu:1"}
    gd.verify(graph)


def test_checkpoint_resume_matches_uninterrupted_training(tmp_path) -> None:
    data = digits()
    dataset = gd.data.Dataset.from_tensor_slices((data.x_train[:128], data.y_train[:128])).batch(32)

    def build(strategy):
        with strategy.scope():
            model = MLP((64, 16, 10), seed=0, trainable=True)
            optimizer = gd.optimizers.Adam(0.01)
        return model, optimizer, model.make_train_step(optimizer, 32)

    def train(strategy, step, batches):
        for x, y in batches:
            strategy.run(step, args=(x, y))

    strategy = gd.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:9")
    batches = list(strategy.experimental_distribute_dataset(dataset))
    model, optimizer, step = build(strategy)
    train(strategy, step, batches)
    model_a, optimizer_a, step_a = build(strategy)
    train(strategy, step_a, batches[:2])
    path = gd.train.Checkpoint(model=model_a, optimizer=optimizer_a).save(tmp_path / "mid.npz")
    model_b, optimizer_b, step_b = build(strategy)
    gd.train.Checkpoint(model=model_b, optimizer=optimizer_b).restore(path)
    train(strategy, step_b, batches[2:])
    for a, b in zip(model_b.trainable_variables + optimizer_b.variables(),
                    model.trainable_variables + optimizer.variables(), strict=True):
        assert a.device == "cpu:9"
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- bad input
def test_bad_input() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="more than once"):
        gd.CentralStorageStrategy(["cpu:0", "/cpu:0"])
    with pytest.raises(gd.InvalidArgumentError, match="at least one device"):
        gd.CentralStorageStrategy([])
    for malformed in ("nowhere:0", "cpu:-1", "cpu:0:1", 3):
        with pytest.raises(gd.DeviceError, match="device"):
            gd.CentralStorageStrategy(["cpu:0", "cpu:1"], parameter_device=malformed)
    gd.config.set_soft_device_placement(False)  # on (the default), the absent GPU becomes a logical CPU
    try:
        with pytest.raises(gd.DeviceError, match="not available"):
            gd.CentralStorageStrategy(["cpu:0"], parameter_device=f"gpu:{gd.config.num_gpus() + 3}")
    finally:
        gd.config.set_soft_device_placement(True)
    strategy = gd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with pytest.raises(gd.InvalidArgumentError, match="2 replicas"):
        strategy.run(lambda v: v, args=(gd.PerReplica((np.ones(2),) * 3),))
