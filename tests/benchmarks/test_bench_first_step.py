"""benchmarks.bench_first_step builds steps in fresh processes and reports consistent numbers (no timing checks)."""

from __future__ import annotations

import json
import math

from benchmarks import bench_first_step as bench


def test_first_step_benchmark_smoke() -> None:
    results = bench.run(quick=True, cases=("one_device", "mirrored_2"))
    cases = {c["id"]: c for c in results["cases"]}
    assert set(cases) == {"mlp/one_device", "mlp/mirrored_2"}
    for case in cases.values():
        median = case["median"]
        assert all(math.isfinite(median[k]) and median[k] >= 0 for k in ("trace_s", "passes_s", "compile_s"))
        assert median["total_s"] >= median["trace_s"] + median["passes_s"] + median["compile_s"]
    # Traced once, as one replica: the same traced graph for one and two replicas, twice the work after.
    assert cases["mlp/one_device"]["traced_nodes"] == cases["mlp/mirrored_2"]["traced_nodes"]
    assert cases["mlp/mirrored_2"]["rewritten_nodes"] > cases["mlp/one_device"]["rewritten_nodes"]
    assert cases["mlp/one_device"]["vs_one_device"] == 1.0
    text = bench.markdown(results, before=json.loads(json.dumps(results)))
    assert text.startswith("## Time to first step") and "→" in text and "**1.00x**" in text
