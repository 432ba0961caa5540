"""The disk compile cache trusts nothing it did not verify: entries copied under another key, native code in
a directory others can write, and a size limit with least-recently-used eviction."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphdist import stats
from graphdist.backends import base
from graphdist.backends.base import CompileCache, cache_key, write_artifact_checksum
from graphdist.backends.ort import OPTIMIZED_MODEL_FILE, OrtBackend
from graphdist.errors import InvalidArgumentError
from graphdist.fsutil import private
from graphdist.runtime.devices import Device

CPU0 = Device("cpu", 0)
RNG = np.random.default_rng(5)
W = RNG.standard_normal((4, 3)).astype(np.float32)


def scaled_model(scale: float) -> onnx.ModelProto:
    """y = x @ (scale * W): ``scale`` makes models whose results differ."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "scaled",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(W * np.float32(scale), "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def entry(root: Path, model: onnx.ModelProto, backend=None) -> Path:
    backend = backend or OrtBackend()
    return root / backend.name / cache_key(backend, model, CPU0, None)


def test_an_entry_copied_over_another_is_rejected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = scaled_model(1.0), scaled_model(-2.0)
    for model in (a, b):
        CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    for name in (OPTIMIZED_MODEL_FILE, OPTIMIZED_MODEL_FILE + ".sha256"):   # B's file and checksum over A's
        shutil.copyfile(entry(tmp_path, b) / name, entry(tmp_path, a) / name)

    before = stats.snapshot()
    exe = CompileCache(tmp_path).get_or_compile(OrtBackend(), a, CPU0)
    assert (stats.delta(before)["compiles"], stats.delta(before)["disk_cache_hits"]) == (1, 0)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], x @ W, rtol=1e-5, atol=1e-6)   # A's result, not B's
    assert "stored under another key" in caplog.text
    before = stats.snapshot()
    CompileCache(tmp_path).get_or_compile(OrtBackend(), a, CPU0)   # rebuilt: a valid entry again
    assert stats.delta(before)["disk_cache_hits"] == 1


def _age(directory: Path, seconds_ago: float) -> None:
    stamp = time.time() - seconds_ago
    for file in directory.rglob("*"):
        os.utime(file, (stamp, stamp))


def test_size_limit_evicts_the_least_recently_used_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models = [scaled_model(s) for s in (1.0, 2.0, 3.0)]
    CompileCache(tmp_path).get_or_compile(OrtBackend(), models[0], CPU0)
    size = sum(f.stat().st_size for f in entry(tmp_path, models[0]).rglob("*"))
    monkeypatch.setenv("GRAPHDIST_CACHE_MAX_BYTES", str(int(size * 2.5)))   # room for two entries
    CompileCache(tmp_path).get_or_compile(OrtBackend(), models[1], CPU0)
    _age(entry(tmp_path, models[0]), 100)
    _age(entry(tmp_path, models[1]), 50)
    before = stats.snapshot()
    CompileCache(tmp_path).get_or_compile(OrtBackend(), models[0], CPU0)   # a disk hit: now the most recent
    assert stats.delta(before)["disk_cache_hits"] == 1
    CompileCache(tmp_path).get_or_compile(OrtBackend(), models[2], CPU0)   # over the limit: evicts models[1]
    assert [entry(tmp_path, m).is_dir() for m in models] == [True, False, True]
    total = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert total <= size * 2.5


def test_bad_size_limit_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_CACHE_MAX_BYTES", "2GB")
    with pytest.raises(InvalidArgumentError, match="GRAPHDIST_CACHE_MAX_BYTES must be a number of bytes"):
        CompileCache(tmp_path).get_or_compile(OrtBackend(), scaled_model(1.0), CPU0)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))   # refused before compiling anything
    monkeypatch.setenv("GRAPHDIST_CACHE_MAX_BYTES", "0")   # 0: only the entry just written stays
    for scale in (1.0, 2.0):
        CompileCache(tmp_path).get_or_compile(OrtBackend(), scaled_model(scale), CPU0)
    assert [p.name for p in (tmp_path / "ort").iterdir()] == [entry(tmp_path, scaled_model(2.0)).name]


# ------------------------------------------------------------- native code
PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("MARKER", "w");
    if (f) { fputs("executed", f); fclose(f); }
}
"""


def _plant(tmp_path: Path, directory: Path) -> Path:
    """A shared library that, once loaded, writes a marker file, planted as ``module.so`` with a valid checksum."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler to build the planted library")
    marker = tmp_path / "executed.txt"
    source = tmp_path / "planted.c"
    source.write_text(PLANTED.replace("MARKER", str(marker)))
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / "module.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=60)
    write_artifact_checksum(library)
    return marker


@pytest.mark.parametrize("writable", ["root-group", "root-world", "entry-world"])
def test_native_code_is_not_loaded_from_a_directory_others_can_write(tmp_path: Path, writable: str,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("tvm")
    from graphdist.backends import tvm as tvm_backend

    root = tmp_path / "cache"
    base.make_cache_dir(root)
    model = scaled_model(1.0)
    directory = entry(root, model, tvm_backend.TvmBackend())
    base.make_cache_dir(directory)
    marker = _plant(tmp_path, directory)
    caplog.set_level(logging.WARNING)
    unsafe = root if writable.startswith("root") else directory
    if writable == "root-group":   # a group others are in (a user's private group would be accepted)
        if os.getuid() == 0:
            os.chown(unsafe, -1, 65534)
        elif private._private_group(os.getgid(), os.getuid()):
            pytest.skip("this user's only group is their private group: needs root to give the cache another group")
    unsafe.chmod(0o770 if writable == "root-group" else 0o777)
    assert tvm_backend._load_cached(directory, "scaled") is None
    assert not marker.exists()   # never loaded
    assert "writable by" in caplog.text and "chmod go-w" in caplog.text

    # The check is what kept it out: in a private directory the same file would be loaded (and run).
    unsafe.chmod(0o700)
    tvm_backend._load_cached(directory, "scaled")
    assert marker.read_text() == "executed"


def test_an_unsafe_cache_compiles_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tvm")
    from graphdist.backends import tvm as tvm_backend

    root = tmp_path / "cache"
    base.make_cache_dir(root)
    root.chmod(0o777)
    monkeypatch.setattr(base, "_warned_unsafe", set())
    model = scaled_model(1.0)
    before = stats.snapshot()
    exe = CompileCache(root).get_or_compile(tvm_backend.TvmBackend(), model, CPU0)
    assert (stats.delta(before)["compiles"], stats.delta(before)["disk_cache_hits"]) == (1, 0)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], x @ W, rtol=1e-5, atol=1e-6)
    assert not list(root.rglob("*.so"))   # nothing native written where others could swap it


# ---------------------------------------------------------- poisoned entries
#: What makes each planted entry untrusted, and the words of the one warning that says so.
UNSAFE = {
    "entry-world-writable": "and others (mode 777)",
    "cache-world-writable": "and others (mode 777)",
    "entry-foreign-owned": "belongs to user id 65534",
    "file-foreign-owned": "belongs to user id 65534",
    "parent-world-writable": "without the sticky bit",
    "symlinked-file": "is a symbolic link",
    "symlinked-entry": "is a symbolic link",
}


def _plant_optimized_model(root: Path, model: onnx.ModelProto, scale: float) -> Path:
    """Compiles ``model`` into the cache ``root``, then plants a model computing ``x @ (scale * W)`` as its
    optimized model with a recomputed checksum file: everything a checksum can check matches.
    """
    CompileCache(root).get_or_compile(OrtBackend(), model, CPU0)
    path = entry(root, model) / OPTIMIZED_MODEL_FILE
    planted = scaled_model(scale)
    planted.ir_version = 10
    path.write_bytes(planted.SerializeToString())
    write_artifact_checksum(path)
    return path


def _make_unsafe(how: str, root: Path, path: Path, elsewhere: Path) -> None:
    if "foreign" in how and os.getuid() != 0:
        pytest.skip("needs root to give a file to another user (os.chown to uid 65534)")
    directory = path.parent
    if how == "entry-world-writable":
        directory.chmod(0o777)
    elif how == "cache-world-writable":
        root.chmod(0o777)
    elif how == "entry-foreign-owned":
        os.chown(directory, 65534, 65534)
    elif how == "file-foreign-owned":
        os.chown(path, 65534, 65534)
    elif how == "parent-world-writable":
        root.parent.chmod(0o777)   # no sticky bit: anyone may rename the cache away and put another in its place
    elif how == "symlinked-file":
        elsewhere.mkdir(parents=True)
        shutil.move(path, elsewhere / "planted.onnx")
        path.symlink_to(elsewhere / "planted.onnx")
        write_artifact_checksum(path)   # the checksum of what the link points to
    elif how == "symlinked-entry":
        shutil.move(directory, elsewhere)
        directory.symlink_to(elsewhere, target_is_directory=True)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("graphdist")]


def test_a_planted_optimized_model_runs_from_a_private_cache(tmp_path: Path) -> None:
    # The control for the tests below: with a recomputed checksum a planted model passes every check but
    # the ownership one, so only that check keeps it from running.
    root = tmp_path / "cache"
    base.make_cache_dir(root)
    model = scaled_model(1.0)
    _plant_optimized_model(root, model, -500.0)
    exe = CompileCache(root).get_or_compile(OrtBackend(), model, CPU0)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], x @ (W * -500), rtol=1e-5)


@pytest.mark.parametrize("how", list(UNSAFE))
def test_a_planted_optimized_model_in_an_unsafe_cache_is_ignored(tmp_path: Path, how: str,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "shared" / "cache"
    base.make_cache_dir(root)
    model = scaled_model(1.0)
    path = _plant_optimized_model(root, model, -500.0)
    _make_unsafe(how, root, path, tmp_path / "elsewhere")
    monkeypatch.setattr(base, "_warned_unsafe", set())
    caplog.set_level(logging.WARNING)

    before = stats.snapshot()
    exe = CompileCache(root).get_or_compile(OrtBackend(), model, CPU0)
    assert stats.delta(before)["disk_cache_hits"] == 0
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], x @ W, rtol=1e-5, atol=1e-6)   # not x @ (-500 W)
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert UNSAFE[how] in warned[0] and "GRAPHDIST_CACHE_DIR" in warned[0], warned[0]
    if how == "symlinked-file":   # the entry's own directory is private: a real file replaced the link
        assert not path.is_symlink() and (tmp_path / "elsewhere" / "planted.onnx").is_file()


def test_a_step_ignores_a_planted_model_in_a_world_writable_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    import graphdist as gd

    root = tmp_path / "cache"
    monkeypatch.setenv("GRAPHDIST_CACHE_DIR", str(root))
    monkeypatch.setattr(base, "_warned_unsafe", set())
    strategy = gd.OneDeviceStrategy("cpu:0")
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)

    def make_step():
        @gd.function
        def step(x):
            return strategy.run(lambda x: x @ W + 1.0, args=(x,))
        return step

    base.default_cache().clear()
    want = make_step()(x)
    planted = list(root.rglob(OPTIMIZED_MODEL_FILE))
    assert len(planted) == 1
    model = onnx.load_from_string(planted[0].read_bytes())
    for tensor in model.graph.initializer:   # every weight x -500: the step would return garbage
        array = numpy_helper.to_array(tensor)
        if array.dtype == np.float32:
            tensor.CopyFrom(numpy_helper.from_array(array * np.float32(-500), tensor.name))
    planted[0].write_bytes(model.SerializeToString())
    write_artifact_checksum(planted[0])
    planted[0].parent.chmod(0o777)
    caplog.set_level(logging.WARNING)

    base.default_cache().clear()
    got = make_step()(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, x @ W + 1.0, rtol=1e-5)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "and others (mode 777)" in warned[0], warned


def test_a_cached_tvm_module_that_is_no_executable_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("tvm")
    from graphdist.backends import tvm as tvm_backend

    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler to build the bad library")
    root = tmp_path / "cache"
    base.make_cache_dir(root)
    model = scaled_model(1.0)
    directory = entry(root, model, tvm_backend.TvmBackend())
    base.make_cache_dir(directory)
    source = tmp_path / "plain.c"
    source.write_text("int answer(void) { return 42; }\n")
    library = directory / tvm_backend.MODULE_FILE
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=60)
    write_artifact_checksum(library)   # a valid checksum: it loads, but the VM has nothing to run
    caplog.set_level(logging.WARNING)

    before = stats.snapshot()
    exe = CompileCache(root).get_or_compile(tvm_backend.TvmBackend(), model, CPU0)
    assert (stats.delta(before)["compiles"], stats.delta(before)["disk_cache_hits"]) == (1, 0)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], x @ W, rtol=1e-5, atol=1e-6)
    assert "vm_load_executable" in caplog.text and "recompiling" in caplog.text
    assert base.read_verified_artifact(library, "module") is not None   # the rebuilt module replaced it


def test_the_tuning_database_is_used_only_where_no_one_else_can_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("tvm")
    from graphdist.backends import tvm as tvm_backend

    root = tmp_path / "cache"
    monkeypatch.setenv("GRAPHDIST_CACHE_DIR", str(root))
    monkeypatch.setattr(base, "_warned_unsafe", set())
    with tvm_backend._tuning_work_dir() as work_dir:   # private: the shared database, created 0700
        assert work_dir == root / "tvm-tuning" and stat.S_IMODE(work_dir.stat().st_mode) == 0o700
    work_dir.chmod(0o777)   # MetaSchedule's records decide the generated code: others could plant some
    caplog.set_level(logging.WARNING)
    with tvm_backend._tuning_work_dir() as scratch:
        assert scratch != work_dir and stat.S_IMODE(scratch.stat().st_mode) == 0o700
    assert not scratch.exists()
    assert len(_warnings(caplog)) == 1 and "tvm-tuning is writable by" in _warnings(caplog)[0]
