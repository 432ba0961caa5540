"""Issue 26: ``graphdist run`` refuses npz keys that match no input, keeps an ONNX model's input and output
names, and ``graphdist inspect`` accepts a plan directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

REPO = Path(__file__).resolve().parents[2]
MIRRORED = ("--strategy", "mirrored", "--devices", "cpu:0,cpu:1")


def graphdist(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "graphdist.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def named_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ONNX model with named input and outputs, exported as a Mirrored inference plan."""
    folder = tmp_path_factory.mktemp("named")
    image = helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, [None, 4])
    logits = helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [None, 4])
    probs = helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, [None, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["image"], ["logits"]),
                               helper.make_node("Softmax", ["logits"], ["probs"])], "named", [image], [logits, probs])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "named.onnx")
    result = graphdist("export", str(folder / "named.onnx"), *MIRRORED, "--batch", "4", "-o", str(folder / "plan"))
    assert result.returncode == 0, result.stderr
    return folder / "plan"


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_run_keeps_the_onnx_models_names(named_plan: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    np.savez(tmp_path / "in.npz", image=x)  # the model's input name is accepted
    run = graphdist("run", str(named_plan), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"))
    assert run.returncode == 0, run.stderr
    assert "step 1: logits = float32[4,4]" in run.stdout and "; probs = float32[4,4]" in run.stdout
    with np.load(tmp_path / "out.npz") as out:
        assert out.files == ["logits", "probs"]
        np.testing.assert_allclose(out["logits"], np.maximum(x, 0), rtol=1e-6)
        np.testing.assert_allclose(out["probs"], _softmax(np.maximum(x, 0)), rtol=1e-5)


def test_run_refuses_npz_keys_that_match_no_input(named_plan: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "typo.npz", imgae=np.ones((4, 4), np.float32))
    run = graphdist("run", str(named_plan), "--inputs", str(tmp_path / "typo.npz"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "'imgae'" in run.stderr and "match no input" in run.stderr and "arg0 or image" in run.stderr


def test_inspect_accepts_a_plan_directory(named_plan: Path) -> None:
    plan = graphdist("inspect", str(named_plan))
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("Plan 'named_inference': 2 segment(s) on cpu:0, cpu:1")
    traced = graphdist("inspect", str(named_plan), "--stage", "traced")
    assert traced.returncode == 0, traced.stderr
    assert "stage=traced" in traced.stdout and "Softmax" in traced.stdout
    refused = graphdist("inspect", str(named_plan), *MIRRORED)
    assert refused.returncode == 2 and "already planned" in refused.stderr and "graphdist replan" in refused.stderr
