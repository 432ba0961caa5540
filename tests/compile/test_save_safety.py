"""Saving never destroys and loading trusts nothing: foreign files survive every save path, kill -9 during a
save leaves the previous copy loadable and the next save cleans up, every edit of plan.json / model.json is
rejected, and an .npy header cannot make a load allocate what the file does not hold."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import random
import select
import shutil
import signal
import subprocess
import time
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphdist as gd
from graphdist.fsutil import savedir
from graphdist.models.mlp import MLP

keras = gd.keras
RNG = np.random.default_rng(11)
X = RNG.standard_normal((16, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 16)
MANIFEST = "graphdist-manifest.json"


class Saved:
    """A trained Keras model, an exported-step concrete function and their variables."""

    def __init__(self) -> None:
        keras.backend.clear_session()
        keras.utils.set_random_seed(3)
        self.strategy = gd.OneDeviceStrategy("cpu:0")
        with self.strategy.scope():
            self.model = keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(6,)),
                                           keras.layers.Dense(3)])
            self.model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            self.mlp = MLP((6, 8, 3), trainable=True, seed=0)
            replica_step = self.mlp.make_train_step(gd.optimizers.SGD(0.1), global_batch_size=8)
        self.model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
        strategy = self.strategy

        @gd.function
        def step(x, y):
            return strategy.run(replica_step, args=(x, y))

        step(X[:8], Y[:8])
        self.concrete = step.get_concrete_function(X[:8], Y[:8])


@pytest.fixture(scope="module")
def saved() -> Saved:
    return Saved()


def _precious(directory: Path, marker: str | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if marker:
        (directory / marker).write_text("{}")
    (directory / "thesis.txt").write_text("precious")
    return directory


def _intact(directory: Path) -> None:
    assert (directory / "thesis.txt").read_text() == "precious"


# ------------------------------------------------------------ foreign files
@pytest.mark.parametrize("marker", ["model.json", None])
def test_model_save_never_replaces_a_directory_with_foreign_files(saved: Saved, tmp_path: Path,
                                                                  marker: str | None) -> None:
    target = _precious(tmp_path / "p", marker)
    with pytest.raises(gd.PlanError, match=r"thesis\.txt.*refusing to replace it"):
        saved.model.save(target)
    _intact(target)


def test_a_save_of_graphdist_plus_a_foreign_file_is_kept(saved: Saved, tmp_path: Path) -> None:
    saved.model.save(tmp_path / "m")
    saved.concrete.export(tmp_path / "plan")
    for directory in (tmp_path / "m", tmp_path / "plan"):
        (directory / "thesis.txt").write_text("precious")
    with pytest.raises(gd.PlanError, match=r"files graphdist did not write \(thesis\.txt\)"):
        saved.model.save(tmp_path / "m")
    with pytest.raises(gd.PlanError, match=r"files graphdist did not write \(thesis\.txt\)"):
        saved.concrete.export(tmp_path / "plan", overwrite=True)
    (tmp_path / "m" / "serving" / "notes").mkdir()   # a foreign (empty) directory counts too
    (tmp_path / "m" / "thesis.txt").unlink()
    with pytest.raises(gd.PlanError, match=r"serving/notes/"):
        saved.model.save(tmp_path / "m")
    _intact(tmp_path / "plan")
    with pytest.raises(gd.PlanError, match="holds a graphdist-plan, not a graphdist-keras-model"):
        saved.model.save(tmp_path / "plan")   # another kind of graphdist directory is not replaced either
    keras.load_model(tmp_path / "m")


@pytest.mark.parametrize("how", ["concrete", "concrete-overwrite", "plan-overwrite", "loaded-plan-save"])
def test_export_never_replaces_a_directory_with_foreign_files(saved: Saved, tmp_path: Path, how: str) -> None:
    target = _precious(tmp_path / "p", "plan.json")
    with pytest.raises(gd.PlanError, match=r"thesis\.txt"):
        if how == "concrete":
            saved.concrete.export(target)
        elif how == "concrete-overwrite":
            saved.concrete.export(target, overwrite=True)
        elif how == "plan-overwrite":
            saved.concrete.plan.export(target, overwrite=True)
        else:
            loaded = gd.load_plan(saved.concrete.export(tmp_path / "exported"))
            loaded.save(target, overwrite=True)
    _intact(target)


def test_the_working_directory_is_never_a_target(saved: Saved, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    work = _precious(tmp_path / "work", "model.json")
    monkeypatch.chdir(work)
    with pytest.raises(gd.PlanError, match="current working directory"):
        saved.model.save(".")
    with pytest.raises(gd.PlanError, match="current working directory"):
        saved.concrete.export(".", overwrite=True)
    with pytest.raises(gd.PlanError, match="current working directory"):
        saved.concrete.export("..", overwrite=True)
    _intact(work)
    assert sorted(os.listdir(work)) == ["model.json", "thesis.txt"]


def test_checkpoints_never_overwrite_a_foreign_file(saved: Saved, tmp_path: Path) -> None:
    target = _precious(tmp_path / "p", "model.json")
    checkpoint = gd.train.Checkpoint(model=saved.model, optimizer=saved.model.optimizer)
    with pytest.raises(gd.CheckpointError, match="is a directory"):
        checkpoint.save(target)
    with pytest.raises(gd.CheckpointError, match="not a file graphdist wrote"):
        checkpoint.save(target / "thesis.txt")
    with pytest.raises(gd.CheckpointError, match="not a file graphdist wrote"):
        saved.model.save_weights(target / "thesis.txt")
    _intact(target)
    checkpoint.save(target / "ckpt.npz")
    checkpoint.save(target / "ckpt.npz")   # its own file is replaced
    assert sorted(os.listdir(target)) == ["ckpt.npz", "model.json", "thesis.txt"]


def test_callbacks_never_destroy_foreign_files(saved: Saved, tmp_path: Path) -> None:
    target = _precious(tmp_path / "p", "model.json")
    weights = saved.model.get_weights()
    for callback in (keras.callbacks.ModelCheckpoint(str(target)),
                     keras.callbacks.ModelCheckpoint(str(target / "thesis.txt"), save_weights_only=True)):
        with pytest.raises(gd.GraphdistError, match=r"thesis\.txt"):
            saved.model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
        _intact(target)
    # BackupAndRestore writes next to the user's files and, when fit completes, deletes only its own file.
    saved.model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(target)])
    _intact(target)
    assert sorted(os.listdir(target)) == ["model.json", "thesis.txt"]
    saved.model.set_weights(weights)


# ------------------------------------------------------------ kill -9
def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def _kill_during(save: Callable[[int], None], load: Callable[[], int], parent: Path, kills: int = 20) -> int:
    """Kills a child that saves in a loop at random moments; after each kill the previous copy must load and
    the next save must leave nothing behind. Returns how many kills left staging data (interrupted saves).
    """
    rng = random.Random(1)
    save(0)
    start = time.perf_counter()
    save(1)
    duration = time.perf_counter() - start
    interrupted = 0
    for kill in range(kills):
        ready, started = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: save versions 0, 1, 0, ... until killed
            try:
                os.close(ready)
                for version in range(10**6):
                    save(version % 2)
                    if version == 0:
                        os.write(started, b"1")  # saving in a loop now: the kill lands somewhere in it
            finally:
                os._exit(0)
        os.close(started)
        # Wait for the child's first save (a loaded machine can delay a forked child by more than a save
        # takes), then kill it at a random moment of its loop.
        assert select.select([ready], [], [], 60)[0], f"kill {kill}: the saving child never started"
        os.close(ready)
        time.sleep(rng.uniform(0.0, 2.0) * duration)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert load() in (0, 1), f"kill {kill}: no complete copy"
        interrupted += bool(_hidden(parent))
        save(kill % 2)
        assert _hidden(parent) == [], f"kill {kill}: the next save left {_hidden(parent)}"
        assert load() == kill % 2
    return interrupted


def _versions(variables: list[Any]) -> list[list[np.ndarray]]:
    return [[np.full(v.shape, 1.0 + k, v.dtype) for v in variables] for k in (0, 1)]


def _version_of(values: list[np.ndarray], versions: list[list[np.ndarray]]) -> int:
    return next(k for k, want in enumerate(versions)
                if all(np.array_equal(a, b) for a, b in zip(values, want)))


skip_without_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.mark.slow
@skip_without_fork
def test_kill_during_checkpoint_save(saved: Saved, tmp_path: Path) -> None:
    variables = saved.model.trainable_variables
    versions = _versions(variables)
    path = tmp_path / "ckpt" / "model.npz"

    def save(version: int) -> None:
        for variable, value in zip(variables, versions[version]):
            variable.assign(value)
        gd.train.Checkpoint(model=saved.model).save(path)

    def load() -> int:
        gd.train.Checkpoint(model=saved.model).restore(path)
        return _version_of([v.numpy() for v in variables], versions)

    assert _kill_during(save, load, path.parent) > 0


@pytest.mark.slow
@skip_without_fork
def test_kill_during_export(saved: Saved, tmp_path: Path) -> None:
    variables = saved.mlp.trainable_variables
    versions = _versions(variables)
    target = tmp_path / "plan"

    def save(version: int) -> None:
        for variable, value in zip(variables, versions[version]):
            variable.assign(value)
        saved.concrete.export(target, overwrite=True)

    def load() -> int:
        loaded = gd.load_plan(target)
        return _version_of([loaded.variables[v.name.removesuffix(":0")] for v in variables], versions)

    assert _kill_during(save, load, tmp_path) > 0


@pytest.mark.slow
@skip_without_fork
def test_kill_during_model_save(saved: Saved, tmp_path: Path) -> None:
    versions = _versions(saved.model.trainable_variables)
    target = tmp_path / "model"

    def save(version: int) -> None:
        saved.model.set_weights(versions[version])
        saved.model.save(target)

    def load() -> int:
        return _version_of(keras.load_model(target).get_weights(), versions)

    assert _kill_during(save, load, tmp_path) > 0


@pytest.mark.slow
@skip_without_fork
@pytest.mark.parametrize("what", ["export", "model.save"])
def test_crash_between_the_renames_of_an_overwrite_is_recovered(saved: Saved, tmp_path: Path, what: str) -> None:
    """Without RENAME_EXCHANGE the old directory is renamed aside first; a crash right then leaves no target,
    and the next load puts the complete old copy back."""
    target = tmp_path / "target"
    save = (lambda: saved.concrete.export(target, overwrite=True)) if what == "export" else (
        lambda: saved.model.save(target))
    save()
    before = (target / MANIFEST).read_bytes()
    pid = os.fork()
    if pid == 0:
        try:
            savedir._exchange = lambda first, second: False
            real_rename = os.rename

            def rename_then_die(src: Any, dst: Any) -> None:
                real_rename(src, dst)
                if Path(dst).name.startswith(".target.old-"):
                    os.kill(os.getpid(), signal.SIGKILL)

            os.rename = rename_then_die
            save()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert not target.exists() and [n for n in _hidden(tmp_path) if ".old-" in n]
    if what == "export":
        gd.load_plan(target)
    else:
        keras.load_model(target)
    assert (target / MANIFEST).read_bytes() == before
    save()
    assert _hidden(tmp_path) == []


# ------------------------------------------------------------ tamper evidence
def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node:
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:
        yield path, node


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return {"SUM": "MEAN", "MEAN": "SUM"}.get(value, value + "x")
    if value is None:
        return 0
    return [0] if isinstance(value, list) else {"x": 0}


def _set(doc: Any, path: tuple, value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _every_edit(file: Path) -> Iterator[tuple[tuple, bytes]]:
    original = file.read_bytes()
    doc = json.loads(original)
    for path, value in _leaves(doc):
        yield path, (json.dumps(_set(doc, path, _changed(value)), indent=1) + "\n").encode()
    file.write_bytes(original)


def test_every_single_field_edit_of_plan_json_is_rejected(saved: Saved, tmp_path: Path) -> None:
    directory = Path(saved.concrete.export(tmp_path / "plan"))
    edits = 0
    for _path, data in _every_edit(directory / "plan.json"):
        (directory / "plan.json").write_bytes(data)
        with pytest.raises(gd.PlanError, match=r"plan\.json fails its SHA-256 checksum in graphdist-manifest"):
            gd.load_plan(directory)
        edits += 1
    assert edits > 200
    gd.load_plan(directory)   # the original still loads


def test_every_single_field_edit_of_model_json_is_rejected(saved: Saved, tmp_path: Path) -> None:
    directory = Path(saved.model.save(tmp_path / "model"))
    edits = 0
    for _path, data in _every_edit(directory / "model.json"):
        (directory / "model.json").write_bytes(data)
        with pytest.raises(gd.CheckpointError, match=r"model\.json fails its SHA-256 checksum"):
            keras.load_model(directory)
        edits += 1
    assert edits > 20
    keras.load_model(directory)


def _reseal(directory: Path) -> None:
    """Rewrites the manifest's checksums and drops the signature (which would name the forgery)."""
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"] = {rel: hashlib.sha256((directory / rel).read_bytes()).hexdigest() for rel in manifest["files"]}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    (directory / "graphdist-signature.json").unlink(missing_ok=True)


def test_a_malformed_model_json_with_a_valid_manifest_is_a_clear_error(saved: Saved, tmp_path: Path) -> None:
    """Whoever can write a private folder can rewrite the manifest and drop the signature: that gets past the
    checksums, but never past the schema check into a raw KeyError or TypeError."""
    directory = Path(saved.model.save(tmp_path / "model"))
    original = (directory / "model.json").read_bytes()
    doc = json.loads(original)
    for path, _ in _leaves(doc):
        for bad in ({"x": []}, None, "x"):
            (directory / "model.json").write_text(json.dumps(_set(doc, path, bad)))
            _reseal(directory)
            try:
                keras.load_model(directory)
            except gd.GraphdistError:
                pass
    (directory / "model.json").write_bytes(original)
    _reseal(directory)
    keras.load_model(directory)


def test_an_edited_checkpoint_manifest_is_rejected(saved: Saved, tmp_path: Path) -> None:
    path = Path(gd.train.Checkpoint(model=saved.model).save(tmp_path / "c.npz"))
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(entries["__graphdist_manifest__.json"])
    first = next(iter(manifest["variables"]))
    manifest["variables"][first]["shape"] = list(reversed(manifest["variables"][first]["shape"]))
    entries["__graphdist_manifest__.json"] = json.dumps(manifest).encode()
    _write_zip(path, entries)
    with pytest.raises(gd.CheckpointError, match="manifest fails its SHA-256 checksum"):
        gd.train.Checkpoint(model=saved.model).restore(path)


def _write_zip(path: Path, entries: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    path.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("manifest_says", ["huge", "real"])
def test_a_huge_npy_header_is_rejected_without_allocating(tmp_path: Path, manifest_says: str) -> None:
    """A header declaring 100000 x 100000 float32 (37 GiB) over 16 bytes of data, with a consistent manifest."""
    variable = gd.Variable(np.zeros((2, 2), np.float32), name="w")
    path = Path(gd.train.Checkpoint(w=variable).save(tmp_path / "c.npz"))
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(entries["__graphdist_manifest__.json"])
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (100000, 100000)})
    entry = manifest["variables"]["w"]["entry"]
    entries[entry] = header.getvalue() + b"\0" * 16
    if manifest_says == "huge":
        manifest["variables"]["w"]["shape"] = [100000, 100000]
    text = json.dumps(manifest).encode()
    entries["__graphdist_manifest__.json"] = text
    entries["__graphdist_manifest__.sha256"] = hashlib.sha256(text).hexdigest().encode()
    _write_zip(path, entries)
    tracemalloc.start()
    try:
        with pytest.raises(gd.CheckpointError, match=r"declares float32\[100000, 100000\]|is float32\[100000"):
            gd.train.Checkpoint(w=variable).restore(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"restore allocated {peak:,} bytes"
    np.testing.assert_array_equal(variable.numpy(), np.zeros((2, 2), np.float32))


def test_a_plan_exported_before_manifests_is_saved_in_place(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An older graphdist's plan directory (no manifest) is recognised by its own checksummed plan.json."""
    directory = tmp_path / "v1"
    shutil.copytree(Path(__file__).parent / "data" / "plan_v1_mlp", directory)
    (directory / "thesis.txt").write_text("precious")
    loaded = gd.load_plan(directory)
    assert "not covered by a checksum" in caplog.text
    with pytest.raises(gd.PlanError, match=r"thesis\.txt"):
        loaded.save()
    _intact(directory)
    (directory / "thesis.txt").unlink()
    loaded.save()
    assert (directory / MANIFEST).is_file()
    caplog.clear()
    gd.load_plan(directory)
    assert "not covered by a checksum" not in caplog.text


# ------------------------------------------------- full and read-only disks
@contextlib.contextmanager
def _small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (unmounted afterwards); skips, saying why, where it cannot be."""
    if os.geteuid() != 0:
        pytest.skip("a full or read-only disk is simulated with a small tmpfs, and mounting one needs root")
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {path}: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def _fill(disk: Path) -> None:
    """Writes a file on ``disk`` until it is full."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)


def _snapshot(target: Path) -> dict[str, bytes]:
    """Every file at ``target`` (a file or a directory) by relative path."""
    if target.is_file():
        return {"": target.read_bytes()}
    return {str(p.relative_to(target)): p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()}


def _saver(saved: Saved, kind: str) -> tuple[Callable[[Path], Any], Callable[[Path], Any]]:
    """``(save(target), load(target))`` for a kind of save."""
    if kind == "Checkpoint.save":
        checkpoint = gd.train.Checkpoint(model=saved.model, optimizer=saved.model.optimizer)
        return checkpoint.save, gd.train.Checkpoint(model=saved.model, optimizer=saved.model.optimizer).restore
    if kind == "model.save":
        return saved.model.save, keras.load_model
    if kind == "export":
        return lambda target: saved.concrete.export(target, overwrite=True), gd.load_plan
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [numpy_helper.from_array(np.eye(64, dtype=np.float32), "w")])
    model = gd.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    return model.save, gd.onnx.load


@pytest.mark.parametrize("kind", ["Checkpoint.save", "model.save", "export", "OnnxModel.save"])
@pytest.mark.parametrize("failure", ["disk-full", "read-only"])
def test_a_full_or_read_only_disk_is_a_storage_error_naming_the_target(saved: Saved, tmp_path: Path, kind: str,
                                                                       failure: str) -> None:
    save, load = _saver(saved, kind)
    with _small_disk(tmp_path / "disk", "2m") as disk:
        target = disk / ("ckpt.npz" if kind == "Checkpoint.save" else "model.onnx" if kind == "OnnxModel.save"
                         else "saved")
        save(target)   # the copy that must survive
        before = _snapshot(target)
        if failure == "disk-full":
            _fill(disk)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, capture_output=True)
        with pytest.raises(gd.StorageError) as caught:
            save(target)
        err = caught.value
        assert isinstance(err, OSError) and isinstance(err, gd.GraphdistError)
        code = errno.ENOSPC if failure == "disk-full" else errno.EROFS
        assert err.errno == code and err.filename == str(target)
        message = str(err)
        assert message.startswith(f"{kind}: cannot write {target}: ") and ".tmp" not in message, message
        assert ("filesystem holding it is full" if failure == "disk-full" else "read-only filesystem") in message
        assert "previous copy, if any, is unchanged" in message
        assert err.__cause__ is None and err.__suppress_context__   # one traceback, not a chain of two
        assert _snapshot(target) == before   # the old copy is intact
        left = {p.name for p in disk.iterdir()}
        assert left == ({target.name, "filler"} if failure == "disk-full" else {target.name})   # no staging left
        if failure == "disk-full":
            (disk / "filler").unlink()
        load(target)


def test_a_storage_error_says_what_to_do_for_each_reason() -> None:
    for code, advice in ((errno.ENOSPC, "free some space"), (errno.EROFS, "read-only filesystem"),
                         (errno.EACCES, "permission denied"), (errno.EDQUOT, "quota"), (errno.EIO, "I/O error")):
        err = gd.StorageError.from_os_error(OSError(code, os.strerror(code), "/d/.x.abc.tmp"), "/d/x", "export")
        assert str(err).startswith(f"export: cannot write /d/x: {os.strerror(code)} ({errno.errorcode[code]}); ")
        assert advice in str(err) and "/d/.x.abc.tmp" not in str(err)
        assert (err.errno, err.filename) == (code, "/d/x")
    assert issubclass(gd.StorageError, OSError) and "StorageError" in gd.__all__
