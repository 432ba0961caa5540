"""Layout rules for grouped convolutions, ``Slice`` and ``Pad`` end to end: a depthwise-separable conv block, a
cropped and a padded split activation train under ModelParallelStrategy on mesh (1, 2) as OneDevice does, the
split kept through those ops (no gather before them in the forward pass)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from tests.distribute.digits_training import train_imported
from tests.distribute.test_model_parallel import _assert_same_training, _digits, _mesh, _train_params

CHANNELS = 8


def _conv(h: object, kernel: object, bias: object, groups: int = 1, padding: str = "SAME") -> object:
    return gd.nn.relu(gd.nn.conv2d(h, kernel, bias, padding=padding, data_format="NCHW", groups=groups))


def _variables(shapes: list[tuple[str, tuple[int, ...], float]]) -> list:
    rng = np.random.default_rng(0)
    return [gd.Variable((rng.standard_normal(shape) * scale + (0.1 if name.endswith("bias") else 0.0))
                        .astype(np.float32), name=name) for name, shape, scale in shapes]


def _forward_ops(concrete: object, op_type: str) -> list:
    return [n for n in concrete.graph("rewritten").nodes if n.op_type == op_type and not n.name.startswith("grad")]


def _layout_sums(concrete: object, device: str = "cpu:0") -> int:
    """All-reduces the layouts made on ``device`` (not the gradients' between batch groups)."""
    return sum(1 for n in concrete.graph("rewritten").nodes if n.op_type == "AllReduce" and n.device == device
               and n.attrs["group_key"].startswith("layout"))


def _fed_by_a_gather(node: object) -> bool:
    producer = node.inputs[0].producer
    return producer is not None and producer.op_type == "AllGather"


@pytest.mark.parametrize("shape", [(1, 2), (2, 2)])
def test_depthwise_separable_block_splits_whole_groups_and_equals_one_device(shape: tuple[int, int]) -> None:
    """conv 1 -> 8 channels (split by output channels), depthwise 3x3 (8 groups, split: 4 per device), pointwise
    1x1 (input channels split: a partial sum, its bias added once), dense; on mesh (2, 2) each of the two batch
    groups splits its half of the batch so."""
    x, y = _digits()
    images = x.reshape(-1, 1, 8, 8)

    def make() -> list:
        return _variables([("conv/kernel", (CHANNELS, 1, 3, 3), 0.3), ("conv/bias", (CHANNELS,), 0.1),
                           ("depthwise/kernel", (CHANNELS, 1, 3, 3), 0.3), ("depthwise/bias", (CHANNELS,), 0.1),
                           ("pointwise/kernel", (CHANNELS, CHANNELS, 1, 1), 0.3), ("pointwise/bias", (CHANNELS,), 0.1),
                           ("dense/kernel", (CHANNELS * 64, 10), 0.05)])

    def forward(params: list, xb: object) -> object:
        h = _conv(xb, params[0], params[1])
        h = _conv(h, params[2], params[3], groups=CHANNELS)
        h = _conv(h, params[4], params[5])
        return h.reshape(-1, CHANNELS * 64) @ params[6]

    layout_map = gd.experimental.LayoutMap(_mesh(shape))
    layout_map["conv/kernel"] = ("model", None, None, None)
    layout_map["conv/bias"] = ("model",)
    layout_map["depthwise/kernel"] = ("model", None, None, None)
    layout_map["depthwise/bias"] = ("model",)
    layout_map["pointwise/kernel"] = (None, "model", None, None)
    one = _train_params(gd.OneDeviceStrategy("cpu:0"), make, forward, images, y, distribute=True)
    tp = _train_params(gd.experimental.ModelParallelStrategy(layout_map=layout_map), make, forward, images, y,
                       distribute=True)
    _assert_same_training(one, tp, rtol=1e-4, atol=1e-5)
    depthwise = [n for n in _forward_ops(tp[2], "Conv") if int(n.attrs.get("group", 1)) > 1]
    devices = [f"cpu:{i}" for i in range(shape[0] * shape[1])]
    assert sorted((n.device, n.attrs["group"], n.inputs[0].shape[1]) for n in depthwise) == [
        (device, CHANNELS // 2, CHANNELS // 2) for device in devices]
    assert not any(_fed_by_a_gather(n) for n in depthwise)
    assert _layout_sums(tp[2]) == 1  # the pointwise conv's sum, in the forward pass


def test_cropped_split_activation_stays_split_and_equals_one_device() -> None:
    """conv (split by output channels) -> crop the image to its centre 6x6 (x[:, :, 1:7, 1:7]: a Slice of the
    spatial dimensions) -> conv (input channels split: a partial sum) -> dense."""
    x, y = _digits()
    images = x.reshape(-1, 1, 8, 8)

    def make() -> list:
        return _variables([("conv1/kernel", (CHANNELS, 1, 3, 3), 0.3), ("conv1/bias", (CHANNELS,), 0.1),
                           ("conv2/kernel", (4, CHANNELS, 3, 3), 0.1), ("dense/kernel", (4 * 16, 10), 0.05)])

    def forward(params: list, xb: object) -> object:
        h = _conv(xb, params[0], params[1])[:, :, 1:7, 1:7]
        h = gd.nn.relu(gd.nn.conv2d(h, params[2], padding="VALID", data_format="NCHW"))
        return h.reshape(16, 4 * 16) @ params[3]

    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["conv1/kernel"] = ("model", None, None, None)
    layout_map["conv1/bias"] = ("model",)
    layout_map["conv2/kernel"] = (None, "model", None, None)
    one = _train_params(gd.OneDeviceStrategy("cpu:0"), make, forward, images, y)
    tp = _train_params(gd.experimental.ModelParallelStrategy(layout_map=layout_map), make, forward, images, y)
    _assert_same_training(one, tp, rtol=1e-4, atol=1e-5)
    crops = [n for n in _forward_ops(tp[2], "Slice") if n.inputs[0].producer.op_type == "Relu"]
    assert sorted((n.device, tuple(n.outputs[0].shape)) for n in crops) == [
        ("cpu:0", (16, CHANNELS // 2, 6, 6)), ("cpu:1", (16, CHANNELS // 2, 6, 6))]
    assert _layout_sums(tp[2]) == 1  # the second conv's sum, in the forward pass


def _padded_model() -> object:
    """An ONNX model: conv 1 -> 8 (3x3, no padding: 6x6), Relu, Pad the image back to 8x8 with zeros, conv 8 -> 4
    (3x3, no padding), Relu, Flatten, Gemm to 10 logits."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    arrays = {"k1": rng.standard_normal((CHANNELS, 1, 3, 3)) * 0.3, "b1": np.full(CHANNELS, 0.1),
              "k2": rng.standard_normal((4, CHANNELS, 3, 3)) * 0.1, "w": rng.standard_normal((4 * 36, 10)) * 0.05}
    initializers = [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items()]
    initializers.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"))
    nodes = [helper.make_node("Conv", ["x", "k1", "b1"], ["c1"], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Pad", ["r1", "pads"], ["p1"], mode="constant"),
             helper.make_node("Conv", ["p1", "k2"], ["c2"], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "padded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [16, 10])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_padded_split_activation_of_an_imported_model_stays_split_and_equals_one_device() -> None:
    x, y = _digits()
    images = x.reshape(-1, 1, 8, 8)
    onnx_model = _padded_model()
    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["^k1$"] = ("model", None, None, None)  # output channels
    layout_map["^b1$"] = ("model",)
    layout_map["^k2$"] = (None, "model", None, None)  # input channels: a partial sum
    one = train_imported(gd.OneDeviceStrategy("cpu:0"), onnx_model, images, y)
    tp = train_imported(gd.experimental.ModelParallelStrategy(layout_map=layout_map), onnx_model, images, y)
    _assert_same_training(one, tp, rtol=1e-4, atol=1e-5)
    pads = [n for n in _forward_ops(tp[2], "Pad") if n.inputs[0].producer.op_type == "Relu"]
    assert sorted((n.device, tuple(n.outputs[0].shape)) for n in pads) == [
        ("cpu:0", (16, CHANNELS // 2, 8, 8)), ("cpu:1", (16, CHANNELS // 2, 8, 8))]
    assert _layout_sums(tp[2]) == 1  # the second conv's sum, in the forward pass
