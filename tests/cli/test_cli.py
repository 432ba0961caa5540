"""The ``graphdist`` command line, run as a subprocess (``python -m graphdist.cli.main``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphdist as gd

REPO = Path(__file__).resolve().parents[2]
#: The repository's MLP model, as a CLI target.
MLP_STEP, MLP_FORWARD = "graphdist.models.mlp:make_step", "graphdist.models.mlp:forward"


def graphdist(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "graphdist.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def assert_clean_failure(result: subprocess.CompletedProcess[str], *phrases: str, status: int = 2) -> None:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines, "no error message on stderr"
    assert lines[-1].startswith("graphdist: error: "), result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, (phrase, result.stderr)


# ---------------------------------------------------------------- help
def test_main_help_lists_subcommands_with_examples() -> None:
    result = graphdist("--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for command in ("devices", "inspect", "export", "run"):
        assert f"    {command} " in out, command
    assert "list the devices" in out and "print a traced function's graph" in out
    assert "write its plan directory" in out and "run an exported plan directory" in out
    assert "examples:" in out and "graphdist inspect graphdist.models.mlp:forward" in out
    assert "graphdist run mlp_plan --inputs mlp_inputs.npz --steps 3" in out
    assert "    launch " in out and "start a multi-process job" in out
    assert "    bench " in out and "time a compiled step" in out


@pytest.mark.parametrize(("command", "example"), [
    ("devices", "graphdist devices"),
    ("inspect", "graphdist inspect graphdist.models.mlp:forward --format onnx -o mlp.onnx"),
    ("inspect", "graphdist inspect graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1"
                " --stage diff"),
    ("export", "graphdist export graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 -o mlp_plan"),
    ("run", "graphdist run mlp_plan --inputs mlp_inputs.npz --steps 5 --save"),
])
def test_subcommand_help_has_example(command: str, example: str) -> None:
    result = graphdist(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "example" in result.stdout and example in result.stdout


def test_no_command_is_a_usage_error() -> None:
    assert_clean_failure(graphdist(), "no command given")


def test_unknown_command_is_a_usage_error() -> None:
    assert_clean_failure(graphdist("frobnicate"), "invalid choice", "frobnicate")


# ------------------------------------------------------------- devices
def test_devices_lists_cpu0_cores_and_backends() -> None:
    result = graphdist("devices")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "cpu:0" in out
    assert "host cores:" in out
    assert "ort" in out and "reference" in out
    assert "default backend:" in out


# ------------------------------------------------------------- inspect
def test_inspect_module_function_prints_traced_graph() -> None:
    result = graphdist("inspect", MLP_FORWARD)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "stage=traced" in out
    assert "MatMul" in out and "Max" in out
    assert "float32[8,64]" in out and "float32[64,32]" in out and "float32[8,10]" in out


@pytest.mark.parametrize("stage", ["rewritten", "partitioned"])
def test_inspect_later_stages_show_placement(stage: str) -> None:
    result = graphdist("inspect", MLP_FORWARD, "--stage", stage, "--backend", "reference")
    assert result.returncode == 0, result.stderr
    assert f"stage={stage}" in result.stdout
    assert "cpu:0" in result.stdout and "MatMul" in result.stdout


def test_inspect_writes_onnx_and_reads_it_back(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    result = graphdist("inspect", MLP_FORWARD, "--format", "onnx", "-o", str(path))
    assert result.returncode == 0, result.stderr
    assert str(path) in result.stdout
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)

    back = graphdist("inspect", str(path))
    assert back.returncode == 0, back.stderr
    assert "stage=traced" in back.stdout
    assert "MatMul x2" in back.stdout and "float32[8,10]" in back.stdout


def test_inspect_uses_function_example_inputs_from_cwd(tmp_path: Path) -> None:
    (tmp_path / "user_step.py").write_text(
        "import numpy as np\n"
        "def step(x):\n"
        "    return np.tanh(x) * 2\n"
        "step.example_inputs = lambda: (np.ones((3, 5), np.float32),)\n"
    )
    result = graphdist("inspect", "user_step:step", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Tanh" in result.stdout and "float32[3,5]" in result.stdout


# ------------------------------------------------------------ failures
def test_bad_target_form() -> None:
    assert_clean_failure(graphdist("inspect", "graphdist.models.mlp"), "module:function", ".onnx")


def test_missing_module() -> None:
    assert_clean_failure(graphdist("inspect", "no_such_module_xyz:forward"), "cannot import module",
                         "no_such_module_xyz")


def test_missing_attribute() -> None:
    assert_clean_failure(graphdist("inspect", "graphdist.models.mlp:no_such_fn"), "no attribute 'no_such_fn'",
                         "forward")


def test_missing_example_inputs(tmp_path: Path) -> None:
    (tmp_path / "bare.py").write_text("def f(x):\n    return x\n")
    assert_clean_failure(graphdist("inspect", "bare:f", cwd=tmp_path), "no example inputs", "example_inputs()")


def test_corrupt_onnx_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07this is not an onnx model\xff\xfe")
    assert_clean_failure(graphdist("inspect", str(path)), "cannot read", "broken.onnx")


def test_missing_onnx_file(tmp_path: Path) -> None:
    assert_clean_failure(graphdist("inspect", str(tmp_path / "absent.onnx")), "does not exist")


def test_unknown_stage() -> None:
    assert_clean_failure(graphdist("inspect", MLP_FORWARD, "--stage", "lowered"), "--stage", "lowered",
                         "traced")


def test_onnx_format_needs_output() -> None:
    assert_clean_failure(graphdist("inspect", MLP_FORWARD, "--format", "onnx"), "-o PATH")


def test_tracing_error_exits_1_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "untraceable.py").write_text(
        "import numpy as np\n"
        "def f(x):\n"
        "    return np.linalg.svd(x)\n"
        "def example_inputs():\n"
        "    return (np.ones((3, 3), np.float32),)\n"
    )
    assert_clean_failure(graphdist("inspect", "untraceable:f", cwd=tmp_path), "TracingError", "svd", status=1)


# ------------------------------------------------- inspect: strategies, stages, formats
MIRRORED = ("--strategy", "mirrored", "--devices", "cpu:0,cpu:1")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (apt-get install -y graphviz; "
                                      "`make test` installs it)")


def test_inspect_training_step_under_mirrored_rewritten() -> None:
    result = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "rewritten")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("Graph 'mlp_train_step'  stage=rewritten")
    # each gradient (and the loss) summed on the replica that reads it: no all-reduce, 5 sums
    assert "ops per device:" in out and "Sum x5" in out and "graphdist.AllReduce" not in out
    assert "summed on the reader (5 group(s) read by one replica, no all-reduce):" in out and "8,192 B" in out
    assert "mirrored on cpu:0, cpu:1" in out and "%arg0_r1: float32[8,64]" in out


def test_inspect_plan_stage() -> None:
    result = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("Plan 'mlp_train_step': 4 segment(s) on cpu:0, cpu:1")
    for title in ("devices:", "segments (execution order):", "communication:", "variables (5, 9,648 B):"):
        assert f"\n{title}\n" in out, title
    assert "per step: 5 task(s), 9,644 B into collectives" in out  # 5 transfers: each gradient sent once
    assert "summed on the reader (5 group(s)" in out


def test_inspect_diff_stage() -> None:
    result = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "diff")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("passes of MirroredStrategy on cpu:0, cpu:1 for 'mlp_train_step'")
    for name in ("AutodiffPass", "LowerVariableUpdatesPass", "LowerCollectivesPass", "AssignDevicesPass",
                 "PartitionPass"):
        assert name in out
    assert "-graphdist.Gradient x1" in out  # traced once: one Gradient node
    assert "+graphdist.AllReduce x10" in out  # InsertCollectivesPass: (4 gradients + the loss) x 2 replicas
    assert "LowerSingleReaderAllReducesPass" in out and "-graphdist.AllReduce x10" in out  # summed at the readers


def test_inspect_central_storage_and_one_device() -> None:
    central = graphdist("inspect", MLP_STEP, "--strategy", "central_storage", "--devices",
                        "cpu:0,cpu:1", "--stage", "plan")
    assert central.returncode == 0, central.stderr
    assert "Transfer" in central.stdout and "cpu:0 -> cpu:1" in central.stdout
    assert "reduce_to_one" in central.stdout
    one = graphdist("inspect", MLP_STEP, "--strategy", "OneDeviceStrategy", "--devices", "cpu:1",
                    "--stage", "plan")
    assert one.returncode == 0, one.stderr
    assert "1 segment(s) on cpu:1" in one.stdout and "communication: none" in one.stdout


def test_inspect_plain_function_under_a_strategy_splits_the_batch() -> None:
    result = graphdist("inspect", MLP_FORWARD, *MIRRORED, "--stage", "partitioned")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "%arg0_r0: float32[4,64]" in out and "%arg0_r1: float32[4,64]" in out
    devices = out.split("ops per device:")[1].split("inputs:")[0]
    assert "cpu0.p0" in devices and "cpu1.p0" in devices
    assert "stage=partitioned" in out and "MatMul" in out


@needs_dot
def test_inspect_dot_output_renders_with_graphviz(tmp_path: Path) -> None:
    for stage in ("partitioned", "plan"):
        result = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", stage, "--format", "dot")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("digraph ")
        assert "subgraph cluster_0" in result.stdout and "subgraph cluster_1" in result.stdout
        rendered = subprocess.run(["dot", "-Tsvg"], input=result.stdout, capture_output=True, text=True,
                                  timeout=60)
        assert rendered.returncode == 0, rendered.stderr
        assert ET.fromstring(rendered.stdout).tag.endswith("svg")


@needs_dot
def test_inspect_writes_pictures(tmp_path: Path) -> None:
    svg = tmp_path / "mlp.svg"
    result = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "partitioned", "-o", str(svg))
    assert result.returncode == 0, result.stderr
    assert re.search(rf"wrote {re.escape(str(svg))} \(svg, \d+ nodes, stage partitioned\)", result.stdout)
    data = svg.read_text()
    assert ET.fromstring(data).tag.endswith("svg") and "cpu:1" in data and "Sum" in data
    png = tmp_path / "plan.png"
    result = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "plan", "--format", "png",
                       "-o", str(png))
    assert result.returncode == 0, result.stderr
    assert png.read_bytes().startswith(b"\x89PNG")


def test_inspect_rewritten_onnx_declares_the_graphdist_domain(tmp_path: Path) -> None:
    path = tmp_path / "rewritten.onnx"
    result = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "rewritten", "-o", str(path))
    assert result.returncode == 0, result.stderr
    assert "opsets ai.onnx, graphdist" in result.stdout
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain: o.version for o in model.opset_import}["graphdist"] == 1
    assert sum(n.op_type == "Sum" for n in model.graph.node) == 5  # the gradients and the loss, at their readers
    assert not [n for n in model.graph.node if n.op_type == "AllReduce"]
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["graphdist.stage"] == "rewritten" and meta["graphdist.strategy"] == "MirroredStrategy"


def test_inspect_onnx_file_as_data_parallel_inference(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    assert graphdist("inspect", MLP_FORWARD, "-o", str(path)).returncode == 0  # format from the suffix
    result = graphdist("inspect", str(path), *MIRRORED, "--batch", "16", "--stage", "plan")
    assert result.returncode == 0, result.stderr
    assert "2 segment(s) on cpu:0, cpu:1" in result.stdout and "AllGather" in result.stdout
    rewritten = graphdist("inspect", str(path), *MIRRORED, "--batch", "16", "--stage", "rewritten")
    assert "%arg0_r0: float32[8,64]" in rewritten.stdout and "%arg0_r1: float32[8,64]" in rewritten.stdout
    assert "graphdist.AllGather" in rewritten.stdout and "float32[16,10]" in rewritten.stdout


def test_inspect_factory_convention_in_user_module(tmp_path: Path) -> None:
    (tmp_path / "user_train.py").write_text(
        "import numpy as np\n"
        "import graphdist as gd\n"
        "def build(strategy, batch=4):\n"
        "    with strategy.scope():\n"
        "        w = gd.Variable(np.ones((3, 2), np.float32), name='w')\n"
        "    @gd.function\n"
        "    def step(x):\n"
        "        return strategy.reduce('SUM', strategy.run(lambda v: (v @ w).sum(), args=(x,)), axis=None)\n"
        "    return step, (np.ones((batch, 3), np.float32),)\n"
    )
    result = graphdist("inspect", "user_train:build", *MIRRORED, "--batch", "6", "--stage", "plan", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "on cpu:0, cpu:1" in result.stdout and "w  " in result.stdout
    # A plain array reaches both replicas whole (as in tf.distribute): the CLI says so and how to split it.
    assert "argument(s) 0" in result.stderr and "each of the 2 replicas the whole array" in result.stderr
    assert "experimental_distribute_dataset" in result.stderr


def test_factory_with_distributed_examples_does_not_warn(tmp_path: Path) -> None:
    (tmp_path / "user_split.py").write_text(
        "import numpy as np\n"
        "import graphdist as gd\n"
        "def build(strategy):\n"
        "    @gd.function\n"
        "    def step(x):\n"
        "        return strategy.reduce('SUM', strategy.run(lambda v: v.sum(), args=(x,)), axis=None)\n"
        "    data = gd.data.Dataset.from_tensors(np.ones((4, 3), np.float32))\n"
        "    return step, (next(iter(strategy.experimental_distribute_dataset(data))),)\n"
    )
    result = graphdist("inspect", "user_split:build", *MIRRORED, "--stage", "plan", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "whole array" not in result.stderr and "on cpu:0, cpu:1" in result.stdout


# ------------------------------------------------------------ inspect: failures
@pytest.mark.parametrize(("extra", "phrases"), [
    (("--strategy", "foo"), ("unknown strategy 'foo'", "one_device, mirrored, central_storage")),
    (("--strategy", "parameter_server"), ("unknown strategy 'parameter_server'", "graphdist launch")),
    (("--strategy", "ModelParallelStrategy"), ("needs --mesh AXIS=SIZE,...", "--layout PATTERN=AXES")),
    (("--strategy", "one_device", "--devices", "cpu:0,cpu:1"), ("one_device runs on one device",)),
    (("--strategy", "mirrored", "--devices", "cuda:7"), ("cannot create mirrored strategy", "cuda:7")),
    (("--strategy", "mirrored", "--devices", ","), ("names no device",)),
    (("--stage", "diff", "--format", "dot"), ("--stage diff is a text report",)),
    (("--stage", "plan", "--format", "onnx", "-o", "x.onnx"), ("graphdist export",)),
    (("--format", "svg"), ("-o PATH", "graph.svg")),
    (("--stage", "lowered"), ("invalid choice: 'lowered'", "plan", "diff")),
])
def test_inspect_usage_errors(extra: tuple[str, ...], phrases: tuple[str, ...]) -> None:
    assert_clean_failure(graphdist("inspect", MLP_STEP, *extra), *phrases)


def test_inspect_picture_without_graphviz(tmp_path: Path) -> None:
    env = dict(os.environ, GRAPHDIST_DOT=str(tmp_path / "no-dot"))
    result = subprocess.run([sys.executable, "-m", "graphdist.cli.main", "inspect", MLP_FORWARD, "-o",
                             str(tmp_path / "g.svg")], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert_clean_failure(result, "needs Graphviz's 'dot'", "apt-get install -y graphviz", "--format dot")


def test_factory_errors(tmp_path: Path) -> None:
    (tmp_path / "factories.py").write_text(
        "def make_step_bad(strategy):\n"
        "    return 42\n"
        "def make_step_raises(strategy):\n"
        "    raise RuntimeError('boom')\n"
    )
    assert_clean_failure(graphdist("inspect", "factories:make_step_bad", cwd=tmp_path), "(step_fn, example_args)")
    assert_clean_failure(graphdist("inspect", "factories:make_step_raises", cwd=tmp_path), "RuntimeError: boom",
                         status=1)
    assert_clean_failure(graphdist("inspect", "factories:make_step_bad", "--batch", "4", cwd=tmp_path),
                         "takes no 'batch' argument")


def test_onnx_target_errors(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    assert graphdist("inspect", MLP_FORWARD, "-o", str(path)).returncode == 0
    assert_clean_failure(graphdist("inspect", str(path), *MIRRORED, "--batch", "7"), "multiple of the number of "
                         "replicas")


# ------------------------------------------------------------------ export / run
def test_export_and_run_the_mirrored_training_step(tmp_path: Path) -> None:
    plan_dir, inputs = tmp_path / "mlp_plan", tmp_path / "inputs.npz"
    result = graphdist("export", MLP_STEP, *MIRRORED, "-o", str(plan_dir), "--save-inputs",
                       str(inputs))
    assert result.returncode == 0, result.stderr
    assert "exported mlp_train_step (graphdist.models.mlp:make_step under MirroredStrategy" in result.stdout
    assert ("4 segment(s) on cpu:0, cpu:1, 5 communication task(s) and 2 run-time check(s), 5 variable(s)"
            in result.stdout)
    assert f"graphdist run {plan_dir} --inputs {inputs}" in result.stdout
    assert (plan_dir / "plan.json").is_file()
    with np.load(inputs) as data:
        assert {k: (data[k].dtype, data[k].shape) for k in data.files} == {
            "arg0": (np.float32, (16, 64)), "arg1": (np.int64, (16,))}

    outputs = tmp_path / "out.npz"
    run = graphdist("run", str(plan_dir), "--inputs", str(inputs), "--steps", "3", "-o", str(outputs), "--save")
    assert run.returncode == 0, run.stderr
    losses = [float(line.split("= ")[1]) for line in run.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]
    # the same three steps in this process, from the same initial weights
    from graphdist.models.mlp import make_step

    step, args = make_step(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    np.testing.assert_allclose(losses, [float(step(*args)) for _ in range(3)], rtol=1e-5)
    with np.load(outputs) as data:
        assert data.files == ["out0"] and float(data["out0"]) == pytest.approx(losses[-1], rel=1e-5)
    # --save wrote the updated variables: the next run continues from step 4
    again = graphdist("run", str(plan_dir), "--inputs", str(inputs))
    assert again.returncode == 0, again.stderr
    fourth = float(again.stdout.splitlines()[-1].split("= ")[1])
    assert fourth == pytest.approx(float(step(*args)), rel=1e-5)


def test_export_onnx_inference_and_run(tmp_path: Path) -> None:
    model_path, plan_dir, inputs = tmp_path / "mlp.onnx", tmp_path / "plan", tmp_path / "x.npz"
    assert graphdist("inspect", MLP_FORWARD, "-o", str(model_path)).returncode == 0
    result = graphdist("export", str(model_path), *MIRRORED, "--batch", "8", "-o", str(plan_dir))
    assert result.returncode == 0, result.stderr
    assert "FILE.npz" in result.stdout
    from graphdist.models.mlp import reference_forward

    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    np.savez(inputs, x)  # numpy's default name arr_0 is accepted
    outputs = tmp_path / "y.npz"
    run = graphdist("run", str(plan_dir), "--inputs", str(inputs), "-o", str(outputs))
    assert run.returncode == 0, run.stderr
    assert "step 1: add_5 = float32[8,10]" in run.stdout  # the model's own output name
    with np.load(outputs) as data:
        np.testing.assert_allclose(data["add_5"], reference_forward(x), rtol=1e-5, atol=1e-5)


def test_export_failures(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    assert_clean_failure(graphdist("export", MLP_STEP, "-o", str(taken)), "not empty", "--overwrite")
    assert_clean_failure(graphdist("export", MLP_STEP, "-o", str(tmp_path / "a" / "b")),
                         "does not exist")
    assert_clean_failure(graphdist("export", MLP_STEP), "-o/--output")
    assert_clean_failure(graphdist("export", "graphdist.models.mlp", "-o", str(tmp_path / "p")), "module:function")
    assert_clean_failure(graphdist("export", MLP_STEP, "--strategy", "nope", "-o",
                                   str(tmp_path / "p")), "unknown strategy 'nope'")
    assert_clean_failure(graphdist("export", str(tmp_path / "absent.onnx"), "-o", str(tmp_path / "p")),
                         "does not exist")
    assert not (tmp_path / "p").exists()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("exported")
    plan_dir, inputs = root / "plan", root / "inputs.npz"
    result = graphdist("export", MLP_STEP, *MIRRORED, "-o", str(plan_dir), "--save-inputs", str(inputs))
    assert result.returncode == 0, result.stderr
    return plan_dir, inputs


def test_run_failures(exported: tuple[Path, Path], tmp_path: Path) -> None:
    plan_dir, inputs = exported
    assert_clean_failure(graphdist("run", str(tmp_path / "absent"), "--inputs", str(inputs)), "does not exist",
                         "graphdist export")
    assert_clean_failure(graphdist("run", str(tmp_path), "--inputs", str(inputs)), "cannot load plan")
    assert_clean_failure(graphdist("run", str(plan_dir), "--inputs", str(tmp_path / "absent.npz")),
                         "does not exist", "numpy.savez")
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip")
    assert_clean_failure(graphdist("run", str(plan_dir), "--inputs", str(corrupt)), "cannot read", "corrupt.npz")
    one = tmp_path / "one.npz"
    np.savez(one, arg0=np.ones((16, 64), np.float32))
    assert_clean_failure(graphdist("run", str(plan_dir), "--inputs", str(one)), "holds 1 array(s)",
                         "arg1: int64[16]", "global batch")
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, arg0=np.ones((16, 63), np.float32), arg1=np.zeros(16, np.int64))
    assert_clean_failure(graphdist("run", str(plan_dir), "--inputs", str(wrong)), "do not fit the plan")
    assert_clean_failure(graphdist("run", str(plan_dir), "--inputs", str(inputs), "--steps", "0"),
                         "--steps must be at least 1")
    assert_clean_failure(graphdist("run", str(plan_dir)), "--inputs")


def test_run_rejects_a_tampered_plan(exported: tuple[Path, Path], tmp_path: Path) -> None:
    plan_dir, inputs = exported
    copy = tmp_path / "copy"
    shutil.copytree(plan_dir, copy)
    (copy / "plan.json").write_text("{ not json")
    assert_clean_failure(graphdist("run", str(copy), "--inputs", str(inputs)), "cannot load plan", "plan.json")


def test_readme_shows_the_real_output() -> None:
    readme = (REPO / "docs" / "plans-and-cli.md").read_text()  # the README's "Inspecting plans", moved
    plan = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "plan")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout in readme
    rewritten = graphdist("inspect", MLP_STEP, *MIRRORED, "--stage", "rewritten")
    assert rewritten.stdout.split("\ninputs:")[0] in readme
    for picture in ("docs/mlp_mirrored.svg", "docs/mlp_mirrored_plan.svg"):
        assert f"]({picture.removeprefix('docs/')})" in readme
        assert ET.parse(REPO / picture).getroot().tag.endswith("svg")
