"""benchmarks.bench_fsdp runs end to end on a small MLP (three child processes; across 2 namespace hosts with
root) and reports consistent numbers (no timing checks)."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_fsdp as bench
from benchmarks.netns import unavailable_reason

_REASON = unavailable_reason()


def test_fsdp_benchmark_smoke() -> None:
    sizes = (16, 8, 8, 4)
    results = bench.run(sizes=sizes, batch=8, steps=2, timeout=300)
    mirrored, ordered, unordered = (results[v] for v in bench.VARIANTS)
    params = 16 * 8 + 8 + 8 * 8 + 8 + 8 * 4 + 4
    assert mirrored["params"] == ordered["params"] == params
    assert ordered["same_weights"] and unordered["same_weights"]
    assert mirrored["gathered_peak_bytes"] == 0  # nothing is gathered under Mirrored
    # One layer at a time: the biggest layer's kernel and bias (16 x 8 + 8 floats, padded to 2 equal shards);
    # unordered: every gathered copy of the step at once.
    assert ordered["gathered_peak_bytes"] == 4 * (16 * 8 + 8)
    assert unordered["gathered_peak_bytes"] > 2 * ordered["gathered_peak_bytes"]
    assert ordered["segments"] > unordered["segments"]
    assert ordered["bytes_ratio"] == unordered["bytes_ratio"] < 0.51
    for variant in (mirrored, ordered, unordered):
        assert variant["peak_rss_bytes"] > 0 and math.isfinite(variant["step_ms"]) and variant["step_ms"] > 0
    assert bench.markdown(results).startswith("## FSDP: one layer's gathered weights at a time")


@pytest.mark.slow
@pytest.mark.skipif(bool(_REASON), reason=f"multi-host test bed unavailable: {_REASON}")
def test_fsdp_benchmark_across_hosts_smoke() -> None:
    results = bench.run_hosts(sizes=(16, 8, 8, 4), batch=8, steps=2, rounds=1, links=("10 Gbit/s",))
    link = results["links"]["10 Gbit/s"]
    assert set(link) == set(bench.HOST_VARIANTS)
    assert all(r["same_weights"] and math.isfinite(r["step_ms"]) and r["step_ms"] > 0 for r in link.values())
    assert link["mirrored"]["step_ratio"] == 1.0
    # One layer at a time cuts a worker's plan at every layer's gathers; unordered, at the phases only.
    assert link["fsdp"]["segments"] > link["fsdp_prefetch1"]["segments"] > link["fsdp_unordered"]["segments"]
    assert "| FSDP, next layer prefetched |" in bench.hosts_markdown(results)
