"""Issue 26, item 1: where graphdist knows a result may surprise a new user, it says so or does what numpy does."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import graphdist as gd
from graphdist.distribute import run_args
from graphdist.errors import InvalidArgumentError


@pytest.fixture
def mirrored() -> gd.MirroredStrategy:
    return gd.MirroredStrategy(["cpu:0", "cpu:1"])


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    run_args._warned.clear()


def _train_step(strategy: gd.Strategy):
    with strategy.scope():
        w = gd.Variable(np.ones((3, 1), np.float32))

    def replica_fn(features):
        with gd.GradientTape() as tape:
            loss = (features @ w).sum()
        return loss, tape.gradient(loss, w)

    return replica_fn


def test_global_array_to_a_training_step_warns_once_naming_the_argument(mirrored, caplog):
    replica_fn = _train_step(mirrored)
    x = np.ones((4, 3), np.float32)
    with caplog.at_level(logging.WARNING, logger="graphdist"):
        loss, _ = mirrored.run(replica_fn, args=(x,))
        mirrored.run(replica_fn, args=(np.ones((6, 3), np.float32),))  # a retrace: no second warning
    warnings = [r.getMessage() for r in caplog.records if "given whole to each" in r.getMessage()]
    assert len(warnings) == 1
    assert "'features'" in warnings[0] and "(4, 3)" in warnings[0]
    assert "experimental_distribute_dataset" in warnings[0]
    assert "distribute_values_from_function" in warnings[0]
    # TF's meaning is kept: each replica saw the whole array.
    assert [float(v) for v in loss.values] == [12.0, 12.0]


def test_distributed_batches_and_steps_without_gradients_do_not_warn(mirrored, caplog):
    replica_fn = _train_step(mirrored)
    dataset = gd.data.Dataset.from_tensor_slices(np.ones((8, 3), np.float32)).batch(4)
    with caplog.at_level(logging.WARNING, logger="graphdist"):
        for batch in mirrored.experimental_distribute_dataset(dataset):
            mirrored.run(replica_fn, args=(batch,))
        mirrored.run(lambda x: x * 2, args=(np.ones((4, 3), np.float32),))
    assert not [r for r in caplog.records if "given whole to each" in r.getMessage()]


def test_np_random_during_tracing_warns(caplog):
    @gd.function
    def noisy(x):
        return x + np.random.normal(size=x.shape).astype(np.float32)

    x = np.zeros(3, np.float32)
    with caplog.at_level(logging.WARNING, logger="graphdist"):
        first, second = noisy(x), noisy(x)
    np.testing.assert_array_equal(first, second)  # frozen at trace time: the reason for the warning
    messages = [r.getMessage() for r in caplog.records if "np.random was called" in r.getMessage()]
    assert len(messages) == 1 and "noisy" in messages[0] and "gd.random.Generator" in messages[0]


def test_step_without_np_random_does_not_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="graphdist"):
        gd.function(lambda x: x * 2)(np.zeros(3, np.float32))
    assert not [r for r in caplog.records if "np.random" in r.getMessage()]


def test_list_of_numbers_in_args_is_converted_as_numpy_would(mirrored):
    result = mirrored.run(lambda x: x * 2, args=([1.0, 2.0, 3.0, 4.0],))
    for value in result.values:  # one array per replica, not a list repeated twice (8 values)
        np.testing.assert_array_equal(value, np.array([2.0, 4.0, 6.0, 8.0]))
    nested = gd.OneDeviceStrategy("cpu:0").run(lambda x: x.sum(axis=0), kwargs={"x": [[1, 2], [3, 4]]})
    np.testing.assert_array_equal(nested, np.array([4, 6]))


def test_list_of_arrays_stays_a_nest():
    strategy = gd.OneDeviceStrategy("cpu:0")
    result = strategy.run(lambda xs: xs[0] + xs[1], args=([np.ones(2, np.float32), np.ones(2, np.float32)],))
    np.testing.assert_array_equal(result, np.full(2, 2.0, np.float32))


@pytest.mark.parametrize("bad, words", [
    ([[1, 2], [3]], "different lengths"),
    ([1.0, np.ones(2)], "mixing numbers"),
])
def test_lists_numpy_cannot_convert_are_refused(bad, words):
    with pytest.raises(InvalidArgumentError, match=words) as info:
        gd.OneDeviceStrategy("cpu:0").run(lambda x: x, args=(bad,))
    assert "args[0]" in str(info.value)


def test_a_caller_that_already_warned_can_quiet_the_warning(mirrored, caplog):
    replica_fn = _train_step(mirrored)
    with caplog.at_level(logging.WARNING, logger="graphdist"), run_args.quiet_global_array_warning():
        mirrored.run(replica_fn, args=(np.ones((4, 3), np.float32),))
    assert not [r for r in caplog.records if "given whole to each" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="graphdist"):  # outside it, the warning is back (a new trace)
        mirrored.run(replica_fn, args=(np.ones((6, 3), np.float32),))
    assert [r for r in caplog.records if "given whole to each" in r.getMessage()]
