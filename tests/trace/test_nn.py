"""gd.nn (graphdist.trace.nn): traced vs eager vs independent numpy references.

Every case is traced, verified (``gd.verify``, ``onnx.checker`` full check),
run on ONNX Runtime and the reference backend and compared with the eager
(numpy) result of the same call (``check`` from test_numpy_ops), and the eager
result is compared with a straightforward reference written here (loops for
convolution and pooling).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphdist as gd
from graphdist.backends import get_backend
from graphdist.errors import AxisError, GraphError, InvalidArgumentError, TracingError
from graphdist.ir import Graph, to_onnx
from graphdist.runtime.devices import parse_device
from graphdist.trace import nn
from tests.trace.test_numpy_ops import check, run_graph

RNG = np.random.default_rng(2024)
DTYPES = (np.float32, np.float64)


def normal(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def tol(dtype) -> float:
    return 1e-4 if dtype == np.float32 else 1e-10


def check_nn(fn, args: tuple, expected, rtol: float = 1e-5) -> gd.Graph:
    """Traced == eager on both backends (``check``), and eager == ``expected``."""
    graph = check(fn, *args, rtol=rtol)
    eager = fn(*args)
    for got, want in zip(eager if isinstance(eager, tuple) else (eager,),
                         expected if isinstance(expected, tuple) else (expected,)):
        got, want = np.asarray(got), np.asarray(want)
        assert got.dtype == want.dtype, f"eager dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    return graph


def op_types(graph: gd.Graph) -> set[str]:
    return {node.op_type for node in graph.nodes}


# ---------------------------------------------------------------- references
def ref_gelu(x: np.ndarray) -> np.ndarray:
    flat = [0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.astype(np.float64).ravel()]
    return np.asarray(flat).reshape(x.shape).astype(x.dtype)


def ref_gelu_tanh(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    return (0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))).astype(x.dtype)


def ref_softmax(x: np.ndarray, axis) -> np.ndarray:
    v = x.astype(np.float64)
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def ref_cross_entropy(labels: np.ndarray, logits: np.ndarray) -> np.ndarray:
    flat_logits = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    losses = []
    for row, label in zip(flat_logits, labels.ravel()):
        top = row.max()
        losses.append(top + math.log(sum(math.exp(v - top) for v in row)) - row[label])
    return np.asarray(losses).reshape(labels.shape).astype(logits.dtype)


def same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def ref_conv_nhwc(x, w, b, stride, pads, dilation, groups) -> np.ndarray:
    """Direct loops: x (N,H,W,C), w (KH,KW,C/groups,Cout), pads (top, bottom, left, right)."""
    n, h, wd, _ = x.shape
    kh, kw, per_group, cout = w.shape
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = stride, dilation, pads
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    xs, ws = x.astype(np.float64), w.astype(np.float64)
    out = np.zeros((n, oh, ow, cout))
    for o in range(cout):
        group = o // (cout // groups)
        channels = slice(group * per_group, (group + 1) * per_group)
        for i in range(oh):
            for j in range(ow):
                total = np.zeros(n)
                for a in range(kh):
                    for c in range(kw):
                        row, col = i * sh + a * dh - pt, j * sw + c * dw - pl
                        if 0 <= row < h and 0 <= col < wd:
                            total += xs[:, row, col, channels] @ ws[a, c, :, o]
                out[:, i, j, o] = total + (0.0 if b is None else b[o])
    return out.astype(x.dtype)


def ref_pool_nhwc(x, kernel, stride, pads, kind) -> np.ndarray:
    """Loops over windows clipped to the image (padding never counts)."""
    n, h, wd, ch = x.shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = kernel, stride, pads
    oh, ow = (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1
    out = np.zeros((n, oh, ow, ch))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * sh - pt, j * sw - pl
            window = x[:, max(r0, 0): min(r0 + kh, h), max(c0, 0): min(c0 + kw, wd), :].astype(np.float64)
            out[:, i, j, :] = window.max(axis=(1, 2)) if kind == "max" else window.mean(axis=(1, 2))
    return out.astype(x.dtype)


# --------------------------------------------------------------- activations
ACT_X = np.concatenate([normal(3, 7), np.array([[-100.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 100.0]], np.float32)])


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_activations(dtype) -> None:
    x = ACT_X.astype(dtype)
    graph = check_nn(
        lambda x: (nn.relu(x), nn.gelu(x), nn.gelu(x, approximate=True), nn.sigmoid(x), nn.tanh(x)),
        (x,),
        (np.maximum(x, 0), ref_gelu(x), ref_gelu_tanh(x),
         (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(dtype), np.tanh(x)),
    )
    assert {"Relu", "Sigmoid", "Tanh"} <= op_types(graph)
    # ONNX Runtime's CPU provider has no float64 Erf: float64 gelu uses an elementwise erf.
    assert ("Erf" in op_types(graph)) == (dtype == np.float32)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gelu(v) / v at v = 0 and v = inf
def test_float64_erf_composite_matches_math_erf() -> None:
    x = np.concatenate([np.linspace(-8.0, 8.0, 4001), [2.5, -2.5, 30.0, -1e-300, 0.0, np.inf, -np.inf]])
    expected = np.array([math.erf(v) for v in x])
    graph = gd.trace(lambda v: nn.gelu(v) / (0.5 * v) - 1.0, x)  # = erf(v / sqrt(2)) where v != 0
    assert "Erf" not in op_types(graph)
    for backend in ("ort", "reference"):
        got = run_graph(graph, (x * math.sqrt(2.0),), backend)
        finite = (x != 0) & np.isfinite(x)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=0, atol=1e-14)


def test_activations_of_integers_are_floats_as_in_numpy() -> None:
    ints = np.array([[-3, 0, 2]], np.int32)
    graph = check_nn(lambda x: (nn.sigmoid(x), nn.tanh(x), nn.relu(x), nn.softmax(x)), (ints,),
                     (1.0 / (1.0 + np.exp(-ints.astype(np.float64))), np.tanh(ints), np.maximum(ints, 0),
                      ref_softmax(ints.astype(np.float64), -1)))
    assert [v.dtype for v in graph.outputs] == [np.float64, np.float64, np.int32, np.float64]


def test_sigmoid_is_stable_eagerly() -> None:
    with np.errstate(over="raise"):
        out = nn.sigmoid(np.array([-1000.0, 1000.0], np.float32))
    np.testing.assert_array_equal(out, [0.0, 1.0])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("axis", [-1, 0, 1, (0, 2)], ids=str)
def test_softmax_and_log_softmax(dtype, axis) -> None:
    x = (normal(2, 3, 4) * 30).astype(dtype)  # large spread: needs the max shift
    v = x.astype(np.float64)
    shifted = v - v.max(axis=axis, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    graph = check_nn(lambda x: (nn.softmax(x, axis), nn.log_softmax(x, axis)), (x,),
                     (ref_softmax(x, axis), log_probs.astype(dtype)), rtol=1e-4 if dtype == np.float32 else 1e-10)
    assert op_types(graph) <= {"ReduceMax", "StopGradient", "Sub", "Exp", "ReduceSum", "Div", "Log"}


def test_softmax_bad_axis() -> None:
    with pytest.raises(AxisError, match=r"softmax axis 2 is out of range.*-2\.\.1"):
        nn.softmax(np.zeros((2, 3)), axis=2)
    with pytest.raises(AxisError, match="log_softmax axis"):
        gd.trace(lambda x: nn.log_softmax(x, axis=-3), np.zeros((2, 3), np.float32))


# -------------------------------------------------------------------- losses
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("label_dtype", [np.int32, np.int64], ids=lambda d: np.dtype(d).name)
def test_sparse_softmax_cross_entropy(dtype, label_dtype) -> None:
    logits = (normal(4, 3, 5) * 10).astype(dtype)
    labels = RNG.integers(0, 5, (4, 3)).astype(label_dtype)
    graph = check_nn(nn.sparse_softmax_cross_entropy, (labels, logits), ref_cross_entropy(labels, logits),
                     rtol=1e-4)
    assert graph.outputs[0].shape == (4, 3)
    allowed = {"Equal", "Cast", "Mul", "ReduceSum", "Sub", "Exp", "Log", "ReduceMax", "Neg", "Unsqueeze",
               "StopGradient"}
    assert op_types(graph) <= allowed, op_types(graph) - allowed


def test_cross_entropy_with_symbolic_batch() -> None:
    graph = gd.trace(nn.sparse_softmax_cross_entropy, gd.TensorSpec((None,), np.int64),
                     gd.TensorSpec((None, 4), np.float32))
    labels, logits = np.array([3, 0, 1], np.int64), normal(3, 4)
    out = run_graph(graph, (labels, logits), "ort")
    np.testing.assert_allclose(out, ref_cross_entropy(labels, logits), rtol=1e-5)


def test_cross_entropy_label_range() -> None:
    logits = normal(2, 5)
    with pytest.raises(InvalidArgumentError, match=r"labels must be in \[0, 5\).*got values from 0 to 5"):
        nn.sparse_softmax_cross_entropy(np.array([0, 5]), logits)
    with pytest.raises(InvalidArgumentError, match=r"\[0, 5\)"):
        nn.sparse_softmax_cross_entropy(np.array([-1, 2]), logits)
    # Traced labels are not checked at run time: an out-of-range label matches no class, loss 0.
    graph = gd.trace(nn.sparse_softmax_cross_entropy, np.array([1, 7], np.int32), logits)
    for backend in ("ort", "reference"):
        out = run_graph(graph, (np.array([1, 7], np.int32), logits), backend)
        np.testing.assert_allclose(out, [ref_cross_entropy(np.array([1]), logits[:1])[0], 0.0], rtol=1e-5)


def test_cross_entropy_bad_arguments() -> None:
    logits = normal(2, 5)
    with pytest.raises(InvalidArgumentError, match="labels must be integer class indices.*float32"):
        nn.sparse_softmax_cross_entropy(np.zeros(2, np.float32), logits)
    with pytest.raises(InvalidArgumentError, match=r"labels of shape \(3,\).*logits have shape \(2, 5\)"):
        nn.sparse_softmax_cross_entropy(np.zeros(3, np.int64), logits)
    with pytest.raises(InvalidArgumentError, match=r"labels of shape \(2, 5\)"):
        gd.trace(nn.sparse_softmax_cross_entropy, np.zeros((2, 5), np.int64), logits)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_compute_average_loss(dtype) -> None:
    loss = np.abs(normal(6, 2, dtype=dtype))
    check_nn(lambda v: nn.compute_average_loss(v, global_batch_size=24), (loss,), dtype(loss.sum() / 24))
    # Default strategy: one replica, global batch = the loss's batch (6 examples).
    check_nn(nn.compute_average_loss, (loss,), dtype(loss.sum() / 6))
    graph = gd.trace(nn.compute_average_loss, gd.TensorSpec((None, 2), dtype))
    np.testing.assert_allclose(run_graph(graph, (loss,), "ort"), loss.sum() / 6, rtol=1e-6)
    assert np.asarray(nn.compute_average_loss(np.zeros((0,), dtype))) == 0


def test_compute_average_loss_uses_replica_count(monkeypatch) -> None:
    from graphdist.trace import context

    class FourReplicas:
        num_replicas_in_sync = 4

    monkeypatch.setattr(context, "current_strategy", lambda: FourReplicas())
    loss = np.arange(1, 6, dtype=np.float32)
    assert nn.compute_average_loss(loss) == np.float32(15 / 20)
    graph = gd.trace(nn.compute_average_loss, gd.TensorSpec((None,), np.float32))
    np.testing.assert_allclose(run_graph(graph, (loss,), "ort"), 15 / 20, rtol=1e-6)
    graph = gd.trace(nn.compute_average_loss, loss)
    np.testing.assert_allclose(run_graph(graph, (loss,), "reference"), 15 / 20, rtol=1e-6)


def test_compute_average_loss_in_strategy_run() -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    loss = np.array([1.0, 2.0, 3.0, 6.0], np.float32)
    assert strategy.run(nn.compute_average_loss, args=(loss,)) == np.float32(3.0)
    with strategy.scope():
        with pytest.raises(InvalidArgumentError, match="cross-replica context.*strategy.run.*global_batch_size"):
            nn.compute_average_loss(loss)
        assert nn.compute_average_loss(loss, global_batch_size=8) == np.float32(1.5)


def test_compute_average_loss_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="rank >= 1"):
        nn.compute_average_loss(np.float32(2.0))
    with pytest.raises(InvalidArgumentError, match="floating point.*int64"):
        nn.compute_average_loss(np.arange(3))
    for bad in (0, -4, 2.5, True):
        with pytest.raises(InvalidArgumentError, match="global_batch_size"):
            nn.compute_average_loss(np.ones(3, np.float32), global_batch_size=bad)


# ------------------------------------------------------------------ conv2d
CONV_CASES = [
    # (x shape NHWC, w shape HWIO, stride, padding, dilation, groups, bias)
    pytest.param((2, 6, 7, 3), (3, 3, 3, 4), 1, "VALID", 1, 1, True, id="valid"),
    pytest.param((2, 6, 7, 3), (3, 3, 3, 4), 1, "SAME", 1, 1, False, id="same"),
    pytest.param((1, 7, 8, 2), (3, 2, 2, 3), (2, 3), "same", 1, 1, True, id="same-strided-odd"),
    pytest.param((2, 7, 7, 2), (3, 3, 2, 2), 1, "SAME", 2, 1, False, id="same-dilated"),
    pytest.param((1, 6, 6, 4), (2, 2, 2, 6), 2, 1, (1, 2), 2, True, id="int-pad-groups"),
    pytest.param((1, 5, 6, 3), (3, 3, 1, 3), 1, ((1, 0), (2, 1)), 1, 3, False, id="explicit-pads-depthwise"),
]


def _conv_pads(x_shape, w_shape, stride, padding, dilation):
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return (0, 0, 0, 0)
        return (*same_pads(x_shape[1], w_shape[0], sh, dh), *same_pads(x_shape[2], w_shape[1], sw, dw))
    if isinstance(padding, int):
        return (padding,) * 4
    (top, bottom), (left, right) = padding
    return (top, bottom, left, right)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding", "dilation", "groups", "bias"), CONV_CASES)
def test_conv2d(dtype, x_shape, w_shape, stride, padding, dilation, groups, bias) -> None:
    x, w = normal(*x_shape, dtype=dtype), normal(*w_shape, dtype=dtype)
    b = normal(w_shape[-1], dtype=dtype) if bias else None

    def pair(v):
        return (v, v) if isinstance(v, int) else tuple(v)

    pads = _conv_pads(x_shape, w_shape, stride, padding, dilation)
    expected = ref_conv_nhwc(x, w, b, pair(stride), pads, pair(dilation), groups)
    if isinstance(padding, str) and padding.upper() == "SAME":
        assert expected.shape[1:3] == tuple(math.ceil(s / t) for s, t in zip(x_shape[1:3], pair(stride)))

    def nhwc(x, w, b=None):
        return nn.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def nchw(x, w, b=None):
        return nn.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups,
                         data_format="NCHW")

    args = (x, w) + ((b,) if bias else ())
    graph = check_nn(nhwc, args, expected, rtol=tol(dtype))
    # float32 uses ONNX Conv; ONNX Runtime has no float64 Conv, so float64 uses the im2col composite.
    assert ("Conv" in op_types(graph)) == (dtype == np.float32)
    nchw_args = (x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)) + ((b,) if bias else ())
    check_nn(nchw, nchw_args, expected.transpose(0, 3, 1, 2), rtol=tol(dtype))


def test_conv2d_symbolic_batch_and_captured_weights() -> None:
    w = normal(3, 3, 2, 4)

    def fn(x):
        return nn.relu(nn.conv2d(x, w, padding="SAME"))

    graph = gd.trace(fn, gd.TensorSpec((None, 5, 5, 2), np.float32))
    gd.verify(graph)
    onnx.checker.check_model(to_onnx(graph), full_check=True)
    assert graph.outputs[0].shape[1:] == (5, 5, 4) and isinstance(graph.outputs[0].shape[0], str)
    assert [n.op_type for n in graph.nodes].count("Transpose") == 2  # the weights are transposed at trace time
    x = normal(3, 5, 5, 2)
    np.testing.assert_allclose(run_graph(graph, (x,), "ort"), fn(x), rtol=1e-4, atol=1e-5)
    graph64 = gd.trace(lambda x: nn.conv2d(x, w.astype(np.float64), stride=2),
                       gd.TensorSpec((None, 5, 5, 2), np.float64))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(run_graph(graph64, (x64,), "ort"), nn.conv2d(x64, w.astype(np.float64), stride=2),
                               rtol=1e-10)


def test_conv2d_promotes_like_numpy() -> None:
    x, w = normal(1, 4, 4, 1), normal(2, 2, 1, 1, dtype=np.float64)
    graph = check_nn(lambda x, w: nn.conv2d(x, w), (x, w),
                     ref_conv_nhwc(x.astype(np.float64), w, None, (1, 1), (0, 0, 0, 0), (1, 1), 1))
    assert graph.outputs[0].dtype == np.float64


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(padding="FULL"), InvalidArgumentError, r"padding must be 'VALID', 'SAME', an int.*'FULL'"),
    (dict(padding=-1), InvalidArgumentError, "padding must be >= 0"),
    (dict(data_format="NWHC"), InvalidArgumentError, "data_format must be 'NHWC'.*or 'NCHW'.*'NWHC'"),
    (dict(stride=0), InvalidArgumentError, "stride must be >= 1"),
    (dict(dilation=(1, 2, 3)), InvalidArgumentError, "dilation must be an int or a pair"),
    (dict(groups=2), InvalidArgumentError, r"3 input channels but w of shape \(3, 3, 3, 4\).*groups=2"),
    (dict(w=np.zeros((3, 3, 2, 4), np.float32)), InvalidArgumentError, "3 input channels.*w.shape\\[2\\]"),
    (dict(w=np.zeros((3, 3, 3), np.float32)), InvalidArgumentError, r"w must be a static 4-D filter \(KH, KW"),
    (dict(x=np.zeros((6, 7, 3), np.float32)), InvalidArgumentError, r"x must be a 4-D image batch \(N, H, W, C\)"),
    (dict(b=np.zeros(3, np.float32)), InvalidArgumentError, r"b must have shape \(4,\)"),
    (dict(w=np.zeros((9, 3, 3, 4), np.float32)), InvalidArgumentError, "window .* is larger than the input"),
])
def test_conv2d_bad_arguments(kwargs, error, match) -> None:
    args = dict(x=np.zeros((1, 6, 7, 3), np.float32), w=np.zeros((3, 3, 3, 4), np.float32))
    args.update(kwargs)
    with pytest.raises(error, match=match):
        nn.conv2d(**args)
    x = args.pop("x")
    with pytest.raises(error, match=match):  # the same message when traced
        gd.trace(lambda x: nn.conv2d(x, **args), x)


def test_conv2d_symbolic_spatial_dims_are_refused() -> None:
    with pytest.raises(TracingError, match="only the batch dimension may be symbolic"):
        gd.trace(lambda x: nn.conv2d(x, np.zeros((3, 3, 1, 1), np.float32)),
                 gd.TensorSpec((None, None, 5, 1), np.float32))


def test_conv2d_nchw_weight_layout_message() -> None:
    with pytest.raises(InvalidArgumentError, match=r"w.shape\[1\] must be C_in / groups.*'NCHW'"):
        nn.conv2d(np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 2, 3, 3), np.float32), data_format="nchw")


# ------------------------------------------------------------------- pools
POOL_CASES = [
    pytest.param(2, None, "VALID", id="2-valid"),
    pytest.param(3, 2, "SAME", id="3s2-same"),
    pytest.param((2, 3), (1, 2), "SAME", id="2x3-s1x2-same"),
    pytest.param(3, 1, "same", id="3s1-same"),
    pytest.param((3, 2), (2, 1), "VALID", id="3x2-valid"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize(("pool_size", "strides", "padding"), POOL_CASES)
def test_pools(dtype, kind, pool_size, strides, padding) -> None:
    x = normal(2, 5, 7, 3, dtype=dtype)
    kernel = (pool_size, pool_size) if isinstance(pool_size, int) else pool_size
    steps = kernel if strides is None else ((strides, strides) if isinstance(strides, int) else strides)
    pads = (0, 0, 0, 0) if padding == "VALID" else (*same_pads(5, kernel[0], steps[0]),
                                                   *same_pads(7, kernel[1], steps[1]))
    expected = ref_pool_nhwc(x, kernel, steps, pads, kind)
    pool = nn.max_pool2d if kind == "max" else nn.avg_pool2d
    graph = check_nn(lambda x: pool(x, pool_size, strides, padding), (x,), expected, rtol=tol(dtype))
    fused = "MaxPool" if kind == "max" else "AveragePool"
    assert (fused in op_types(graph)) == (kind == "max" or dtype == np.float32)
    check_nn(lambda x: pool(x, pool_size, strides, padding, data_format="NCHW"), (x.transpose(0, 3, 1, 2),),
             expected.transpose(0, 3, 1, 2), rtol=tol(dtype))


def test_pools_with_symbolic_batch() -> None:
    for pool in (nn.max_pool2d, nn.avg_pool2d):
        graph = gd.trace(lambda x, pool=pool: pool(x, 2, padding="SAME"), gd.TensorSpec((None, 3, 3, 2), np.float32))
        x = normal(4, 3, 3, 2)
        # An average near zero loses relative precision to the summation order ORT picks
        # on each CPU, so an absolute floor goes with the relative tolerance.
        np.testing.assert_allclose(run_graph(graph, (x,), "ort"), pool(x, 2, padding="SAME"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(padding=1), r"padding must be 'VALID' or 'SAME'; got 1"),
    (dict(padding="CAUSAL"), "padding must be 'VALID' or 'SAME'"),
    (dict(data_format="HWC"), "data_format must be"),
    (dict(pool_size=6), "window .* is larger than the input"),
    (dict(pool_size=0), "pool_size must be >= 1"),
    (dict(strides=(1, 1, 1)), "strides must be an int or a pair"),
])
def test_pool_bad_arguments(kwargs, match) -> None:
    args = dict(pool_size=2)
    args.update(kwargs)
    for pool in (nn.max_pool2d, nn.avg_pool2d):
        with pytest.raises(InvalidArgumentError, match=match):
            pool(np.zeros((1, 5, 5, 1), np.float32), **args)
        with pytest.raises(InvalidArgumentError, match=match):
            gd.trace(lambda x, pool=pool: pool(x, **args), np.zeros((1, 5, 5, 1), np.float32))
    pooled = nn.max_pool2d(np.arange(16, dtype=np.int32).reshape(1, 4, 4, 1), 2)  # integers become floats
    np.testing.assert_array_equal(pooled, np.array([[5.0, 7.0], [13.0, 15.0]]).reshape(1, 2, 2, 1))


# ---------------------------------------------------------- normalisation
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_batch_norm(dtype) -> None:
    x = normal(4, 3, dtype=dtype)
    mean, var = normal(3, dtype=dtype), np.abs(normal(3, dtype=dtype))
    beta, gamma = normal(3, dtype=dtype), normal(3, dtype=dtype)
    v = [a.astype(np.float64) for a in (x, mean, var, beta, gamma)]
    full = (v[0] - v[1]) / np.sqrt(v[2] + 1e-3) * v[4] + v[3]
    plain = (v[0] - v[1]) / np.sqrt(v[2] + 0.01)
    rtol = 1e-5 if dtype == np.float32 else 1e-10
    check_nn(lambda *a: nn.batch_norm(*a), (x, mean, var, beta, gamma), full.astype(dtype), rtol=rtol)
    check_nn(lambda x, m, s: nn.batch_norm(x, m, s, variance_epsilon=0.01), (x, mean, var), plain.astype(dtype),
             rtol=rtol)


def test_batch_norm_python_scalars_are_weak() -> None:
    x = normal(2, 3)
    graph = check_nn(lambda x: nn.batch_norm(x, 0.5, 4.0, 1.0, 2.0, variance_epsilon=0.0), (x,),
                     ((x - 0.5) / 2.0 * 2.0 + 1.0).astype(np.float32))
    assert graph.outputs[0].dtype == np.float32
    with pytest.raises(InvalidArgumentError, match="variance_epsilon must be a non-negative"):
        nn.batch_norm(x, 0.0, 1.0, variance_epsilon=-1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("axes", [0, (0, 1), [0, 1, 2], -1], ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_moments(dtype, axes, keepdims) -> None:
    x = normal(3, 4, 5, dtype=dtype)
    axis = tuple(axes) if isinstance(axes, list) else axes
    mean = x.astype(np.float64).mean(axis=axis, keepdims=keepdims)
    var = x.astype(np.float64).var(axis=axis, keepdims=keepdims)
    check_nn(lambda x: nn.moments(x, axes, keepdims=keepdims), (x,), (mean.astype(dtype), var.astype(dtype)),
             rtol=1e-5)


def test_moments_bad_axes() -> None:
    with pytest.raises(AxisError, match="moments axes 3 is out of range"):
        nn.moments(np.zeros((2, 3)), 3)
    with pytest.raises(AxisError, match="repeats an axis"):
        gd.trace(lambda x: nn.moments(x, (0, -2)), np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_layer_norm(dtype) -> None:
    x = (normal(2, 3, 6, dtype=dtype) * 5 + 2).astype(dtype)
    gamma, beta = normal(6, dtype=dtype), normal(6, dtype=dtype)
    v = x.astype(np.float64)
    normed = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    graph = check_nn(lambda x, g, b: nn.layer_norm(x, g, b), (x, gamma, beta),
                     (normed * gamma + beta).astype(dtype), rtol=rtol)
    assert "LayerNormalization" not in op_types(graph)
    v2 = (v - v.mean((1, 2), keepdims=True)) / np.sqrt(v.var((1, 2), keepdims=True) + 1e-3)
    check_nn(lambda x: nn.layer_norm(x, axis=(1, 2), epsilon=1e-3), (x,), v2.astype(dtype), rtol=rtol)


def test_layer_norm_bad_arguments() -> None:
    x = np.zeros((2, 6), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"gamma of shape \(5,\) does not broadcast to x of shape \(2, 6\)"):
        nn.layer_norm(x, np.ones(5, np.float32))
    with pytest.raises(InvalidArgumentError, match="beta of shape"):
        gd.trace(lambda x: nn.layer_norm(x, beta=np.ones((3, 6), np.float32)), x)
    with pytest.raises(AxisError, match="moments axes 2"):
        nn.layer_norm(x, axis=2)
    with pytest.raises(InvalidArgumentError, match="epsilon must be a non-negative"):
        nn.layer_norm(x, epsilon="small")


# ----------------------------------------------------------------- dropout
def _assert_dropout(out: np.ndarray, x: np.ndarray, rate: float, tolerance: float = 0.02) -> np.ndarray:
    kept = out != 0
    assert abs(kept.mean() - (1 - rate)) < tolerance, f"kept fraction {kept.mean()} for rate {rate}"
    np.testing.assert_allclose(out[kept], (x * np.asarray(1 / (1 - rate), x.dtype))[kept], rtol=1e-6)
    return kept


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dropout_eager(dtype) -> None:
    x = np.abs(normal(100, 200, dtype=dtype)) + 0.5
    out = nn.dropout(x, 0.3, seed=7)
    assert out.dtype == dtype
    _assert_dropout(out, x, 0.3)
    np.testing.assert_array_equal(out, nn.dropout(x, 0.3, seed=7))  # a seed fixes the mask eagerly
    assert not np.array_equal(out, nn.dropout(x, 0.3, seed=8))
    assert not np.array_equal(nn.dropout(x, 0.3), nn.dropout(x, 0.3))
    assert nn.dropout(x, 0.0) is x and nn.dropout(x, 0.5, training=False) is x


def _session(graph: Graph, backend: str):
    return get_backend(backend).compile(to_onnx(graph), parse_device("cpu:0"))


def test_dropout_traced_ort_masks_per_run() -> None:
    x = np.abs(normal(100, 200)) + 0.5
    seeded = gd.trace(lambda x: nn.dropout(x, 0.3, seed=7), x)
    gd.verify(seeded)
    onnx.checker.check_model(to_onnx(seeded), full_check=True)
    assert op_types(seeded) == {"RandomUniformLike", "GreaterOrEqual", "Cast", "Mul"}
    session = _session(seeded, "ort")
    first, second = (session.run({"arg0": x})[0] for _ in range(2))
    masks = [_assert_dropout(out, x, 0.3) for out in (first, second)]
    assert not np.array_equal(*masks), "ORT draws a new mask on every run of a session"
    # A new session with the same seed starts the same sequence again.
    np.testing.assert_array_equal(_session(seeded, "ort").run({"arg0": x})[0], first)
    # Nearby seeds give unrelated masks (the seed is scrambled before it reaches ORT's LCG).
    other = _session(gd.trace(lambda x: nn.dropout(x, 0.3, seed=8), x), "ort").run({"arg0": x})[0]
    agreement = ((other != 0) == masks[0]).mean()
    assert agreement < 0.7, agreement  # independent masks agree on 0.7^2 + 0.3^2 = 58%
    unseeded = gd.trace(lambda x: nn.dropout(x, 0.6), x)
    assert "seed" not in unseeded.nodes[0].attrs
    session = _session(unseeded, "ort")
    a, b = (_assert_dropout(session.run({"arg0": x})[0], x, 0.6) for _ in range(2))
    assert not np.array_equal(a, b)


def test_dropout_traced_reference_backend() -> None:
    x = np.ones((50, 100), np.float64)
    seeded = _session(gd.trace(lambda x: nn.dropout(x, 0.25, seed=3), x), "reference")
    first = seeded.run({"arg0": x})[0]
    assert first.dtype == np.float64
    _assert_dropout(first, x, 0.25, tolerance=0.03)
    np.testing.assert_array_equal(seeded.run({"arg0": x})[0], first)  # onnx.reference reseeds on every run
    unseeded = _session(gd.trace(lambda x: nn.dropout(x, 0.25), x), "reference")
    assert not np.array_equal(unseeded.run({"arg0": x})[0], unseeded.run({"arg0": x})[0])


def test_dropout_in_gd_function_changes_per_step() -> None:
    step = gd.function(lambda x: nn.dropout(x, 0.5, seed=11))
    x = np.ones(4000, np.float32)
    a, b = step(x), step(x)
    _assert_dropout(a, x, 0.5, tolerance=0.05)
    assert not np.array_equal(a, b)


def test_dropout_inside_trace_on_a_constant_is_random_per_run() -> None:
    const = np.ones(1000, np.float32)
    graph = gd.trace(lambda x: x + nn.dropout(const, 0.5), np.zeros(1, np.float32))
    assert "RandomUniformLike" in op_types(graph)
    assert gd.trace(lambda x: nn.dropout(x, 0.5, training=False), const).nodes[0].op_type == "Identity"


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(rate=1.0), InvalidArgumentError, r"rate must be a float in \[0, 1\).*got 1.0"),
    (dict(rate=-0.1), InvalidArgumentError, r"rate must be a float in \[0, 1\)"),
    (dict(rate="0.5"), InvalidArgumentError, "rate must be a float"),
    (dict(rate=True), InvalidArgumentError, "rate must be a float"),
    (dict(rate=0.5, seed=-1), InvalidArgumentError, "seed must be >= 0"),
    (dict(rate=0.5, seed=1.5), InvalidArgumentError, "seed must be an int"),
])
def test_dropout_bad_arguments(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        nn.dropout(np.ones(3, np.float32), **kwargs)
    with pytest.raises(error, match=match):
        gd.trace(lambda x: nn.dropout(x, **kwargs), np.ones(3, np.float32))


def test_dropout_refuses_integers_and_traced_rates() -> None:
    with pytest.raises(InvalidArgumentError, match="x must be floating point"):
        nn.dropout(np.ones(3, np.int32), 0.5)
    with pytest.raises(TracingError, match="rate and training must be Python values"):
        gd.trace(lambda x, r: nn.dropout(x, r), np.ones(3, np.float32), np.float32(0.5))


# --------------------------------------------------------------- embedding
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64, np.uint8], ids=lambda d: np.dtype(d).name)
def test_embedding(id_dtype) -> None:
    table = normal(10, 3)
    ids = np.array([[1, 0, 9], [3, 3, 7]], id_dtype)
    graph = check_nn(lambda i, t: nn.embedding(i, t), (ids, table), table[ids.astype(np.int64)])
    assert graph.outputs[0].shape == (2, 3, 3) and "Gather" in op_types(graph)
    check_nn(lambda i: nn.embedding(i, table), (ids,), table[ids.astype(np.int64)])  # captured table
    check_nn(lambda t: nn.embedding([4, 2], t), (table,), table[[4, 2]])  # constant ids


def test_embedding_bad_arguments() -> None:
    table = normal(10, 3)
    with pytest.raises(InvalidArgumentError, match=r"ids must be in \[0, 10\).*got values from 0 to 10"):
        nn.embedding(np.array([0, 10]), table)
    with pytest.raises(InvalidArgumentError, match=r"\[0, 10\)"):
        gd.trace(lambda t: nn.embedding(np.array([-1]), t), table)
    with pytest.raises(InvalidArgumentError, match="ids must be integers.*float32"):
        nn.embedding(np.zeros(2, np.float32), table)
    with pytest.raises(InvalidArgumentError, match="table must have rank >= 1"):
        nn.embedding(np.zeros(2, np.int32), np.float32(1.0))


# ---------------------------------------------------- variables and strategies
def test_variables_are_read() -> None:
    v = gd.Variable(np.array([[-1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(nn.relu(v), [[0.0, 2.0]])
    graph = gd.trace(lambda x: nn.relu(x) + nn.layer_norm(v), np.zeros((1, 2), np.float32))
    assert len(graph.inputs) == 2 and graph.inputs[1].meta["variable"].uid == v.uid
    assert graph.meta.variables == [(graph.inputs[1].name, graph.inputs[1].meta["variable"])]


def test_small_convnet_step_in_strategy_run() -> None:
    rng = np.random.default_rng(5)
    w1, b1 = rng.standard_normal((3, 3, 1, 4)).astype(np.float32) * 0.3, np.zeros(4, np.float32)
    w2 = rng.standard_normal((4 * 4 * 4, 5)).astype(np.float32) * 0.1
    emb = rng.standard_normal((7, 4)).astype(np.float32)

    def step(images, labels, tokens):
        h = nn.relu(nn.conv2d(images, w1, b1, padding="SAME"))
        h = nn.max_pool2d(h, 2)
        h = nn.layer_norm(h.reshape(h.shape[0], -1))
        logits = nn.gelu(h @ w2) + nn.embedding(tokens, emb).sum(axis=1) @ np.ones((4, 5), np.float32)
        loss = nn.sparse_softmax_cross_entropy(labels, logits)
        return nn.compute_average_loss(loss), nn.softmax(logits)

    images = rng.standard_normal((6, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 5, 6).astype(np.int64)
    tokens = rng.integers(0, 7, (6, 2)).astype(np.int32)
    strategy = gd.OneDeviceStrategy("cpu:0")
    loss, probs = strategy.run(step, args=(images, labels, tokens))
    want_loss, want_probs = step(images, labels, tokens)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-4)
    np.testing.assert_allclose(probs, want_probs, rtol=1e-4, atol=1e-6)


# ------------------------------------------------- shape rules of the added ops
def _node(op_type: str, inputs, attrs=None, consts=None, num_outputs=None):
    graph = Graph("g")
    values = [graph.add_input(f"in{i}", dtype, shape) for i, (dtype, shape) in enumerate(inputs)]
    values += [graph.add_initializer(f"c{i}", np.asarray(c)) for i, c in enumerate(consts or [])]
    return graph.add_node(op_type, values, attrs, num_outputs=num_outputs)


def _types(node) -> list[tuple[str, tuple]]:
    return [(out.dtype.name, out.shape) for out in node.outputs]


def test_conv_shape_rule() -> None:
    f32 = np.float32
    node = _node("Conv", [(f32, ("n", 4, 9, 8)), (f32, (6, 2, 3, 3)), (f32, (6,))],
                 {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 0], "dilations": [1, 2]})
    assert _types(node) == [("float32", ("n", 6, 5, 4))]
    node = _node("Conv", [(f32, (1, 3, 7, 7)), (f32, (2, 3, 3, 3))], {"auto_pad": "SAME_UPPER", "strides": [2, 2]})
    assert _types(node) == [("float32", (1, 2, 4, 4))]
    node = _node("Conv", [(f32, (1, 3, "h", 5)), (f32, (2, 3, 3, 3))])
    assert node.outputs[0].shape[:2] == (1, 2) and isinstance(node.outputs[0].shape[2], str)
    with pytest.raises(GraphError, match="4 channels but weights .* expect 3 per group x 1"):
        _node("Conv", [(f32, (1, 4, 5, 5)), (f32, (2, 3, 3, 3))])
    with pytest.raises(GraphError, match="does not fit an axis of size 2"):
        _node("Conv", [(f32, (1, 3, 2, 5)), (f32, (2, 3, 3, 3))])
    with pytest.raises(GraphError, match="one dtype"):
        _node("Conv", [(f32, (1, 3, 5, 5)), (np.float64, (2, 3, 3, 3))])
    with pytest.raises(GraphError, match=r"bias .* must have shape \(2,\)"):
        _node("Conv", [(f32, (1, 3, 5, 5)), (f32, (2, 3, 3, 3)), (f32, (3,))])


def test_pool_pad_and_random_shape_rules() -> None:
    f32 = np.float32
    node = _node("MaxPool", [(f32, ("n", 3, 7, 6))], {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 0]})
    assert _types(node) == [("float32", ("n", 3, 4, 3))]
    node = _node("MaxPool", [(f32, (1, 1, 5, 5))], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
                 num_outputs=2)
    assert _types(node) == [("float32", (1, 1, 3, 3)), ("int64", (1, 1, 3, 3))]
    node = _node("AveragePool", [(f32, (2, 3, 5, 5))], {"kernel_shape": [3, 3], "auto_pad": "VALID"})
    assert _types(node) == [("float32", (2, 3, 3, 3))]
    with pytest.raises(GraphError, match="needs the kernel_shape attribute"):
        _node("AveragePool", [(f32, (2, 3, 5, 5))])
    node = _node("Pad", [(f32, ("n", 4, 5))], consts=[np.array([0, 1, 2, 0, 3, -1], np.int64), np.float32(0)])
    assert _types(node) == [("float32", ("n", 8, 6))]
    node = _node("Pad", [(f32, ("n", 4))], consts=[np.array([1, 0, 1, 0], np.int64)])
    assert _types(node) == [("float32", ("n+2", 4))]
    with pytest.raises(GraphError, match="need 2 x 2 values"):
        _node("Pad", [(f32, (3, 4))], consts=[np.array([1, 1], np.int64)])
    node = _node("RandomUniformLike", [(np.int32, ("n", 3))], {"dtype": onnx.TensorProto.DOUBLE, "seed": 1.0})
    assert _types(node) == [("float64", ("n", 3))]
    assert _types(_node("RandomUniformLike", [(f32, (2,))])) == [("float32", (2,))]
    with pytest.raises(GraphError, match="produces floating point values"):
        _node("RandomUniformLike", [(np.int64, (2,))])
