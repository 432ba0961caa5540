"""The examples of shared/seeds that need only one replica, with tf.distribute read as graphdist."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd


@pytest.fixture
def strategy() -> gd.OneDeviceStrategy:
    return gd.OneDeviceStrategy(device="/cpu:0")


def test_default_strategy_reduce_of_python_float() -> None:
    # distributed-training-guide: strategy.reduce("SUM", 1.)  -> 1.0
    default_strategy = gd.get_strategy()
    assert default_strategy.reduce("SUM", 1.0) == 1.0


def test_default_strategy_is_a_singleton_and_scope_is_transparent() -> None:
    default_strategy = gd.get_strategy()
    assert gd.get_strategy() is default_strategy
    with default_strategy.scope():
        assert gd.get_strategy() is default_strategy
    with pytest.raises(gd.InvalidArgumentError, match="singleton"):
        type(default_strategy)()


def test_scope_makes_strategy_current(strategy: gd.OneDeviceStrategy) -> None:
    default = gd.get_strategy()
    assert not gd.has_strategy()
    with strategy.scope():
        assert gd.get_strategy() is strategy
        assert gd.has_strategy()
        assert gd.in_cross_replica_context()
        assert gd.get_replica_context() is None
    assert gd.get_strategy() is default
    assert not gd.in_cross_replica_context()
    assert gd.get_replica_context() is not None  # the default replica context


def test_mixing_strategies_in_scopes_is_refused(strategy: gd.OneDeviceStrategy) -> None:
    other = gd.OneDeviceStrategy("cpu:1")
    with strategy.scope(), pytest.raises(gd.InvalidArgumentError, match="mixing different strategies"):
        with other.scope():
            pass


def test_run_with_constant_tensor_input(strategy: gd.OneDeviceStrategy) -> None:
    # strategy-api run: tensor_input = tf.constant(3.0); replica_fn(input) = input * 2.0  -> 6.0 float32
    tensor_input = np.float32(3.0)

    @gd.function
    def replica_fn(input):  # noqa: A002 - the seed's name
        return input * 2.0

    result = strategy.run(replica_fn, args=(tensor_input,))
    assert result == np.float32(6.0)
    assert np.asarray(result).dtype == np.float32


def test_value_fn_constant(strategy: gd.OneDeviceStrategy) -> None:
    distributed_values = strategy.experimental_distribute_values_from_function(lambda ctx: np.float32(1.0))
    local_result = strategy.experimental_local_results(distributed_values)
    assert local_result == (np.float32(1.0),)


def test_value_fn_indexes_by_replica_id(strategy: gd.OneDeviceStrategy) -> None:
    array_value = np.array([3.0, 2.0, 1.0])

    def value_fn(ctx: gd.ValueContext) -> float:
        return array_value[ctx.replica_id_in_sync_group]

    distributed_values = strategy.experimental_distribute_values_from_function(value_fn)
    assert strategy.experimental_local_results(distributed_values) == (3.0,)


def test_value_fn_num_replicas(strategy: gd.OneDeviceStrategy) -> None:
    distributed_values = strategy.experimental_distribute_values_from_function(lambda ctx: ctx.num_replicas_in_sync)
    assert strategy.experimental_local_results(distributed_values) == (1,)


def test_value_fn_placed_on_worker_devices(strategy: gd.OneDeviceStrategy) -> None:
    worker_devices = strategy.extended.worker_devices
    multiple_values = [np.float32(1.0) for _ in range(strategy.num_replicas_in_sync)]
    assert worker_devices == ("cpu:0",)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: multiple_values[ctx.replica_id_in_sync_group])
    assert strategy.experimental_local_results(values) == (np.float32(1.0),)


def test_reduce_of_replica_id(strategy: gd.OneDeviceStrategy) -> None:
    # strategy-api reduce: sum of replica ids over one replica is 0 (int32)
    def step_fn():
        i = gd.get_replica_context().replica_id_in_sync_group
        return i

    per_replica_result = strategy.run(step_fn)
    total = strategy.reduce("SUM", per_replica_result, axis=None)
    assert total == 0
    assert np.asarray(total).dtype == np.int32


def test_run_inside_function_with_distributed_values(strategy: gd.OneDeviceStrategy) -> None:
    @gd.function
    def run():
        def value_fn(value_context):
            return value_context.num_replicas_in_sync

        distributed_values = strategy.experimental_distribute_values_from_function(value_fn)

        def replica_fn2(input):  # noqa: A002
            return input * 2

        return strategy.run(replica_fn2, args=(distributed_values,))

    assert run() == 2  # 1 replica * 2


def test_all_reduce_in_replica_context(strategy: gd.OneDeviceStrategy) -> None:
    @gd.function
    def run():
        def value_fn(value_context):
            return np.int32(value_context.replica_id_in_sync_group)

        distributed_values = strategy.experimental_distribute_values_from_function(value_fn)

        def replica_fn(input):  # noqa: A002
            return gd.get_replica_context().all_reduce("sum", input)

        return strategy.run(replica_fn, args=(distributed_values,))

    assert run() == 0
    graph = run.get_concrete_function().graph("traced")
    assert graph.find_nodes("ReplicaAllReduce", "graphdist"), "all_reduce must be a graphdist.ReplicaAllReduce node"


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_every_axis(strategy: gd.OneDeviceStrategy, axis: int) -> None:
    single_tensor = np.arange(6).reshape(1, 2, 3)
    distributed_values = strategy.experimental_distribute_values_from_function(lambda _: single_tensor)

    @gd.function
    def run(axis):
        return strategy.gather(distributed_values, axis=axis)

    np.testing.assert_array_equal(run(axis), single_tensor)  # one replica: nothing to concatenate
    np.testing.assert_array_equal(strategy.gather(distributed_values, axis=axis), single_tensor)


def test_gather_seed_shape(strategy: gd.OneDeviceStrategy) -> None:
    distributed_values = strategy.experimental_distribute_values_from_function(lambda _: np.array([[1], [2]]))

    @gd.function
    def run():
        return strategy.gather(distributed_values, axis=0)

    out = run()
    np.testing.assert_array_equal(out, [[1], [2]])
    assert out.dtype == np.array([[1]]).dtype


def test_reduce_axis_semantics(strategy: gd.OneDeviceStrategy) -> None:
    per_replica_result = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(strategy.reduce("sum", per_replica_result, axis=None), per_replica_result)
    assert strategy.reduce("sum", per_replica_result, axis=0) == 28.0
    assert strategy.reduce(gd.ReduceOp.MEAN, per_replica_result, axis=0) == 3.5
    assert strategy.reduce("MAX", per_replica_result, axis=0) == 7.0
    assert strategy.reduce("min", per_replica_result, axis=0) == 0.0


def test_traced_reduce_matches_eager(strategy: gd.OneDeviceStrategy) -> None:
    x = np.arange(12, dtype=np.float32).reshape(6, 2)

    @gd.function
    def step(x):
        per_replica = strategy.run(lambda v: v * 2.0, args=(x,))
        return {op: strategy.reduce(op, per_replica, axis=0) for op in ("SUM", "MEAN", "MAX", "MIN")}

    out = step(x)
    for op in ("SUM", "MEAN", "MAX", "MIN"):
        np.testing.assert_allclose(out[op], strategy.reduce(op, x * 2.0, axis=0))


def test_variable_free_custom_loop_of_the_strategy_page(strategy: gd.OneDeviceStrategy) -> None:
    # strategy-api: total_result += my_strategy.reduce(SUM, my_strategy.run(replica_fn, (x,)), axis=None)
    dataset = [np.full((2,), i, dtype=np.float32) for i in range(3)]
    with strategy.scope():
        @gd.function
        def distribute_train_epoch(x):
            def replica_fn(input):  # noqa: A002
                return input * 2

            per_replica_result = strategy.run(replica_fn, args=(x,))
            return strategy.reduce(gd.ReduceOp.SUM, per_replica_result, axis=None)

    total_result = sum(distribute_train_epoch(x) for x in dataset)
    np.testing.assert_array_equal(total_result, [6.0, 6.0])
    assert distribute_train_epoch.experimental_get_tracing_count() == 1
