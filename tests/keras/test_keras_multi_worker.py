"""gd.keras under MultiWorkerMirroredStrategy: 2 MPI workers fit (with sample weights)/evaluate/predict like one
device."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distribute"))
import mpi_jobs  # noqa: E402 - the multi-process helpers of tests/distribute


def _one_device() -> dict[str, np.ndarray]:
    """Worker 0's program on one device: same seed (initial weights, shuffling order), same data."""
    gd.keras.utils.set_random_seed(0)
    with gd.OneDeviceStrategy("cpu:0").scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                     gd.keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.SGD(0.2), metrics=["accuracy"],
                      loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = digits()
    history = model.fit(data.x_train[:149], data.y_train[:149], batch_size=32, epochs=2, verbose=0,
                        sample_weight=np.linspace(0.5, 1.5, 149))
    evaluation = model.evaluate(data.x_test[:70], data.y_test[:70], batch_size=32, verbose=0)
    return {"weights": model.get_weights(), "loss": np.array(history.history["loss"]),
            "accuracy": np.array(history.history["accuracy"]), "eval": np.array(evaluation),
            "predictions": model.predict(data.x_test[:70], batch_size=32)}


@pytest.mark.slow
def test_two_workers_fit_evaluate_predict_like_one_device(tmp_path) -> None:
    job = mpi_jobs.mpiexec(2, "tests/keras/keras_mw_worker.py", "--out", str(tmp_path))
    assert job.returncode == 0, job.stderr[-3000:]
    reference = _one_device()
    for rank in range(2):
        with np.load(tmp_path / f"rank{rank}.npz") as got:
            for i, want in enumerate(reference["weights"]):
                np.testing.assert_allclose(got[f"arr_{i}"], want, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}")
            for key in ("loss", "accuracy", "eval"):
                np.testing.assert_allclose(got[key], reference[key], rtol=1e-4, atol=1e-6, err_msg=key)
            np.testing.assert_allclose(got["predictions"], reference["predictions"], rtol=1e-4, atol=1e-5)
    # The chief's saved model, loaded in this (single) process, predicts like the one-device model.
    saved = gd.keras.load_model(tmp_path / "saved")
    np.testing.assert_allclose(saved.predict(digits().x_test[:70], batch_size=32, verbose=0),
                               reference["predictions"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_parameter_server_workers_fit_asynchronously(tmp_path) -> None:
    job = mpi_jobs.launch("--workers", "2", "--ps", "1", "--timeout", "60", "--", sys.executable,
                          "tests/keras/keras_ps_worker.py", "--out", str(tmp_path))
    assert job.returncode == 0, job.stderr[-3000:]
    for worker in range(2):
        with np.load(tmp_path / f"worker{worker}.npz") as got:
            assert got["loss"][-1] < 0.5 * got["loss"][0]
            assert got["eval"][1] > 0.85                      # test accuracy of the shared (ps) weights
            assert got["predictions"].shape == (359, 10)
