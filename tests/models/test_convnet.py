"""graphdist.models.convnet: traced forward equals eager numpy; the ConvNet trains on the digits."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.ir import graph_summary
from graphdist.models import convnet
from graphdist.models.convnet import ConvNet


def test_traced_forward_equals_eager() -> None:
    model = ConvNet(seed=0)
    x, _ = ConvNet.example_data(n=32)
    strategy = gd.OneDeviceStrategy("cpu:0")
    traced = strategy.run(model.forward, args=(x,))
    assert traced.shape == (32, 10) and traced.dtype == np.float32
    np.testing.assert_allclose(traced, model.forward(x), rtol=1e-5, atol=1e-5)
    before = gd.stats.snapshot()
    strategy.run(model.forward, args=(x,))
    assert gd.stats.delta(before)["traces"] == 0


def test_float64_traced_forward_equals_eager() -> None:
    # float64 takes gd.nn's composite convolution and average pool (ONNX Runtime has no float64 Conv).
    model = ConvNet(seed=1, dtype=np.float64)
    x, _ = ConvNet.example_data(n=4, dtype=np.float64)
    traced = gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(x,))
    assert traced.dtype == np.float64
    np.testing.assert_allclose(traced, model.forward(x), rtol=1e-12, atol=1e-12)


def test_traced_loss_equals_eager() -> None:
    model = ConvNet(seed=2)
    x, labels = ConvNet.example_data(n=16)
    loss = gd.OneDeviceStrategy("cpu:0").run(model.loss, args=(x, labels))
    logits = model.forward(x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    expected = np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(16), labels])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(model.loss(x, labels), expected, rtol=1e-5)


def test_structure_and_variables() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = ConvNet(seed=0)
    names = [v.name for v in model.trainable_variables]
    assert names == ["convnet/conv1/kernel:0", "convnet/conv1/bias:0", "convnet/conv2/kernel:0",
                     "convnet/conv2/bias:0", "convnet/dense/kernel:0", "convnet/dense/bias:0"]
    assert model.conv1_kernel.shape == (3, 3, 1, 8) and model.dense_kernel.shape == (64, 10)
    assert model.num_parameters == 80 + 1168 + 650
    assert all(strategy.extended.variable_created_in_scope(v) for v in model.trainable_variables)
    again = ConvNet(seed=0)
    for a, b in zip(model.trainable_variables, again.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    traced = gd.trace(model.forward, np.zeros((2, 8, 8, 1), np.float32))
    ops = [n.op_type for n in traced.nodes]
    assert ops.count("Conv") == 2 and ops.count("MaxPool") == 1 and ops.count("AveragePool") == 1


def test_example_data_is_digits() -> None:
    x, labels = ConvNet.example_data(n=300, seed=3)
    assert x.shape == (300, 8, 8, 1) and x.dtype == np.float32
    assert labels.shape == (300,) and labels.dtype == np.int64
    assert 0.0 <= x.min() and x.max() <= 1.0 and set(np.unique(labels)) == set(range(10))
    again, _ = ConvNet.example_data(n=300, seed=3)
    np.testing.assert_array_equal(x, again)
    with pytest.raises(ValueError, match="1797"):
        ConvNet.example_data(n=5000)


def test_module_level_forward_and_example_inputs() -> None:
    (x,) = convnet.example_inputs()
    assert x.shape == (8, 8, 8, 1)
    graph = gd.trace(convnet.forward, x)
    assert graph_summary(graph)
    out = gd.OneDeviceStrategy("cpu:0").run(convnet.forward, args=(x,))
    np.testing.assert_allclose(out, convnet.forward(x), rtol=1e-5, atol=1e-5)


def test_bad_inputs_and_arguments() -> None:
    model = ConvNet()
    with pytest.raises(ValueError, match=r"images of shape \(batch, 8, 8, 1\)"):
        gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(np.zeros((2, 8, 8, 3), np.float32),))
    with pytest.raises(ValueError, match="multiple of 4"):
        ConvNet(image_size=10)
    with pytest.raises(ValueError, match="floating-point"):
        ConvNet(dtype=np.int32)


def test_convnet_trains_on_digits() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = ConvNet(seed=0)
        optimizer = gd.optimizers.Adam(0.01)
    step = model.make_train_step(optimizer)
    x, labels = ConvNet.example_data(n=640, seed=0)
    x_train, y_train, x_test, y_test = x[:512], labels[:512], x[512:], labels[512:]
    accuracy_before = model.accuracy(x_train, y_train)
    losses = []
    for i in range(40):
        start = (i % 8) * 64
        losses.append(float(strategy.run(step, args=(x_train[start:start + 64], y_train[start:start + 64]))))
        if i == 0:
            after_first = gd.stats.snapshot()
    assert gd.stats.delta(after_first)["traces"] == 0  # one trace for all 40 steps
    assert gd.stats.delta(after_first)["compiles"] == 0
    assert int(optimizer.iterations.numpy()) == 40
    assert np.mean(losses[-5:]) < 0.6 * losses[0], losses
    assert model.accuracy(x_train, y_train) > max(0.7, accuracy_before + 0.4)
    assert model.accuracy(x_test, y_test) > 0.6
