"""benchmarks.bench_train_step runs end to end on a tiny MLP and reports finite numbers (no timing checks)."""

from __future__ import annotations

import math

import numpy as np

from benchmarks import bench_train_step as bench


def test_train_step_benchmark_smoke(tmp_path) -> None:
    results = bench.run(quick=True, rounds=2, calls=2, tf=False, sizes=(16, 8, 4), batch=8, wait_s=0)
    assert results["checks"]["finite_after_timing"]
    assert results["checks"]["graphdist_vs_numpy"] < 1e-4
    for name in (bench._GD, bench._NP):
        assert math.isfinite(results["us"][name]) and results["us"][name] > 0
    assert math.isfinite(results["ratios"]["graphdist/numpy"])
    assert results["ratios"]["graphdist/TF"] is None
    assert results["tf"]["status"] == "not requested"
    assert results["profile"]["kernel_us"] > 0
    text = bench.markdown(results)
    assert text.startswith("## MLP training step") and "graphdist / numpy" in text
    assert "graphdist strategy.run" in bench.table(results)


def test_missing_tf_environment_is_skipped(tmp_path) -> None:
    results = bench.run(quick=True, rounds=1, calls=1, tf=True, tf_venv=tmp_path / "none", sizes=(8, 4),
                        batch=4, profile=False, wait_s=0)
    assert results["tf"]["status"] == "skipped" and "--setup-tf" in results["tf"]["reason"]
    assert "TensorFlow was skipped" in bench.markdown(results)


def test_numpy_step_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    params = [rng.standard_normal((5, 4)).astype(np.float32), np.zeros(4, np.float32),
              rng.standard_normal((4, 3)).astype(np.float32), np.zeros(3, np.float32)]
    x = rng.standard_normal((6, 5)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2])
    lr = 0.5
    step = bench.NumpyTrainStep(params, lr, 6)

    def loss(p: list[np.ndarray]) -> float:
        h = np.maximum(x.astype(np.float64) @ p[0] + p[1], 0) @ p[2] + p[3]
        h = h - h.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(h).sum(axis=1)) - h[np.arange(6), labels]))

    base = [p.astype(np.float64) for p in params]
    step(x, labels)
    eps = 1e-6
    for index in range(len(base)):
        flat = base[index].reshape(-1)
        for j in range(0, flat.size, 3):
            bumped = [p.copy() for p in base]
            bumped[index].reshape(-1)[j] += eps
            grad = (loss(bumped) - loss(base)) / eps
            expected = flat[j] - lr * grad
            assert abs(step.params[index].reshape(-1)[j] - expected) < 1e-3
