"""Labels and indices out of range raise from compiled steps, naming the argument and its range.

Traced ``sparse_softmax_cross_entropy``, the Keras sparse losses, ``gd.nn.embedding``,
``np.take`` and integer-array indexing record a ``graphdist.CheckIndices`` node; the plan's
``AssertInRange`` task raises ``gd.InvalidArgumentError`` after the step, before any variable is
written back, on every backend, per replica, in exported and re-planned plans too. Without the
checks a label out of range gave a silent loss of 0 (these tests fail with the check disabled).
"""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.ir.ops import get_opdef

BACKENDS = ["ort", "tvm", "reference"]
RNG = np.random.default_rng(7)
LOGITS = RNG.normal(size=(4, 3)).astype(np.float32)
GOOD = np.array([0, 2, 1, 1])


def _sparse_ce(labels, logits):
    return gd.nn.sparse_softmax_cross_entropy(labels, logits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_labels_out_of_range_raise_and_valid_labels_keep_their_value(backend: str) -> None:
    step = gd.function(_sparse_ce, backend=backend)
    np.testing.assert_allclose(step(GOOD, LOGITS), _sparse_ce(GOOD, LOGITS), rtol=1e-6)  # eager value
    with pytest.raises(gd.InvalidArgumentError, match=r"sparse_softmax_cross_entropy: labels must be in \[0, 3\) "
                                                      r"\(logits.shape\[-1\] = 3 classes\); got values from 0 to 3\."):
        step(np.array([0, 3, 1, 1]), LOGITS)
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be in \[0, 3\).*from -1 to 1"):
        step(np.array([-1, 0, 1, 1]), LOGITS)
    np.testing.assert_allclose(step(GOOD, LOGITS), _sparse_ce(GOOD, LOGITS), rtol=1e-6)  # still usable


@pytest.mark.parametrize("backend", BACKENDS)
def test_take_and_integer_array_indices_out_of_range_raise(backend: str) -> None:
    x = np.arange(12.0).reshape(3, 4)
    take = gd.function(lambda a, i: np.take(a, i, axis=1), backend=backend)
    index = gd.function(lambda a, i: a[i], backend=backend)
    good = np.array([[3, -4], [0, -1]])
    np.testing.assert_array_equal(take(x, good), np.take(x, good, axis=1))  # negative indices as in numpy
    np.testing.assert_array_equal(index(x, np.array([-3, 2])), x[np.array([-3, 2])])
    with pytest.raises(gd.InvalidArgumentError, match=r"np.take: indices must be in \[-4, 4\) \(an axis of size 4\); "
                                                      r"got values from -5 to 3"):
        take(x, np.array([[3, -5], [0, 1]]))
    with pytest.raises(gd.InvalidArgumentError, match=r"x\[index\]: indices must be in \[-3, 3\).*from 0 to 3"):
        index(x, np.array([0, 3]))


def test_eager_calls_raise_at_once() -> None:
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be in \[0, 3\)"):
        _sparse_ce(np.array([0, 3, 1, 1]), LOGITS)
    loss = gd.keras.losses.SparseCategoricalCrossentropy()
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be in \[0, 3\).*Fix the labels$"):
        loss(np.array([4, 0, 0, 0]), np.full((4, 3), 1 / 3, np.float32))


def _mirrored_training():
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        weights = gd.Variable(RNG.normal(size=(5, 3)).astype(np.float32), name="w")
        optimizer = gd.optimizers.SGD(0.1)

    def replica_step(x, y):
        with gd.GradientTape() as tape:
            loss = gd.nn.compute_average_loss(_sparse_ce(y, x @ weights), global_batch_size=4)
        optimizer.apply_gradients(zip(tape.gradient(loss, [weights]), [weights]))
        return loss

    @gd.function
    def train(x, y):
        return strategy.reduce("SUM", strategy.run(replica_step, (x, y)), axis=None)

    return strategy, weights, train


def _per_replica(array: np.ndarray) -> gd.PerReplica:
    return gd.PerReplica((array[:2], array[2:]))


def test_mirrored_step_names_the_replica_and_writes_nothing_back(tmp_path) -> None:
    strategy, weights, train = _mirrored_training()
    x = RNG.normal(size=(4, 5)).astype(np.float32)
    train(_per_replica(x), _per_replica(GOOD))
    before = weights.numpy()
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be in \[0, 3\).*from 1 to 7 \(replica 1\)"):
        train(_per_replica(x), _per_replica(np.array([0, 2, 1, 7])))
    np.testing.assert_array_equal(weights.numpy(), before)  # the failed step updated nothing
    expected = np.mean(_sparse_ce(GOOD, x @ before))
    np.testing.assert_allclose(train(_per_replica(x), _per_replica(GOOD)), expected, rtol=1e-5)

    concrete = train.get_concrete_function(_per_replica(x), _per_replica(GOOD))
    checks = [c for c in concrete.plan.comms if c.op == "AssertInRange"]
    assert [c.attrs["replica"] for c in checks] == [0, 1] and concrete.graph("traced").find_nodes(
        "CheckIndices", GRAPHDIST_DOMAIN)
    loaded = gd.load_plan(concrete.export(tmp_path / "plan"))
    with pytest.raises(gd.InvalidArgumentError, match=r"got values from 0 to 9 \(replica 0\)"):
        loaded(x, np.array([9, 0, 1, 1]))  # a global batch, split over the two replicas
    one_device = concrete.replan(gd.OneDeviceStrategy("cpu:0"))
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be in \[0, 3\) .*; got values from -2 to 2\. "):
        one_device(x, np.array([0, 2, -2, 1]))  # one replica: none named


@pytest.mark.parametrize("backend", BACKENDS)
def test_mirrored_labels_checked_per_replica_on_every_backend(backend: str) -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    step = gd.function(lambda y, z: strategy.run(_sparse_ce, (y, z)), backend=backend)
    logits = _per_replica(LOGITS)
    result = step(_per_replica(GOOD), logits)
    np.testing.assert_allclose(np.concatenate(result.values), _sparse_ce(GOOD, LOGITS), rtol=1e-6)
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be in \[0, 3\).*from 1 to 3 \(replica 1\)"):
        step(_per_replica(np.array([0, 2, 1, 3])), logits)
    with pytest.raises(gd.InvalidArgumentError, match=r"from -7 to 2 \(replica 0\)"):  # the first failing replica
        step(_per_replica(np.array([-7, 2, 1, 3])), logits)


def test_keras_loss_and_embedding_in_a_custom_loop() -> None:
    loss = gd.keras.losses.SparseCategoricalCrossentropy()
    probabilities = np.full((2, 3), 1 / 3, np.float32)
    step = gd.function(lambda y, p: loss(y, p))
    np.testing.assert_allclose(step(np.array([0, 2]), probabilities), np.log(3.0), rtol=1e-6)
    with pytest.raises(gd.InvalidArgumentError, match=r"sparse_categorical_crossentropy: labels must be in \[0, 3\) "
                                                      r"\(the model outputs 3 classes\); got values from 0 to 5"):
        step(np.array([0, 5]), probabilities)
    table = np.eye(4, dtype=np.float32)
    lookup = gd.function(lambda ids, t: gd.nn.embedding(ids, t))
    np.testing.assert_array_equal(lookup(np.array([3, 1]), table), table[[3, 1]])
    with pytest.raises(gd.InvalidArgumentError, match=r"embedding: ids must be in \[0, 4\).*from -1 to 1"):
        lookup(np.array([-1, 1]), table)  # a negative id is an error here, as eagerly (numpy would wrap it)


def test_empty_labels_pass_and_gd_trace_graphs_stay_plain_onnx() -> None:
    step = gd.function(_sparse_ce)
    assert step(np.zeros((0,), np.int64), np.zeros((0, 3), np.float32)).shape == (0,)
    graph = gd.trace(_sparse_ce, GOOD, LOGITS)
    assert not graph.find_nodes("CheckIndices", GRAPHDIST_DOMAIN)  # any ONNX runtime loads it


def test_references_of_the_check_ops_raise_like_the_plan() -> None:
    attrs = {"low": 0, "high": 3, "op": "sparse_softmax_cross_entropy", "argument": "labels", "hint": ""}
    check = get_opdef("CheckIndices", GRAPHDIST_DOMAIN).reference
    np.testing.assert_array_equal(check(np.array([2, 0]), **attrs)[0], [2, 0])
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be in \[0, 3\); got values from 0 to 5"):
        check(np.array([0, 5]), **attrs)
    assertion = get_opdef("AssertInRange", GRAPHDIST_DOMAIN).reference
    with pytest.raises(gd.InvalidArgumentError, match=r"from -1 to 2 \(replica 3\)"):
        assertion(np.array([-1, 2], np.int64), replica=3, **attrs)
    empty = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)  # [min, max] of no values
    np.testing.assert_array_equal(assertion(empty, **attrs)[0], empty)


# ------------------------------------------------------------- label dtypes
SUPPORTED = ["int8", "uint8", "int32", "int64"]
UNSUPPORTED = ["uint64", "uint32", "int16", "uint16"]   # ONNX Runtime has no ReduceMin/ReduceMax kernel for them


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_supported_label_dtype_runs_on_every_backend(backend: str) -> None:
    step = gd.function(_sparse_ce, backend=backend)
    for dtype in SUPPORTED:
        np.testing.assert_allclose(step(GOOD.astype(dtype), LOGITS), _sparse_ce(GOOD, LOGITS), rtol=1e-6)


@pytest.mark.parametrize("dtype", UNSUPPORTED)
def test_an_unsupported_label_dtype_is_named(dtype: str) -> None:
    # Before: ONNX Runtime's "Could not find an implementation for ReduceMin(18) node with name
    # 'check_labels_reducemin'" (uint32, uint64) or an invalid-model type error (int16, uint16).
    expected = (rf"sparse_softmax_cross_entropy: labels of dtype {dtype} are not supported; class labels must be "
                r"int8, uint8, int32 or int64 .*labels.astype\(np.int64\)")
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(labels, logits):
        return strategy.run(_sparse_ce, args=(labels, logits))

    for call in (lambda: step(GOOD.astype(dtype), LOGITS), lambda: _sparse_ce(GOOD.astype(dtype), LOGITS)):
        with pytest.raises(gd.InvalidArgumentError, match=expected):
            call()


@pytest.mark.parametrize("dtype", UNSUPPORTED)
@pytest.mark.parametrize("from_logits", [True, False])
def test_keras_sparse_losses_take_any_integer_labels(dtype: str, from_logits: bool) -> None:
    # As Keras does, the sparse losses and metrics cast labels to int64 (fit checks their range first).
    keras = gd.keras
    x = RNG.normal(size=(16, 4)).astype(np.float32)
    y = np.arange(16) % 3
    histories = []
    for labels in (y.astype(np.int64), y.astype(dtype)):
        keras.utils.set_random_seed(1)
        layers = [keras.layers.Dense(3, input_shape=(4,))]
        model = keras.Sequential(layers if from_logits else layers + [keras.layers.Softmax()])
        model.compile(optimizer="sgd", metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits))
        histories.append(model.fit(x, labels, batch_size=8, epochs=2, verbose=0).history)
    assert histories[1] == histories[0]
    with pytest.raises(gd.InvalidArgumentError, match=r"labels must be class indices in \[0, 3\)"):
        model.fit(x, np.full(16, 2**40, dtype=np.uint64), batch_size=8, epochs=1, verbose=0)
