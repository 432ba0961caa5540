"""Distributed input: experimental_distribute_dataset, distribute_datasets_from_function, InputContext.

Multi-replica strategies come later; ``gd.Strategy([...])`` (the base class
with several devices) stands in for them here: it has ``num_replicas_in_sync``
and ``experimental_local_results`` / eager ``reduce``, which is all the input
distribution needs.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import graphdist as gd
from graphdist.data import Dataset
from graphdist.distribute.input import DistributedDataset, InputContext


@pytest.fixture
def two() -> gd.Strategy:
    return gd.Strategy(["cpu:0", "cpu:1"])


def local(strategy: gd.Strategy, value) -> list:
    return [np.asarray(v).tolist() for v in strategy.experimental_local_results(value)]


# ------------------------------------------------- experimental_distribute_dataset
def test_seed_example_two_replicas(two: gd.Strategy) -> None:
    # strategy-api experimental_distribute_dataset: range(4).batch(2) on 2 replicas, replica_fn = input * 2
    dataset = Dataset.range(4).batch(2)
    dist_dataset = two.experimental_distribute_dataset(dataset)
    inputs = list(dist_dataset)
    assert all(isinstance(x, gd.PerReplica) for x in inputs)
    assert [local(two, x) for x in inputs] == [[[0], [1]], [[2], [3]]]
    result = [[v * 2 for v in two.experimental_local_results(x)] for x in inputs]
    assert [[r.tolist() for r in step] for step in result] == [[[0], [2]], [[4], [6]]]
    component = inputs[0].values[0]
    assert component.shape == (1,) and component.dtype == np.int64
    assert "PerReplica:{" in repr(inputs[0]) and "numpy=[0]" in repr(inputs[0])


def test_partial_last_batch_seed_split(two: gd.Strategy) -> None:
    # strategy-api reduce: global batch 8, a last batch of 6 is divided into [0, 1, 2, 3] and [4, 5]
    steps = list(two.experimental_distribute_dataset(Dataset.range(14).batch(8)))
    assert local(two, steps[0]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert local(two, steps[1]) == [[8, 9, 10, 11], [12, 13]]
    (only,) = list(two.experimental_distribute_dataset(Dataset.range(6).batch(8)))
    assert local(two, only) == [[0, 1, 2, 3], [4, 5]]
    # MEAN with axis=0 uses the real number of examples (6) as the denominator.
    assert two.reduce("MEAN", only, axis=0) == 15 // 6  # integer mean keeps the dtype
    assert two.reduce("SUM", only, axis=0) == 15
    mean = two.reduce("MEAN", gd.PerReplica([v.astype(np.float32) for v in only.values]), axis=0)
    assert mean == pytest.approx(2.5)


def test_partial_batch_of_plain_iterable_uses_first_batch_size(two: gd.Strategy) -> None:
    batches = [np.arange(8), np.arange(8, 14)]
    steps = list(two.experimental_distribute_dataset(batches))
    assert local(two, steps[1]) == [[8, 9, 10, 11], [12, 13]]


def test_replicas_past_the_data_get_empty_batches(two: gd.Strategy) -> None:
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    steps = list(two.experimental_distribute_dataset(Dataset.from_tensor_slices(x).batch(4)))
    last = two.experimental_local_results(steps[1])
    np.testing.assert_array_equal(last[0], x[4:5])
    assert last[1].shape == (0, 3) and last[1].dtype == np.float32
    assert two.reduce("SUM", steps[1], axis=0).tolist() == x[4].tolist()


def test_three_replicas_and_uneven_global_batch() -> None:
    three = gd.Strategy(["cpu:0", "cpu:1", "cpu:2"])
    steps = list(three.experimental_distribute_dataset(Dataset.range(10).batch(6)))
    assert local(three, steps[0]) == [[0, 1], [2, 3], [4, 5]]
    assert local(three, steps[1]) == [[6, 7], [8, 9], []]
    two = gd.Strategy(["cpu:0", "cpu:1"])
    steps = list(two.experimental_distribute_dataset(Dataset.range(5).batch(5)))
    assert local(two, steps[0]) == [[0, 1, 2], [3, 4]]  # ceil(5 / 2) = 3, filled in order


def test_nested_elements_get_per_replica_leaves(two: gd.Strategy) -> None:
    features = np.arange(8, dtype=np.float32).reshape(4, 2)
    labels = np.array([0, 1, 0, 1])
    dataset = Dataset.from_tensor_slices(({"x": features}, labels)).batch(4)
    (step,) = list(two.experimental_distribute_dataset(dataset))
    assert isinstance(step, tuple) and isinstance(step[0], dict)
    assert isinstance(step[0]["x"], gd.PerReplica) and isinstance(step[1], gd.PerReplica)
    replica0, replica1 = two.experimental_local_results(step)
    np.testing.assert_array_equal(replica0[0]["x"], features[:2])
    np.testing.assert_array_equal(replica1[1], labels[2:])


def test_python_list_of_numpy_tuples(two: gd.Strategy) -> None:
    batches = [(np.ones((4, 2), np.float32) * i, np.arange(4) + i) for i in range(3)]
    steps = list(two.experimental_distribute_dataset(batches))
    assert len(steps) == 3
    features, labels = steps[2]
    assert local(two, labels) == [[2, 3], [4, 5]]
    assert features.values[1].shape == (2, 2)
    assert len(list(two.experimental_distribute_dataset(batches))) == 3  # a list is re-iterable


def test_iter_next_and_reiteration(two: gd.Strategy) -> None:
    dist_dataset = two.experimental_distribute_dataset(Dataset.range(6).batch(2))
    iterator = iter(dist_dataset)
    assert iter(iterator) is iterator
    assert local(two, next(iterator)) == [[0], [1]]
    assert local(two, iterator.get_next()) == [[2], [3]]
    assert local(two, next(iterator)) == [[4], [5]]
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)
    assert len(list(dist_dataset)) == 3  # every iter() starts over


def test_unbatched_elements_with_several_replicas_are_refused(two: gd.Strategy) -> None:
    dist_dataset = two.experimental_distribute_dataset(Dataset.range(4))
    with pytest.raises(gd.InvalidArgumentError, match="batch the dataset by the global batch size"):
        next(iter(dist_dataset))


def test_components_with_different_batch_sizes_are_refused(two: gd.Strategy) -> None:
    dist_dataset = two.experimental_distribute_dataset([(np.zeros(4), np.zeros(3))])
    with pytest.raises(gd.InvalidArgumentError, match=r"different batch sizes \[3, 4\]"):
        list(dist_dataset)


def test_distributed_dataset_cannot_be_transformed(two: gd.Strategy) -> None:
    dist_dataset = two.experimental_distribute_dataset(Dataset.range(4).batch(2))
    assert isinstance(dist_dataset, DistributedDataset)
    with pytest.raises(gd.InvalidArgumentError, match="cannot be transformed further.*'map'"):
        dist_dataset.map(lambda x: x)
    with pytest.raises(AttributeError):
        dist_dataset.batch(2)
    assert not hasattr(dist_dataset, "shuffle")
    with pytest.raises(gd.InvalidArgumentError, match="already distributed"):
        two.experimental_distribute_dataset(dist_dataset)
    with pytest.raises(gd.InvalidArgumentError, match="from_tensor_slices"):
        two.experimental_distribute_dataset(np.zeros((4, 2)))


def test_errors_in_the_pipeline_propagate_and_abandoning_does_not_hang(two: gd.Strategy) -> None:
    def check(x):
        if x[0] == 4:
            raise ValueError("corrupt record 4")
        return x

    dist_dataset = two.experimental_distribute_dataset(Dataset.range(8).batch(2).map(check), options=None)
    iterator = iter(dist_dataset)
    next(iterator), next(iterator)
    with pytest.raises(ValueError, match="corrupt record 4"):
        next(iterator)
    before = sum(t.name == "graphdist-prefetch" for t in threading.enumerate())
    for count, _ in enumerate(two.experimental_distribute_dataset(Dataset.range(2).batch(2).repeat())):
        if count == 3:
            break
    deadline = time.monotonic() + 5
    while sum(t.name == "graphdist-prefetch" for t in threading.enumerate()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(t.name == "graphdist-prefetch" for t in threading.enumerate()) <= before


def test_options_buffer_size_is_accepted(two: gd.Strategy) -> None:
    class Options:
        experimental_per_replica_buffer_size = 3

    dist_dataset = two.experimental_distribute_dataset(Dataset.range(4).batch(2), options=Options())
    assert len(list(dist_dataset)) == 2


# ------------------------------------------------------------------ one replica
def test_one_replica_passes_elements_through_and_runs() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    dist_dataset = strategy.experimental_distribute_dataset(Dataset.range(4).batch(2))
    inputs = list(dist_dataset)
    assert all(type(x) is np.ndarray for x in inputs)
    assert [x.tolist() for x in inputs] == [[0, 1], [2, 3]]

    def replica_fn(input):  # noqa: A002 - the seed's name
        return input * 2

    result = [strategy.run(replica_fn, args=(x,)) for x in dist_dataset]
    assert [np.asarray(r).tolist() for r in result] == [[0, 2], [4, 6]]
    # Unbatched scalars are fine with one replica.
    assert list(strategy.experimental_distribute_dataset(Dataset.range(3))) == [0, 1, 2]


def test_custom_training_loop_shape() -> None:
    # strategy-api: for x in dataset: total += strategy.reduce(SUM, strategy.run(replica_fn, args=(x,)), axis=None)
    strategy = gd.OneDeviceStrategy("cpu:0")
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.arange(6, dtype=np.float32)
    with strategy.scope():
        dist_dataset = strategy.experimental_distribute_dataset(Dataset.from_tensor_slices((x, y)).batch(3))

        def step(inputs):
            features, labels = inputs
            return (features.sum(axis=1) - labels).sum()

        total = 0.0
        for inputs in dist_dataset:
            total += strategy.reduce(gd.ReduceOp.SUM, strategy.run(step, args=(inputs,)), axis=None)
    assert total == pytest.approx(float((x.sum(axis=1) - y).sum()))


def test_default_strategy_distributes_a_python_list() -> None:
    batches = [(np.zeros((2, 3)), np.array([1, 2]))]
    (element,) = list(gd.get_strategy().experimental_distribute_dataset(batches))
    assert isinstance(element, tuple) and element[1].tolist() == [1, 2]


# ----------------------------------------------- distribute_datasets_from_function
def test_from_function_dequeues_one_element_per_replica(two: gd.Strategy) -> None:
    contexts = []

    def dataset_fn(ctx: InputContext) -> Dataset:
        contexts.append(ctx)
        batch = ctx.get_per_replica_batch_size(4)
        return Dataset.range(8).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(batch)

    dist_dataset = two.distribute_datasets_from_function(dataset_fn)
    assert contexts == [InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2)]
    steps = list(dist_dataset)
    assert [local(two, s) for s in steps] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert len(list(dist_dataset)) == 2 and len(contexts) == 1  # called once, re-iterable


def test_from_function_data_ending_mid_step_gives_empty_batches(two: gd.Strategy) -> None:
    dist_dataset = two.distribute_datasets_from_function(
        lambda ctx: Dataset.from_tensor_slices(np.ones((5, 3), np.float32)).batch(2))
    steps = list(dist_dataset)
    assert len(steps) == 2
    last = two.experimental_local_results(steps[1])
    assert last[0].shape == (1, 3) and last[1].shape == (0, 3) and last[1].dtype == np.float32
    # three batches: [2, 2], [1, empty]
    steps = list(two.distribute_datasets_from_function(lambda ctx: Dataset.range(5).batch(2)))
    assert [local(two, s) for s in steps] == [[[0, 1], [2, 3]], [[4], []]]


def test_from_function_unbatched_elements(two: gd.Strategy) -> None:
    steps = list(two.distribute_datasets_from_function(lambda ctx: Dataset.range(4)))
    assert [local(two, s) for s in steps] == [[0, 1], [2, 3]]
    odd = two.distribute_datasets_from_function(lambda ctx: Dataset.range(3))
    with pytest.raises(gd.InvalidArgumentError, match="ended in the middle of step 1"):
        list(odd)


def test_from_function_one_replica_and_bad_dataset_fn() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    seen = []

    def dataset_fn(ctx):
        seen.append(ctx)
        return [np.array([1.0, 2.0]), np.array([3.0])]

    out = list(strategy.distribute_datasets_from_function(dataset_fn))
    assert [v.tolist() for v in out] == [[1.0, 2.0], [3.0]]
    assert seen[0].num_replicas_in_sync == 1 and seen[0].get_per_replica_batch_size(8) == 8
    with pytest.raises(gd.InvalidArgumentError, match="callable"):
        strategy.distribute_datasets_from_function(Dataset.range(3))
    with pytest.raises(gd.InvalidArgumentError, match="returned None"):
        strategy.distribute_datasets_from_function(lambda ctx: None)


def test_from_function_mismatched_structures(two: gd.Strategy) -> None:
    dist_dataset = two.distribute_datasets_from_function(lambda ctx: [np.zeros(2), (np.zeros(2), np.zeros(2))])
    with pytest.raises(gd.InvalidArgumentError, match="same structure"):
        list(dist_dataset)


# ------------------------------------------------------------------ multi-worker hook
class _TwoWorkers(gd.Strategy):
    """Four replicas over two input workers; this process is worker 1."""

    def _input_workers(self) -> tuple[int, int]:
        return 2, 1


def test_input_workers_hook_takes_this_workers_slice() -> None:
    strategy = _TwoWorkers(["cpu:0", "cpu:1", "cpu:2", "cpu:3"])
    (step,) = list(strategy.experimental_distribute_dataset(Dataset.range(8).batch(8)))
    assert [v.tolist() for v in step.values] == [[4, 5], [6, 7]]
    contexts = []
    strategy.distribute_datasets_from_function(lambda ctx: contexts.append(ctx) or Dataset.range(2))
    assert (contexts[0].num_input_pipelines, contexts[0].input_pipeline_id, contexts[0].num_replicas_in_sync) == (
        2, 1, 4)


# ------------------------------------------------------------------ InputContext
def test_input_context_defaults_and_batch_size() -> None:
    ctx = InputContext()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
    assert InputContext(2, 1, 4).get_per_replica_batch_size(64) == 16
    assert "input_pipeline_id=1" in repr(InputContext(2, 1, 4))


def test_input_context_errors() -> None:
    message = "global_batch_size 10 is not divisible by num_replicas_in_sync 4"
    with pytest.raises(gd.InvalidArgumentError, match=message):
        InputContext(num_replicas_in_sync=4).get_per_replica_batch_size(10)
    with pytest.raises(ValueError):
        InputContext(num_replicas_in_sync=3).get_per_replica_batch_size(7)
    with pytest.raises(gd.InvalidArgumentError, match="input_pipeline_id"):
        InputContext(num_input_pipelines=2, input_pipeline_id=2)
    with pytest.raises(gd.InvalidArgumentError, match="num_replicas_in_sync"):
        InputContext(num_replicas_in_sync=0)
    with pytest.raises(gd.InvalidArgumentError, match="global_batch_size must be an int"):
        InputContext().get_per_replica_batch_size(2.5)


def test_dataset_passed_to_a_function_is_refused() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    dist_dataset = strategy.experimental_distribute_dataset(gd.data.Dataset.range(4).batch(2))

    @gd.function
    def epoch(dataset):
        total = 0
        for x in dataset:
            total += strategy.reduce("SUM", strategy.run(lambda v: v * 2, args=(x,)), axis=0)
        return total

    with pytest.raises(gd.InvalidArgumentError, match="one element per call"):
        epoch(dist_dataset)
