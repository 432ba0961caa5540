"""The tvm backend: models against numpy/ONNX Runtime, training equivalence under Mirrored,
the disk cache across processes, CUDA code generation without a GPU, MetaSchedule tuning,
and its errors. (Every traced numpy op and gradient rule also runs on tvm in tests/trace.)"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphdist as gd
import graphdist.backends.tvm as tvm_backend_module
from graphdist import stats
from graphdist.backends import CompileCache, get_backend
from graphdist.backends.base import cache_key
from graphdist.backends.tvm import MODULE_FILE, TvmBackend, build, structure_key, tune_trials
from graphdist.backends.tvm_onnx import prepare_for_tvm
from graphdist.compile.plan import Plan
from graphdist.models.convnet import ConvNet
from graphdist.models.mlp import MLP
from graphdist.models.transformer import TransformerBlock
from graphdist.runtime.devices import Device, num_gpus

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(5)
CPU0 = Device("cpu", 0)


def dense_model(rows: int = 6, inner: int = 40, cols: int = 24) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """relu(x @ W + b) with W and b as initializers; returns the model, W and b."""
    w = RNG.standard_normal((inner, cols)).astype(np.float32)
    b = RNG.standard_normal(cols).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, inner])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model, w, b


def test_targets() -> None:
    backend = TvmBackend()
    cpu = tvm_backend_module._host_cpu()
    assert cpu  # LLVM knows every host of this machine kind (Intel and AMD seen)
    assert [backend.target(d) for d in ("cpu:0", "cpu:3", "tpu:2", "cuda:1")] == [
        f"llvm -mcpu={cpu}", f"llvm -mcpu={cpu}", f"tpu -mcpu={cpu}", f"cuda:1 -mcpu={cpu}"]
    assert backend.version.startswith("tvm-0.27")
    assert get_backend("tvm").name == "tvm"


def test_code_built_for_one_cpu_is_cached_apart_from_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache copied from an Intel host to an AMD one (or back) never hands out the other's code."""
    model, _, _ = dense_model(4, 8, 3)
    backend = TvmBackend()
    keys = {}
    for cpu in ("sapphirerapids", "znver4"):
        monkeypatch.setattr(tvm_backend_module, "_host_cpu", lambda cpu=cpu: cpu)
        keys[cpu] = (cache_key(backend, model, Device("cpu", 0)),
                     structure_key(model, backend.target("cpu:0"), backend.version, 2))
    assert keys["sapphirerapids"][0] != keys["znver4"][0]
    assert keys["sapphirerapids"][1] != keys["znver4"][1]


@pytest.mark.parametrize("shape", [(256, 784, 512), (7, 33, 10), (64, 16, 130)])
def test_matmul_schedule_matches_numpy_on_awkward_shapes(shape: tuple[int, int, int]) -> None:
    """The register-tiled matmul pads to its tile: sizes that are not multiples of it stay exact."""
    rows, inner, cols = shape
    model, w, b = dense_model(rows, inner, cols)
    x = RNG.standard_normal((rows, inner)).astype(np.float32)
    (y,) = TvmBackend().compile(model, CPU0).run({"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_transposed_matmuls_become_einsum_and_stay_exact() -> None:
    a = RNG.standard_normal((12, 9)).astype(np.float32)
    b = RNG.standard_normal((12, 20)).astype(np.float32)
    c = RNG.standard_normal((9, 20)).astype(np.float32)
    fn = gd.function(lambda a, b, c: (a.T @ b, b @ c.T @ c), backend="tvm")
    model = fn.get_concrete_function(a, b, c).plan.segments[0].model
    ops = [n.op_type for n in prepare_for_tvm(model).graph.node]
    assert ops.count("Einsum") == 2 and "MatMul" in ops  # two transposed operands folded, one plain matmul left
    got = fn(a, b, c)
    np.testing.assert_allclose(got[0], a.T @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], b @ c.T @ c, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fn,rewritten", [
    (lambda x: np.maximum(x, 0.0), ["Less", "Where"]),     # a clamp to a NaN-free constant: compare + select
    (lambda x: np.minimum(2.0, x), ["Greater", "Where"]),
    (lambda x: np.maximum(x, x[::-1]), ["Max", "IsNaN", "Where", "IsNaN", "Where"]),  # both may be NaN
])
def test_nan_propagation_rewrite(fn, rewritten: list[str]) -> None:
    step = gd.function(fn, backend="tvm")
    x = np.array([1.0, np.nan, -2.0, 0.0, 3.0, -0.5], np.float32)
    model = step.get_concrete_function(x).plan.segments[0].model
    ops = [n.op_type for n in prepare_for_tvm(model).graph.node if n.op_type not in ("Slice", "Constant")]
    assert ops == rewritten
    np.testing.assert_array_equal(step(x), fn(x))  # NaN where numpy has NaN


@pytest.mark.parametrize("pads", [[1, 0, 2, 1], [0, 0, 0, 0], [2, 1, 2, 1]])
def test_conv_transpose_runs_as_a_flipped_conv(pads: list[int]) -> None:
    """A convolution's input gradient (unit stride) becomes a Conv for TVM, with ONNX Runtime's values."""
    x = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    w = RNG.standard_normal((3, 4, 3, 2)).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)
    kernel = [3, 2]
    out_shape = [2, 4, 5 + 2 - pads[0] - pads[2], 4 + 1 - pads[1] - pads[3]]
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=kernel, pads=pads)], "convt",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    assert "ConvTranspose" not in [n.op_type for n in prepare_for_tvm(model).graph.node]
    expected = get_backend("ort").compile(model, CPU0).run({"x": x, "w": w})[0]
    got = TvmBackend().compile(model, CPU0).run({"x": x, "w": w})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


MODELS = {
    "mlp": (lambda: MLP((64, 32, 10), seed=0, trainable=True), lambda n: (
        np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32),
        np.random.default_rng(1).integers(0, 10, n))),
    "convnet": (lambda: ConvNet(seed=0), lambda n: ConvNet.example_data(n=n)),
    "transformer": (lambda: TransformerBlock(seed=0), lambda n: TransformerBlock.example_data(n=n)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_forward_matches_ort(name: str) -> None:
    make, data = MODELS[name]
    model = make()
    x, _ = data(16)
    expected = gd.function(model.forward, backend="ort")(x)
    got = gd.function(model.forward, backend="tvm")(x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    if hasattr(model, "reference_forward"):
        np.testing.assert_allclose(got, model.reference_forward(x), rtol=1e-4, atol=1e-5)


def _train(strategy: gd.Strategy, name: str, steps: int = 3, batch: int = 16) -> list[np.ndarray]:
    make, data = MODELS[name]
    with strategy.scope():
        model = make()
        optimizer = gd.optimizers.SGD(0.05, momentum=0.9)
    step = model.make_train_step(optimizer, batch) if name != "mlp" else model.make_train_step(optimizer)
    x_all, y_all = data(batch * steps)
    dataset = gd.data.Dataset.from_tensor_slices((x_all, y_all)).batch(batch)
    for x, y in strategy.experimental_distribute_dataset(dataset):
        strategy.run(step, args=(x, y))
    return [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_mirrored_training_on_tvm_equals_one_device(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi-device oracle with every segment compiled by TVM: Mirrored(2) == OneDevice, and both
    equal the same training on ONNX Runtime."""
    monkeypatch.setenv("GRAPHDIST_BACKEND", "ort")
    ort_one = _train(gd.OneDeviceStrategy("cpu:0"), name)
    monkeypatch.setenv("GRAPHDIST_BACKEND", "tvm")
    before = stats.snapshot()
    one = _train(gd.OneDeviceStrategy("cpu:0"), name)
    mirrored = _train(gd.MirroredStrategy(["cpu:0", "cpu:1"]), name)
    assert stats.delta(before)["compiles"] > 0  # really compiled by TVM, not served by ORT
    for got, want, ort in zip(mirrored, one, ort_one):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(want, ort, rtol=2e-4, atol=2e-5)


def _lowered_functions(model: onnx.ModelProto) -> dict[str, object]:
    """The PrimFuncs TVM's CPU lowering makes of an ONNX segment, by name (before any schedule)."""
    from graphdist.backends import tvm as tvm_backend

    tvm = tvm_backend._tvm()
    mod = tvm_backend._import_onnx(model, "segment")
    with tvm_backend._llvm_target(2):
        mod = tvm_backend._cpu_passes(tvm)(mod)
    return {gv.name_hint: func for gv, func in mod.functions.items() if isinstance(func, tvm.tirx.PrimFunc)}


def _output_rows(func: object) -> int:
    """Rows of a PrimFunc's output (its last buffer parameter's second-to-last dimension)."""
    signature = next(line for line in func.script().splitlines() if line.startswith("def main("))
    *_, output = re.findall(r"T\.Buffer\(\(([^\"]*)\), \"", signature)
    dims = [int(d) for d in re.findall(r"\d+", output.replace("T.int64", ""))]
    return dims[-2] if len(dims) >= 2 else 1


@pytest.mark.parametrize("name", ["convnet", "mlp"])
def test_every_matmul_and_convolution_of_a_training_step_gets_the_tiled_schedule(name: str) -> None:
    """A rule that stops applying fails silently (TVM's default serial code runs instead, 10-100x slower):
    the matmul rule must schedule every matrix multiply, einsum and convolution of the training step
    (forward, both gradients of a convolution included) without raising, and spread it over both
    cores (a narrow convolution's single column panel used to run on one).
    """
    from graphdist.backends import tvm as tvm_backend
    from graphdist.backends.tvm_schedules import CPUMatmul

    strategy = gd.OneDeviceStrategy("cpu:0")
    make, data = MODELS[name]
    with strategy.scope():
        model = make()
        optimizer = gd.optimizers.SGD(0.05)
    step = model.make_train_step(optimizer, 64) if name != "mlp" else model.make_train_step(optimizer)
    x, y = data(64)
    concrete = gd.function(lambda a, b: strategy.run(step, args=(a, b)), backend="tvm").get_concrete_function(x, y)
    target = tvm_backend._llvm_target(2)
    scheduled = []
    for segment in concrete.plan.segments:
        for fname, func in _lowered_functions(segment.model).items():
            if not any(kind in fname for kind in ("matmul", "conv2d", "einsum")):
                continue
            result = CPUMatmul().apply(func, target, False)
            if result is None and _output_rows(func) == 1:
                continue  # a matrix-vector product (a bias gradient): dlight's GEMV/reduction rules
            assert result is not None, fname
            if _output_rows(func) > 8:  # more than one row tile (8 rows x one vector: the conv1 weight gradient)
                assert "T.parallel(T.int64(1))" not in result.mod.script(), f"{fname} runs on one core"
            scheduled.append(fname)
    assert len(scheduled) >= 5, scheduled


@pytest.mark.parametrize("a_shape,b_shape", [
    ((1, 1, 16, 1024), (1, 9, 1024, 8)),    # a convolution's weight gradient: batch broadcast, 8 columns
    ((37, 144), (144, 8)),                  # one 8-lane column panel, rows split over the cores
    ((20, 50), (50, 72)),                   # 72 columns: one 16-lane vector per row, padded to 80
])
def test_narrow_matmul_tiles_match_numpy(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "narrow",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape)),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    (y,) = TvmBackend().compile(model, CPU0, threads=2).run({"a": a, "b": b})
    np.testing.assert_allclose(y, np.matmul(a, b), rtol=1e-4, atol=1e-4)


def test_running_a_tvm_segment_leaves_the_process_cpu_affinity_alone() -> None:
    """TVM's thread pool pins the calling thread to core 0 unless told not to: every thread the user's
    main thread starts afterwards (ONNX Runtime's pools, the scheduler's device threads) would share it.
    """
    before = os.sched_getaffinity(0)
    model, _, _ = dense_model()
    TvmBackend().compile(model, CPU0, threads=2).run({"x": RNG.standard_normal((6, 40)).astype(np.float32)})
    assert os.sched_getaffinity(0) == before


CHILD = """
import json, sys
import numpy as np
import onnx
from graphdist import stats
from graphdist.backends import default_cache, get_backend
from graphdist.runtime.devices import parse_device

model = onnx.load(sys.argv[1])
exe = default_cache().get_or_compile(get_backend("tvm"), model, parse_device("cpu:0"), threads=1)
np.save(sys.argv[3], exe.run({"x": np.load(sys.argv[2])})[0])
print(json.dumps(stats.snapshot()))
"""


def _run_child(tmp_path: Path, tag: str) -> tuple[dict[str, int], np.ndarray]:
    env = dict(os.environ, GRAPHDIST_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    out = tmp_path / f"{tag}.npy"
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "m.onnx"), str(tmp_path / "x.npy"), str(out)],
                          check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(out)


def test_second_process_loads_the_compiled_module(tmp_path: Path) -> None:
    model, w, b = dense_model()
    onnx.save(model, tmp_path / "m.onnx")
    x = RNG.standard_normal((6, 40)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    first, y1 = _run_child(tmp_path, "first")
    assert (first["compiles"], first["disk_cache_hits"]) == (1, 0)
    assert list((tmp_path / "cache" / "tvm").glob(f"*/{MODULE_FILE}"))
    second, y2 = _run_child(tmp_path, "second")
    assert (second["compiles"], second["disk_cache_hits"]) == (0, 1)
    np.testing.assert_allclose(y1, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y1, y2)


def test_corrupt_cached_module_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, w, b = dense_model()
    CompileCache(tmp_path).get_or_compile(TvmBackend(), model, CPU0)
    (library,) = tmp_path.glob(f"tvm/*/{MODULE_FILE}")
    damaged = library.with_suffix(".damaged")
    damaged.write_bytes(library.read_bytes()[:100])
    damaged.replace(library)  # a new file: never rewrite a shared library some process may have mapped
    before = stats.snapshot()
    exe = CompileCache(tmp_path).get_or_compile(TvmBackend(), model, CPU0)
    assert stats.delta(before)["compiles"] == 1
    assert "corrupt" in caplog.text
    x = RNG.standard_normal((6, 40)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})[0], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_cuda_code_is_generated_and_exported_without_a_gpu(tmp_path: Path) -> None:
    model, _, _ = dense_model(64, 128, 32)
    built = build(model, "cuda:0", cuda_arch="sm_80")
    assert built.kind == "cuda" and built.target.kind.name == "cuda"
    path = built.export(tmp_path / "dense_cuda.so")
    assert path.stat().st_size > 0
    source = "\n".join(m.inspect_source() for m in _modules(built.executable.mod) if m.kind == "cuda")
    assert "__global__" in source  # real CUDA kernels, compiled for sm_80
    if num_gpus() == 0:
        with pytest.raises(gd.DeviceError, match="no GPU"):
            TvmBackend().compile(model, "cuda:0")


def _modules(module):
    yield module
    for imported in module.imports:
        yield from _modules(imported)


def test_feed_errors_name_the_input() -> None:
    model, _, _ = dense_model()
    exe = TvmBackend().compile(model, CPU0)
    with pytest.raises(gd.BackendError, match="missing feed 'x'"):
        exe.run({})
    with pytest.raises(gd.BackendError, match=r"feed 'x' is float64\[6, 40\], expected float32\[6, 40\]"):
        exe.run({"x": np.zeros((6, 40))})


def test_unconvertible_op_is_a_backend_error() -> None:
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "det",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(gd.BackendError, match="segment 'det'"):
        build(model)


def test_failed_op_conversion_names_the_op_and_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    # An Expand whose input has no known rank makes TVM's converter fail after printing to stdout.
    graph = helper.make_graph([helper.make_node("Expand", ["x", "s"], ["y"])], "expand",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(gd.BackendError, match="cannot convert segment 'expand' op 'Expand'"):
        build(model)
    assert "Error converting operator" not in capsys.readouterr().out


def test_tune_budget_must_be_an_integer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_TVM_TUNE", "lots")
    with pytest.raises(gd.BackendError, match="GRAPHDIST_TVM_TUNE='lots'"):
        tune_trials()
    monkeypatch.setenv("GRAPHDIST_TVM_TUNE", "8")
    assert tune_trials() == 8 and TvmBackend().version.endswith("-tuned8")


@pytest.mark.slow
def test_metaschedule_tuning_persists_its_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_CACHE_DIR", str(tmp_path))
    model, w, b = dense_model(32, 64, 48)
    user_logger = logging.getLogger("a_user_module")
    built = build(model, tune=2)  # MetaSchedule's builder/runner pools take most of the time on 2 cores
    assert built.tuned_trials == 2
    # MetaSchedule's dictConfig disables every existing logger; graphdist puts them back (else graphdist's
    # and the user's warnings vanish for the rest of the process)
    assert not user_logger.disabled and not logging.getLogger("graphdist.compile.progress").disabled
    records = list((tmp_path / "tvm-tuning").glob("*.json"))
    assert records and any(p.stat().st_size > 0 for p in records)
    vm = __import__("tvm").relax.VirtualMachine(built.executable, __import__("tvm").cpu())
    x = RNG.standard_normal((32, 64)).astype(np.float32)
    y = vm["main"](__import__("tvm").runtime.tensor(x)).numpy()
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_replica_segments_share_one_build(tmp_path: Path) -> None:
    """The replicas of a step traced once compile to segments that differ only in names: one build each kind
    (4 forward/backward segments and 4 update segments, the updates balanced over the replicas)."""
    from graphdist.models.mlp import make_step

    cache = CompileCache(tmp_path)
    step, args = make_step(gd.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"]), batch=16)
    concrete = step.get_concrete_function(*args)
    before = stats.snapshot()
    plan = Plan.from_graph(concrete.graph("partitioned")).compile(TvmBackend(), cache)
    delta = stats.delta(before)
    assert len(plan.segments) == 8 and delta["compiles"] < len(plan.segments)
    assert delta.get("shared_builds", 0) >= 2  # replicas 1 and 2 (their segments equal up to names)
    ort = Plan.from_graph(concrete.graph("partitioned")).compile(get_backend("ort"))
    feeds = {name: np.asarray(value) for name, value in zip(concrete._input_names, [a for p in args for a in p.values])}
    feeds.update({name: v._value for name, v in concrete._variable_feeds})
    for got, want in zip(plan.run(feeds), ort.run(feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_structure_key_ignores_names_only() -> None:
    model, _, _ = dense_model()
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.name = "other"
    inner = renamed.graph.node[0].output[0]  # an internal value, renamed where it is made and read
    for node in renamed.graph.node:
        node.name = node.name + "_r1"
        node.input[:] = [f"{n}_r1" if n == inner else n for n in node.input]
        node.output[:] = [f"{n}_r1" if n == inner else n for n in node.output]
    key = structure_key(model, "llvm", "v", 2)
    assert structure_key(renamed, "llvm", "v", 2) == key
    assert structure_key(model, "llvm", "v", 1) != key  # the thread budget is part of the build
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    changed.graph.node[0].op_type = "Sub" if changed.graph.node[0].op_type != "Sub" else "Add"
    assert structure_key(changed, "llvm", "v", 2) != key
