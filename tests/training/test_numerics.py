"""NaN and Inf: gd.debugging.enable_check_numerics names the op and the step, TerminateOnNaN stops fit,
Checkpoint.save / model.save warn about non-finite weights.

Oracles: numpy (which values are NaN or infinite, and which op makes them), and the variables' values before
the failing step (a step stopped by the checks applies no update).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphdist as gd
from graphdist.runtime import numerics

keras = gd.keras


@pytest.fixture
def checks():
    gd.debugging.enable_check_numerics()
    yield
    gd.debugging.disable_check_numerics()


def _log_step():
    w = gd.Variable(np.ones(3, np.float32), name="w")

    @gd.function
    def train_step(x):
        y = np.log(x) * w
        w.assign_sub(0.1 * y)
        return y.sum()

    return w, train_step


# ---------------------------------------------------------------- check numerics
def test_check_numerics_names_the_op_and_the_step_and_applies_no_update(checks) -> None:
    w, train_step = _log_step()
    assert train_step(np.ones(3, np.float32)) == 0.0
    with pytest.raises(gd.NumericsError) as info:
        train_step(np.array([1, 0, -1], np.float32))  # log(0) = -inf, log(-1) = nan
    message = str(info.value)
    assert "NaN and Inf (1 and 1 of 3 elements) in %log" in message
    assert "op Log (node 'log', traced at test_numerics.py:" in message
    assert "step 'train_step' (call 2)" in message and "on cpu:0" in message
    assert "Its inputs were finite: this op made it" in message
    np.testing.assert_array_equal(w.numpy(), [1, 1, 1])  # the failing step's update was not applied
    assert isinstance(info.value, gd.InvalidArgumentError) and isinstance(info.value, FloatingPointError)
    assert train_step(np.full(3, np.e, np.float32)) == pytest.approx(3.0)  # the next good step runs


def test_without_checks_the_nan_goes_through_and_no_segment_is_inspected(monkeypatch) -> None:
    assert not gd.debugging.check_numerics_enabled()
    w, train_step = _log_step()
    train_step(np.ones(3, np.float32))

    def inspected(*args, **kwargs):
        raise AssertionError("segment outputs inspected with the checks off")

    monkeypatch.setattr(numerics, "find_non_finite_outputs", inspected)
    assert np.isnan(train_step(np.array([1, 0, -1], np.float32)))
    assert np.isnan(w.numpy()).any()


def test_a_nan_in_the_batch_is_named_as_fed_to_the_step(checks) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = gd.Variable(np.ones(3, np.float32), name="v")

    @gd.function
    def step(x):
        def replica(x):
            with gd.GradientTape() as tape:
                loss = np.mean(x * v)
            v.assign_sub(0.1 * tape.gradient(loss, [v])[0])
            return loss
        return strategy.reduce("SUM", strategy.run(replica, args=(x,)), axis=None)

    step(np.ones((4, 3), np.float32))
    before = v.numpy().copy()
    x = np.ones((4, 3), np.float32)
    x[1, 1] = np.nan
    with pytest.raises(gd.NumericsError, match=r"op Mul \(node 'mul(_r\d)?'.*step 'step' \(call 2\).*Its input "
                                               r"%\w+ \(NaN \(1 of 12 elements\)\) already held it: a value fed"):
        step(x)
    np.testing.assert_array_equal(v.numpy(), before)


def test_nan_made_on_one_device_of_several_is_found(checks) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = gd.Variable(np.ones(2, np.float32), name="v")

    @gd.function
    def step(x):
        def replica(x):
            return np.sum(np.sqrt(x) * v)
        return strategy.run(replica, args=(x,))

    pieces = gd.PerReplica((np.ones(2, np.float32), np.array([4, -4], np.float32)))
    with pytest.raises(gd.NumericsError, match=r"NaN \(1 of 2 elements\) in %sqrt.*op Sqrt.*on cpu:1"):
        step(pieces)


def test_steps_compiled_before_the_checks_are_checked_and_disable_turns_them_off() -> None:
    _, train_step = _log_step()
    train_step(np.ones(3, np.float32))
    gd.debugging.enable_check_numerics()
    try:
        assert gd.debugging.check_numerics_enabled()
        with pytest.raises(gd.NumericsError, match="op Log"):
            train_step(np.zeros(3, np.float32))
    finally:
        gd.debugging.disable_check_numerics()
    assert not gd.debugging.check_numerics_enabled()
    assert np.isinf(train_step(np.zeros(3, np.float32)))


def test_an_imported_onnx_models_node_is_named(checks) -> None:
    nodes = [helper.make_node("Sub", ["x", "x"], ["zero"], name="zero_out"),
             helper.make_node("Div", ["x", "zero"], ["ratio"], name="divide_by_zero"),
             helper.make_node("Relu", ["ratio"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "divides", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 10
    onnx.checker.check_model(proto)
    model = gd.onnx.load(proto)
    with pytest.raises(gd.NumericsError, match=r"Inf \(2 of 2 elements\) in %\w+ \(output 0 of op Div \(node "
                                               r"'divide_by_zero'"):
        model(np.array([1, 2], np.float32))


# ---------------------------------------------------------------- TerminateOnNaN
def _regression(nan_row: int | None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    if nan_row is not None:
        x[nan_row] = np.nan
    keras.backend.clear_session()
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
    model.compile(loss="mse", optimizer="sgd")
    return model, x, y


def test_terminate_on_nan_stops_fit_after_the_batch(capsys) -> None:
    model, x, y = _regression(nan_row=40)  # batch 5 of 8 rows
    seen = []

    class Batches(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                        callbacks=[keras.callbacks.TerminateOnNaN(), Batches()])
    assert "Batch 5: Invalid loss, terminating training" in capsys.readouterr().out
    assert seen == [0, 1, 2, 3, 4, 5] and history.epoch == [0] and model.stop_training
    assert np.isnan(history.history["loss"][0])
    # Without the callback the NaN trains on: every batch of every epoch runs.
    model, x, y = _regression(nan_row=40)
    seen.clear()
    history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[Batches()])
    assert history.epoch == [0, 1, 2] and len(seen) == 24


def test_terminate_on_nan_leaves_finite_training_alone(capsys) -> None:
    model, x, y = _regression(nan_row=None)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])
    assert history.epoch == [0, 1] and "Invalid loss" not in capsys.readouterr().out


# ---------------------------------------------------------------- saves warn
def test_checkpoint_and_model_save_warn_once_per_save_about_non_finite_weights(tmp_path, caplog) -> None:
    model, x, y = _regression(nan_row=None)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    with caplog.at_level(logging.WARNING, logger="graphdist.runtime.numerics"):
        gd.train.Checkpoint(model=model).save(tmp_path / "good.npz")
        model.save(tmp_path / "good_model")
    assert not caplog.records
    kernel = model.trainable_variables[0]
    poisoned = kernel.numpy().copy()
    poisoned[0, 0], poisoned[1, 0] = np.nan, np.inf
    kernel.assign(poisoned)
    for save in (lambda: gd.train.Checkpoint(model=model).save(tmp_path / "bad.npz"),
                 lambda: gd.train.Checkpoint(model=model).save(tmp_path / "bad.npz"),
                 lambda: model.save(tmp_path / "bad_model")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="graphdist.runtime.numerics"):
            save()
        assert len(caplog.records) == 1
        assert "1 weight(s) hold NaN or Inf: model/layer0/kernel (NaN and Inf)" in caplog.records[0].getMessage()
    assert caplog.records[0].getMessage().startswith("model.save")
    restored = gd.train.Checkpoint(model=model)
    restored.restore(tmp_path / "bad.npz")  # saved as they are
    assert np.isnan(kernel.numpy()[0, 0]) and np.isinf(kernel.numpy()[1, 0])



def test_a_loaded_plan_is_checked_too(checks, tmp_path) -> None:
    w, train_step = _log_step()
    concrete = train_step.get_concrete_function(np.ones(3, np.float32))
    concrete.export(tmp_path / "plan")
    loaded = gd.load_plan(tmp_path / "plan")
    with pytest.raises(gd.NumericsError, match=r"in %\w+ \(output 0 of op Log \(node 'log'.*step 'train_step'"):
        loaded(np.array([1, 2, -3], np.float32))
