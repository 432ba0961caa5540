"""``gd.random.Generator``: draws recorded in compiled steps, new per call and per replica, checkpointed."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.errors import InvalidArgumentError


def test_each_call_of_a_step_draws_new_numbers_and_eager_draws_agree():
    traced = gd.random.Generator.from_seed(7)
    eager = gd.random.Generator.from_seed(7)

    @gd.function
    def step():
        return traced.normal((1000,))

    first, second = step(), step()
    assert not np.allclose(first, second)
    np.testing.assert_allclose(first, eager.normal((1000,)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second, eager.normal((1000,)), rtol=1e-5, atol=1e-6)
    assert traced.state.numpy()[1] == 2


def test_distribution_moments():
    g = gd.random.Generator.from_seed(1)
    normal = g.normal((200_000,), mean=1.0, stddev=2.0)
    assert abs(normal.mean() - 1.0) < 0.03 and abs(normal.std() - 2.0) < 0.03
    uniform = g.uniform((200_000,), minval=-1.0, maxval=3.0)
    assert uniform.min() >= -1.0 and uniform.max() < 3.0 and abs(uniform.mean() - 1.0) < 0.02
    ints = g.uniform((10_000,), minval=2, maxval=7, dtype=np.int32)
    assert ints.dtype == np.int32 and set(np.unique(ints)) == {2, 3, 4, 5, 6}


def test_each_replica_draws_its_own_stream():
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        g = gd.random.Generator.from_seed(3)
    first = strategy.run(lambda: g.uniform((4,)))
    second = strategy.run(lambda: g.uniform((4,)))
    assert not np.allclose(first.values[0], first.values[1])
    assert not np.allclose(first.values[0], second.values[0])


def test_checkpoint_restores_the_same_stream(tmp_path):
    g = gd.random.Generator.from_seed(11)
    step = gd.function(lambda: g.normal((5,)))
    step()
    path = gd.train.Checkpoint(generator=g).save(tmp_path / "g.ckpt")
    expected = [step(), step()]
    restored = gd.random.Generator.from_seed(999)
    gd.train.Checkpoint(generator=restored).restore(path)
    again = gd.function(lambda: restored.normal((5,)))
    np.testing.assert_array_equal(again(), expected[0])
    np.testing.assert_array_equal(again(), expected[1])


def test_seeds_differ_and_bad_arguments_are_refused():
    a = gd.random.Generator.from_seed(1).uniform((8,))
    b = gd.random.Generator.from_seed(2).uniform((8,))
    assert not np.allclose(a, b)
    g = gd.random.Generator.from_non_deterministic_state()
    with pytest.raises(InvalidArgumentError, match="maxval"):
        g.uniform((2,), dtype=np.int32)
    with pytest.raises(InvalidArgumentError, match="shape"):
        g.normal("3")
    with pytest.raises(InvalidArgumentError, match="seed must be an int"):
        gd.random.Generator.from_seed(1.5)
