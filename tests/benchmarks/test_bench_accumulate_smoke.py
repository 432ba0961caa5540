"""benchmarks.bench_accumulate runs end to end on a tiny MLP (three child processes) and reports sane
numbers (no timing checks)."""

from __future__ import annotations

import math

from benchmarks import bench_accumulate as bench


def test_accumulate_benchmark_smoke() -> None:
    results = bench.run(sizes=(16, 8, 4), batch=32, k=4, steps=2, timeout=300)
    assert results["weight_difference"] < 1e-5  # the same update
    assert results["accumulated"]["accumulate"] == 4 and results["alone"]["rows"] == 8
    for key in ("whole", "accumulated", "alone"):
        variant = results[key]
        assert variant["peak_rss_bytes"] > 0 and math.isfinite(variant["step_ms"]) and variant["step_ms"] > 0
    text = bench.markdown(results)
    assert text.startswith("## Gradient accumulation: memory and step time") and "accumulate_steps=4" in text
