"""gd.train.Checkpoint: exact round trips, resuming into fresh objects, corrupt files, atomic writes."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

SIZES = (64, 16, 10)
BATCH = 32


def _build(strategy):
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(0.01)
    return model, optimizer, model.make_train_step(optimizer, global_batch_size=BATCH)


def _train(strategy, step, data, start: int, steps: int) -> list[float]:
    losses = []
    for i in range(start, start + steps):
        lo = (i * BATCH) % (len(data.x_train) - BATCH)
        losses.append(float(strategy.run(step, args=(data.x_train[lo:lo + BATCH], data.y_train[lo:lo + BATCH]))))
    return losses


def test_round_trip_is_exact(tmp_path) -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    model, optimizer, step = _build(strategy)
    _train(strategy, step, digits(), 0, 3)
    path = gd.train.Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt.npz")
    saved = [v.numpy() for v in model.trainable_variables + optimizer.variables()]
    for v in model.trainable_variables:
        v.assign(np.zeros(v.shape, v.dtype))
    gd.train.Checkpoint(model=model, optimizer=optimizer).restore(path)
    for variable, value in zip(model.trainable_variables + optimizer.variables(), saved):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_resume_into_fresh_objects_matches_uninterrupted_training(tmp_path) -> None:
    data = digits()
    strategy = gd.OneDeviceStrategy("cpu:0")
    model, optimizer, step = _build(strategy)
    uninterrupted = _train(strategy, step, data, 0, 6)

    model_a, optimizer_a, step_a = _build(strategy)
    _train(strategy, step_a, data, 0, 3)
    path = gd.train.Checkpoint(model=model_a, optimizer=optimizer_a).save(tmp_path / "mid.npz")

    # A new process would build everything afresh; the Adam slots do not exist yet.
    model_b, optimizer_b, step_b = _build(strategy)
    gd.train.Checkpoint(model=model_b, optimizer=optimizer_b).restore(path)
    assert int(optimizer_b.iterations.numpy()) == 3
    resumed = _train(strategy, step_b, data, 3, 3)
    np.testing.assert_allclose(resumed, uninterrupted[3:], rtol=1e-6)
    for a, b in zip(model.trainable_variables, model_b.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def _saved_model(tmp_path):
    strategy = gd.OneDeviceStrategy("cpu:0")
    model, _, _ = _build(strategy)
    path = gd.train.Checkpoint(model=model).save(tmp_path / "model.npz")
    return model, path


def _assert_untouched(model, before) -> None:
    for variable, value in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_truncated_file_fails_cleanly(tmp_path) -> None:
    model, path = _saved_model(tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    before = [v.numpy() + 1 for v in model.trainable_variables]
    for v, b in zip(model.trainable_variables, before):
        v.assign(b)
    with pytest.raises(gd.CheckpointError, match="truncated or corrupt"):
        gd.train.Checkpoint(model=model).restore(path)
    _assert_untouched(model, before)


def test_flipped_byte_fails_its_checksum(tmp_path) -> None:
    model, path = _saved_model(tmp_path)
    raw = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("v0.npy")
    raw[info.header_offset + 30 + len(info.filename) + info.file_size - 3] ^= 0xFF  # inside the array data
    open(path, "wb").write(bytes(raw))
    before = [v.numpy() for v in model.trainable_variables]
    with pytest.raises(gd.CheckpointError, match="corrupt"):
        gd.train.Checkpoint(model=model).restore(path)
    _assert_untouched(model, before)


def test_mismatched_model_and_missing_file_and_version(tmp_path) -> None:
    _, path = _saved_model(tmp_path)
    with gd.OneDeviceStrategy("cpu:0").scope():
        other = MLP((64, 8, 10), seed=0, trainable=True)
    with pytest.raises(gd.CheckpointError, match="same sizes"):
        gd.train.Checkpoint(model=other).restore(path)
    with pytest.raises(gd.CheckpointError, match="no value for"):
        gd.train.Checkpoint(net=other).restore(path)
    with pytest.raises(gd.CheckpointError, match="does not exist"):
        gd.train.Checkpoint(model=other).restore(tmp_path / "nope.npz")
    # a file of a future format version
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(entries["__graphdist_manifest__.json"])
    manifest["version"] = 99
    entries["__graphdist_manifest__.json"] = json.dumps(manifest).encode()
    future = tmp_path / "future.npz"
    with zipfile.ZipFile(future, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    with pytest.raises(gd.CheckpointError, match="version 99"):
        gd.train.Checkpoint(model=other).restore(future)


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    model, path = _saved_model(tmp_path)
    original = open(path, "rb").read()
    for v in model.trainable_variables:
        v.assign(np.full(v.shape, 7, v.dtype))

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        gd.train.Checkpoint(model=model).save(path)
    assert open(path, "rb").read() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]  # no temp file left


def test_checkpoint_needs_trackables() -> None:
    with pytest.raises(gd.CheckpointError, match="at least one"):
        gd.train.Checkpoint()
    with pytest.raises(gd.CheckpointError, match="has no variables"):
        gd.train.Checkpoint(thing=object()).save("/tmp/never-written.npz")
