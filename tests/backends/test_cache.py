"""Tests for graphdist.backends.base: registry, cache keys, memory and disk
caches (including a second process and corrupt files), atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphdist import stats
from graphdist.backends import base, get_backend
from graphdist.backends.base import (
    CompileCache,
    atomic_write_bytes,
    available_backends,
    cache_dir,
    cache_key,
    default_cache,
    prepare_model,
)
from graphdist.backends.ort import OPTIMIZED_MODEL_FILE, OrtBackend
from graphdist.backends.reference import ReferenceBackend
from graphdist.errors import BackendError, PlanError
from graphdist.runtime.devices import Device

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(2)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)
CPU0 = Device("cpu", 0)


def mlp_model(scale: float = 1.0) -> onnx.ModelProto:
    """relu(x @ (scale * W) + B), float32; ``scale`` makes distinct models."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["m"]),
            helper.make_node("Add", ["m", "B"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [
            numpy_helper.from_array(W * np.float32(scale), "W"),
            numpy_helper.from_array(B, "B"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W + B, 0)


def segment_dir(root: Path, model: onnx.ModelProto, threads: int | None = None) -> Path:
    return root / "ort" / cache_key(OrtBackend(), model, CPU0, threads)


# --- registry --------------------------------------------------------------


def test_available_backends() -> None:
    assert {"ort", "reference"} <= set(available_backends())


def test_get_backend_default_is_ort(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPHDIST_BACKEND", raising=False)
    assert get_backend().name == "ort"


def test_get_backend_honours_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_BACKEND", "reference")
    assert isinstance(get_backend(), ReferenceBackend)
    assert get_backend("ort").name == "ort"  # an explicit name wins


def test_unknown_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        PlanError, match=r"unknown backend 'nope'; choose one of .*'ort'.*'reference'"
    ):
        get_backend("nope")
    with pytest.raises(ValueError):
        get_backend("nope")
    monkeypatch.setenv("GRAPHDIST_BACKEND", "tvmm")
    with pytest.raises(PlanError, match="unknown GRAPHDIST_BACKEND 'tvmm'"):
        get_backend()


def test_register_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_registry", dict(base._registry))
    custom = ReferenceBackend()
    custom.name = "mine"
    base.register_backend(custom)
    assert get_backend("mine") is custom
    assert "mine" in available_backends()


# --- keys and helpers ----------------------------------------------------


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRAPHDIST_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("GRAPHDIST_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "graphdist"


def test_cache_key_covers_every_part() -> None:
    ort, ref = OrtBackend(), ReferenceBackend()
    key = cache_key(ort, mlp_model(), CPU0)
    assert len(key) == 64
    assert key == cache_key(ort, mlp_model(), Device("cpu", 3))  # same target
    assert key != cache_key(ort, mlp_model(2.0), CPU0)
    assert key != cache_key(ref, mlp_model(), CPU0)
    assert key != cache_key(ort, mlp_model(), CPU0, threads=1)
    assert key != cache_key(ort, mlp_model(), Device("cuda", 0))


def test_prepare_model_lowers_ir_without_mutating() -> None:
    model = mlp_model()
    model.ir_version = 14
    prepared = prepare_model(model)
    assert prepared.ir_version == 10 and model.ir_version == 14
    assert prepared.graph == model.graph
    model.ir_version = 8
    assert prepare_model(model) is model


def test_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "file.bin"
    atomic_write_bytes(path, b"first")
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert os.listdir(path.parent) == ["file.bin"]


def test_atomic_write_failure_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "file.bin"
    atomic_write_bytes(path, b"old")

    def killed(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # the process dies between write and rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(path, b"new content")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"]


# --- memory cache ----------------------------------------------------------


def test_memory_hit(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    before = stats.snapshot()
    first = cache.get_or_compile(OrtBackend(), mlp_model(), CPU0)
    second = cache.get_or_compile(OrtBackend(), mlp_model(), Device("cpu", 1))
    changes = stats.delta(before)
    assert second is first
    assert (
        changes["compiles"],
        changes["memory_cache_hits"],
        changes["disk_cache_hits"],
    ) == (1, 1, 0)
    third = cache.get_or_compile(OrtBackend(), mlp_model(), CPU0, threads=1)
    assert third is not first and len(cache) == 2
    assert stats.delta(before)["compiles"] == 2


def test_concurrent_requests_compile_once(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    results: list[object] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(cache.get_or_compile(OrtBackend(), mlp_model(), CPU0))

    before = stats.snapshot()
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    changes = stats.delta(before)
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert changes["compiles"] + changes["disk_cache_hits"] == 1
    assert changes["memory_cache_hits"] == 7


def test_default_cache_uses_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GRAPHDIST_CACHE_DIR", str(tmp_path))
    assert default_cache() is default_cache()
    assert default_cache().directory == tmp_path


# --- disk cache ------------------------------------------------------------


def test_disk_cache_files(tmp_path: Path) -> None:
    model = mlp_model()
    CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    directory = segment_dir(tmp_path, model)
    assert sorted(os.listdir(directory)) == [
        OPTIMIZED_MODEL_FILE,
        OPTIMIZED_MODEL_FILE + ".sha256",
    ]
    data = (directory / OPTIMIZED_MODEL_FILE).read_bytes()
    record = json.loads((directory / (OPTIMIZED_MODEL_FILE + ".sha256")).read_text())
    assert hashlib.sha256(data).hexdigest() == record["sha256"]
    assert record["key"] == f"ort/{directory.name}/{OPTIMIZED_MODEL_FILE}"  # the key it is stored under
    onnx.load_from_string(data)  # a complete, parseable model


def test_disk_hit_in_process(tmp_path: Path) -> None:
    model = mlp_model()
    CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    before = stats.snapshot()
    exe = CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    changes = stats.delta(before)
    assert (changes["disk_cache_hits"], changes["compiles"]) == (1, 0)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], expected(x), rtol=1e-5, atol=1e-6)


CHILD = """
import json, sys
import numpy as np
import onnx
from graphdist import stats
from graphdist.backends import default_cache, get_backend
from graphdist.runtime.devices import parse_device

model = onnx.load(sys.argv[1])
exe = default_cache().get_or_compile(get_backend(), model, parse_device("cpu:0"), threads=1)
np.save(sys.argv[3], exe.run({"x": np.load(sys.argv[2])})[0])
print(json.dumps(stats.snapshot()))
"""


def run_child(tmp_path: Path, tag: str) -> tuple[dict[str, int], np.ndarray]:
    env = dict(
        os.environ, GRAPHDIST_CACHE_DIR=str(tmp_path / "cache"), GRAPHDIST_BACKEND="ort"
    )
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    out = tmp_path / f"y_{tag}.npy"
    args = [
        sys.executable,
        "-c",
        CHILD,
        str(tmp_path / "m.onnx"),
        str(tmp_path / "x.npy"),
        str(out),
    ]
    done = subprocess.run(
        args,
        check=False,
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(out)


def test_disk_hit_in_second_process(tmp_path: Path) -> None:
    model = mlp_model()
    model.ir_version = 14  # as onnx 1.23 writes it
    onnx.save(model, tmp_path / "m.onnx")
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)

    first, y1 = run_child(tmp_path, "first")
    assert (first["compiles"], first["disk_cache_hits"]) == (1, 0)
    assert (tmp_path / "cache" / "ort").is_dir()

    second, y2 = run_child(tmp_path, "second")
    assert (second["disk_cache_hits"], second["compiles"]) == (1, 0)
    np.testing.assert_allclose(y1, expected(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y1, y2)


def _corrupt_and_recompile(tmp_path: Path, corrupt) -> None:
    model = mlp_model()
    CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    directory = segment_dir(tmp_path, model)
    good = (directory / OPTIMIZED_MODEL_FILE).read_bytes()
    corrupt(
        directory / OPTIMIZED_MODEL_FILE, directory / (OPTIMIZED_MODEL_FILE + ".sha256")
    )

    before = stats.snapshot()
    exe = CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    changes = stats.delta(before)
    assert (changes["compiles"], changes["disk_cache_hits"]) == (1, 0)
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], expected(x), rtol=1e-5, atol=1e-6)
    assert (directory / OPTIMIZED_MODEL_FILE).read_bytes() == good  # rewritten

    before = stats.snapshot()
    CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    assert stats.delta(before)["disk_cache_hits"] == 1  # and valid again


def test_garbage_cached_file_is_recompiled(tmp_path: Path) -> None:
    def corrupt(path: Path, checksum: Path) -> None:
        path.write_bytes(b"\x00garbage\xff" * 10)

    _corrupt_and_recompile(tmp_path, corrupt)


def test_truncated_cached_file_is_recompiled(tmp_path: Path) -> None:
    def corrupt(path: Path, checksum: Path) -> None:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    _corrupt_and_recompile(tmp_path, corrupt)


def test_swapped_cached_model_is_recompiled(tmp_path: Path) -> None:
    def corrupt(path: Path, checksum: Path) -> None:
        other = mlp_model(2.0)  # loadable, but computes something else
        other.ir_version = 10
        path.write_bytes(other.SerializeToString())

    _corrupt_and_recompile(tmp_path, corrupt)


def test_unloadable_file_with_valid_checksum_is_recompiled(tmp_path: Path) -> None:
    def corrupt(path: Path, checksum: Path) -> None:
        data = b"not an onnx model"
        path.write_bytes(data)
        checksum.write_text(json.dumps({"key": f"ort/{path.parent.name}/{path.name}",
                                        "sha256": hashlib.sha256(data).hexdigest()}))

    _corrupt_and_recompile(tmp_path, corrupt)


def test_missing_checksum_is_recompiled(tmp_path: Path) -> None:
    def corrupt(path: Path, checksum: Path) -> None:
        checksum.unlink()

    _corrupt_and_recompile(tmp_path, corrupt)


def test_unwritable_cache_dir_still_compiles(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    before = stats.snapshot()
    exe = CompileCache(blocker).get_or_compile(OrtBackend(), mlp_model(), CPU0)
    assert stats.delta(before)["compiles"] == 1
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], expected(x), rtol=1e-5, atol=1e-6)


def test_reference_backend_persists_nothing(tmp_path: Path) -> None:
    CompileCache(tmp_path).get_or_compile(ReferenceBackend(), mlp_model(), CPU0)
    assert not any(tmp_path.rglob("*.onnx"))


def test_ort_failing_to_save_still_compiles_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import graphdist.backends.ort as ort_module

    class FixedUuid:
        hex = "fixed"

    monkeypatch.setattr(ort_module.uuid, "uuid4", lambda: FixedUuid)
    model = mlp_model()
    directory = segment_dir(tmp_path, model)
    (directory / ".fixed.tmp.onnx").mkdir(parents=True)  # ORT cannot write its file
    before = stats.snapshot()
    exe = CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    assert stats.delta(before)["compiles"] == 1
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], expected(x), rtol=1e-5, atol=1e-6)
    assert not (directory / OPTIMIZED_MODEL_FILE).exists()
    assert capsys.readouterr().out == ""  # ORT's provider-fallback prints are off


def test_invalid_model_with_disk_cache(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(BackendError, match="'broken'.*NoSuchOp"):
        CompileCache(tmp_path).get_or_compile(OrtBackend(), model, CPU0)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
