"""benchmarks.bench_mirrored_train runs end to end on a tiny MLP and reports finite numbers (no timing checks)."""

from __future__ import annotations

import math

import numpy as np

from benchmarks import bench_mirrored_train as bench


def test_mirrored_train_benchmark_smoke(tmp_path) -> None:
    results = bench.run(quick=True, rounds=2, calls=2, tf=False, sizes=(16, 8, 4), batch=8, wait_s=0)
    checks = results["checks"]
    assert checks["finite_after_timing"] and checks["mirrored_replicas_equal"]
    assert checks["mirrored_vs_one_device"] < 1e-5
    assert checks["mirrored_vs_reference"] < 1e-4 and checks["one_device_vs_reference"] < 1e-4
    for name in (bench._MIR, bench._MIR_PR, bench._ONE):
        assert math.isfinite(results["us"][name]) and results["us"][name] > 0
        assert results["samples_per_s"][name] > 0
    assert math.isfinite(results["ratios"]["mirrored/one_device"])
    assert results["ratios"]["mirrored/tf_mirrored"] is None and results["goal_met"] is None
    assert results["tf"]["status"] == "not requested"
    parts = results["breakdown"]
    # the default MirroredStrategy sums each of the 4 gradients on the replica that updates it
    assert parts["median_us"]["step"] > 0 and parts["all_reduce_tasks"] == 0 and parts["reader_sums"] == 4
    assert {s["device"] for s in parts["segments"]} == {"cpu:0", "cpu:1"}
    assert parts["threads"] is None or parts["threads"][bench._MIR]["wall_us"] > 0
    text = bench.markdown(results)
    assert text.startswith("## MLP training throughput") and "Goal: not measured" in " ".join(text.split())
    assert "Where graphdist Mirrored's step spends its time" in text
    assert bench._MIR in bench.table(results)
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# title\n\n<!-- begin other -->\nkeep\n<!-- end other -->\n")
    bench.write_section(text, path)
    bench.write_section(text, path)  # replaces, does not append twice
    written = path.read_text()
    assert written.count(f"<!-- begin {bench.NAME} -->") == 1 and "keep" in written


def test_missing_tf_environment_is_skipped(tmp_path) -> None:
    results = bench.run(quick=True, rounds=1, calls=1, tf=True, tf_venv=tmp_path / "none", sizes=(8, 4),
                        batch=4, wait_s=0, breakdown=False)
    assert results["tf"]["status"] == "skipped" and "--setup-tf" in results["tf"]["reason"]
    assert "TensorFlow was skipped" in bench.markdown(results)


def test_reference_step_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    params = [rng.standard_normal((5, 4)), np.zeros(4), rng.standard_normal((4, 3)), np.zeros(3)]
    x = rng.standard_normal((6, 5))
    labels = np.array([0, 1, 2, 0, 1, 2])
    lr = 0.5

    def loss(p: list[np.ndarray]) -> float:
        h = np.maximum(x @ p[0] + p[1], 0) @ p[2] + p[3]
        h = h - h.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(h).sum(axis=1)) - h[np.arange(6), labels]))

    value, updated = bench.reference_step(params, x, labels, lr, 6)
    assert abs(value - loss(params)) < 1e-12
    eps = 1e-6
    for index, param in enumerate(params):
        flat = param.reshape(-1)
        for j in range(0, flat.size, 3):
            bumped = [p.copy() for p in params]
            bumped[index].reshape(-1)[j] += eps
            grad = (loss(bumped) - loss(params)) / eps
            assert abs(updated[index].reshape(-1)[j] - (flat[j] - lr * grad)) < 1e-4
