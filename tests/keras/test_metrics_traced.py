"""Keras metrics updated inside traced steps: TensorFlow's custom training loop, where the replica function
calls ``train_accuracy.update_state(labels, predictions)`` under ``strategy.run`` inside ``gd.function``.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd

FEATURES, CLASSES, EXAMPLES, GLOBAL_BATCH = 5, 4, 20, 8  # batches of 8, 8 and a partial 4

STRATEGIES = {
    "mirrored2": lambda: gd.MirroredStrategy(["cpu:0", "cpu:1"]),
    "central_storage2": lambda: gd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
}


def _data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((EXAMPLES, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, EXAMPLES).astype(np.int64)
    w = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    return x, y, w


def _numpy_accuracy_and_loss(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    logits = x.astype(np.float64) @ w
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(np.mean(logits.argmax(axis=1) == y)), float(np.mean(-log_probs[np.arange(len(y)), y]))


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_metrics_updated_in_replica_fn_equal_numpy(name: str) -> None:
    strategy = STRATEGIES[name]()
    x, y, w_value = _data(0)
    with strategy.scope():
        w = gd.Variable(w_value, name="w")
        train_accuracy = gd.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        train_loss = gd.keras.metrics.Mean(name="train_loss")

    def replica_fn(features, labels):
        predictions = features @ w
        one_hot = (labels[:, None] == np.arange(CLASSES)).astype(np.float32)
        per_example_loss = -(one_hot * gd.nn.log_softmax(predictions)).sum(axis=1)
        train_accuracy.update_state(labels, predictions)
        train_loss.update_state(per_example_loss)
        return gd.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)

    @gd.function
    def distributed_step(features, labels):
        per_replica_losses = strategy.run(replica_fn, args=(features, labels))
        return strategy.reduce("SUM", per_replica_losses, axis=None)

    def epoch(features: np.ndarray, labels: np.ndarray) -> None:
        dataset = gd.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH)
        for batch_x, batch_y in strategy.experimental_distribute_dataset(dataset):
            distributed_step(batch_x, batch_y)

    epoch(x, y)
    accuracy, loss = _numpy_accuracy_and_loss(x, y, w_value)
    assert 0.0 < accuracy < 1.0
    assert train_accuracy.result() == pytest.approx(accuracy, abs=1e-12)  # counts are exact
    assert train_loss.result() == pytest.approx(loss, rel=1e-5)
    assert isinstance(train_accuracy.variables[0], type(w))  # state in a variable of the strategy's kind

    train_accuracy.reset_state()
    train_loss.reset_state()
    assert train_accuracy.result() == 0.0 and train_loss.result() == 0.0
    x2, y2, _ = _data(1)
    epoch(x2, y2)
    epoch(x2[:12], y2[:12])  # two more steps, one more trace shape (12 = 8 + 4 is already traced)
    both_x, both_y = np.concatenate([x2, x2[:12]]), np.concatenate([y2, y2[:12]])
    accuracy2, loss2 = _numpy_accuracy_and_loss(both_x, both_y, w_value)
    assert train_accuracy.result() == pytest.approx(accuracy2, abs=1e-12)
    assert train_loss.result() == pytest.approx(loss2, rel=1e-5)


def test_result_and_call_inside_the_step_and_eager_updates_share_the_state() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        accuracy = gd.keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state(np.array([1, 0]), np.array([[0.0, 1.0], [0.0, 1.0]]))  # eager: 1 of 2 before the step

    @gd.function
    def step(labels, logits):
        running = strategy.run(lambda lab, log: accuracy(lab, log), args=(labels, logits))
        return strategy.experimental_local_results(running)[0]

    labels = np.array([0, 1, 1, 1])
    logits = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], np.float32)  # 3 of 4 right
    split = strategy.experimental_distribute_values_from_function
    inside = step(split(lambda ctx: labels[2 * ctx.replica_id_in_sync_group:][:2]),
                  split(lambda ctx: logits[2 * ctx.replica_id_in_sync_group:][:2]))
    assert float(inside) == pytest.approx(4 / 6)  # the running value, both replicas' updates included
    assert accuracy.result() == pytest.approx(4 / 6)
    accuracy.update_state(np.array([0]), np.array([[0.0, 1.0]]))  # eager updates now go to the variable
    assert accuracy.result() == pytest.approx(4 / 7)
    accuracy.reset_state()
    assert accuracy.result() == 0.0
