"""benchmarks/bench_tvm.py: the environment switch restores the caller's settings, and the report
formats what run() returns (the timing itself is a benchmark, not a test)."""

from __future__ import annotations

import os

import pytest

from benchmarks import bench_tvm


def test_environment_sets_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_TVM_TUNE", "3")
    with bench_tvm._environment(GRAPHDIST_TVM_TUNE="8"):
        assert os.environ["GRAPHDIST_TVM_TUNE"] == "8"
    assert os.environ["GRAPHDIST_TVM_TUNE"] == "3"
    with bench_tvm._environment(GRAPHDIST_TVM_TUNE=None):
        assert os.environ.get("GRAPHDIST_TVM_TUNE") is None
    assert os.environ["GRAPHDIST_TVM_TUNE"] == "3"


def test_report_formats_results() -> None:
    case = {"label": "MLP", "batch": 8, "rounds": 3, "calls": 2, "compile_s": {"ort": 0.1, "tvm": 2.0},
            "forward": {"ort": 1.0, "tvm": 1.4}, "train": {"ort": 2.0, "tvm": 4.0},
            "forward_ratio": 1.4, "train_ratio": 2.0}
    results = {"goal": 1.5, "goal_met": False, "worst_ratio": 2.0, "cases": [case], "tune": 0}
    text = bench_tvm.table(results)
    assert "forward 1.40x, train 2.00x" in text and "goal <= 1.5x missed" in text
    md = bench_tvm.markdown(results)
    assert "| MLP, batch 8 | tvm | 1.40 | 4.00 | 2.0 |" in md and "**not met** (worst 2.00x)" in md
    assert "Where the time goes" in md
    mirrored = {"label": "MLP", "batch": 8, "ms": {"tvm, OneDevice": 9.0, "tvm, Mirrored (2 devices)": 6.0},
                "speedup": 1.5}
    assert "Mirrored 1.50x faster" in bench_tvm.table({**results, "mirrored": mirrored})
    assert "takes 6.00 ms, under `OneDeviceStrategy` 9.00 ms: **1.50x**" in bench_tvm.markdown(
        {**results, "mirrored": mirrored})
    tuned = bench_tvm.markdown({**results, "tune": 8})
    assert "MetaSchedule-tuned (8 trials)" in tuned and "Where the time goes" not in tuned
