"""graphdist.models.mlp: the traced forward pass equals the plain-numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models import mlp
from graphdist.models.mlp import MLP


def test_strategy_run_matches_reference() -> None:
    model = MLP(sizes=(784, 512, 512, 10), seed=0)
    (x,) = model.example_inputs(batch=32)
    strategy = gd.OneDeviceStrategy("cpu:0")
    logits = strategy.run(model.forward, args=(x,))
    assert isinstance(logits, np.ndarray)
    assert logits.shape == (32, 10) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, model.reference_forward(x), rtol=1e-5, atol=1e-5)


def test_second_call_does_not_retrace() -> None:
    model = MLP(sizes=(16, 8, 4))
    (x,) = model.example_inputs(batch=4)
    strategy = gd.OneDeviceStrategy("cpu:0")
    strategy.run(model.forward, args=(x,))
    before = gd.stats.snapshot()
    strategy.run(model.forward, args=(x,))
    assert gd.stats.delta(before)["traces"] == 0


def test_function_step_with_reduce_matches_reference() -> None:
    model = mlp.default_model()
    (x,) = mlp.example_inputs(batch=16)
    strategy = gd.OneDeviceStrategy("cpu:0")

    @gd.function
    def step(x: np.ndarray) -> np.ndarray:
        return strategy.reduce("MEAN", strategy.run(model.forward, args=(x,)), axis=0)

    np.testing.assert_allclose(step(x), model.reference_forward(x).mean(axis=0), rtol=1e-5, atol=1e-6)
    traced = step.get_concrete_function(x).graph("traced")
    assert sum(node.op_type == "MatMul" for node in traced.nodes) == 2


def test_module_level_forward_traces_and_matches() -> None:
    (x,) = mlp.example_inputs()
    assert x.shape == (8, mlp.DEFAULT_SIZES[0]) and x.dtype == np.float32
    graph = gd.trace(mlp.forward, x)
    assert [n.op_type for n in graph.nodes] == ["MatMul", "Add", "Max", "MatMul", "Add"]
    out = gd.OneDeviceStrategy("cpu:0").run(mlp.forward, args=(x,))
    np.testing.assert_allclose(out, mlp.reference_forward(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mlp.forward(x), mlp.reference_forward(x), rtol=1e-6, atol=1e-6)


def test_float64_model_stays_float64() -> None:
    model = MLP(sizes=(6, 5, 3), dtype=np.float64)
    (x,) = model.example_inputs(batch=2)
    out = gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(x,))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, model.reference_forward(x), rtol=1e-12)


def test_he_initialisation_and_determinism() -> None:
    a, b = MLP(sizes=(512, 256, 10), seed=3), MLP(sizes=(512, 256, 10), seed=3)
    for wa, wb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(wa, wb)
    assert abs(a.weights[0].std() - np.sqrt(2 / 512)) < 0.1 * np.sqrt(2 / 512)
    assert all(not bias.any() for bias in a.biases)
    assert a.num_parameters == 512 * 256 + 256 + 256 * 10 + 10
    assert not np.array_equal(MLP((4, 3), seed=1).weights[0], MLP((4, 3), seed=2).weights[0])


def test_wrong_input_width_is_a_clear_error() -> None:
    model = MLP(sizes=(8, 4))
    with pytest.raises(ValueError, match=r"expects inputs of shape \(batch, 8\), got \(2, 5\)"):
        gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(np.ones((2, 5), np.float32),))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sizes": (4,)}, "at least an input and an output"),
    ({"sizes": (4, 0)}, "positive"),
    ({"sizes": (4, 2), "dtype": np.int32}, "floating-point"),
])
def test_bad_constructor_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MLP(**kwargs)
