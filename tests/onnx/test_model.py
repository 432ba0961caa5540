"""gd.onnx.load / OnnxModel: calls, variables, training under strategies, save, errors.

Oracles: ONNX Runtime on the same (or the saved) model, numpy formulas
(Gemm gradients, batch normalisation, dropout's scaling), and the
one-device run for distributed ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphdist as gd
from graphdist.onnx import files as onnx_files

RNG = np.random.default_rng(5)
D_IN, HIDDEN, CLASSES = 8, 16, 4


def tensor(name: str, shape, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 21, name: str = "m") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def mlp21(seed: int = 0) -> onnx.ModelProto:
    """Gemm -> LayerNormalization -> Gelu -> Gemm(transB) at opset 21, built with onnx.helper."""
    rng = np.random.default_rng(seed)
    arrays = {
        "dense1/w": rng.standard_normal((D_IN, HIDDEN)) / np.sqrt(D_IN),
        "dense1/b": rng.standard_normal(HIDDEN) * 0.1,
        "ln/scale": 1 + 0.1 * rng.standard_normal(HIDDEN),
        "ln/bias": 0.1 * rng.standard_normal(HIDDEN),
        "dense2/w": rng.standard_normal((CLASSES, HIDDEN)) / np.sqrt(HIDDEN),
        "dense2/b": rng.standard_normal(CLASSES) * 0.1,
    }
    nodes = [
        helper.make_node("Gemm", ["x", "dense1/w", "dense1/b"], ["h"], name="dense1"),
        helper.make_node("LayerNormalization", ["h", "ln/scale", "ln/bias"], ["hn"], axis=-1, epsilon=1e-5),
        helper.make_node("Gelu", ["hn"], ["g"]),
        helper.make_node("Gemm", ["g", "dense2/w", "dense2/b"], ["logits"], transB=1, name="dense2"),
    ]
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    return make_model(nodes, [tensor("x", ["N", D_IN])], [tensor("logits", ["N", CLASSES])], inits, name="mlp21")


def run_ort(model: onnx.ModelProto | str, *arrays: np.ndarray) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})


def data(batch: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, D_IN)).astype(np.float32), rng.integers(0, CLASSES, batch)


# ---------------------------------------------------------------- structure and calls
def test_load_structure_and_eager_call_equal_onnxruntime(tmp_path: Path) -> None:
    proto = mlp21()
    path = tmp_path / "mlp21.onnx"
    onnx.save(proto, str(path))
    for source in (proto, str(path), path):
        model = gd.onnx.load(source)
        assert model.input_names == ["x"] and model.output_names == ["logits"]
        assert [v.name for v in model.variables] == [f"{n}:0" for n in
                                                     ("dense1/w", "dense1/b", "ln/scale", "ln/bias", "dense2/w",
                                                      "dense2/b")]
        assert model.trainable_variables == model.variables
        assert isinstance(model.graph, gd.Graph) and model.graph.opset == 21
        x, _ = data()
        np.testing.assert_allclose(model(x), run_ort(proto, x)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(model(x=x), run_ort(proto, x)[0], rtol=1e-5, atol=1e-6)
    x3 = data(3)[0]  # another batch size: one more compiled specialisation
    np.testing.assert_allclose(model(x3), run_ort(proto, x3)[0], rtol=1e-5, atol=1e-6)
    assert len(proto.graph.initializer) == 6  # the caller's ModelProto is not changed


def test_eager_call_reads_the_variables_current_values() -> None:
    model = gd.onnx.load(mlp21())
    x, _ = data()
    before = model(x)
    bias = model.variables[-1]
    bias.assign(bias.numpy() + 1.0)
    np.testing.assert_allclose(model(x), before + 1.0, rtol=1e-5, atol=1e-5)


def test_trainable_false_and_frozen() -> None:
    constants = gd.onnx.load(mlp21(), trainable=False)
    assert constants.variables == [] and constants.trainable_variables == []
    x, _ = data()
    np.testing.assert_allclose(constants(x), run_ort(mlp21(), x)[0], rtol=1e-5, atol=1e-6)
    frozen = gd.onnx.load(mlp21(), frozen=["ln/scale", "ln/bias"])
    assert len(frozen.variables) == 6
    assert [v.name for v in frozen.trainable_variables] == ["dense1/w:0", "dense1/b:0", "dense2/w:0", "dense2/b:0"]
    with pytest.raises(gd.InvalidArgumentError, match=r"frozen names \['nope'\].*dense1/w"):
        gd.onnx.load(mlp21(), frozen=["nope"])
    with pytest.raises(gd.InvalidArgumentError, match="trainable=False"):
        gd.onnx.load(mlp21(), trainable=False, frozen=["ln/scale"])


def test_several_outputs_and_inputs_by_name() -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "w"], ["scaled"])]
    w = numpy_helper.from_array(np.float32([2.0, 3.0]), "w")
    model = gd.onnx.load(make_model(nodes, [tensor("a", [2]), tensor("b", [2])],
                                    [tensor("sum", [2]), tensor("scaled", [2])], [w]))
    a, b = np.float32([1, 2]), np.float32([10, 20])
    for result in (model(a, b), model(b=b, a=a), model(a, b=b)):
        assert isinstance(result, tuple) and len(result) == 2
        np.testing.assert_array_equal(result[0], [11, 22])
        np.testing.assert_array_equal(result[1], [2, 6])
    with pytest.raises(gd.InvalidArgumentError, match="no input 'c'.*a, b"):
        model(a, b, c=a)
    with pytest.raises(gd.InvalidArgumentError, match="missing input.*b"):
        model(a)
    with pytest.raises(gd.InvalidArgumentError, match="given twice"):
        model(a, a=a, b=b)
    with pytest.raises(gd.InvalidArgumentError, match="takes 2 input"):
        model(a, b, a)
    with pytest.raises(gd.TracingError, match="float64.*astype"):
        model(a.astype(np.float64), b)


def test_shape_deciding_input_is_bound_per_value() -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = gd.onnx.load(make_model(nodes, [tensor("x", [2, 3]), tensor("shape", [2], TensorProto.INT64)],
                                    [tensor("y", ["r0", "r1"])]))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert model(x, np.int64([3, 2])).shape == (3, 2)
    assert model(x, np.int64([1, 6])).shape == (1, 6)

    @gd.function
    def step(x):
        return model(x, np.int64([6, 1]))

    assert step(x).shape == (6, 1)


# ---------------------------------------------------------------- gradients and training
def test_gradients_reach_the_variables_like_numpy() -> None:
    w0 = RNG.standard_normal((3, 2)).astype(np.float32)
    b0 = RNG.standard_normal(2).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"])]
    model = gd.onnx.load(make_model(nodes, [tensor("x", ["N", 3])], [tensor("y", ["N", 2])],
                                    [numpy_helper.from_array(w0, "w"), numpy_helper.from_array(b0, "b")]))
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    target = RNG.standard_normal((5, 2)).astype(np.float32)

    @gd.function
    def grads(x, target):
        with gd.GradientTape() as tape:
            loss = ((model(x) - target) ** 2).sum()
        return tape.gradient(loss, model.trainable_variables)

    gw, gb = grads(x, target)
    residual = 2 * (x @ w0 + b0 - target)
    np.testing.assert_allclose(gw, x.T @ residual, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, residual.sum(0), rtol=1e-4, atol=1e-5)


def _train(strategy: gd.Strategy, proto: onnx.ModelProto, steps: int, global_batch: int) -> tuple:
    with strategy.scope():
        model = gd.onnx.load(proto)
        optimizer = gd.optimizers.SGD(0.2)

    @gd.function
    def train_step(x, labels):
        def replica_step(x, labels):
            with gd.GradientTape() as tape:
                logits = model(x)
                loss = gd.nn.compute_average_loss(gd.nn.sparse_softmax_cross_entropy(labels, logits),
                                                  global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    losses = []
    replicas = strategy.num_replicas_in_sync
    for _ in range(steps):
        x, labels = data(global_batch, seed=0)  # one batch: the loss must fall
        if replicas > 1:
            dist = strategy.experimental_distribute_dataset(
                gd.data.Dataset.from_tensor_slices((x, labels)).batch(global_batch))
            args = next(iter(dist))
        else:
            args = (x, labels)
        losses.append(float(train_step(*args)))
    return model, losses


@pytest.mark.parametrize("make_strategy", [
    lambda: gd.MirroredStrategy(["cpu:0", "cpu:1"]),
    lambda: gd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    lambda: gd.TPUStrategy(gd.cluster_resolver.TPUClusterResolver("local[2]")),  # compiled whole by TVM
], ids=["mirrored", "central_storage", "tpu"])
def test_opset21_model_trains_under_two_replicas_like_one_device(make_strategy, tmp_path: Path) -> None:
    proto = mlp21()
    one, one_losses = _train(gd.OneDeviceStrategy("cpu:0"), proto, steps=4, global_batch=8)
    strategy = make_strategy()
    two, two_losses = _train(strategy, proto, steps=4, global_batch=8)
    assert strategy.num_replicas_in_sync == 2
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-5)
    assert two_losses[-1] < two_losses[0]
    initial = [numpy_helper.to_array(t) for t in proto.graph.initializer]
    assert max(np.abs(v.numpy() - i).max() for v, i in zip(one.variables, initial)) > 1e-2
    for a, b in zip(one.variables, two.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    # The trained model saved: ONNX Runtime computes what graphdist computes.
    path = two.save(tmp_path / "trained.onnx")
    x, _ = data(6, seed=9)
    np.testing.assert_allclose(run_ort(str(path), x)[0], two(x), rtol=1e-5, atol=1e-5)
    reloaded = onnx.load(str(path))
    assert {o.domain: o.version for o in reloaded.opset_import}[""] == 21
    assert [n.op_type for n in reloaded.graph.node] == ["Gemm", "LayerNormalization", "Gelu", "Gemm"]
    for tensor_proto, variable in zip(reloaded.graph.initializer, two.variables):
        np.testing.assert_array_equal(numpy_helper.to_array(tensor_proto), variable.numpy())


def test_non_differentiable_op_is_a_tracing_error_naming_it() -> None:
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"]), helper.make_node("Hardmax", ["h"], ["y"])]
    w = numpy_helper.from_array(RNG.standard_normal((3, 3)).astype(np.float32), "w")
    model = gd.onnx.load(make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], [w]))
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(model(x), run_ort(make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])],
                                                               [w]), x)[0])

    @gd.function
    def grads(x):
        with gd.GradientTape() as tape:
            loss = model(x).sum()
        return tape.gradient(loss, model.variables)

    with pytest.raises(gd.TracingError, match="Hardmax"):
        grads(x)


# ---------------------------------------------------------------- training form
def _batch_norm_model(opset: int = 15) -> onnx.ModelProto:
    channels = 3
    arrays = {"bn/scale": np.float32([1.0, 2.0, 0.5]), "bn/bias": np.float32([0.0, 1.0, -1.0]),
              "bn/mean": np.float32([0.5, -0.5, 0.0]), "bn/var": np.float32([1.0, 2.0, 0.5])}
    nodes = [helper.make_node("BatchNormalization", ["x", *arrays], ["y"], epsilon=1e-5, momentum=0.9)]
    return make_model(nodes, [tensor("x", ["N", channels, 2, 2])], [tensor("y", ["N", channels, 2, 2])],
                      [numpy_helper.from_array(a, n) for n, a in arrays.items()], opset=opset)


def _bn_numpy(x, scale, bias, mean, var, eps=1e-5):
    shape = (1, -1, 1, 1)
    return scale.reshape(shape) * (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) + bias.reshape(shape)


@pytest.mark.parametrize("opset", [9, 15])
def test_batch_norm_training_mode_uses_batch_statistics_and_moves_running_ones(opset: int) -> None:
    proto = _batch_norm_model(opset) if opset >= 15 else _batch_norm_opset9()
    model = gd.onnx.load(proto, batch_norm="update")
    x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32) * 2 + 1
    scale, bias, mean, var = (v.numpy() for v in model.variables)
    np.testing.assert_allclose(model(x), run_ort(proto, x)[0], rtol=1e-5, atol=1e-5)  # inference form
    batch_mean, batch_var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(model(x, training=True), _bn_numpy(x, scale, bias, batch_mean, batch_var),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(model.variables[2].numpy(), 0.9 * mean + 0.1 * batch_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.variables[3].numpy(), 0.9 * var + 0.1 * batch_var, rtol=1e-5, atol=1e-6)


def _batch_norm_opset9() -> onnx.ModelProto:
    model = _batch_norm_model(15)
    model.opset_import[0].version = 9
    return model


def test_batch_norm_training_under_mirrored_moves_by_the_replicas_mean() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.onnx.load(_batch_norm_model(), batch_norm="update")
    mean, var = model.variables[2].numpy(), model.variables[3].numpy()
    x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32) * 2 + 1
    halves = (x[:2], x[2:])
    result = strategy.run(lambda x: model(x, training=True), args=(gd.PerReplica(list(halves)),))
    scale, bias = model.variables[0].numpy(), model.variables[1].numpy()
    for half, got in zip(halves, result.values):  # each replica normalises with its own slice's statistics
        want = _bn_numpy(half, scale, bias, half.mean(axis=(0, 2, 3)), half.var(axis=(0, 2, 3)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    new_mean = np.mean([0.9 * mean + 0.1 * h.mean(axis=(0, 2, 3)) for h in halves], axis=0)
    new_var = np.mean([0.9 * var + 0.1 * h.var(axis=(0, 2, 3)) for h in halves], axis=0)
    np.testing.assert_allclose(model.variables[2].numpy(), new_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.variables[3].numpy(), new_var, rtol=1e-5, atol=1e-6)


def test_dropout_training_mode_drops_and_scales() -> None:
    nodes = [helper.make_node("Dropout", ["x", "ratio"], ["y"], seed=3)]
    ratio = numpy_helper.from_array(np.float32(0.5), "ratio")
    model = gd.onnx.load(make_model(nodes, [tensor("x", [1000])], [tensor("y", [1000])], [ratio]), trainable=False)
    x = np.ones(1000, np.float32)
    np.testing.assert_array_equal(model(x), x)  # inference form: the identity
    dropped = model(x, training=True)
    assert set(np.unique(dropped)) <= {0.0, 2.0}
    assert 300 < int((dropped == 0).sum()) < 700


# ---------------------------------------------------------------- save
def test_save_is_atomic_and_keeps_the_model(tmp_path: Path) -> None:
    model = gd.onnx.load(mlp21())
    model.variables[0].assign(np.zeros((D_IN, HIDDEN), np.float32))
    path = tmp_path / "sub" / "m.onnx"
    assert model.save(path) == str(path)
    assert sorted(os.listdir(path.parent)) == ["m.onnx"]  # no temporary file left
    x, _ = data()
    np.testing.assert_allclose(run_ort(str(path), x)[0], model(x), rtol=1e-5, atol=1e-6)
    assert gd.onnx.load(path).variables[0].numpy().max() == 0.0


def test_save_large_model_with_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_files, "INLINE_LIMIT", 100)
    monkeypatch.setattr(onnx_files, "EXTERNAL_THRESHOLD", 64)
    model = gd.onnx.load(mlp21())
    path = tmp_path / "big.onnx"
    model.save(path)
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]
    assert onnx_files.external_tensors(onnx.load(str(path), load_external_data=False))
    x, _ = data()
    np.testing.assert_allclose(run_ort(str(path), x)[0], model(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gd.onnx.load(path)(x), model(x), rtol=1e-6)


# ---------------------------------------------------------------- bad input
def test_external_data_is_read_and_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "ext.onnx"
    onnx.save(mlp21(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.weights", size_threshold=0)
    x, _ = data()
    np.testing.assert_allclose(gd.onnx.load(path)(x), run_ort(mlp21(), x)[0], rtol=1e-5, atol=1e-6)
    os.remove(tmp_path / "ext.weights")
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail):
        ort.InferenceSession(str(path))  # ONNX Runtime refuses it too
    with pytest.raises(gd.GraphError, match=r"ext\.onnx.*external-data file 'ext\.weights', which does not exist"):
        gd.onnx.load(path)
    with pytest.raises(gd.GraphError, match="external data"):
        gd.onnx.load(onnx.load(str(path), load_external_data=False))


def test_truncated_file_is_a_graph_error_naming_it(tmp_path: Path) -> None:
    data_bytes = mlp21().SerializeToString()
    for cut in (len(data_bytes) // 2, len(data_bytes) - 7, 40):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data_bytes[:cut])
        with pytest.raises(gd.GraphError, match=f"cut{cut}.onnx"):
            gd.onnx.load(path)
    with pytest.raises(gd.GraphError, match="absent.onnx.*does not exist"):
        gd.onnx.load(tmp_path / "absent.onnx")
    with pytest.raises(gd.InvalidArgumentError, match="gd.onnx.load: model must be an onnx.ModelProto.*or a path"):
        gd.onnx.load(42)


def test_op_onnxruntime_rejects_is_named(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Frobnicate", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "bad", [tensor("x", [2])], [tensor("y", [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 10
    path = tmp_path / "bad.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(Exception, match="Frobnicate"):
        ort.InferenceSession(str(path))
    with pytest.raises(gd.GraphError, match=r"bad\.onnx.*Frobnicate"):
        gd.onnx.load(path)
    with pytest.raises(gd.GraphError, match="Frobnicate"):
        gd.onnx.load(proto)


def test_opset_newer_than_onnxruntime_is_refused() -> None:
    proto = mlp21()
    proto.opset_import[0].version = 99
    with pytest.raises(gd.GraphError, match="opset 99"):
        gd.onnx.load(proto)
