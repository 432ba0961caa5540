"""Tests for the ONNX Runtime backend: results, devices, error wrapping."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphdist import stats
from graphdist.backends import get_backend
from graphdist.backends.ort import DISABLED_OPTIMIZERS, OPTIMIZED_MODEL_FILE, OrtBackend, OrtExecutable
from graphdist.errors import BackendError, DeviceError
from graphdist.runtime import devices
from graphdist.runtime.devices import Device

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def mlp_model(ir_version: int | None = 10) -> onnx.ModelProto:
    """relu(x @ W + B), float32, weights as initializers, batch dim symbolic."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["m"]),
            helper.make_node("Add", ["m", "B"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def f64_model() -> onnx.ModelProto:
    """Two float64 inputs, two outputs: (tanh(a * b), sum(a - b, axis=1))."""
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["a", "b"], ["p"]),
            helper.make_node("Tanh", ["p"], ["t"]),
            helper.make_node("Sub", ["a", "b"], ["d"]),
            helper.make_node("ReduceSum", ["d", "axes"], ["s"], keepdims=0),
        ],
        "f64",
        [
            helper.make_tensor_value_info("a", TensorProto.DOUBLE, [2, 3]),
            helper.make_tensor_value_info("b", TensorProto.DOUBLE, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("t", TensorProto.DOUBLE, [2, 3]),
            helper.make_tensor_value_info("s", TensorProto.DOUBLE, [2]),
        ],
        [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def bad_model() -> onnx.ModelProto:
    """A model using an op that does not exist."""
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.fixture
def backend() -> OrtBackend:
    return OrtBackend()


@pytest.fixture
def mlp(backend: OrtBackend) -> OrtExecutable:
    return backend.compile(mlp_model(), Device("cpu", 0), threads=1)


def test_registered_as_default() -> None:
    assert isinstance(get_backend("ort"), OrtBackend)
    assert get_backend("ort").name == "ort"


def test_version_and_targets(backend: OrtBackend) -> None:
    import onnxruntime

    assert backend.version == f"onnxruntime-{onnxruntime.__version__}"
    assert backend.target(Device("cpu", 0)) == "cpu"
    assert backend.target(Device("cpu", 5)) == "cpu"
    assert backend.target(Device("cuda", 1)) == "cuda:1"


def test_mlp_matches_numpy(mlp: OrtExecutable) -> None:
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    (y,) = mlp.run({"x": x})
    assert y.dtype == np.float32 and y.shape == (5, 3)
    np.testing.assert_allclose(y, np.maximum(x @ W + B, 0), rtol=1e-5, atol=1e-6)
    assert mlp.input_names == ["x"] and mlp.output_names == ["y"]


def test_symbolic_batch_dim(mlp: OrtExecutable) -> None:
    for batch in (1, 7):
        x = RNG.standard_normal((batch, 4)).astype(np.float32)
        assert mlp.run({"x": x})[0].shape == (batch, 3)


def test_float64_model_matches_numpy(backend: OrtBackend) -> None:
    exe = backend.compile(f64_model(), Device("cpu", 0))
    a = RNG.standard_normal((2, 3))
    b = RNG.standard_normal((2, 3))
    t, s = exe.run({"a": a, "b": b})
    assert t.dtype == np.float64 and s.dtype == np.float64
    np.testing.assert_allclose(t, np.tanh(a * b), rtol=1e-12)
    # A row sum of standard-normal differences can be near zero, where ORT's and numpy's summation orders
    # differ by float64 ulps of the O(1) terms.
    np.testing.assert_allclose(s, (a - b).sum(axis=1), rtol=1e-12, atol=1e-14)
    assert exe.input_names == ["a", "b"] and exe.output_names == ["t", "s"]


def test_session_options(backend: OrtBackend) -> None:
    exe = backend.compile(mlp_model(), Device("cpu", 0), threads=1)
    options = exe.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.inter_op_num_threads == 1
    assert exe.session.get_providers() == ["CPUExecutionProvider"]
    default = backend.compile(mlp_model(), Device("cpu", 1))
    assert (
        default.session.get_session_options().intra_op_num_threads
        == devices.host_cores()
    )


def test_compile_counts_a_compile(backend: OrtBackend) -> None:
    before = stats.snapshot()
    backend.compile(mlp_model(), Device("cpu", 0))
    changes = stats.delta(before)
    assert changes["compiles"] == 1 and changes["disk_cache_hits"] == 0


def test_ir_version_14_runs_and_is_not_mutated(backend: OrtBackend) -> None:
    model = mlp_model(ir_version=None)
    model.ir_version = 14
    exe = backend.compile(model, Device("cpu", 0))
    assert model.ir_version == 14
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(
        exe.run({"x": x})[0], np.maximum(x @ W + B, 0), rtol=1e-5
    )


def test_wrong_dtype_is_wrapped(mlp: OrtExecutable) -> None:
    x = RNG.standard_normal((5, 4))  # float64, model wants float32
    with pytest.raises(BackendError) as info:
        mlp.run({"x": x})
    message = str(info.value)
    assert "'mlp'" in message
    assert "x: float64[5, 4]" in message
    assert "x: float32['N', 4]" in message
    assert "[ONNXRuntimeError]" not in message
    assert info.value.__cause__ is not None
    assert not isinstance(info.value.__cause__, BackendError)


def test_missing_feed_is_wrapped(mlp: OrtExecutable) -> None:
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    with pytest.raises(BackendError, match=r"missing feed\(s\) 'x'") as info:
        mlp.run({"z": x})
    assert "unexpected feed(s) 'z'" in str(info.value)
    with pytest.raises(BackendError, match=r"missing feed\(s\) 'x'.*Feeds given: none"):
        mlp.run({})


def test_wrong_shape_is_wrapped(mlp: OrtExecutable) -> None:
    x = RNG.standard_normal((5, 2)).astype(np.float32)
    with pytest.raises(BackendError, match=r"x: float32\[5, 2\]"):
        mlp.run({"x": x})


def test_invalid_model_is_wrapped(backend: OrtBackend) -> None:
    with pytest.raises(BackendError, match="'broken'.*check_model") as info:
        backend.compile(bad_model(), Device("cpu", 0))
    assert "NoSuchOp" in str(info.value)
    assert info.value.__cause__ is not None


def test_tpu_is_refused(backend: OrtBackend) -> None:
    with pytest.raises(BackendError, match="use backend 'tvm' for tpu"):
        backend.compile(mlp_model(), Device("tpu", 0))


def test_missing_gpu_is_refused(
    backend: OrtBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "num_gpus", lambda: 0)
    with pytest.raises(DeviceError, match="no GPU is visible"):
        backend.compile(mlp_model(), "cuda:0")


# ------------------------------------------------ NoopElimination (float64)
#: Distinct float64 scalars that float32 rounds to 0 or 1.
TINY = (1.37e-46, 2.05e-48, 2.96e-50)
NEAR_ONE = 1 + 1e-10


def tiny_constants_model() -> onnx.ModelProto:
    """Horner form ``((x*x + T0) * x + T1) * x + T2``, then three times ``* NEAR_ONE``, float64.

    Every Add/Mul by a constant that reads a node output (and does not write the graph
    output) is a candidate for ONNX Runtime's NoopElimination.
    """
    names = ["t0", "t1", "t2"]
    nodes = [helper.make_node("Mul", ["x", "x"], ["m0"])]
    prev = "m0"
    for i, name in enumerate(names):
        nodes.append(helper.make_node("Add", [prev, name], [f"a{i}"]))
        if i < len(names) - 1:
            nodes.append(helper.make_node("Mul", [f"a{i}", "x"], [f"m{i + 1}"]))
            prev = f"m{i + 1}"
    nodes += [
        helper.make_node("Mul", ["a2", "one"], ["s0"]),
        helper.make_node("Mul", ["s0", "one"], ["s1"]),
        helper.make_node("Mul", ["s1", "one"], ["y"]),
    ]
    initializers = [numpy_helper.from_array(np.array(v), n) for n, v in zip(names, TINY)]
    initializers.append(numpy_helper.from_array(np.array(NEAR_ONE), "one"))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


TINY_X = np.array([1e-30, 1e-16, 0.5, 3.0])


def tiny_expected(x: np.ndarray) -> np.ndarray:
    return (((x * x + TINY[0]) * x + TINY[1]) * x + TINY[2]) * NEAR_ONE * NEAR_ONE * NEAR_ONE


def test_noop_elimination_bug_reproduces_in_plain_onnxruntime() -> None:
    """Documents the bug the backend works around (onnxruntime 1.31): NoopElimination drops
    float64 Add/Mul whose scalar constant is 0 or 1 once rounded to float32.
    Disabling ConstantSharing (which compares constants byte for byte) does not help."""
    import onnxruntime

    if not onnxruntime.__version__.startswith("1.31."):
        pytest.skip("the reproduction is pinned to onnxruntime 1.31")
    data = tiny_constants_model().SerializeToString()
    expected = tiny_expected(TINY_X)
    for disabled in ([], ["ConstantSharing"]):
        session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        (y,) = session.run(None, {"x": TINY_X})
        # All three Adds and two of the Muls are gone (the last Mul writes the graph output).
        np.testing.assert_allclose(y, TINY_X**4 * NEAR_ONE, rtol=1e-15, atol=0)
        assert not np.allclose(y, expected, rtol=1e-14, atol=0), disabled
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"],
                                           disabled_optimizers=["NoopElimination"])
    np.testing.assert_allclose(session.run(None, {"x": TINY_X})[0], expected, rtol=1e-15, atol=0)


def test_float64_tiny_constants_are_kept(backend: OrtBackend, tmp_path) -> None:
    assert "NoopElimination" in DISABLED_OPTIMIZERS
    expected = tiny_expected(TINY_X)
    # Without the disk cache, then writing the EXTENDED-optimized model, then loading it.
    for cache_dir, hits in ((None, 0), (tmp_path, 0), (tmp_path, 1)):
        before = stats.snapshot()
        exe = backend.compile(tiny_constants_model(), Device("cpu", 0), cache_dir=cache_dir)
        (y,) = exe.run({"x": TINY_X})
        np.testing.assert_allclose(y, expected, rtol=1e-15, atol=0)
        assert stats.delta(before)["disk_cache_hits"] == hits
    saved = onnx.load(tmp_path / OPTIMIZED_MODEL_FILE)
    assert [n.op_type for n in saved.graph.node].count("Add") == 3


def test_float64_traced_polynomial_with_tiny_coefficients() -> None:
    import graphdist as gd

    def horner(x):
        acc = x * 0.0 + TINY[0]
        for c in TINY[1:]:
            acc = acc * x + c
        return acc * NEAR_ONE

    x = np.array([1e-30, 0.25, 2.0])
    np.testing.assert_allclose(gd.function(horner, backend="ort")(x), horner(x), rtol=1e-15, atol=0)


def _chain_model(nodes: int, weights_as_inputs: bool = True) -> onnx.ModelProto:
    """y = x * w0 * w1 * ... (``nodes`` Muls), the weights graph inputs (as a graphdist segment's variables)."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])]
    inputs += [helper.make_tensor_value_info(f"w{i}", TensorProto.FLOAT, [2]) for i in range(nodes)]
    chain = [helper.make_node("Mul", ["x" if i == 0 else f"m{i - 1}", f"w{i}"], [f"m{i}"]) for i in range(nodes)]
    graph = helper.make_graph(chain, "chain", inputs, [helper.make_tensor_value_info(f"m{nodes - 1}",
                                                                                      TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_large_segment_skips_the_offline_model_in_every_process(backend: OrtBackend, tmp_path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import graphdist.backends.ort as ort_backend

    monkeypatch.setattr(ort_backend, "OFFLINE_MAX_NODES", 8)
    feeds = {"x": np.float32([1, 2]), **{f"w{i}": np.float32([2, 0.5]) for i in range(9)}}
    for nodes, written in ((8, True), (9, False)):
        directory = tmp_path / str(nodes)
        for hits in ((0, 1) if written else (0, 0)):  # a second compile (a later process) reads what the first wrote
            before = stats.snapshot()
            exe = backend.compile(_chain_model(nodes), Device("cpu", 0), cache_dir=directory)
            np.testing.assert_array_equal(exe.run({k: feeds[k] for k in exe.input_names})[0],
                                          [2.0 ** nodes, 2 * 0.5 ** nodes])
            changes = stats.delta(before)
            assert (changes["compiles"], changes["disk_cache_hits"]) == (1 - hits, hits)
        assert (directory / OPTIMIZED_MODEL_FILE).exists() == written


def test_run_with_many_inputs_skips_the_wrappers_quadratic_feed_check(backend: OrtBackend) -> None:
    # onnxruntime's InferenceSession.run looks every input up in a list of the feeds (quadratic); the executable
    # calls the C++ session, which checks the feeds itself: a missing one is still named.
    exe = backend.compile(_chain_model(3000), Device("cpu", 0))
    feeds = {"x": np.float32([1, 1]), **{f"w{i}": np.float32([1, 1]) for i in range(3000)}}
    np.testing.assert_array_equal(exe.run(feeds)[0], [1, 1])
    del feeds["w1234"]
    with pytest.raises(BackendError, match=r"missing feed\(s\) 'w1234'"):
        exe.run(feeds)
