"""gd.function: whole-step tracing, per-signature caching, stages and backends."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphdist as gd
from graphdist.ir import to_onnx


def _step(x, w):
    return np.tanh(x @ w).mean(axis=0)


X = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
W = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)


@pytest.mark.parametrize("backend", ["ort", "reference"])
def test_function_matches_numpy_on_every_backend(backend: str) -> None:
    step = gd.function(_step, backend=backend)
    np.testing.assert_allclose(step(X, W), _step(X, W), rtol=1e-5, atol=1e-6)
    assert step.get_concrete_function(X, W).plan.backend_name == backend


def test_backend_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_BACKEND", "reference")
    step = gd.function(_step)
    assert step.get_concrete_function(X, W).plan.backend_name == "reference"
    monkeypatch.setenv("GRAPHDIST_BACKEND", "nonsense")
    with pytest.raises(gd.PlanError, match="nonsense"):
        gd.function(_step)(X, W)


def test_decorator_with_and_without_arguments() -> None:
    @gd.function
    def a(x):
        return x + 1

    @gd.function(backend="reference", name="custom")
    def b(x):
        return x + 1

    np.testing.assert_array_equal(a(X), X + 1)
    np.testing.assert_array_equal(b(X), X + 1)
    assert b.get_concrete_function(X).graph("traced").name == "custom"
    assert a.__name__ == "a"


def test_concrete_function_stages() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")

    @gd.function
    def step(x, w):
        per_replica = strategy.run(_step, args=(x, w))
        return strategy.reduce("SUM", per_replica, axis=None)

    concrete = step.get_concrete_function(gd.TensorSpec((4, 3), np.float32), gd.TensorSpec((3, 5), np.float32))
    traced = concrete.graph("traced")
    assert traced.stage == "traced"
    assert traced.find_nodes("CrossReplicaReduce", "graphdist") and not traced.find_nodes("AllReduce", "graphdist")
    rewritten = concrete.graph("rewritten")
    assert rewritten.stage == "rewritten" and not rewritten.find_nodes("AllReduce", "graphdist")
    assert all(n.device == "cpu:0" for n in rewritten.nodes)
    partitioned = concrete.graph("partitioned")
    assert partitioned.stage == "partitioned"
    onnx.checker.check_model(to_onnx(traced), full_check=True)
    assert "cpu0" in concrete.plan.summary()
    with pytest.raises(gd.InvalidArgumentError, match="unknown stage"):
        concrete.graph("optimized")
    # the TensorSpec specialisation is the one a real call with those shapes uses
    before = gd.stats.snapshot()
    np.testing.assert_allclose(step(X, W), _step(X, W), rtol=1e-5, atol=1e-6)
    assert gd.stats.delta(before)["traces"] == 0


def test_retrace_only_for_new_signatures() -> None:
    step = gd.function(_step)
    step(X, W)
    step(X + 1, W)
    step(np.ones((8, 3), np.float32), W)
    assert step.experimental_get_tracing_count() == 2


def test_structured_outputs_and_kwargs() -> None:
    @gd.function
    def step(x, *, scale):
        return {"a": x * scale, "b": [x.sum(), (x.max(), 3)]}

    out = step(X, scale=2.0)
    np.testing.assert_allclose(out["a"], X * 2)
    np.testing.assert_allclose(out["b"][0], X.sum(), rtol=1e-5)
    assert out["b"][1][1] == 3
    assert np.isscalar(out["b"][0])  # rank-0 results are numpy scalars


def test_output_that_is_an_input_or_repeated() -> None:
    @gd.function
    def step(x):
        y = x + 1
        return x, y, y

    a, b, c = step(X)
    np.testing.assert_array_equal(a, X)
    np.testing.assert_array_equal(b, c)


def test_not_callable() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="callable"):
        gd.function(3)


def test_concrete_function_checks_its_signature() -> None:
    step = gd.function(_step)
    concrete = step.get_concrete_function(X, W)
    np.testing.assert_allclose(concrete(X, W), _step(X, W), rtol=1e-5, atol=1e-6)
    with pytest.raises(gd.InvalidArgumentError, match=r"traced for \(float32\[4, 3\], float32\[3, 5\]\)"):
        concrete(np.ones((2, 3), np.float32), W)


def test_lambda_in_a_loop_warns(caplog: pytest.LogCaptureFixture) -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    x = np.ones(2, np.float32)
    with caplog.at_level("WARNING", logger="graphdist.distribute.strategy"):
        for _ in range(9):
            strategy.run(lambda v: v + 1, args=(x,))
    assert any("Define the function once outside the loop" in r.message for r in caplog.records)
