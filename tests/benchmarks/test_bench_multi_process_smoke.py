"""The multi-process benchmarks run end to end on tiny settings and report finite numbers (no timing checks)."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_mpi_allreduce, bench_multi_worker


@pytest.mark.slow
def test_mpi_allreduce_benchmark_smoke() -> None:
    results = bench_mpi_allreduce.run(rounds=1, quick=True, sizes=(4 << 10, 64 << 10), wait_s=0)
    assert [c["size"] for c in results["cases"]] == [4 << 10, 64 << 10]
    for case in results["cases"]:
        assert set(case["ratio"]) == {"graphdist", "graphdist, new output", "graphdist ring"}
        assert all(math.isfinite(v) and v > 0 for v in case["ratio"].values())
        assert case["us"]["mpi4py Allreduce"] > 0 and case["rounds"] == 1
    assert results["worst"] is None and results["goal_met"]  # no large buffer measured
    assert "Allreduce us" in bench_mpi_allreduce.table(results)
    assert bench_mpi_allreduce.markdown(results).startswith("## All-reduce between processes")


@pytest.mark.slow
def test_multi_worker_benchmark_smoke() -> None:
    results = bench_multi_worker.run(repeats=1, quick=True, wait_s=0)
    assert set(results["ms"]) == set(bench_multi_worker.SETUPS)
    assert all(math.isfinite(v) and v > 0 for v in results["ms"].values())
    assert results["speedup"]["1 worker"] == 1.0
    assert "2 workers" in bench_multi_worker.table(results)
    assert "| 2 workers |" in bench_multi_worker.markdown(results)
