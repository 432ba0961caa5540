"""benchmarks.bench_zero1 runs end to end on a tiny MLP (two child processes, two 2-worker MPI jobs) and
reports sane numbers (no timing checks)."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_zero1 as bench


@pytest.mark.slow  # two MPI jobs
def test_zero1_benchmark_smoke() -> None:
    results = bench.run(sizes=(16, 8, 4), batch=8, steps=2, timeout=300)
    assert results["same_weights"] and results["workers"]["same_weights"]
    plain, zero = results["plain"], results["zero"]
    assert plain["params"] == zero["params"] == 16 * 8 + 8 + 8 * 4 + 4
    # Adam's m and v (float32) whole vs halved, plus the int64 step counter kept whole.
    assert plain["state_bytes_per_replica"] == 8 + 2 * 4 * plain["params"]
    assert zero["state_bytes_per_replica"] == 8 + 4 * plain["params"]
    for variant in (plain, zero):
        assert variant["peak_rss_bytes"] > 0 and math.isfinite(variant["step_ms"]) and variant["step_ms"] > 0
    across = results["workers"]
    # Each worker process stores its chunk of m and v (4 variables of 128, 8, 32, 4 elements: even, halved).
    assert across["plain"]["stored_state_bytes"] == 8 + 2 * 4 * plain["params"]
    assert across["zero"]["stored_state_bytes"] == 8 + 4 * plain["params"]
    text = bench.markdown(results)
    assert text.startswith("## ZeRO-1: sharded optimizer state") and "shard_optimizer_state=True" in text
