"""benchmarks.bench_onnx_resnet runs end to end on a small zoo model (no timing checks)."""

from __future__ import annotations

import math

from benchmarks import bench_onnx_resnet as bench


def test_onnx_resnet_benchmark_smoke() -> None:
    results = bench.run(quick=True, rounds=1, calls=1, model="squeezenet", batch=4, budget_s=0, wait_s=0)
    assert set(results["ms"]) == {bench._ORT, bench._CONST, bench._VARS, bench._ORT_INPUTS}
    for name, ms in results["ms"].items():
        assert math.isfinite(ms) and ms > 0, name
        assert math.isfinite(results["ratios"][name])
    assert results["ratios"][bench._ORT] == 1.0
    assert all(d < 1e-3 for d in results["max_abs_diff"].values())
    assert results["optimized_ops"][bench._ORT] and results["optimized_ops"][bench._ORT_INPUTS]
    text = bench.markdown(results)
    assert text.startswith("## ResNet50 inference: Mirrored(2) vs ONNX Runtime")
    assert bench._CONST in text and "throughput vs ORT" in text
    assert "graphdist Mirrored(2)" in bench.table(results)
