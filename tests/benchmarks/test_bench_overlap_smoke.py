"""benchmarks.bench_overlap runs end to end on a tiny MLP and reports finite numbers (no timing checks)."""

from __future__ import annotations

import math

from benchmarks import bench_overlap as bench


def test_overlap_benchmark_smoke(tmp_path) -> None:
    results = bench.run(models=("mlp",), quick=True, rounds=2, calls=2, batch=16, sizes=(16, 12, 8, 4),
                        wait_steps=2, wait_s=0)
    (entry,) = results["models"]
    assert entry["weights_bitwise_equal"]
    assert entry["segments"][bench._ONE] == 1 and entry["segments"][bench._ON] > entry["segments"][bench._OFF]
    for name in (bench._ONE, bench._OFF, bench._ON):
        assert math.isfinite(entry["us"][name]) and entry["us"][name] > 0
    for name in (bench._OFF, bench._ON):
        assert entry["vs_one_device"][name] > 0
        assert entry["wait"][name]["collective_us"] > 0
        assert 0 <= entry["wait"][name]["wait_us"] <= entry["wait"][name]["collective_us"] + 1e-6
    text = bench.markdown(results)
    assert text.startswith("## Overlap of gradient all-reduces") and "mlp (batch 16)" in text
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# title\n\n<!-- begin other -->\nkeep\n<!-- end other -->\n")
    bench.write_section(text, path)
    bench.write_section(text, path)
    written = path.read_text()
    assert written.count(f"<!-- begin {bench.NAME} -->") == 1 and "keep" in written
