"""graphdist.models.transformer: traced forward equals eager numpy; the encoder block trains."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models import transformer
from graphdist.models.transformer import TransformerBlock


def _attention_reference(model: TransformerBlock, h: np.ndarray) -> np.ndarray:
    """Per-head loops, independent of the model's reshape/transpose code."""
    d, heads = model.d_model, model.num_heads
    dh = d // heads
    q = h @ model.query_kernel.numpy() + model.query_bias.numpy()
    k = h @ model.key_kernel.numpy() + model.key_bias.numpy()
    v = h @ model.value_kernel.numpy() + model.value_bias.numpy()
    out = np.zeros_like(h)
    for n in range(h.shape[0]):
        for head in range(heads):
            cols = slice(head * dh, (head + 1) * dh)
            scores = q[n, :, cols] @ k[n, :, cols].T / np.sqrt(dh)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            weights /= weights.sum(axis=1, keepdims=True)
            out[n, :, cols] = weights @ v[n, :, cols]
    return out @ model.output_kernel.numpy() + model.output_bias.numpy()


def test_traced_forward_equals_eager() -> None:
    model = TransformerBlock(seed=0)
    ids, _ = TransformerBlock.example_data(n=32)
    strategy = gd.OneDeviceStrategy("cpu:0")
    traced = strategy.run(model.forward, args=(ids,))
    assert traced.shape == (32, 4) and traced.dtype == np.float32
    np.testing.assert_allclose(traced, model.forward(ids), rtol=1e-5, atol=1e-5)
    before = gd.stats.snapshot()
    strategy.run(model.forward, args=(ids,))
    assert gd.stats.delta(before)["traces"] == 0


def test_attention_matches_per_head_reference() -> None:
    model = TransformerBlock(seed=3, dtype=np.float64)
    h = np.random.default_rng(0).standard_normal((3, 8, 32))
    out, weights = model.attention(h, return_weights=True)
    np.testing.assert_allclose(out, _attention_reference(model, h), rtol=1e-10, atol=1e-12)
    assert weights.shape == (3, 2, 8, 8)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-12)
    traced = gd.OneDeviceStrategy("cpu:0").run(model.attention, args=(h,))
    np.testing.assert_allclose(traced, out, rtol=1e-10, atol=1e-12)


def test_float64_and_shorter_sequences() -> None:
    model = TransformerBlock(seed=1, dtype=np.float64)
    ids, _ = TransformerBlock.example_data(n=4, length=5)
    traced = gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(ids.astype(np.int32),))
    assert traced.dtype == np.float64 and traced.shape == (4, 4)
    np.testing.assert_allclose(traced, model.forward(ids), rtol=1e-10, atol=1e-12)


def test_structure_and_variables() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = TransformerBlock(seed=0)
    names = [v.name for v in model.trainable_variables]
    assert names[:4] == ["transformer/embedding/tokens:0", "transformer/embedding/positions:0",
                         "transformer/attention/query/kernel:0", "transformer/attention/query/bias:0"]
    assert names[-1] == "transformer/classifier/bias:0" and len(set(names)) == len(names) == 20
    assert model.num_parameters == 16 * 32 + 8 * 32 + 4 * (32 * 32 + 32) + 2 * 64 + (32 * 64 + 64 + 64 * 32 + 32) \
        + 32 * 4 + 4
    assert all(strategy.extended.variable_created_in_scope(v) for v in model.trainable_variables)
    graph = gd.trace(model.forward, np.zeros((2, 8), np.int64))
    ops = [n.op_type for n in graph.nodes]
    assert "Gather" in ops and "Erf" in ops and ops.count("MatMul") >= 9


def test_example_data_labels_are_most_frequent_class_token() -> None:
    ids, labels = TransformerBlock.example_data(n=400, seed=5)
    assert ids.shape == (400, 8) and ids.dtype == np.int64 and labels.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 16
    counts = (ids[:, :, None] == np.arange(4)).sum(axis=1)
    np.testing.assert_array_equal(labels, counts.argmax(axis=1))
    assert ((counts == counts.max(axis=1, keepdims=True)).sum(axis=1) == 1).all()  # no ties
    assert np.bincount(labels, minlength=4).min() > 60  # roughly balanced: chance is ~1/4
    np.testing.assert_array_equal(ids, TransformerBlock.example_data(n=400, seed=5)[0])


def test_module_level_forward_and_example_inputs() -> None:
    (ids,) = transformer.example_inputs()
    assert ids.shape == (8, 8)
    out = gd.OneDeviceStrategy("cpu:0").run(transformer.forward, args=(ids,))
    np.testing.assert_allclose(out, transformer.forward(ids), rtol=1e-5, atol=1e-5)


def test_bad_inputs_and_arguments() -> None:
    model = TransformerBlock()
    with pytest.raises(ValueError, match="length <= 8"):
        model.forward(np.zeros((2, 9), np.int64))
    with pytest.raises(ValueError, match="integer token ids"):
        gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(np.zeros((2, 8), np.float32),))
    with pytest.raises(ValueError, match="must divide d_model"):
        TransformerBlock(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="vocab_size > num_classes"):
        TransformerBlock.example_data(vocab_size=4, num_classes=4)


def test_transformer_block_trains() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = TransformerBlock(seed=0)
        optimizer = gd.optimizers.Adam(0.01)
    step = model.make_train_step(optimizer)
    ids, labels = TransformerBlock.example_data(n=512, seed=0)
    test_ids, test_labels = TransformerBlock.example_data(n=256, seed=1)
    accuracy_before = model.accuracy(ids, labels)
    losses = []
    for i in range(40):
        start = (i % 8) * 64
        losses.append(float(strategy.run(step, args=(ids[start:start + 64], labels[start:start + 64]))))
        if i == 0:
            after_first = gd.stats.snapshot()
    assert gd.stats.delta(after_first)["traces"] == 0  # one trace for all 40 steps
    assert gd.stats.delta(after_first)["compiles"] == 0
    assert int(optimizer.iterations.numpy()) == 40
    assert np.mean(losses[-5:]) < 0.6 * losses[0], losses
    assert accuracy_before < 0.4  # chance is ~0.25
    assert model.accuracy(ids, labels) > 0.8
    assert model.accuracy(test_ids, test_labels) > 0.7
    np.testing.assert_allclose(model.loss(ids[:64], labels[:64], global_batch_size=64),
                               strategy.run(model.loss, args=(ids[:64], labels[:64])), rtol=1e-5)


def test_momentum_sgd_step_with_explicit_global_batch() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = TransformerBlock(seed=2)
        optimizer = gd.optimizers.SGD(0.1, momentum=0.9)
    ids, labels = TransformerBlock.example_data(n=64, seed=2)
    step = model.make_train_step(optimizer, global_batch_size=64)
    first = float(strategy.run(step, args=(ids, labels)))
    for _ in range(14):
        last = float(strategy.run(step, args=(ids, labels)))
    assert last < 0.6 * first
