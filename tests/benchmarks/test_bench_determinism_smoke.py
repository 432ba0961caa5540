"""benchmarks.bench_determinism measures one small case end to end and reports it (no timing checks)."""

from __future__ import annotations

import math

import graphdist as gd
from benchmarks import bench_determinism as bench


def test_determinism_benchmark_smoke() -> None:
    case = bench.measure("mlp", "mirrored2", batch=32, rounds=1, calls=1)
    assert not gd.config.experimental.is_op_determinism_enabled()  # switched off again after the build
    assert math.isfinite(case["ratio"]) and case["default_ms"] > 0 and case["deterministic_ms"] > 0
    results = {"batch": 32, "rounds": 1, "calls": 1, "cases": [case], "goal_met": case["ratio"] <= bench.GOAL}
    text = bench.markdown(results)
    assert text.startswith("## Op determinism: step time with and without") and "| mlp | mirrored2 |" in text
