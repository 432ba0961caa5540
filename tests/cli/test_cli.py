"""The ``graphdist`` command line, run as a subprocess (``python -m graphdist.cli.main``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

REPO = Path(__file__).resolve().parents[2]


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
    assert "devices" in out and "inspect" in out
    assert "list the devices" in out and "print a traced function's graph" in out
    assert "examples:" in out and "graphdist inspect models.mlp:forward" in out
    for later in ("export", "launch", "bench"):
        assert f"    {later} " not in out  # no stubs for later subcommands


@pytest.mark.parametrize(("command", "example"), [
    ("devices", "graphdist devices"),
    ("inspect", "graphdist inspect models.mlp:forward --format onnx -o mlp.onnx"),
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
    result = graphdist("inspect", "models.mlp:forward")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "stage=traced" in out
    assert "MatMul" in out and "Max" in out
    assert "float32[8,64]" in out and "float32[64,32]" in out and "float32[8,10]" in out


@pytest.mark.parametrize("stage", ["rewritten", "partitioned"])
def test_inspect_later_stages_show_placement(stage: str) -> None:
    result = graphdist("inspect", "models.mlp:forward", "--stage", stage, "--backend", "reference")
    assert result.returncode == 0, result.stderr
    assert f"stage={stage}" in result.stdout
    assert "cpu:0" in result.stdout and "MatMul" in result.stdout


def test_inspect_writes_onnx_and_reads_it_back(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    result = graphdist("inspect", "models.mlp:forward", "--format", "onnx", "-o", str(path))
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
    assert_clean_failure(graphdist("inspect", "models.mlp"), "module:function", ".onnx")


def test_missing_module() -> None:
    assert_clean_failure(graphdist("inspect", "no_such_module_xyz:forward"), "cannot import module",
                         "no_such_module_xyz")


def test_missing_attribute() -> None:
    assert_clean_failure(graphdist("inspect", "models.mlp:no_such_fn"), "no attribute 'no_such_fn'", "forward")


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
    assert_clean_failure(graphdist("inspect", "models.mlp:forward", "--stage", "lowered"), "--stage", "lowered",
                         "traced")


def test_onnx_format_needs_output() -> None:
    assert_clean_failure(graphdist("inspect", "models.mlp:forward", "--format", "onnx"), "-o PATH")


def test_tracing_error_exits_1_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "untraceable.py").write_text(
        "import numpy as np\n"
        "def f(x):\n"
        "    return np.linalg.svd(x)\n"
        "def example_inputs():\n"
        "    return (np.ones((3, 3), np.float32),)\n"
    )
    assert_clean_failure(graphdist("inspect", "untraceable:f", cwd=tmp_path), "TracingError", "svd", status=1)
