"""``make gpu-check``: on a machine without a GPU, one clear skip line and exit 0; the checks themselves run
with a CPU device standing in for the GPU (which exercises the script, not a GPU)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from graphdist.runtime.devices import num_gpus

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.skipif(num_gpus() > 0, reason="this machine has a GPU: make gpu-check runs the checks there")
def test_make_gpu_check_without_a_gpu_prints_one_skip_line_and_exits_0() -> None:
    # PY: this interpreter; STAMP empty: no virtual environment is created for the test.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PY={sys.executable}", "STAMP="], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = [line for line in done.stdout.splitlines() if not line.startswith(sys.executable)]  # make's echo
    assert printed == [gpu_check.SKIP_LINE]
    assert "no NVIDIA GPU" in gpu_check.SKIP_LINE


def test_checks_run_with_a_cpu_standing_in_for_the_gpu(capsys) -> None:
    import graphdist as gd

    assert gpu_check.main(["--stand-in", "cpu:1", "--sizes", "16,8,4"]) == 0
    assert gd.config.get_soft_device_placement() is True  # turned off for the checks only
    out = capsys.readouterr().out
    assert "stand-in: cpu:1 in the GPU's place (no GPU here; proves nothing about GPUs)" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| check")]
    assert len(rows) == 4 and all(row.endswith("| pass |") for row in rows)
    assert "| forward, tvm CUDA module, OneDevice | cpu:1 | tvm |" in out
