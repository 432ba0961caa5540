"""ONNX models whose shapes are decided when the step runs, loaded as exporters write them.

Oracle: plain ONNX Runtime on the same model and data. Material:

* PaddleOCR's recogniser ``ppocr_rec`` (Paddle2ONNX; Apache-2.0; shipped in the ``rapidocr_onnxruntime``
  1.4.4 wheel, fetched by :mod:`tests.real_models`): dynamic batch, ``Reshape`` targets computed from
  ``Shape`` nodes (ONNX cannot infer their rank), so it did not load before.
* scikit-learn pipelines exported by skl2onnx (a real exporter; ``ai.onnx.ml`` ops whose outputs ONNX
  shape inference leaves rankless), trained on scikit-learn's bundled digits.
* Small models with a shape-deciding graph input, as ONNX's own node tests have them.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import graphdist as gd
from graphdist.ir.batch import BatchDim
from graphdist.ir.batch_fold import folded_provenance
from graphdist.ir.graph import Graph
from tests.real_models import model_path


def _reshape_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape", [x, shape], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _ort(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


# ------------------------------------------------------------------ specialisation on values
def test_shape_input_is_specialised_on_its_value_and_keys_the_cache() -> None:
    step = gd.function(gd.onnx.load(_reshape_model(), trainable=False))
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    for shape in ([3, 8], [3, 8], [8, 3], [3, 8]):
        got = step(x, np.array(shape, dtype=np.int64))
        np.testing.assert_array_equal(got, x.reshape(shape))
    assert step.experimental_get_tracing_count() == 2  # one trace per distinct value, reused after


def test_a_new_value_each_call_warns_once_naming_the_argument(caplog: pytest.LogCaptureFixture) -> None:
    step = gd.function(gd.onnx.load(_reshape_model(), trainable=False))
    x = np.zeros((4, 6), np.float32)
    with caplog.at_level(logging.WARNING, logger="graphdist"):
        for rows in (1, 2, 3, 4, 6, 8, 12):
            step(x, np.array([rows, -1], dtype=np.int64))
    warned = [r.getMessage() for r in caplog.records if "different values" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "argument 1" in warned[0] and "close over" in warned[0]
    assert not [r for r in caplog.records if "once per new input signature" in r.getMessage()]


def test_a_shape_computed_inside_the_step_is_refused_clearly() -> None:
    model = gd.onnx.load(_reshape_model(), trainable=False)

    @gd.function
    def step(x: np.ndarray, shape: np.ndarray) -> object:
        return model(x, shape * 1)

    with pytest.raises(gd.TracingError, match="'shape' decides output shapes.*computed by the step"):
        step(np.zeros((4, 6), np.float32), np.array([3, 8]))


def test_concrete_function_of_a_specialised_value_checks_the_value() -> None:
    step = gd.function(gd.onnx.load(_reshape_model(), trainable=False))
    x = np.zeros((4, 6), np.float32)
    concrete = step.get_concrete_function(x, np.array([3, 8]))
    assert concrete(x, np.array([3, 8])).shape == (3, 8)
    with pytest.raises(gd.InvalidArgumentError, match="traced for .*argument 1 = \\[3, 8\\]"):
        concrete(x, np.array([8, 3]))


def test_onnx_node_test_with_shape_inputs_runs_through_gd_function() -> None:
    """ONNX's own generated node tests that feed shapes, axes, pads, k and sizes as inputs (82% -> 98%)."""
    from benchmarks.onnx_node_coverage import node_cases, run_case

    names = ["test_reshape_negative_dim", "test_expand_dim_changed", "test_tile", "test_reduce_sum_keepdims_example",
             "test_top_k", "test_edge_pad", "test_slice", "test_resize_upsample_sizes_nearest",
             "test_split_variable_parts_1d_opset18", "test_constantofshape_int_zeros", "test_center_crop_pad_crop",
             "test_blackmanwindow", "test_loop11"]
    cases = {c.name: c for c in node_cases(names)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = {name: run_case(cases[name], "function:ort") for name in names}
    assert all(ok for ok, _ in results.values()), {n: r for n, (ok, r) in results.items() if not ok}


# ------------------------------------------------------------------ a real exported model
@pytest.fixture(scope="module")
def rec_path() -> str:
    return str(model_path("ppocr_rec"))


def test_model_with_computed_reshapes_loads_as_shipped_and_runs_under_mirrored(rec_path: str) -> None:
    x = np.random.default_rng(0).standard_normal((4, 3, 48, 160)).astype(np.float32)
    expected = [_ort(rec_path, {"x": x[:2]})[0], _ort(rec_path, {"x": x[2:]})[0]]
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.onnx.load(rec_path, trainable=False)
    result = strategy.run(model, args=(gd.PerReplica([x[:2], x[2:]]),))
    for replica, (got, want) in enumerate(zip(result.values, expected)):
        assert got.shape == want.shape == (2, 20, 6625)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"replica {replica}")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphdist", *args], capture_output=True, text=True, timeout=600)


def test_cli_export_under_mirrored_and_replan_of_a_one_device_export(rec_path: str, tmp_path) -> None:
    mirrored, one, replanned = tmp_path / "mirrored", tmp_path / "one", tmp_path / "replanned"
    inputs = tmp_path / "inputs.npz"
    done = _cli("export", rec_path, "--input-shape", "x=8x3x48x192", "--strategy", "mirrored",
                "--devices", "cpu:0,cpu:1", "-o", str(mirrored), "--save-inputs", str(inputs))
    assert done.returncode == 0, done.stderr
    done = _cli("export", rec_path, "--input-shape", "x=8x3x48x192", "-o", str(one))
    assert done.returncode == 0, done.stderr
    done = _cli("replan", str(one), "--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "-o", str(replanned))
    assert done.returncode == 0, done.stderr
    assert "2 segment(s) on cpu:0, cpu:1" in done.stdout
    x = np.load(inputs)["arg0"]
    want = _ort(rec_path, {"x": x})[0]
    for plan_dir in (mirrored, one, replanned):
        plan = gd.load_plan(str(plan_dir))
        got = plan(x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str(plan_dir.name))
    assert len(gd.load_plan(str(replanned)).plan.segments) == 2
    in_python = gd.load_plan(str(one)).replan(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    assert len(in_python.plan.segments) == 2
    np.testing.assert_allclose(in_python(x), want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ batch provenance through folding
def test_folded_shape_computation_remembers_the_batch() -> None:
    graph = Graph("g")
    x = graph.add_input("x", np.float32, (BatchDim(4), 3, 5))
    shape = np.array([4, 3, 5], np.int64)
    (record,) = folded_provenance("Shape", "", {}, [x], [shape], graph.opset_imports)
    assert record == [(1, 0), None, None]
    shape_value = graph.add_initializer("shape", shape)
    shape_value.meta["batch"] = record
    starts, ends = graph.add_initializer("starts", np.array([0])), graph.add_initializer("ends", np.array([2]))
    (sliced,) = folded_provenance("Slice", "", {}, [shape_value, starts, ends], [shape[:2]], graph.opset_imports)
    assert sliced == [(1, 0), None]
    sliced_value = graph.add_initializer("sliced", shape[:2])
    sliced_value.meta["batch"] = sliced
    minus_one = graph.add_initializer("minus_one", np.array([-1]))
    (joined,) = folded_provenance("Concat", "", {"axis": 0}, [minus_one, sliced_value],
                                  [np.array([-1, 4, 3])], graph.opset_imports)
    assert joined == [None, (1, 0), None]
    two = graph.add_initializer("two", np.array(2))
    (doubled,) = folded_provenance("Mul", "", {}, [sliced_value, two], [shape[:2] * 2], graph.opset_imports)
    assert doubled == [(2, 0), None]
    (product,) = folded_provenance("Mul", "", {}, [sliced_value, sliced_value], [shape[:2] ** 2],
                                   graph.opset_imports)
    assert product is None  # B * B is not affine: not recorded, so re-planning is refused, not wrong


# ------------------------------------------------------------------ -1 dims and ai.onnx.ml
def test_backend_accepts_minus_one_dims() -> None:
    from graphdist.onnx.backend import prepare

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    data = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(prepare(model).run([data])[0], np.maximum(data, 0))


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x.astype(np.float32), y


def _sklearn_models(x: np.ndarray, y: np.ndarray) -> dict[str, onnx.ModelProto]:
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    opsets = {"": 17, "ai.onnx.ml": 3}
    forest = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the MLP does not converge in 50 iterations: it need not
        mlp = make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(16,), max_iter=50,
                                                            random_state=0)).fit(x, y)
    boosted = GradientBoostingRegressor(n_estimators=5, random_state=0).fit(x, y)
    off = {"zipmap": False}
    return {
        "forest": skl2onnx.to_onnx(forest, x[:1], options={RandomForestClassifier: off}, target_opset=opsets),
        "mlp": skl2onnx.to_onnx(mlp, x[:1], options={MLPClassifier: off}, target_opset=opsets),
        "boosted": skl2onnx.to_onnx(boosted, x[:1], target_opset=opsets),
    }


def test_sklearn_pipelines_with_rankless_ml_ops_load_and_match_onnxruntime(digits) -> None:
    x, y = digits
    for name, proto in _sklearn_models(x, y).items():
        feeds = {proto.graph.input[0].name: x[:16]}
        want = _ort(proto, feeds)
        strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
        with strategy.scope():
            model = gd.onnx.load(proto, trainable=False)
        eager = model(x[:16])
        eager = eager if isinstance(eager, tuple) else (eager,)
        for got, expected in zip(eager, want):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=name)
        replicas = strategy.run(model, args=(gd.PerReplica([x[:8], x[8:16]]),))
        first = replicas[0] if isinstance(replicas, tuple) else replicas
        np.testing.assert_allclose(np.concatenate(first.values), want[0], rtol=1e-5, atol=1e-5, err_msg=name)


def test_model_with_a_rank_known_only_from_the_call_imports_at_its_first_call() -> None:
    """silero-vad's 16 kHz export (torch.onnx, MIT, from the silero_vad 6.2.3 wheel): an ``If`` whose output
    rank ONNX cannot infer with a symbolic batch. It loads, and is imported with the first call's shapes.
    """
    path = str(model_path("silero_vad_16k_op15"))
    model = gd.onnx.load(path, trainable=False)
    rng = np.random.default_rng(0)
    for batch in (2, 3):
        x = rng.standard_normal((batch, 512)).astype(np.float32)
        state = rng.standard_normal((2, batch, 128)).astype(np.float32) * 0.1
        want = _ort(path, {"input": x, "state": state, "sr": np.array(16000)})
        got = model(x, state, np.array(16000))
        for name, a, b in zip(("output", "state"), got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"batch {batch} {name}")


def test_an_exported_plan_keeps_its_specialised_value_and_refuses_another(tmp_path) -> None:
    step = gd.function(gd.onnx.load(_reshape_model(), trainable=False))
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    concrete = step.get_concrete_function(x, np.array([3, 8]))
    concrete.export(str(tmp_path / "plan"))
    plan = gd.load_plan(str(tmp_path / "plan"))
    np.testing.assert_array_equal(plan(x, np.array([3, 8])), x.reshape(3, 8))
    with pytest.raises(gd.PlanError, match=r"decides shapes.*traced and compiled for its value \[3, 8\]"):
        plan(x, np.array([8, 3]))
    replanned = plan.replan(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    with pytest.raises(gd.PlanError, match="decides shapes"):
        replanned(x, np.array([8, 3]))


def test_a_flag_deciding_an_if_is_specialised_under_gd_function() -> None:
    """silero-vad (torch.onnx, MIT): the whole model is an If on ``sr == 16000``. Passed to a gd.function as a
    numpy array, ``sr`` is specialised like a shape input: the taken branch is inlined, one trace per rate.
    """
    path = str(model_path("silero_vad"))
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.onnx.load(path, trainable=False)

    @gd.function
    def step(audio: object, state: object, rate: np.ndarray) -> object:
        return strategy.run(model, args=(audio, state, rate))

    rng = np.random.default_rng(0)
    for rate, samples in ((16000, 512), (8000, 256), (16000, 512)):
        audio = rng.standard_normal((4, samples)).astype(np.float32)
        state = (rng.standard_normal((2, 4, 128)) * 0.1).astype(np.float32)
        result = step(gd.PerReplica([audio[:2], audio[2:]]), gd.PerReplica([state[:, :2], state[:, 2:]]),
                      np.array(rate))
        for replica in range(2):
            rows = slice(2 * replica, 2 * replica + 2)
            want = _ort(path, {"input": audio[rows], "state": state[:, rows], "sr": np.array(rate)})
            for got, expected in zip(result, want):
                np.testing.assert_allclose(got.values[replica], expected, rtol=1e-5, atol=1e-6)
    assert step.experimental_get_tracing_count() == 2


def test_a_zero_dimensional_string_output_is_an_array() -> None:
    """ONNX's StringConcat node test on 0-d strings: the output is a 0-d object array (numeric 0-d outputs are
    numpy scalars), through the path that distributes a model.
    """
    from benchmarks.onnx_node_coverage import node_cases, run_case

    (case,) = node_cases(["test_string_concat_zero_dimensional"])
    assert run_case(case, "function:ort") == (True, "pass")
