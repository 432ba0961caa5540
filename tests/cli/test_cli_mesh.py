"""``--strategy model_parallel`` with ``--mesh``, ``--layout`` and ``--batch-dim-name`` (run as a subprocess).

Oracles: ONNX Runtime on the same ``.onnx`` file and input for an exported tensor-parallel inference plan
(scikit-learn's MLP on the digits, exported by skl2onnx: MatMul + Add weights; PaddleOCR's classifier: Conv and
MatMul weights as Constant nodes); the same training step exported under ``one_device`` for a factory's training
step (losses and trained weights).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import graphdist as gd
from tests.cli.test_cli import MLP_STEP, assert_clean_failure, graphdist
from tests.real_models import model_path

FOUR = "cpu:0,cpu:1,cpu:2,cpu:3"
MESH = ("--mesh", "batch=1,model=2")
#: The skl2onnx MLP's weights: ``X @ coefficient + intercepts``, Relu, ``@ coefficient1 + intercepts1``.
#: Megatron's split: the first layer by columns (hidden units), the second by rows (a partial sum).
SKLEARN_LAYOUTS = ("--layout", "^coefficient$=None,model", "--layout", "^intercepts$=None,model",
                   "--layout", "^coefficient1$=model,None")
#: The repository MLP's weights (``mlp/dense_<i>/kernel``), the same split.
MLP_LAYOUTS = ("--layout", "dense_0/kernel=None,model", "--layout", "dense_0/bias=model",
               "--layout", "dense_1/kernel=model,None")


@pytest.fixture(scope="module")
def digits_mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """scikit-learn's MLPClassifier (64-32-10) fitted on the digits, exported by skl2onnx; 16 rows of digits."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 30 iterations do not converge: they need not
        mlp = MLPClassifier(hidden_layer_sizes=(32,), max_iter=30, random_state=0).fit(x, y)
    proto = skl2onnx.to_onnx(mlp, x[:1], options={MLPClassifier: {"zipmap": False}},
                             target_opset={"": 17, "ai.onnx.ml": 3})
    path = tmp_path_factory.mktemp("sklearn") / "digits_mlp.onnx"
    path.write_bytes(proto.SerializeToString())
    return path, x[100:116]


def _onnxruntime(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"X": x})))


def _run_and_compare(plan: Path, inputs: Path, want: dict[str, np.ndarray], tmp_path: Path) -> None:
    out = tmp_path / f"{plan.name}_out.npz"
    run = graphdist("run", str(plan), "--inputs", str(inputs), "-o", str(out))
    assert run.returncode == 0, run.stderr
    with np.load(out) as got:
        assert sorted(got.files) == sorted(want), got.files  # the model's own output names, after a re-plan too
        np.testing.assert_array_equal(got["label"], want["label"])
        np.testing.assert_allclose(got["probabilities"], want["probabilities"], rtol=1e-5, atol=1e-6)


def test_onnx_mlp_tensor_parallel_inference_equals_onnxruntime_and_replans(digits_mlp, tmp_path: Path) -> None:
    path, x = digits_mlp
    inputs = tmp_path / "x.npz"
    np.savez(inputs, X=x)
    want = _onnxruntime(path, x)
    plan = tmp_path / "tp"
    result = graphdist("export", str(path), "--strategy", "model_parallel", "--devices", FOUR,
                       "--mesh", "batch=2,model=2", *SKLEARN_LAYOUTS, "--batch-dim-name", "batch", "--batch", "16",
                       "-o", str(plan))
    assert result.returncode == 0, result.stderr
    assert "model-parallel inference" in result.stdout and "4 variable(s)" in result.stdout  # initializers
    assert "WARNING" not in result.stderr, result.stderr
    _run_and_compare(plan, inputs, want, tmp_path)

    summary = graphdist("inspect", str(path), "--devices", FOUR, "--mesh", "batch=2,model=2", *SKLEARN_LAYOUTS,
                        "--batch", "16", "--stage", "rewritten")
    assert summary.returncode == 0, summary.stderr
    rows = {line.split()[0]: line for line in summary.stdout.splitlines() if line.strip().startswith("%coef")}
    assert "[-, model]" in rows["%coefficient"] and "[64x16]" in rows["%coefficient"]
    assert "[model, -]" in rows["%coefficient1"] and "[16x10]" in rows["%coefficient1"]
    # One all-reduce of the second layer's partial sums per batch group, over the model axis.
    assert len(re.findall(r"graphdist\.AllReduce\s+SUM", summary.stdout)) == 2, summary.stdout

    for name, strategy in (("mesh12", ("--mesh", "batch=1,model=2", *SKLEARN_LAYOUTS)),
                           ("mirrored", ("--strategy", "mirrored", "--devices", "cpu:0,cpu:1"))):
        replanned = tmp_path / name
        result = graphdist("replan", str(plan), *strategy, "-o", str(replanned))
        assert result.returncode == 0, result.stderr
        _run_and_compare(replanned, inputs, want, tmp_path)


def test_paddle_ocr_classifier_with_split_convolutions_and_matmul_equals_onnxruntime(tmp_path: Path) -> None:
    """PaddleOCR's text-direction classifier (Paddle2ONNX, from the rapidocr_onnxruntime wheel): its weights are
    ``Constant`` nodes, which ``gd.onnx.load`` makes variables named by their outputs; two convolutions split by
    output channels and the final MatMul by rows (a partial sum) over ``model``, the batch over ``batch``.
    """
    path = model_path("ppocr_cls")
    plan, inputs, outputs = tmp_path / "plan", tmp_path / "x.npz", tmp_path / "y.npz"
    flags = ("--mesh", "batch=2,model=2", "--layout", r"^fc_0\.w_0$=model,None",
             "--layout", "^conv1_weights$=model,None,None,None",
             "--layout", "^conv12_expand_weights$=model,None,None,None", "--input-shape", "x=4x3x48x192")
    summary = graphdist("inspect", str(path), *flags, "--stage", "rewritten").stdout
    for row in (r"%fc_0\.w_0\s+float32\[200,2\]\s+\[model, -\]\s+\[100x2\]",
                r"%conv1_weights\s+float32\[8,3,3,3\]\s+\[model, -, -, -\]\s+\[4x3x3x3\]"):
        assert re.search(row, summary), row
    assert len(re.findall(r"graphdist\.AllReduce\s+SUM", summary)) == 2  # the MatMul's partial sums, per batch group
    result = graphdist("export", str(path), *flags, "-o", str(plan))
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    x = np.random.default_rng(3).standard_normal((4, 3, 48, 192)).astype(np.float32)
    np.savez(inputs, x=x)
    run = graphdist("run", str(plan), "--inputs", str(inputs), "-o", str(outputs))
    assert run.returncode == 0, run.stderr
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": x})
    with np.load(outputs) as got:
        np.testing.assert_allclose(got[session.get_outputs()[0].name], want, rtol=1e-5, atol=1e-6)


def test_onnx_fsdp_inference_equals_onnxruntime(digits_mlp, tmp_path: Path) -> None:
    path, x = digits_mlp
    plan, inputs = tmp_path / "fsdp", tmp_path / "x.npz"
    np.savez(inputs, X=x)
    result = graphdist("export", str(path), "--mesh", "batch=2", "--layout", "^coefficient1?$=batch,None",
                       "--batch", "16", "-o", str(plan))
    assert result.returncode == 0, result.stderr
    _run_and_compare(plan, inputs, _onnxruntime(path, x), tmp_path)


def test_onnx_target_with_input_shape_under_a_mesh_equals_onnxruntime(tmp_path: Path) -> None:
    from tests.cli.test_cli_onnx import symbolic_model

    path = symbolic_model(tmp_path / "seq.onnx")  # x[N, S, 4] @ w[4, 3], Relu
    plan, inputs, outputs = tmp_path / "plan", tmp_path / "x.npz", tmp_path / "y.npz"
    result = graphdist("export", str(path), *MESH, "--layout", "^w$=model,None", "--input-shape", "x=4x5x4",
                       "-o", str(plan))
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(2).standard_normal((4, 5, 4)).astype(np.float32)
    np.savez(inputs, x=x)
    assert graphdist("run", str(plan), "--inputs", str(inputs), "-o", str(outputs)).returncode == 0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with np.load(outputs) as got:
        np.testing.assert_allclose(got["y"], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert_clean_failure(graphdist("inspect", str(path), *MESH, "--layout", "^w$=None,model", "--input-shape",
                                   "x=4x5x4"),
                         "--layout does not fit a variable", "'w': dimension 1 (size 3) is not divisible")


def _losses(stdout: str) -> list[float]:
    return [float(v) for v in re.findall(r"^step \d+: out0 = (\S+)$", stdout, re.MULTILINE)]


def test_training_step_under_a_mesh_equals_one_device(tmp_path: Path) -> None:
    inputs = tmp_path / "batch.npz"
    one = tmp_path / "one"
    assert graphdist("export", MLP_STEP, "--strategy", "one_device", "-o", str(one),
                     "--save-inputs", str(inputs)).returncode == 0
    tp = tmp_path / "tp"  # two batch groups of two devices: the batch split, each group's weights split
    result = graphdist("export", MLP_STEP, "--mesh", "batch=2,model=2", "--devices", FOUR, *MLP_LAYOUTS,
                       "-o", str(tp))
    assert result.returncode == 0, result.stderr
    assert "ModelParallelStrategy(mesh=(2, 2)" in result.stdout
    replanned = tmp_path / "replanned"  # the one-device plan re-planned onto a mesh: no Python code needed
    result = graphdist("replan", str(one), "--strategy", "model_parallel", "--mesh", "batch=1,model=2",
                       *MLP_LAYOUTS, "-o", str(replanned))
    assert result.returncode == 0, result.stderr
    mirrored, fsdp = tmp_path / "mirrored", tmp_path / "fsdp"  # a 2-replica plan re-planned onto FSDP weights
    assert graphdist("export", MLP_STEP, "--strategy", "mirrored", "--devices", "cpu:0,cpu:1",
                     "-o", str(mirrored)).returncode == 0
    result = graphdist("replan", str(mirrored), "--mesh", "batch=2", "--devices", "cpu:0,cpu:1", "--layout",
                       "kernel=batch,None", "--layout", "bias=batch", "-o", str(fsdp))
    assert result.returncode == 0, result.stderr
    assert "AllGather" in graphdist("inspect", str(fsdp), "--stage", "rewritten").stdout
    runs = {}
    for plan in (one, tp, replanned, fsdp):
        run = graphdist("run", str(plan), "--inputs", str(inputs), "--steps", "3", "--save")
        assert run.returncode == 0, run.stderr
        runs[plan.name] = (_losses(run.stdout), gd.load_plan(str(plan)).variables)
    want_losses, want_weights = runs["one"]
    assert len(want_losses) == 3 and want_losses[0] > want_losses[2]
    for name in ("tp", "replanned", "fsdp"):
        losses, weights = runs[name]
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5, err_msg=name)
        assert sorted(weights) == sorted(want_weights)
        for key, value in want_weights.items():
            np.testing.assert_allclose(weights[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} {key}")
    summary = graphdist("inspect", MLP_STEP, *MESH, *MLP_LAYOUTS, "--stage", "rewritten").stdout
    assert re.search(r"%mlp/dense_0/kernel\s+float32\[64,32\]\s+\[-, model\]\s+\[64x16\]", summary), summary


@pytest.mark.parametrize(("extra", "phrases"), [
    (("--mesh", "batch2"), ("--mesh 'batch2'", "is not AXIS=SIZE", "--mesh batch=1,model=2")),
    (("--mesh", "batch=0"), ("size of axis 'batch' must be a positive integer",)),
    (("--mesh", "batch=1,batch=2"), ("names axis 'batch' twice",)),
    (("--mesh", "batch=2,model=2", "--devices", "cpu:0,cpu:1"),
     ("--mesh batch=2,model=2 needs 4 devices", "more devices than --devices lists (2", "list 4 devices")),
    ((*MESH, "--devices", "cpu:0,cpu:0"), ("--mesh batch=1,model=2", "lists cpu:0 more than once")),
    ((*MESH, "--devices", "cuda:0,cuda:1"), ("--mesh batch=1,model=2", "'cuda:0' is not available")),
    ((*MESH, "--layout", "dense_0/kernel=None,modl"),
     ("--layout 'dense_0/kernel=None,modl' names 'modl'", "not an axis of --mesh", "batch, model")),
    ((*MESH, "--layout", "dense_0/kernel"), ("is not PATTERN=AXES", "dense.*kernel=None,model")),
    ((*MESH, "--layout", "dense_0/kernel=None,,model"), ("an empty entry",)),
    ((*MESH, "--layout", "(=model"), ("is not a regular expression",)),
    ((*MESH, "--layout", "x=model", "--layout", "x=None"), ("gives pattern 'x' twice",)),
    ((*MESH, "--layout", "x=model,model"), ("uses a mesh axis on two dimensions",)),
    ((*MESH, "--layout", "dense_0/kernel=model"),
     ("--layout does not fit", "'mlp/dense_0/kernel' has rank 2", "1 entries")),
    (("--mesh", "batch=1,model=3", "--layout", "dense_0/kernel=None,model"),
     ("--layout does not fit", "dimension 1 (size 32) is not divisible by mesh axis 'model' (size 3)")),
    ((*MESH, "--layout", "dense_0=None,model", "--layout", "kernel=None,model"),
     ("--layout does not fit", "'mlp/dense_0/kernel' matches several LayoutMap patterns (dense_0, kernel)")),
    ((*MESH, "--batch-dim-name", "data"), ("--batch-dim-name 'data' is not an axis of --mesh", "batch, model")),
    (("--strategy", "mirrored", *MESH), ("--mesh applies to --strategy model_parallel only",)),
    (("--strategy", "model_parallel"), ("needs --mesh AXIS=SIZE",)),
])
def test_mesh_flag_errors_name_the_flag_and_the_fix(extra: tuple[str, ...], phrases: tuple[str, ...]) -> None:
    assert_clean_failure(graphdist("inspect", MLP_STEP, *extra), *phrases)


def test_fsdp_and_tensor_parallel_on_one_variable_is_a_clear_failure() -> None:
    result = graphdist("inspect", MLP_STEP, "--mesh", "batch=2,model=2", "--layout", "dense_0/kernel=batch,model")
    assert_clean_failure(result, "are not combined on one variable yet", status=1)


def test_a_pattern_matching_no_variable_warns(digits_mlp, tmp_path: Path) -> None:
    path, _ = digits_mlp
    result = graphdist("inspect", str(path), *MESH, "--layout", "^kernel$=None,model", "--batch", "4")
    assert result.returncode == 0, result.stderr
    assert "pattern '^kernel$' matches none of the 4 variable(s)" in result.stderr
    assert "coefficient" in result.stderr  # the names to match, listed
    data_parallel = tmp_path / "dp"  # exported for inference under mirrored: its weights are constants
    assert graphdist("export", str(path), "--strategy", "mirrored", "--devices", "cpu:0,cpu:1",
                     "-o", str(data_parallel)).returncode == 0
    result = graphdist("replan", str(data_parallel), *MESH, *SKLEARN_LAYOUTS, "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "matches none of the 0 variable(s)" in result.stderr and "export it with --strategy model_parallel" \
        in result.stderr


def test_replan_checks_layouts_against_the_plans_variables(tmp_path: Path) -> None:
    plan = tmp_path / "one"
    assert graphdist("export", MLP_STEP, "--strategy", "one_device", "-o", str(plan)).returncode == 0
    out = str(tmp_path / "out")
    assert_clean_failure(graphdist("replan", str(plan), *MESH, "--layout", "dense_0/kernel=model", "-o", out),
                         "--layout dense_0/kernel=model", "'mlp/dense_0/kernel' has rank 2")
    assert_clean_failure(graphdist("replan", str(plan), "--mesh", "batch=1,model=3", "--layout",
                                   "dense_1/kernel=None,model", "-o", out),
                         "dimension 1 of variable 'mlp/dense_1/kernel' (size 10) is not divisible")
    assert_clean_failure(graphdist("replan", str(plan), "-o", out), "--strategy (or --mesh")
    assert_clean_failure(graphdist("inspect", str(plan), *MESH), "already planned", "--mesh")


def test_flag_values_parse_to_keras_names() -> None:
    from graphdist.cli.mesh import parse_layout, parse_mesh

    assert parse_mesh(" batch=2, model=4 ") == (("batch", "model"), (2, 4))
    assert parse_layout("dense.*kernel=None,model", ("batch", "model")) == ("dense.*kernel", (None, "model"))
    assert parse_layout("bias=model", ("batch", "model")) == ("bias", ("model",))
    # A regular expression may hold '=' (a lookahead): the axes follow the last one.
    assert parse_layout("(?=dense)\\w+/kernel=none,model", ("model",)) == ("(?=dense)\\w+/kernel", (None, "model"))
