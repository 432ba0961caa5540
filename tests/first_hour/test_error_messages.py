"""Issue 26, item 3: errors name the user's own call and value, not numpy's internals."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import graphdist as gd


def test_np_full_with_a_traced_fill_value_names_np_full():
    @gd.function
    def step(x):
        return np.full(x.shape, x.sum())

    with pytest.raises(gd.TracingError) as info:
        step(np.ones(3, np.float32))
    message = str(info.value)
    assert "np.full(shape, fill_value)" in message and "np.broadcast_to(fill_value, shape)" in message
    assert "copyto" not in message


def test_np_full_fix_from_the_message_works():
    step = gd.function(lambda x: np.broadcast_to(x.sum(), x.shape))
    np.testing.assert_array_equal(step(np.ones(3, np.float32)), np.full(3, 3.0, np.float32))


def test_none_loss_in_tape_gradient_is_named():
    v = gd.Variable(np.ones(3, np.float32))

    @gd.function
    def step():
        with gd.GradientTape() as tape:
            loss = None  # e.g. a loss function without `return`
        return tape.gradient(loss, v)

    with pytest.raises(gd.TracingError) as info:
        step()
    message = str(info.value)
    assert "tape.gradient(target, sources): target is None" in message and "return" in message
    assert "dtype object" not in message


def test_a_list_of_targets_is_their_sum_as_in_tf():
    v = gd.Variable(np.ones(3, np.float32))

    @gd.function
    def step():
        with gd.GradientTape() as tape:
            first, second = (v * 2).sum(), v * 3
        return tape.gradient([first, second], v)

    np.testing.assert_array_equal(step(), np.full(3, 5.0, np.float32))


def test_fit_takes_lists_of_lists_as_keras_does():
    def trained(x, y):
        model = gd.keras.Sequential([gd.keras.layers.Dense(1, kernel_initializer="ones")])
        model.compile(optimizer=gd.optimizers.SGD(0.1), loss="mse")
        history = model.fit(x, y, batch_size=2, epochs=2, verbose=0, shuffle=False)
        return history.history["loss"]

    rows, targets = [[1.0, 2.0], [3.0, 4.0]], [[1.0], [2.0]]
    np.testing.assert_allclose(trained(rows, targets),
                               trained(np.array(rows, np.float32), np.array(targets, np.float32)), rtol=1e-6)


def test_fit_refuses_ragged_lists_naming_the_argument():
    model = gd.keras.Sequential([gd.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(gd.InvalidArgumentError, match=r"fit: x is a list of lists of different lengths"):
        model.fit([[1.0, 2.0], [3.0]], [[1.0], [2.0]], verbose=0)


@pytest.mark.parametrize("value", [np.array(["a", "b", "c"]), ["a", "b", "c"], "abc"])
def test_assigning_strings_to_a_variable_is_refused_naming_the_call(value):
    v = gd.Variable(np.ones(3, np.float32), name="weights")
    with pytest.raises(gd.InvalidArgumentError) as info:
        v.assign(value)
    message = str(info.value)
    assert message.startswith("weights.assign(") and "float32" in message and "not numeric" in message
    np.testing.assert_array_equal(v.numpy(), np.ones(3, np.float32))


def test_a_misspelt_reduce_op_suggests_the_right_one():
    with pytest.raises(gd.InvalidArgumentError, match=r"gd.ReduceOp.SUMM does not exist; did you mean "
                                                      r"gd.ReduceOp.SUM\?"):
        _ = gd.ReduceOp.SUMM
    assert not hasattr(gd.ReduceOp, "AVERAGE")  # still an AttributeError for hasattr/getattr(default)
    with pytest.raises(gd.InvalidArgumentError, match="did you mean 'MEAN'"):
        gd.MirroredStrategy(["cpu:0"]).reduce("MEEN", np.ones(2, np.float32), axis=None)


def test_retrace_warning_shows_per_replica_shapes(caplog):
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(x):
        return strategy.run(lambda a: a * 2, args=(x,))

    with caplog.at_level(logging.WARNING, logger="graphdist"):
        for rows in range(2, 7):
            data = gd.data.Dataset.from_tensor_slices(np.ones((2 * rows, 3), np.float32)).batch(2 * rows)
            for x in strategy.experimental_distribute_dataset(data):
                step(x)
    warnings = [r.getMessage() for r in caplog.records if "has been traced 5 times" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].endswith("latest signature: (PerReplica(float32[6, 3], float32[6, 3]))")
