"""The tvm backend's ONNX Runtime fallback (graphdist.backends.tvm_fallback) and the rewrites that fixed
TVM 0.27's silently wrong values, with ``onnx.reference`` as the oracle.

Material: ONNX's own backend node tests (model + inputs), taken from their modules one at a time
(``collect_testcases()`` generates all ~1,900 in ~10 s)."""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import graphdist as gd
from graphdist import stats
from graphdist.backends import default_cache, get_backend, tvm_fallback
from graphdist.backends.ort import OPTIMIZED_MODEL_FILE
from graphdist.backends.tvm import TvmBackend, TvmExecutable
from graphdist.backends.tvm_fallback import FallbackExecutable, fallback_note, unsupported_nodes
from graphdist.backends.tvm_onnx import prepare_for_tvm
from graphdist.compile.graph_runner import GraphRunner
from graphdist.runtime.devices import Device, parse_device, thread_budget
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import current_trace

CPU0 = Device("cpu", 0)
TVM_LOGGER = "graphdist.backends.tvm"
RNG = np.random.default_rng(14)


@functools.cache
def node_case(module: str, name: str) -> Any:
    """The ONNX backend node test ``name``, defined in ``onnx.backend.test.case.node.<module>``."""
    from onnx.backend.test.case import node

    importlib.import_module(f"onnx.backend.test.case.node.{module}")  # defining its cases records them
    found = [case for case in node._NodeTestCases if case.name == name]
    if not found:
        found = [case for case in node.collect_testcases() if case.name == name]
    return found[0]


def reference(model: onnx.ModelProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
    names = [value.name for value in model.graph.input]
    return [np.asarray(out) for out in ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))]


def assert_matches(got: list[np.ndarray], expected: list[np.ndarray], rtol: float, atol: float) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def single_node_model(node: onnx.NodeProto, inputs: list[tuple[str, int, list[int]]], outputs: list[str],
                      opset: int = 18, initializers: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph([node], node.op_type.lower(),
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, 0, None) for n in outputs], initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forgets which op types were warned about (the warning comes once per op type per process)."""
    monkeypatch.setattr(tvm_fallback, "_warned_ops", set())


# ---------------------------------------------------------------------------- fallback

def test_op_tvm_cannot_convert_runs_on_ort_with_one_warning(fresh_warnings: None,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    case = node_case("gru", "test_gru_defaults")
    inputs = case.data_sets[0][0]
    expected = reference(case.model, inputs)
    before = stats.snapshot()
    with caplog.at_level(logging.DEBUG, logger=TVM_LOGGER):
        got = GraphRunner(case.model, backend="tvm")(*inputs)
        exe = TvmBackend().compile(case.model, CPU0)  # the same op again: no second warning
    assert_matches(got, expected, case.rtol, case.atol)
    assert stats.delta(before)["tvm_fallbacks"] == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == TVM_LOGGER]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "op GRU of segment 'test_gru_defaults" in message and "runs on ONNX Runtime instead" in message
    assert "not supported for frontend ONNX: GRU" in message
    assert isinstance(exe, FallbackExecutable) and exe.backend == "ort" and exe.fallback_ops == ("GRU",)
    assert fallback_note(exe) == "ort fallback (GRU)"
    names = [value.name for value in case.model.graph.input]
    assert_matches(exe.run(dict(zip(names, inputs))), expected, case.rtol, case.atol)


@pytest.mark.parametrize(("module", "name", "op"), [
    ("nonmaxsuppression", "test_nonmaxsuppression_suppress_by_IOU", "NonMaxSuppression"),  # TVM selected no box
    ("resize", "test_resize_downsample_scales_linear_antialias", "Resize"),  # TVM ignored antialias
    ("resize", "test_resize_downsample_scales_cubic", "Resize"),  # TVM used the size ratio, not the scale
    ("resize", "test_resize_upsample_sizes_nearest", "Resize"),  # TVM rounded ties the other way
    ("maxpool", "test_maxpool_with_argmax_2d_precomputed_pads", "MaxPool"),  # no Indices output in TVM
])
def test_denylisted_op_runs_on_ort_and_matches_the_reference(module: str, name: str, op: str) -> None:
    case = node_case(module, name)
    inputs = case.data_sets[0][0]
    before = stats.snapshot()
    got = GraphRunner(case.model, backend="tvm")(*inputs)
    assert stats.delta(before)["tvm_fallbacks"] == 1
    assert_matches(got, reference(case.model, inputs), case.rtol, case.atol)
    assert [u.op for u in unsupported_nodes(prepare_for_tvm(case.model))] == [op]


def _det(x: Any) -> Any:
    """``Det`` (TVM 0.27's frontend has no converter for it) as a traced op."""
    if isinstance(x, Tensor):
        return current_trace().emit("Det", [x.value], {}, num_outputs=1)[0]
    return np.linalg.det(x)


def test_mixed_plan_under_mirrored_runs_tvm_and_fallback_segments(monkeypatch: pytest.MonkeyPatch,
                                                                    fresh_warnings: None,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Det before the all-reduce (ONNX Runtime), tanh after it (TVM), on both replicas."""
    monkeypatch.setenv("GRAPHDIST_BACKEND", "tvm")
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    def replica(x: Any) -> Any:
        return np.tanh(gd.get_replica_context().all_reduce("sum", _det(x)) * 0.1)

    xs = [RNG.standard_normal((2, 3, 3)).astype(np.float32) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger=TVM_LOGGER):
        out = strategy.run(replica, args=(gd.PerReplica(tuple(xs)),))
    expected = np.tanh((np.linalg.det(xs[0].astype(np.float64)) + np.linalg.det(xs[1].astype(np.float64))) * 0.1)
    for got in strategy.experimental_local_results(out):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert sum("op Det of segment" in r.getMessage() for r in caplog.records) == 1  # once per op type

    plan = strategy._function_for(replica).get_concrete_function(gd.PerReplica(tuple(xs))).plan
    threads = thread_budget(len(plan.devices))
    kinds = {}
    for segment in plan.segments:  # the executables the plan runs (memory hits of the compile cache)
        exe = default_cache().get_or_compile(get_backend("tvm"), segment.model, parse_device(segment.device), threads)
        kinds[segment.name] = (type(exe).__name__, [n.op_type for n in segment.graph.nodes])
    assert sorted(kinds.values()) == [("FallbackExecutable", ["Det"])] * 2 + [("TvmExecutable", ["Mul", "Tanh"])] * 2


@pytest.mark.parametrize(("module", "name", "op"), [
    ("gru", "test_gru_defaults", "GRU"),  # TVM's frontend cannot convert it
    ("nonmaxsuppression", "test_nonmaxsuppression_suppress_by_IOU", "NonMaxSuppression"),  # denylisted
])
def test_tpu_segment_tvm_cannot_run_is_a_clear_error(module: str, name: str, op: str) -> None:
    case = node_case(module, name)
    with pytest.raises(gd.BackendError, match=rf"on tpu:0 uses '{op}', which TVM cannot run .*no fallback"):
        TvmBackend().compile(case.model, "tpu:0")


def test_fallback_that_ort_cannot_run_either_names_both_errors() -> None:
    model = single_node_model(helper.make_node("LRN", ["x"], ["y"], size=2),
                              [("x", TensorProto.FLOAT, [1, 4, 3, 3])], ["y"])
    with pytest.raises(gd.BackendError, match=r"(?s)cannot convert segment 'lrn' op 'LRN'.*ONNX Runtime.*cannot "
                                              r"run it either"):
        TvmBackend().compile(model, CPU0)


def test_fallback_keeps_its_onnx_runtime_artefacts_in_the_disk_cache(tmp_path: Any) -> None:
    case = node_case("gru", "test_gru_defaults")
    TvmBackend().compile(case.model, CPU0, cache_dir=tmp_path)
    assert (tmp_path / tvm_fallback.FALLBACK_CACHE / OPTIMIZED_MODEL_FILE).is_file()
    before = stats.snapshot()
    assert isinstance(TvmBackend().compile(case.model, CPU0, cache_dir=tmp_path), FallbackExecutable)
    assert stats.delta(before)["disk_cache_hits"] == 1


def test_bfloat16_runs_on_ort_rounded_as_the_reference() -> None:
    """TVM 0.27 returned float32 values unrounded through a bfloat16 Cast (and raw DLPack errors for
    bfloat16 arrays): such segments fall back."""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
                               helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT)], "bf16",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    x = np.array([1.0, 1.00390625, 3.14159, -2.5], np.float32)
    exe = TvmBackend().compile(model, CPU0)
    assert isinstance(exe, FallbackExecutable) and exe.fallback_ops == ("Cast",)
    (expected,) = reference(model, [x])
    assert expected[2] != x[2]  # the oracle rounds
    np.testing.assert_array_equal(exe.run({"x": x})[0], expected)


def test_bfloat16_op_neither_backend_runs_is_a_backend_error() -> None:
    model = single_node_model(helper.make_node("Relu", ["x"], ["y"]), [("x", TensorProto.BFLOAT16, [4])], ["y"])
    with pytest.raises(gd.BackendError, match=r"(?s)op 'Relu'.*bfloat16 values.*ONNX Runtime"):
        TvmBackend().compile(model, CPU0)
    assert np.dtype(ml_dtypes.bfloat16).itemsize == 2  # the arrays users would pass


def test_denylist_rules() -> None:
    """Which forms go to ONNX Runtime (no compile: the rules alone)."""
    def resize(attrs: dict[str, Any], scales: list[float], source: list[int]) -> list[str]:
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
        init = onnx.numpy_helper.from_array(np.asarray(scales, np.float32), "scales")
        model = single_node_model(node, [("x", TensorProto.FLOAT, source)], ["y"], 19, [init])
        return [u.reason for u in unsupported_nodes(model)]

    assert resize({"mode": "nearest"}, [1, 1, 2, 3], [1, 1, 2, 2]) == []  # integer upsampling: TVM is right
    assert resize({"mode": "linear"}, [1, 1, 2, 2], [1, 1, 3, 3]) == []
    assert "antialias" in resize({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.5], [1, 1, 4, 4])[0]
    assert "given scales" in resize({"mode": "linear"}, [1, 1, 0.6, 0.6], [1, 1, 2, 4])[0]
    assert "half_pixel_symmetric" in resize({"mode": "linear", "coordinate_transformation_mode":
                                             "half_pixel_symmetric"}, [1, 1, 2, 2], [1, 1, 2, 2])[0]

    training = helper.make_node("Dropout", ["x", "ratio", "mode"], ["y"])
    init = [onnx.numpy_helper.from_array(np.asarray(0.3, np.float32), "ratio")]
    model = single_node_model(training, [("x", TensorProto.FLOAT, [3]), ("mode", TensorProto.BOOL, [])], ["y"],
                              initializers=init)
    assert [u.op for u in unsupported_nodes(model)] == ["Dropout"]
    inference = helper.make_node("Dropout", ["x", "ratio"], ["y"])
    model = single_node_model(inference, [("x", TensorProto.FLOAT, [3])], ["y"], initializers=init)
    assert unsupported_nodes(model) == []

    # Rewritten where the input is typed: nothing left for the denylist; untyped: denylisted.
    isinf = helper.make_node("IsInf", ["x"], ["y"], detect_negative=0)
    model = single_node_model(isinf, [("x", TensorProto.FLOAT, [3])], ["y"])
    assert "IsInf" not in [n.op_type for n in prepare_for_tvm(model).graph.node if n.name == isinf.name]
    assert unsupported_nodes(prepare_for_tvm(model)) == []
    assert "detect_negative" in unsupported_nodes(model)[0].reason


# ---------------------------------------------------------------------------- fixed wrong values

FIXED = [
    ("isinf", "test_isinf_positive"),  # detect_negative=0 was ignored
    ("isinf", "test_isinf_negative"),  # detect_positive=0 was ignored
    ("convtranspose", "test_convtranspose_output_shape"),  # output_shape was ignored (9x7 instead of 10x8)
    ("layernormalization", "test_layer_normalization_3d_axis1_epsilon"),  # Mean/InvStdDev were placeholders
    ("layernormalization", "test_layer_normalization_4d_axis_negative_1"),
    ("batch_normalization", "test_batchnorm_example_training_mode"),  # running stats: momentum swapped
    ("mish", "test_mish"),  # log(1 + exp(x)) in float32: 1.2e-3 off at x = -10
    ("mish", "test_mish_expanded"),  # Softplus in float32, as above
    ("sinh", "test_sinh"),  # LLVM has no sinh: TVM could not build it
    ("cosh", "test_cosh"),
    ("reducemax", "test_reduce_max_empty_set"),  # -3.4e38 instead of -inf
    ("reducemin", "test_reduce_min_empty_set"),  # 3.4e38 instead of inf
    ("reducemin", "test_reduce_min_bool_inputs"),  # booleans: TVM could not build it
    ("dropout", "test_dropout_default_mask"),  # the mask was float32, not bool
    ("pow", "test_pow_types_float32_int64"),  # exponent of another type: TVM could not convert it
    ("pow", "test_pow_types_float32_uint32"),  # (ONNX Runtime has no kernel for this one)
    ("pow", "test_pow_types_int64_float32"),  # integer base, float exponent: truncated
    ("pow", "test_pow_types_int32_int32"),  # integers: TVM's power is float-only
]


@pytest.mark.parametrize(("module", "name"), FIXED, ids=[name[5:] for _, name in FIXED])
def test_fixed_tvm_conversion_matches_the_reference(module: str, name: str) -> None:
    case = node_case(module, name)
    inputs = case.data_sets[0][0]
    expected = reference(case.model, inputs)
    before = stats.snapshot()
    got = GraphRunner(case.model, backend="tvm")(*inputs)
    assert stats.delta(before)["tvm_fallbacks"] == 0  # computed by TVM
    assert_matches(got, expected, case.rtol, case.atol)


def test_max_of_a_row_of_minus_infinity_is_minus_infinity() -> None:
    """A fully masked attention row: TVM reduced from the lowest finite float."""
    model = single_node_model(helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=0),
                              [("x", TensorProto.FLOAT, [3, 2])], ["y"], opset=17)
    x = np.array([[-np.inf, -np.inf], [1.0, -np.inf], [np.finfo(np.float32).min, -np.inf]], np.float32)
    exe = TvmBackend().compile(model, CPU0)
    assert isinstance(exe, TvmExecutable)
    np.testing.assert_array_equal(exe.run({"x": x})[0], reference(model, [x])[0])


EMPTY_REDUCTIONS = [
    ("ReduceSum", TensorProto.FLOAT), ("ReduceProd", TensorProto.FLOAT), ("ReduceMax", TensorProto.FLOAT),
    ("ReduceMin", TensorProto.FLOAT), ("ReduceL1", TensorProto.FLOAT), ("ReduceL2", TensorProto.FLOAT),
    ("ReduceLogSum", TensorProto.FLOAT), ("ReduceLogSumExp", TensorProto.FLOAT),
    ("ReduceSumSquare", TensorProto.FLOAT), ("ReduceMean", TensorProto.FLOAT),
    ("ReduceSum", TensorProto.INT64), ("ReduceProd", TensorProto.INT32), ("ReduceMax", TensorProto.INT64),
    ("ReduceMin", TensorProto.INT32), ("ReduceMax", TensorProto.BOOL), ("ReduceMin", TensorProto.BOOL),
]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize(("op", "elem"), EMPTY_REDUCTIONS,
                         ids=[f"{op}-{helper.tensor_dtype_to_np_dtype(e)}" for op, e in EMPTY_REDUCTIONS])
def test_reductions_over_an_empty_axis_give_the_identity(op: str, elem: int, keepdims: int) -> None:
    """A TIR reduction initialises its output in its first iteration: over an empty axis it wrote nothing,
    and the output was uninitialised memory (wrong on an AMD host, right by luck on an Intel one). Each run
    follows a run of the same shapes over a non-empty axis, so memory reused from it holds other values.
    """
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    empty = single_node_model(node, [("x", elem, [3, 0, 5])], ["y"], initializers=[axes])
    full = single_node_model(node, [("x", elem, [3, 4, 5])], ["y"], initializers=[axes])
    values = (RNG.standard_normal((3, 4, 5)) * 3 + 1).astype(dtype)
    backend = TvmBackend()
    assert isinstance(backend.compile(full, CPU0), TvmExecutable)
    exe = backend.compile(empty, CPU0)
    assert isinstance(exe, TvmExecutable)  # computed by TVM, not by the fallback
    x = np.zeros((3, 0, 5), dtype)
    for _ in range(3):
        backend.compile(full, CPU0).run({"x": values})
        got, expected = exe.run({"x": x})[0], reference(empty, [x])[0]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_float16_matmul_accumulates_in_float32() -> None:
    """TVM accumulated a float16 MatMul in float16 (36% off over 64 products); now as the reference."""
    a = RNG.standard_normal((2, 4, 64)).astype(np.float16)
    b = RNG.standard_normal((2, 64, 16)).astype(np.float16)
    model = single_node_model(helper.make_node("MatMul", ["a", "b"], ["y"]),
                              [("a", TensorProto.FLOAT16, list(a.shape)), ("b", TensorProto.FLOAT16, list(b.shape))],
                              ["y"])
    exe = TvmBackend().compile(model, CPU0)
    assert isinstance(exe, TvmExecutable)
    got, expected = exe.run({"a": a, "b": b})[0], reference(model, [a, b])[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=2e-3, atol=2e-3)
