"""Hints for common TF habits: missing gradients in apply_gradients, and a gd.function that keeps retracing."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import graphdist as gd


def _step(optimizer: gd.optimizers.Optimizer, used: gd.Variable, unused: gd.Variable, with_used: bool):
    @gd.function
    def step(x):
        with gd.GradientTape() as tape:
            loss = ((used * x).sum() if with_used else x.sum())
        grads = tape.gradient(loss, [used, unused], unconnected_gradients="none")  # as TF: None
        optimizer.apply_gradients(zip(grads, [used, unused]))
        return loss
    return step


def test_no_gradient_for_any_variable_is_an_error_naming_them() -> None:
    used, unused = gd.Variable(np.ones(3, np.float32), name="w"), gd.Variable(np.ones(3, np.float32), name="b")
    step = _step(gd.optimizers.SGD(0.1), used, unused, with_used=False)
    with pytest.raises(gd.InvalidArgumentError, match=r"no gradients provided for any variable: \['w:0', 'b:0'\]"):
        step(np.ones(3, np.float32))


def test_some_missing_gradients_warn_and_leave_those_variables(caplog: pytest.LogCaptureFixture) -> None:
    used, unused = gd.Variable(np.ones(3, np.float32), name="w"), gd.Variable(np.ones(3, np.float32), name="b")
    step = _step(gd.optimizers.SGD(0.5), used, unused, with_used=True)
    with caplog.at_level(logging.WARNING, logger="graphdist.optimizers"):
        step(np.full(3, 2.0, np.float32))
    assert "gradients do not exist for variables ['b:0']" in caplog.text
    np.testing.assert_allclose(used.numpy(), np.zeros(3))  # 1 - 0.5 * 2
    np.testing.assert_allclose(unused.numpy(), np.ones(3))


def test_retracing_warns_once_after_five_traces(caplog: pytest.LogCaptureFixture) -> None:
    double = gd.function(lambda x: x * 2.0, name="double")
    with caplog.at_level(logging.WARNING, logger="graphdist.compile.function"):
        for n in range(1, 5):
            double(np.ones(n, np.float32))
            double(np.ones(n, np.float32))  # the same signature again: no trace
        assert "traced" not in caplog.text
        double(np.ones(5, np.float32))
        for n in range(6, 9):
            double(np.ones(n, np.float32))
    warnings = [r.getMessage() for r in caplog.records if "has been traced" in r.getMessage()]
    assert len(warnings) == 1 and double.experimental_get_tracing_count() == 8
    assert "gd.function double has been traced 5 times" in warnings[0]
    assert "latest signature: (float32[5])" in warnings[0] and "keep batch shapes fixed" in warnings[0]


def test_unconnected_gradients_none_or_zero() -> None:
    w, b = gd.Variable(np.ones(2, np.float32), name="w"), gd.Variable(np.ones(2, np.float32), name="b")

    @gd.function
    def grads(x, mode):
        with gd.GradientTape() as tape:
            loss = (w * x).sum() + gd.stop_gradient(b).sum()
        got = tape.gradient(loss, [w, b], unconnected_gradients=mode)
        return [g if g is not None else np.float32(-1.0) for g in got]

    x = np.float32([3.0, 4.0])
    zero_w, zero_b = grads(x, "zero")
    none_w, none_b = grads(x, "none")
    np.testing.assert_allclose(zero_w, x) and np.testing.assert_allclose(none_w, x)
    np.testing.assert_allclose(zero_b, [0.0, 0.0])
    assert none_b == -1.0  # None: b reaches the loss only through stop_gradient
    with pytest.raises(gd.TracingError, match="unconnected_gradients must be 'zero' or 'none'"):
        grads(x, "sometimes")
