"""The command line with the tvm backend and TPUStrategy: export a TPU plan, run it, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd

REPO = Path(__file__).resolve().parents[2]
#: The repository's MLP model, as a CLI target.
MLP_STEP, MLP_FORWARD = "graphdist.models.mlp:make_step", "graphdist.models.mlp:forward"
TPU = ("--strategy", "tpu", "--devices", "tpu:0,tpu:1")


def graphdist(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "graphdist.cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_export_and_run_a_tpu_training_step(tmp_path: Path) -> None:
    plan_dir, inputs = tmp_path / "tpu_plan", tmp_path / "inputs.npz"
    result = graphdist("export", MLP_STEP, *TPU, "-o", str(plan_dir), "--save-inputs", str(inputs))
    assert result.returncode == 0, result.stderr
    assert "under TPUStrategy" in result.stdout and "backend tvm" in result.stdout
    run = graphdist("run", str(plan_dir), "--inputs", str(inputs), "--steps", "2")
    assert run.returncode == 0, run.stderr
    losses = [float(line.split("= ")[1]) for line in run.stdout.splitlines() if line.startswith("step ")]
    # The same steps on two logical CPUs with ONNX Runtime: TPU cores compute the same training.
    from graphdist.models.mlp import make_step

    step, args = make_step(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    np.testing.assert_allclose(losses, [float(step(*args)) for _ in range(2)], rtol=1e-5)


def test_inspect_with_the_tvm_backend_on_cpu() -> None:
    result = graphdist("inspect", MLP_FORWARD, "--strategy", "mirrored", "--devices", "cpu:0,cpu:1",
                       "--stage", "plan", "--backend", "tvm")
    assert result.returncode == 0, result.stderr
    assert "backend=tvm" in result.stdout


@pytest.mark.parametrize(("devices", "phrase"), [("tpu:1,tpu:2", "the devices must be tpu:0,tpu:1"),
                                                  ("cpu:0,cpu:1", "the devices must be tpu:0,tpu:1")])
def test_tpu_strategy_needs_tpu_cores_in_order(devices: str, phrase: str) -> None:
    result = graphdist("inspect", MLP_STEP, "--strategy", "tpu", "--devices", devices)
    assert result.returncode == 2 and phrase in result.stderr
    assert "Traceback" not in result.stderr
