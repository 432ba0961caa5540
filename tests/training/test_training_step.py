"""A full MLP training step (forward, backward, optimizer) equals a hand-written numpy step."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd

SIZES = (6, 8, 3)


def _data(batch: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], batch)


def _init(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES, SIZES[1:]):
        params += [(rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in)).astype(np.float32),
                   np.zeros(fan_out, np.float32)]
    return params


def _numpy_grads(params: list[np.ndarray], x: np.ndarray, labels: np.ndarray) -> tuple[float, list[np.ndarray]]:
    w1, b1, w2, b2 = params
    h_pre = x @ w1 + b1
    h = np.maximum(h_pre, 0)
    logits = h @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    loss = -(onehot * log_probs).sum() / len(x)
    g_logits = (np.exp(log_probs) - onehot) / len(x)
    g_w2, g_b2 = h.T @ g_logits, g_logits.sum(0)
    g_h = g_logits @ w2.T * (h_pre > 0)
    return loss, [x.T @ g_h, g_h.sum(0), g_w2, g_b2]


def _sgd(params, grads, state, lr=0.1, momentum=0.0, nesterov=False):
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
        if momentum == 0.0:
            out.append(p - lr * g)
            continue
        v = state.get(i, np.zeros_like(p))
        v = momentum * v - lr * g
        state[i] = v
        out.append(p + (momentum * v - lr * g if nesterov else v))
    return out


def _adam(params, grads, state, lr=0.01, b1=0.9, b2=0.999, eps=1e-7):
    t = state["t"] = state.get("t", 0) + 1
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
        m = b1 * state.get(("m", i), 0) + (1 - b1) * g
        v = b2 * state.get(("v", i), 0) + (1 - b2) * g * g
        state[("m", i)], state[("v", i)] = m, v
        lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        out.append(p - lr_t * m / (np.sqrt(v) + eps))
    return out


def _adamw(params, grads, state, lr=0.01, wd=0.05):
    """Keras' AdamW: decay the weights by lr * wd, then the Adam step."""
    return _adam([p - lr * wd * p for p in params], grads, state, lr=lr)


def _rmsprop(params, grads, state, lr=0.01, rho=0.9, momentum=0.0, eps=1e-7, centered=False):
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
        ms = state[("ms", i)] = rho * state.get(("ms", i), 0) + (1 - rho) * g * g
        denominator = ms
        if centered:
            mg = state[("mg", i)] = rho * state.get(("mg", i), 0) + (1 - rho) * g
            denominator = ms - mg * mg
        step = lr * g / np.sqrt(denominator + eps)
        if momentum:
            step = state[("mom", i)] = momentum * state.get(("mom", i), 0) + step
        out.append(p - step)
    return out


def _adagrad(params, grads, state, lr=0.1, initial=0.1, eps=1e-7):
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
        acc = state[i] = state.get(i, np.full_like(p, initial)) + g * g
        out.append(p - lr * g / np.sqrt(acc + eps))
    return out


def _graphdist_step(variables, optimizer):
    def step(x, labels):
        with gd.GradientTape() as tape:
            w1, b1, w2, b2 = variables
            h = np.maximum(x @ w1 + b1, 0)
            logits = h @ w2 + b2
            shifted = logits - logits.max(axis=1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            onehot = (np.arange(SIZES[-1]) == labels[:, None]).astype(np.float32)
            loss = -(onehot * log_probs).sum() / x.shape[0]
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return step


@pytest.mark.parametrize(
    ("make_optimizer", "numpy_update"),
    [
        (lambda: gd.optimizers.SGD(0.1), lambda p, g, s: _sgd(p, g, s)),
        (lambda: gd.optimizers.SGD(0.1, momentum=0.9), lambda p, g, s: _sgd(p, g, s, momentum=0.9)),
        (lambda: gd.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
         lambda p, g, s: _sgd(p, g, s, momentum=0.9, nesterov=True)),
        (lambda: gd.optimizers.Adam(0.01), lambda p, g, s: _adam(p, g, s)),
        (lambda: gd.optimizers.AdamW(0.01, weight_decay=0.05), lambda p, g, s: _adamw(p, g, s)),
        (lambda: gd.optimizers.RMSprop(0.01), lambda p, g, s: _rmsprop(p, g, s)),
        (lambda: gd.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
         lambda p, g, s: _rmsprop(p, g, s, momentum=0.5, centered=True)),
        (lambda: gd.optimizers.Adagrad(0.1), lambda p, g, s: _adagrad(p, g, s)),
    ],
    ids=["sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "rmsprop-centered-momentum", "adagrad"],
)
@pytest.mark.parametrize("backend", ["ort", "reference"])
def test_training_steps_equal_numpy(make_optimizer, numpy_update, backend: str) -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    params = _init()
    with strategy.scope():
        variables = [gd.Variable(p, name=f"p{i}") for i, p in enumerate(params)]
        optimizer = make_optimizer()
    step = gd.function(_graphdist_step(variables, optimizer), backend=backend)
    state: dict = {}
    for i in range(4):
        x, labels = _data(seed=i)
        loss = strategy.run(step, args=(x, labels))
        expected_loss, grads = _numpy_grads(params, x, labels)
        params = numpy_update(params, grads, state)
        np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
        for variable, expected in zip(variables, params):
            np.testing.assert_allclose(variable.numpy(), expected, rtol=2e-5, atol=2e-6)
    assert int(optimizer.iterations.numpy()) == 4
    assert all(strategy.extended.variable_created_in_scope(v) for v in variables)


def test_variable_basics_and_repr() -> None:
    v = gd.Variable(1.0)
    assert v.dtype == np.float32 and v.shape == ()
    assert repr(v).startswith("<gd.Variable 'Variable") and "numpy=1.0" in repr(v)
    v.assign(3.0)
    v.assign_add(1.0)
    v.assign_sub(0.5)
    assert v.numpy() == 3.5
    assert float(v + 1) == 4.5  # eager arithmetic uses the value
    with pytest.raises(gd.InvalidArgumentError, match="shape cannot change"):
        v.assign(np.ones(2))


def test_assign_inside_a_step_and_read_after() -> None:
    counter = gd.Variable(np.zeros(2, np.float32), name="counter")

    @gd.function
    def bump(x):
        counter.assign_add(x)
        counter.assign_add(x)  # reads see the previous assign
        return counter.value() * 1.0

    out = bump(np.ones(2, np.float32))
    np.testing.assert_array_equal(out, [2, 2])
    np.testing.assert_array_equal(counter.numpy(), [2, 2])
    bump(np.ones(2, np.float32))
    np.testing.assert_array_equal(counter.numpy(), [4, 4])  # state persists across calls, no retrace
    assert bump.experimental_get_tracing_count() == 1


def test_tape_outside_trace_is_a_clear_error() -> None:
    with pytest.raises(gd.TracingError, match="strategy.run"):
        with gd.GradientTape():
            pass


def test_apply_gradients_outside_trace_is_a_clear_error() -> None:
    v = gd.Variable(np.ones(2, np.float32))
    with pytest.raises(gd.TracingError, match="strategy.run"):
        gd.optimizers.SGD(0.1).apply_gradients([(np.ones(2, np.float32), v)])


def test_bad_optimizer_arguments() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="learning_rate"):
        gd.optimizers.SGD(-1.0)
    with pytest.raises(gd.InvalidArgumentError, match="momentum"):
        gd.optimizers.SGD(0.1, momentum=1.5)
    with pytest.raises(gd.InvalidArgumentError, match="beta_1"):
        gd.optimizers.Adam(beta_1=1.0)
    with pytest.raises(gd.InvalidArgumentError, match="weight_decay"):
        gd.optimizers.AdamW(weight_decay=-0.1)
    with pytest.raises(gd.InvalidArgumentError, match="rho"):
        gd.optimizers.RMSprop(rho=1.0)
    with pytest.raises(gd.InvalidArgumentError, match="initial_accumulator_value"):
        gd.optimizers.Adagrad(initial_accumulator_value=-1)
    with pytest.raises(gd.InvalidArgumentError, match="'rmsprop'"):
        gd.optimizers.get("lion")


def test_optimizers_by_name_and_config_round_trip() -> None:
    for name, cls in [("SGD", gd.optimizers.SGD), ("adam", gd.optimizers.Adam), ("AdamW", gd.optimizers.AdamW),
                      ("rmsprop", gd.optimizers.RMSprop), ("ADAGRAD", gd.optimizers.Adagrad)]:
        assert type(gd.optimizers.get(name)) is cls
    original = gd.optimizers.RMSprop(0.02, rho=0.8, momentum=0.3, centered=True, name="rms")
    copy = gd.optimizers.deserialize({"class_name": "RMSprop", "config": original.get_config()})
    assert type(copy) is gd.optimizers.RMSprop and copy.get_config() == original.get_config()
    with pytest.raises(gd.InvalidArgumentError, match="unknown optimizer class"):
        gd.optimizers.deserialize({"class_name": "Lion", "config": {}})
