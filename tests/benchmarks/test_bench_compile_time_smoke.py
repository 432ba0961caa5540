"""benchmarks.bench_compile_time: fresh processes, graphdist's outputs equal ONNX Runtime's (no timing checks)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks import bench_compile_time as bench


def test_ladder_model_has_the_size_asked_and_runs() -> None:
    for nodes in (6, 7, 64, 301):
        model = bench.ladder_model(nodes)
        onnx.checker.check_model(model, full_check=True)
        assert len(model.graph.node) == nodes
    session = ort.InferenceSession(bench.ladder_model(64).SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones((bench.BATCH, bench.WIDTH), np.float32)})
    assert np.isfinite(y).all()


def test_compile_time_benchmark_smoke() -> None:
    results = bench.run(quick=True)
    assert [e["nodes"] for e in results["sizes"]] == [300, 3000]
    for entry in results["sizes"]:
        for kind in ("cold", "warm"):
            median = entry[kind]
            assert all(math.isfinite(median[k]) and median[k] > 0 for k in ("ort_s", "ort_inputs_s", "load_s",
                                                                              "total_s", "vs_ort"))
            assert median["total_s"] >= median["load_s"]
            assert median["max_abs_diff"] == 0.0
        assert entry["cold_compiles"][1] == 0 and entry["warm_compiles"][1] >= 1  # the second process: disk cache
    text = bench.markdown(results, before=results)
    assert text.startswith("## Compile time against graph size") and "| 3,000 (749) |" in text and "→" in text
    assert "goal" in bench.table(results)
