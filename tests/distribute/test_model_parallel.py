"""ModelParallelStrategy (tensor parallelism, issue 27): the Keras 3 API, its errors, and training that equals
OneDeviceStrategy on the same data, with the collectives the Megatron layout needs and no more."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import graphdist as gd
from graphdist.errors import InvalidArgumentError
from graphdist.passes.lower_layouts import variable_bytes_per_device
from tests.distribute.digits_training import train_imported


def _digits(count: int = 64) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x[:count] / 16).astype(np.float32), y[:count].astype(np.int64)


def _mesh(shape: tuple[int, ...] = (1, 2), names: tuple[str, ...] = ("batch", "model")) -> gd.experimental.DeviceMesh:
    return gd.experimental.DeviceMesh(shape, names, [f"cpu:{i}" for i in range(int(np.prod(shape)))])


def _megatron_map(mesh: gd.experimental.DeviceMesh, blocks: int = 1) -> gd.experimental.LayoutMap:
    """Block b is layers 2b (columns split, and its bias) and 2b + 1 (rows split); the last layer replicated."""
    layout_map = gd.experimental.LayoutMap(mesh)
    for block in range(blocks):
        layout_map[f"dense_{2 * block}/kernel"] = (None, "model")
        layout_map[f"dense_{2 * block}/bias"] = ("model",)
        layout_map[f"dense_{2 * block + 1}/kernel"] = ("model", None)
    return layout_map


def _train(strategy: gd.Strategy, sizes: list[int], x: np.ndarray, y: np.ndarray, steps: int = 5,
           batch: int = 16, constrain: bool = False, pins: dict[int, tuple] | None = None
           ) -> tuple[list[float], list[np.ndarray], object]:
    """``steps`` Adam steps of an MLP (ReLU between layers, softmax cross-entropy) in a custom loop.

    ``constrain``: each hidden activation pinned split by columns over ``model``, then whole, alternately;
    ``pins``: hidden layer -> the layout its activation is pinned to (``with_sharding_constraint``).
    """
    rng = np.random.default_rng(0)
    with strategy.scope():
        params = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            params.append(gd.Variable((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32),
                                      name=f"dense_{i}/kernel"))
            params.append(gd.Variable(rng.standard_normal(fan_out).astype(np.float32) * 0.1, name=f"dense_{i}/bias"))
        optimizer = gd.optimizers.Adam(0.01)

    def replica_step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        with gd.GradientTape() as tape:
            h = xb
            for layer in range(len(sizes) - 1):
                h = h @ params[2 * layer] + params[2 * layer + 1]
                if layer < len(sizes) - 2:
                    h = gd.nn.relu(h)
                    if constrain:
                        h = gd.experimental.with_sharding_constraint(h, (None, "model") if layer % 2 == 0
                                                                     else (None, None))
                    if pins and layer in pins:
                        h = gd.experimental.with_sharding_constraint(h, pins[layer])
            per_example = gd.nn.sparse_softmax_cross_entropy(yb, h)
            loss = gd.nn.compute_average_loss(per_example, global_batch_size=batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss

    @gd.function
    def step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

    losses = []
    for s in range(steps):
        start = (s * batch) % len(x)
        losses.append(float(step(x[start:start + batch], y[start:start + batch])))
    concrete = step.get_concrete_function(x[:batch], y[:batch])
    return losses, [p.numpy() for p in params] + [v.numpy() for v in optimizer.variables()], concrete


def _assert_same_training(one: tuple, tp: tuple, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(tp[0], one[0], rtol=rtol, atol=atol)
    assert len(tp[1]) == len(one[1])
    for got, want in zip(tp[1], one[1]):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _collectives(concrete: object, op_type: str) -> dict[str, list[str]]:
    """Group key -> the value names its members reduce, for ``op_type`` nodes of the rewritten graph."""
    groups: dict[str, list[str]] = {}
    for node in concrete.graph("rewritten").nodes:
        if node.op_type == op_type:
            groups.setdefault(node.attrs["group_key"], []).append(node.inputs[0].name)
    return groups


# ------------------------------------------------------------------ training
def test_megatron_mlp_on_digits_equals_one_device_with_one_all_reduce_forward() -> None:
    x, y = _digits()
    sizes = [64, 32, 32, 10]
    one = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y)
    mesh = _mesh()
    tp = _train(gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(mesh), batch_dim_name="batch"),
                sizes, x, y)
    _assert_same_training(one, tp)
    groups = _collectives(tp[2], "AllReduce")
    forward = [k for k, names in groups.items() if not names[0].startswith("grad_")]
    backward = [k for k, names in groups.items() if names[0].startswith("grad_")]
    # The block's output (a row-split product) is summed once; its input x needs no gradient, so the
    # backward pass has nothing to sum (the weights' gradients come out split like the weights).
    assert (len(forward), len(backward)) == (1, 0)
    assert all(len(names) == 2 for names in groups.values())
    assert not _collectives(tp[2], "AllGather")


def test_two_megatron_blocks_sum_once_per_block_forward_and_once_backward() -> None:
    x, y = _digits()
    sizes = [64, 32, 16, 32, 16, 10]
    one = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=3)
    mesh = _mesh()
    tp = _train(gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(mesh, blocks=2)), sizes, x, y, steps=3)
    _assert_same_training(one, tp)
    groups = _collectives(tp[2], "AllReduce")
    forward = [k for k, names in groups.items() if not names[0].startswith("grad_")]
    backward = [k for k, names in groups.items() if names[0].startswith("grad_")]
    # Block 2's input gradient contracts over its split hidden dimension: one all-reduce (Megatron's `f`).
    assert (len(forward), len(backward)) == (2, 1)


def test_collective_bytes_measured_in_a_step_equal_the_plans() -> None:
    """The recorded step's collectives move what the plan predicts: one all-reduce of the (16, 32) float32
    block product, 2 (n-1)/n of it sent by each of the n = 2 devices (the cost model's ring estimate)."""
    from graphdist.runtime import timeline

    x, y = _digits()
    tp = _train(gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(_mesh())), [64, 32, 32, 10], x, y,
                steps=1)
    concrete = tp[2]
    predicted = {n.attrs["group_key"]: (n.inputs[0].nbytes, n.meta["bytes_per_device"])
                 for n in concrete.graph("rewritten").nodes if n.op_type == "AllReduce"}
    with timeline.record() as steps:
        concrete(x[:16], y[:16])
    measured = {e.name: e.args["bytes"] for e in steps[0] if e.cat == "collective"}
    assert measured == {key: payload for key, (payload, _) in predicted.items()} == {next(iter(predicted)): 16 * 32 * 4}
    assert [sent for _, sent in predicted.values()] == [16 * 32 * 4]  # 2 (2 - 1) / 2 of the payload


def test_megatron_784_1024_1024_10_equals_one_device_at_half_the_bytes_per_device() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int64)
    sizes = [784, 1024, 1024, 10]
    one = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, batch=32)
    tp = _train(gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(_mesh())), sizes, x, y, batch=32)
    _assert_same_training(one, tp, rtol=1e-4, atol=1e-5)
    # Parameters and Adam slots: the split ones (w1, b1, w2 and their m, v) are stored as one block per device.
    whole = variable_bytes_per_device(one[2].graph("rewritten"))
    per_device = variable_bytes_per_device(tp[2].graph("rewritten"))
    split = 784 * 1024 + 1024 + 1024 * 1024
    replicated = 1024 + 1024 * 10 + 10
    assert whole == 3 * 4 * (split + replicated) + 8  # three copies (weights, m, v) in float32, plus the counter
    assert per_device == 3 * 4 * (split // 2 + replicated) + 8
    assert 0.50 < per_device / whole < 0.51
    stored = _stored_bytes_per_device(tp[2].variables, devices=2)
    assert stored == [per_device, per_device]  # what the variables really hold, part by part


def _stored_bytes_per_device(variables: list, devices: int) -> list[int]:
    """Bytes each device's share of ``variables`` holds: a part where stored in parts, else the whole value."""
    totals = [0] * devices
    for variable in variables:
        stored = variable.stored_value()
        for device in range(devices):
            totals[device] += stored[device].nbytes if isinstance(stored, tuple) else stored.nbytes
    return totals


def _train_on_dataset(strategy: gd.Strategy, make: object, x: np.ndarray, y: np.ndarray, batch: int = 16
                      ) -> tuple[list[float], list[np.ndarray], object]:
    """Adam steps of the model ``make()`` builds over ``x, y`` in global batches of ``batch`` (split over the
    replicas by ``experimental_distribute_dataset``)."""
    with strategy.scope():
        model = make()
        optimizer = gd.optimizers.Adam(0.01)
    replica_step = model.make_train_step(optimizer, global_batch_size=batch)

    @gd.function
    def step(xb: object, yb: object) -> np.ndarray:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

    dataset = strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensor_slices((x, y)).batch(batch))
    losses = []
    for xb, yb in dataset:
        losses.append(float(step(xb, yb)))
    values = [v.numpy() for v in model.trainable_variables] + [v.numpy() for v in optimizer.variables()]
    return losses, values, step.get_concrete_function(xb, yb)


def test_mlp_on_mesh_2x2_batch_and_model_equals_one_device() -> None:
    from graphdist.models.mlp import MLP

    x, y = _digits()
    mesh = _mesh((2, 2))
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["dense_0/kernel"] = (None, "model")
    layout_map["dense_0/bias"] = ("model",)
    layout_map["dense_1/kernel"] = ("model", None)

    def make() -> object:
        return MLP([64, 32, 10], trainable=True, seed=0)

    one = _train_on_dataset(gd.OneDeviceStrategy("cpu:0"), make, x, y)
    tp = _train_on_dataset(gd.experimental.ModelParallelStrategy(layout_map=layout_map), make, x, y)
    _assert_same_training(one, tp)
    # Each device sums its gradient blocks with the device of the other batch group that holds the same block.
    gradient_sums = {k: n for k, n in _collectives(tp[2], "AllReduce").items() if "/d" in k}
    assert gradient_sums and all(len(names) == 2 for names in gradient_sums.values())


def test_transformer_block_heads_split_on_mesh_2x2_equals_one_device() -> None:
    from graphdist.models.transformer import TransformerBlock

    ids, labels = TransformerBlock.example_data(n=64)
    layout_map = TransformerBlock.get_layout_map(_mesh((2, 2)))  # heads and MLP units split over "model"

    def make() -> object:
        return TransformerBlock(num_heads=4)

    one = _train_on_dataset(gd.OneDeviceStrategy("cpu:0"), make, ids, labels)
    tp = _train_on_dataset(gd.experimental.ModelParallelStrategy(layout_map=layout_map), make, ids, labels)
    _assert_same_training(one, tp, rtol=1e-4, atol=1e-5)
    layout_sums = [k for k in _collectives(tp[2], "AllReduce") if k.startswith("layout") and k.endswith("/r0")]
    forward = [k for k in layout_sums if ".grad_" not in k]
    assert len(forward) == 2  # the attention block's output projection and the MLP's second layer
    # Backward: the MLP block's input gradient (its residual added on one device only), and the attention
    # block's input gradient, summed only after the embeddings' gradients reduce it (two smaller sums).
    assert len(layout_sums) - len(forward) == 3
    assert not _collectives(tp[2], "AllGather")


def test_kernels_split_over_two_model_axes_on_mesh_1x2x2_equal_one_device() -> None:
    x, y = _digits()
    sizes = [64, 32, 32, 10]
    mesh = gd.experimental.DeviceMesh((1, 2, 2), ("batch", "model", "x"), [f"cpu:{i}" for i in range(4)])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["dense_0/kernel"] = ("x", "model")  # a 2-D block per device
    layout_map["dense_1/kernel"] = ("model", "x")
    layout_map["dense_2/kernel"] = ("x", None)
    one = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=3)
    tp = _train(gd.experimental.ModelParallelStrategy(layout_map=layout_map), sizes, x, y, steps=3)
    _assert_same_training(one, tp)
    assert [v.worker_shard.part_shape(3) for v in tp[2].variables[:1]] == [(32, 16)]


def _train_params(strategy: gd.Strategy, make: object, forward: object, x: np.ndarray, y: np.ndarray,
                  distribute: bool = False) -> tuple[list[float], list[np.ndarray], object]:
    """Adam steps on 16-row batches of ``forward(params, xb) -> logits`` over the params ``make()`` creates
    (``distribute``: the global batches split over the replicas by ``experimental_distribute_dataset``)."""
    with strategy.scope():
        params = make()
        optimizer = gd.optimizers.Adam(0.01)

    def replica_step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        with gd.GradientTape() as tape:
            per_example = gd.nn.sparse_softmax_cross_entropy(yb, forward(params, xb))
            loss = gd.nn.compute_average_loss(per_example, global_batch_size=16)
        optimizer.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss

    @gd.function
    def step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    if distribute:
        batches = list(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensor_slices((x, y)).batch(16)))
    losses = [float(step(xb, yb)) for xb, yb in batches]
    values = [v.numpy() for v in params] + [v.numpy() for v in optimizer.variables()]
    return losses, values, step.get_concrete_function(*batches[0])


def _layout_ops(concrete: object) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for node in concrete.graph("rewritten").nodes:
        counts[(node.op_type, node.device)] = counts.get((node.op_type, node.device), 0) + 1
    return counts


def test_imported_onnx_gemm_model_splits_by_initializer_names() -> None:
    from onnx import TensorProto, helper, numpy_helper

    x, y = _digits()
    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array((rng.standard_normal((32, 64)) * 0.1).astype(np.float32), "w1"),
                    numpy_helper.from_array(np.zeros(32, np.float32), "b1"),
                    numpy_helper.from_array((rng.standard_normal((10, 32)) * 0.1).astype(np.float32), "w2"),
                    numpy_helper.from_array(np.full(10, 0.1, np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [16, 10])], initializers)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def make() -> list:
        return gd.onnx.load(onnx_model).trainable_variables

    def forward(params: list, xb: object) -> object:  # the imported graph's own ops, written out
        return gd.nn.relu(xb @ params[0].T + params[1]) @ params[2].T + params[3]

    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["^w1$"] = ("model", None)  # Gemm transB=1: rows of w1 are the hidden units
    layout_map["^b1$"] = ("model",)
    layout_map["^w2$"] = (None, "model")
    strategy = gd.experimental.ModelParallelStrategy(layout_map=layout_map)
    losses, values, concrete = train_imported(strategy, onnx_model, x[:64], y[:64])
    one = _train_params(gd.OneDeviceStrategy("cpu:0"), make, forward, x, y)
    np.testing.assert_allclose(losses, one[0], rtol=1e-5)
    for got, want in zip(values[:4], one[1]):  # the four weights
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    counts = _layout_ops(concrete)
    assert counts[("Gemm", "cpu:0")] == counts[("Gemm", "cpu:1")] > 0  # Gemms on blocks, C added once
    assert counts[("AllReduce", "cpu:0")] == 1


def test_convolutions_split_by_output_then_input_channels_equal_one_device() -> None:
    x, y = _digits()
    images = x.reshape(-1, 1, 8, 8)

    def make() -> list:
        rng = np.random.default_rng(0)
        shapes = [("conv1/kernel", (8, 1, 3, 3), 0.3), ("conv1/bias", (8,), 0.0), ("conv2/kernel", (8, 8, 3, 3), 0.1),
                  ("conv2/bias", (8,), 0.0), ("dense/kernel", (8 * 64, 10), 0.05)]
        return [gd.Variable((rng.standard_normal(shape) * scale + (0.1 if name == "conv2/bias" else 0.0))
                            .astype(np.float32), name=name) for name, shape, scale in shapes]

    def forward(params: list, xb: object) -> object:
        h = gd.nn.relu(gd.nn.conv2d(xb, params[0], params[1], padding="SAME", data_format="NCHW"))
        h = gd.nn.relu(gd.nn.conv2d(h, params[2], params[3], padding="SAME", data_format="NCHW"))
        return h.reshape(16, 8 * 64) @ params[4]

    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["conv1/kernel"] = ("model", None, None, None)  # output channels
    layout_map["conv1/bias"] = ("model",)
    layout_map["conv2/kernel"] = (None, "model", None, None)  # input channels: a partial sum, bias added once
    one = _train_params(gd.OneDeviceStrategy("cpu:0"), make, forward, images, y)
    tp = _train_params(gd.experimental.ModelParallelStrategy(layout_map=layout_map), make, forward, images, y)
    _assert_same_training(one, tp, rtol=1e-4, atol=1e-5)
    counts = _layout_ops(tp[2])
    assert counts[("Conv", "cpu:1")] == 2 and counts[("ConvTranspose", "cpu:1")] == 1
    assert counts[("AllReduce", "cpu:0")] == 1  # the second convolution's sum, in the forward pass


def test_sharding_constraints_keep_the_numbers_and_are_identity_elsewhere() -> None:
    x, y = _digits()
    sizes = [64, 32, 32, 10]
    one = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=2, constrain=True)
    tp = _train(gd.experimental.ModelParallelStrategy(device_mesh=_mesh()), sizes, x, y, steps=2, constrain=True)
    _assert_same_training(one, tp)
    assert not any(n.op_type == "ShardingConstraint" for n in one[2].graph("traced").nodes)
    assert any(n.op_type == "ShardingConstraint" for n in tp[2].graph("traced").nodes)
    # Re-planned for a strategy without layouts, a pin is the identity (written to ONNX as a tagged Identity).
    replanned = tp[2].replan(gd.OneDeviceStrategy("cpu:0"))
    later = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=3, constrain=True)
    np.testing.assert_allclose(float(replanned(x[32:48], y[32:48])), later[0][2], rtol=1e-5)
    # Every weight replicated, the first hidden activation pinned split by columns: the second MatMul
    # contracts over that split (its replicated weight sliced by rows), so its product is summed, not gathered.
    assert _collectives(tp[2], "AllReduce") and not _collectives(tp[2], "AllGather")


def test_a_one_device_step_replans_onto_a_mesh_and_trains_the_same() -> None:
    """A stored traced step has no gd.Variables to match: the LayoutMap's patterns are matched by name. (The
    step takes plain arrays, so it is re-planned onto one batch group: mesh (1, 2).)"""
    x, y = _digits()
    sizes = [64, 32, 32, 10]
    once = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=1)
    twice = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=3)
    plan = once[2].replan(gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(_mesh())))
    for step in (1, 2):
        plan(x[step * 16:(step + 1) * 16], y[step * 16:(step + 1) * 16])
    rewritten = plan.graph("rewritten")
    assert any(n.op_type == "AllReduce" and n.attrs["group_key"].startswith("layout") for n in rewritten.nodes)
    for got, want in zip(plan.variables.values(), twice[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 2), (2, 2)])
def test_keras_fit_under_model_parallel_equals_one_device(shape: tuple[int, int]) -> None:
    x, y = _digits()

    def fit(strategy: gd.Strategy) -> tuple[list[float], list[np.ndarray], list]:
        with strategy.scope():
            model = gd.keras.Sequential([
                gd.keras.layers.Dense(32, activation="relu", input_shape=(64,), name="up"),
                gd.keras.layers.Dense(16, activation="relu", name="down"),
                gd.keras.layers.Dense(10, activation="softmax", name="classes")])
            model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
        rng = np.random.default_rng(0)
        for variable in model.trainable_variables:
            variable.assign((rng.standard_normal(variable.shape) * 0.1).astype(np.float32))
        history = model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
        return history.history["loss"], [v.numpy() for v in model.trainable_variables], model.trainable_variables

    layout_map = gd.experimental.LayoutMap(_mesh(shape))
    layout_map["up/kernel"] = (None, "model")
    layout_map["up/bias"] = ("model",)
    layout_map["down/kernel"] = ("model", None)
    one = fit(gd.OneDeviceStrategy("cpu:0"))
    tp = fit(gd.experimental.ModelParallelStrategy(layout_map=layout_map))
    np.testing.assert_allclose(tp[0], one[0], rtol=1e-5)
    for got, want in zip(tp[1], one[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert tp[2][0].worker_shard is not None and tp[2][0].worker_shard.blocks is not None  # stored in blocks


def test_summary_export_and_checkpoint_of_a_split_step(tmp_path: object) -> None:
    x, y = _digits()
    sizes = [64, 32, 32, 10]
    tp = _train(gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(_mesh())), sizes, x, y, steps=2)
    concrete = tp[2]
    summary = concrete.graph("rewritten").summary()
    assert "layouts over the mesh batch=1 x model=2" in summary
    assert "%dense_0/kernel" in summary and "[-, model]" in summary and "partial(model)" in summary
    assert "graphdist.AllReduce" in summary and "in 2 parts" in summary
    # An exported plan stores each variable whole (its devices slice their blocks) and trains on.
    loaded = gd.load_plan(concrete.plan.export(str(tmp_path / "plan")))
    after_export = float(loaded(x[32:48], y[32:48]))
    more = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=3)
    np.testing.assert_allclose(after_export, more[0][2], rtol=1e-5)
    # A checkpoint of blocks-stored variables restores under OneDevice whole.
    variables = concrete.variables
    path = gd.train.Checkpoint(**{f"v{i}": v for i, v in enumerate(variables)}).save(str(tmp_path / "ckpt"))
    with gd.OneDeviceStrategy("cpu:0").scope():
        fresh = [gd.Variable(np.zeros(v.shape, v.dtype), name=v._name) for v in variables]
    gd.train.Checkpoint(**{f"v{i}": v for i, v in enumerate(fresh)}).restore(path)
    assert any(v.worker_shard is not None for v in variables)
    for got, want in zip(fresh, variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


# -------------------------------------------------------------------- errors
def test_mesh_needing_more_devices_than_given() -> None:
    with pytest.raises(InvalidArgumentError, match=r"needs 4 devices, devices lists 3"):
        gd.experimental.DeviceMesh((2, 2), ("batch", "model"), ["cpu:0", "cpu:1", "cpu:2"])


def test_unknown_axis_name() -> None:
    layout_map = gd.experimental.LayoutMap(_mesh())
    with pytest.raises(InvalidArgumentError, match=r"unknown mesh axis 'modle'.*batch, model"):
        layout_map["dense.*kernel"] = (None, "modle")
    with pytest.raises(InvalidArgumentError, match=r"batch_dim_name 'data' is not an axis"):
        gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="data")


def test_layout_rank_differs_from_the_variable() -> None:
    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["dense.*kernel"] = ("model",)
    strategy = gd.experimental.ModelParallelStrategy(layout_map=layout_map)
    with strategy.scope(), pytest.raises(InvalidArgumentError, match=r"'dense/kernel' has rank 2.*1 entries"):
        gd.Variable(np.zeros((4, 6), np.float32), name="dense/kernel")


def test_axis_that_does_not_divide_a_dimension_names_variable_and_dimension() -> None:
    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["dense.*kernel"] = (None, "model")
    strategy = gd.experimental.ModelParallelStrategy(layout_map=layout_map)
    with strategy.scope(), pytest.raises(InvalidArgumentError,
                                         match=r"'dense/kernel': dimension 1 \(size 5\) is not divisible by mesh "
                                               r"axis 'model' \(size 2\)"):
        gd.Variable(np.zeros((4, 5), np.float32), name="dense/kernel")


def test_pattern_matching_no_variable_warns(caplog: pytest.LogCaptureFixture) -> None:
    layout_map = _megatron_map(_mesh())
    layout_map["conv.*kernel"] = (None, None, None, "model")
    x, y = _digits(16)
    with caplog.at_level(logging.WARNING, logger="graphdist.distribute.model_parallel"):
        _train(gd.experimental.ModelParallelStrategy(layout_map=layout_map), [64, 32, 32, 10], x, y, steps=1)
    warnings = [r.getMessage() for r in caplog.records if "matches none" in r.getMessage()]
    assert len(warnings) == 1 and "'conv.*kernel'" in warnings[0]


def test_sharding_constraint_rank_must_match() -> None:
    strategy = gd.experimental.ModelParallelStrategy(device_mesh=_mesh())
    with strategy.scope(), pytest.raises(InvalidArgumentError, match=r"has 1 entries but the value has rank 2"):
        gd.experimental.with_sharding_constraint(np.zeros((4, 6), np.float32), ("model",))


def test_two_patterns_matching_one_variable() -> None:
    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["dense"] = (None, "model")
    layout_map["kernel"] = ("model", None)
    with pytest.raises(InvalidArgumentError, match="matches several LayoutMap patterns"):
        layout_map["dense/kernel"]


def test_op_determinism_is_refused_and_gradient_accumulation_works() -> None:
    x, y = _digits()
    sizes = [64, 32, 32, 10]
    strategy = gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(_mesh()))
    gd.config.experimental.enable_op_determinism()
    try:
        with pytest.raises(NotImplementedError, match="partial sums in another order"):
            _train(strategy, sizes, x, y, steps=1)
    finally:
        gd.config.experimental.disable_op_determinism()
    one = _train(gd.OneDeviceStrategy("cpu:0"), sizes, x, y, steps=2)
    accumulated = _train_accumulated(gd.experimental.ModelParallelStrategy(layout_map=_megatron_map(_mesh())),
                                     sizes, x, y)
    for got, want in zip(accumulated, one[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _train_accumulated(strategy: gd.Strategy, sizes: list[int], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """As :func:`_train` (2 steps), each step's batch cut into 2 micro-batches (``accumulate_steps=2``)."""
    rng = np.random.default_rng(0)
    with strategy.scope():
        params = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            params.append(gd.Variable((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32),
                                      name=f"dense_{i}/kernel"))
            params.append(gd.Variable(rng.standard_normal(fan_out).astype(np.float32) * 0.1, name=f"dense_{i}/bias"))
        optimizer = gd.optimizers.Adam(0.01)

    def replica_step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        with gd.GradientTape() as tape:
            h = xb
            for layer in range(len(sizes) - 1):
                h = h @ params[2 * layer] + params[2 * layer + 1]
                h = gd.nn.relu(h) if layer < len(sizes) - 2 else h
            loss = gd.nn.compute_average_loss(gd.nn.sparse_softmax_cross_entropy(yb, h), global_batch_size=16)
        optimizer.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss

    def step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

    step = gd.function(step, accumulate_steps=2)
    for s in range(2):
        step(x[16 * s:16 * (s + 1)], y[16 * s:16 * (s + 1)])
    return [p.numpy() for p in params] + [v.numpy() for v in optimizer.variables()]
