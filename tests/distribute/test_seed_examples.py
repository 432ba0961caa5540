"""The strategy-api seeds' examples on every multi-replica strategy: Mirrored with 2 and 4
logical devices, CentralStorage with the parameter device among the compute devices or apart."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd


def _devices(n: int) -> list[str]:
    return [f"cpu:{i}" for i in range(n)]


_STRATEGIES = {
    "mirrored_2dev": lambda: gd.MirroredStrategy(_devices(2)),
    "mirrored_4dev": lambda: gd.MirroredStrategy(_devices(4)),
    "central_2dev": lambda: gd.CentralStorageStrategy(_devices(2), "cpu:0"),
    "central_4dev": lambda: gd.CentralStorageStrategy(_devices(4), "cpu:0"),
    "central_2dev_cpu9": lambda: gd.CentralStorageStrategy(_devices(2), "cpu:9"),
}


@pytest.fixture(params=list(_STRATEGIES), ids=list(_STRATEGIES))
def strategy(request) -> gd.Strategy:
    return _STRATEGIES[request.param]()


def test_run_constant_input(strategy) -> None:
    result = strategy.run(lambda x: x * 2.0, args=(np.float32(3.0),))
    assert isinstance(result, gd.PerReplica)
    assert [float(v) for v in result.values] == [6.0] * strategy.num_replicas_in_sync


def test_value_fn_examples(strategy) -> None:
    n = strategy.num_replicas_in_sync
    one = strategy.experimental_distribute_values_from_function(lambda ctx: np.float32(1.0))
    assert strategy.experimental_local_results(one) == (np.float32(1.0),) * n
    array_value = np.array([3.0, 2.0, 1.0, 0.0])
    by_id = strategy.experimental_distribute_values_from_function(lambda ctx: array_value[ctx.replica_id_in_sync_group])
    assert strategy.experimental_local_results(by_id) == tuple(array_value[:n])
    count = strategy.experimental_distribute_values_from_function(lambda ctx: ctx.num_replicas_in_sync)
    assert strategy.experimental_local_results(count) == (n,) * n


def test_reduce_of_replica_ids(strategy) -> None:
    def step_fn():
        return gd.get_replica_context().replica_id_in_sync_group

    per_replica_result = strategy.run(step_fn)
    n = strategy.num_replicas_in_sync
    assert strategy.reduce("SUM", per_replica_result, axis=None) == sum(range(n))
    assert strategy.reduce("MAX", per_replica_result, axis=None) == n - 1


def test_all_reduce_in_function(strategy) -> None:
    @gd.function
    def run():
        def value_fn(value_context):
            return np.int32(value_context.replica_id_in_sync_group)

        distributed_values = strategy.experimental_distribute_values_from_function(value_fn)
        return strategy.run(lambda v: gd.get_replica_context().all_reduce("sum", v), args=(distributed_values,))

    n = strategy.num_replicas_in_sync
    result = run()
    assert [int(v) for v in result.values] == [sum(range(n))] * n
    assert "AllReduce" in run.get_concrete_function().plan.summary()


def test_run_in_function_with_distributed_values(strategy) -> None:
    @gd.function
    def run():
        values = strategy.experimental_distribute_values_from_function(lambda ctx: ctx.num_replicas_in_sync)
        return strategy.run(lambda v: v * 2, args=(values,))

    n = strategy.num_replicas_in_sync
    assert [int(v) for v in run().values] == [2 * n] * n


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_every_axis(strategy, axis: int) -> None:
    single_tensor = np.arange(6).reshape(1, 2, 3)
    values = strategy.experimental_distribute_values_from_function(lambda _: single_tensor)

    @gd.function
    def run(axis):
        return strategy.gather(values, axis=axis)

    n = strategy.num_replicas_in_sync
    expected = np.concatenate([single_tensor] * n, axis=axis)
    np.testing.assert_array_equal(run(axis), expected)
    np.testing.assert_array_equal(strategy.gather(values, axis=axis), expected)
