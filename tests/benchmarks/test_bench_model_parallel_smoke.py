"""benchmarks.bench_model_parallel runs end to end on a small MLP (two child processes) and reports consistent
numbers (no timing checks)."""

from __future__ import annotations

import math

from benchmarks import bench_model_parallel as bench


def test_model_parallel_benchmark_smoke() -> None:
    results = bench.run(sizes=(16, 8, 8, 4), batch=8, steps=2, timeout=300)
    assert results["same_weights"]
    mirrored, split = results["mirrored"], results["tensor"]
    params = 16 * 8 + 8 + 8 * 8 + 8 + 8 * 4 + 4
    assert mirrored["params"] == split["params"] == params
    # Weights, m and v in float32 plus the int64 step counter; split: w1, b1, w2 (and their m, v) halved.
    assert mirrored["bytes_per_device"] == 3 * 4 * params + 8
    assert split["bytes_per_device"] == 3 * 4 * (params - (16 * 8 + 8 + 8 * 8) // 2) + 8
    for variant in (mirrored, split):
        assert variant["collective_bytes_measured"] == variant["collective_bytes_predicted"] > 0
        assert variant["peak_rss_bytes"] > 0 and math.isfinite(variant["step_ms"]) and variant["step_ms"] > 0
    assert mirrored["collective_bytes_predicted"] == 2 * 4 * (params + 1)  # every gradient and the loss, x2 replicas
    assert split["collective_bytes_predicted"] == 2 * 4 * 8 * 8  # the (8, 8) block product, from both devices
    assert bench.markdown(results).startswith("## Tensor parallelism vs Mirrored on 2 logical devices")
    transformer = results["transformer"]["ops"]
    assert set(transformer) == {"AllReduce (layouts)", "AllReduce (gradients across batch groups)"}
    for row in transformer.values():
        assert row["measured"] == row["plan"] > 0 and row["groups"] > 0
    # The lowering's model (2 (n-1)/n S per device, n = 2) and the summary's estimate (2 (n-1) S per group) agree.
    layouts = transformer["AllReduce (layouts)"]
    assert layouts["sent_per_device"] == layouts["sent_estimate"] == layouts["plan"]
    assert "| AllReduce (layouts) | 10 |" in bench.markdown(results)
