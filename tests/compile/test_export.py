"""Plan export and gd.load_plan: same results as in process, validation, atomic writes."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile import plan_files
from graphdist.compile.plan import Plan
from graphdist.fsutil import savedir
from graphdist.models.mlp import MLP

GLOBAL_BATCH = 8
RNG = np.random.default_rng(0)
XS = [RNG.standard_normal((GLOBAL_BATCH, 8)).astype(np.float32) for _ in range(4)]
YS = [RNG.integers(0, 4, GLOBAL_BATCH) for _ in range(4)]

STRATEGIES = {
    "mirrored": lambda: gd.MirroredStrategy(["cpu:0", "cpu:1"]),
    "central": lambda: gd.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    "one_device": lambda: gd.OneDeviceStrategy("cpu:0"),
}


class Run:
    """An in-process MLP training step under a strategy."""

    def __init__(self, kind: str, backend: str) -> None:
        self.strategy = STRATEGIES[kind]()
        with self.strategy.scope():
            model = MLP(sizes=(8, 16, 4), trainable=True, seed=0)
            optimizer = gd.optimizers.SGD(0.1, momentum=0.9)
            replica_step = model.make_train_step(optimizer, global_batch_size=GLOBAL_BATCH)
        strategy = self.strategy

        @gd.function(backend=backend)
        def step(x, y):
            per_replica = strategy.run(replica_step, args=(x, y))
            return {"loss": strategy.reduce("SUM", per_replica, axis=None), "per_replica": per_replica}

        self.step = step

    def batch(self, i: int):
        data = gd.data.Dataset.from_tensor_slices((XS[i], YS[i])).batch(GLOBAL_BATCH)
        return next(iter(self.strategy.experimental_distribute_dataset(data)))

    def __call__(self, i: int):
        return self.step(*self.batch(i))

    @property
    def concrete(self):
        return self.step.get_concrete_function(*self.batch(0))

    def variables(self) -> dict[str, np.ndarray]:
        return {name: var.numpy() for name, var in self.concrete._variable_feeds}


def _components(value):
    return list(value.values) if isinstance(value, gd.PerReplica) else [value]


def _assert_same_result(expected, actual) -> None:
    np.testing.assert_allclose(actual["loss"], expected["loss"], rtol=1e-5, atol=1e-6)
    assert type(actual["per_replica"]) is type(expected["per_replica"])
    for a, e in zip(_components(actual["per_replica"]), _components(expected["per_replica"])):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def _assert_same_variables(expected: dict, actual: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def mirrored_plan(tmp_path_factory: pytest.TempPathFactory):
    """A Mirrored/ort plan exported after one step, and the run it came from (in its state at export)."""
    run = Run("mirrored", "ort")
    run(0)
    directory = tmp_path_factory.mktemp("plans") / "mirrored"
    run.concrete.export(directory)
    return directory, run.variables()


# ------------------------------------------------------------ round trips
@pytest.mark.parametrize("backend", ["ort", "reference"])
@pytest.mark.parametrize("kind", ["mirrored", "central", "one_device"])
def test_loaded_plan_matches_in_process(kind: str, backend: str, tmp_path: Path) -> None:
    run = Run(kind, backend)
    run(0)
    directory = tmp_path / "plan"
    assert run.concrete.plan.export(directory) == str(directory.absolute())
    loaded = gd.load_plan(directory)
    assert loaded.backend_name == backend
    assert loaded.devices == run.concrete.plan.devices
    _assert_same_variables(run.variables(), loaded.variables)
    assert loaded.summary() == run.concrete.plan.summary()  # placement, collectives and variables survive
    for i in range(1, 4):
        # the loaded plan takes the global batch and splits it like experimental_distribute_dataset
        _assert_same_result(run(i), loaded(XS[i], YS[i]))
    _assert_same_variables(run.variables(), loaded.variables)


def test_plan_json_schema(mirrored_plan) -> None:
    directory, _ = mirrored_plan
    doc = json.loads((directory / "plan.json").read_text())
    assert doc["format"] == "graphdist-plan" and doc["version"] == 3
    assert doc["backend"] == "ort" and doc["devices"] == ["cpu:0", "cpu:1"]
    assert {e["name"]: (e["arg"], e["replica"]) for e in doc["inputs"]} == {
        "arg0_r0": (0, 0), "arg0_r1": (0, 1), "arg1_r0": (1, 0), "arg1_r1": (1, 1)}
    assert [leaf["kind"] for leaf in doc["arguments"]["leaves"]] == ["per_replica", "per_replica"]
    kernel = next(v for v in doc["variables"] if v["input"] == "mlp/dense_0/kernel")
    assert kernel["placement"] == "mirrored" and kernel["trainable"] and kernel["update_output"]
    assert kernel["shape"] == [8, 16] and kernel["dtype"] == "<f4"
    assert {s["device"] for s in doc["segments"]} == {"cpu:0", "cpu:1"}
    for seg in doc["segments"]:
        assert (directory / seg["file"]).is_file() and len(seg["sha256"]) == 64
    # each gradient summed by the replica that updates it, the other's read through a Transfer; and each
    # replica's labels check (graphdist.ir.check_ops)
    assert {c["op"] for c in doc["collectives"]} == {"Transfer", "AssertInRange"}
    ids = [t["id"] for t in doc["tasks"]]
    assert all(set(t["deps"]) <= set(ids[:i]) for i, t in enumerate(doc["tasks"]))  # topological order
    assert doc["outputs"]["counts"] == [None, 2]
    assert doc["outputs"]["structure"]["kind"] == "dict"
    assert set(doc["graphs"]) == {"traced", "rewritten", "partitioned"}
    # The traced step, for re-planning: one replica's inputs, its interface, variables and batch size.
    traced = doc["traced"]
    per_replica_batch = doc["inputs"][0]["shape"][0]
    assert traced["per_replica_inputs"] == {"arg0": None, "arg1": None} and traced["batch"] == per_replica_batch
    assert traced["replicas_in_sync"] == 2 and traced["rebatch"] == {"verified": True, "reason": None}
    assert [a["kind"] for a in traced["interface"]["arguments"]] == ["per_replica", "per_replica"]
    assert {v["input"] for v in traced["variables"]} == {v["input"] for v in doc["variables"]}
    assert doc["replicas"] == {"local": 2, "in_sync": 2, "offset": 0}
    assert sorted(p.name for p in directory.iterdir()) == [
        "constants.npz", "graphdist-manifest.json", "graphdist-signature.json", "graphs", "plan.json", "segments",
        "variables.npz"]


def test_loaded_plan_in_a_fresh_process_without_model_code(mirrored_plan, tmp_path: Path) -> None:
    directory, exported_variables = mirrored_plan
    np.savez(tmp_path / "data.npz", **{f"x{i}": XS[i] for i in range(1, 4)}, **{f"y{i}": YS[i] for i in range(1, 4)})
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import graphdist as gd

        plan = gd.load_plan({str(directory)!r})
        data = np.load({str(tmp_path / "data.npz")!r}, allow_pickle=False)
        results = {{}}
        for i in range(1, 4):
            out = plan(data[f"x{{i}}"], data[f"y{{i}}"])
            assert isinstance(out["per_replica"], gd.PerReplica), type(out["per_replica"])
            results[f"loss{{i}}"] = out["loss"]
            for r, value in enumerate(out["per_replica"].values):
                results[f"per{{i}}_{{r}}"] = value
        variables = plan.variables
        names = sorted(variables)
        results.update({{f"var{{k}}": variables[n] for k, n in enumerate(names)}})
        np.savez({str(tmp_path / "out.npz")!r}, names=np.array(names), **results)
        leaked = [m for m in ("models", "graphdist.models.mlp", "tests", {__name__!r}) if m in sys.modules]
        assert not leaked, leaked
    """)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    run = Run("mirrored", "ort")
    for name, var in run.concrete._variable_feeds:  # start from the exported state
        var.assign(exported_variables[name])
    with np.load(tmp_path / "out.npz", allow_pickle=False) as out:
        for i in range(1, 4):
            expected = run(i)
            np.testing.assert_allclose(out[f"loss{i}"], expected["loss"], rtol=1e-5, atol=1e-6)
            for r, value in enumerate(expected["per_replica"].values):
                np.testing.assert_allclose(out[f"per{i}_{r}"], value, rtol=1e-5, atol=1e-6)
        loaded_vars = {str(n): out[f"var{k}"] for k, n in enumerate(out["names"])}
    _assert_same_variables(run.variables(), loaded_vars)


def test_save_then_load_continues_training(mirrored_plan, tmp_path: Path) -> None:
    source, _ = mirrored_plan
    directory = tmp_path / "plan"
    gd.load_plan(source).save(directory)  # a copy to modify
    loaded = gd.load_plan(directory)
    loaded(XS[1], YS[1])
    assert loaded.save() == str(directory.absolute())  # in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # no temporary or old directories left
    again = gd.load_plan(directory)
    _assert_same_variables(loaded.variables, again.variables)
    _assert_same_result(loaded(XS[2], YS[2]), again(XS[2], YS[2]))
    _assert_same_variables(loaded.variables, again.variables)
    # save to a new directory, also through plan.export; then both continue identically
    copy = again.plan.export(tmp_path / "copy")
    third = gd.load_plan(copy)
    _assert_same_result(again(XS[3], YS[3]), third(XS[3], YS[3]))
    _assert_same_variables(again.variables, third.variables)
    with pytest.raises(gd.PlanError, match="already exists"):
        again.save(tmp_path / "copy")
    again.save(tmp_path / "copy", overwrite=True)


def test_per_replica_arguments_and_call_errors(mirrored_plan) -> None:
    directory, _ = mirrored_plan
    a, b = gd.load_plan(directory), gd.load_plan(directory)
    x = gd.PerReplica([XS[1][:4], XS[1][4:]])
    y = gd.PerReplica([YS[1][:4], YS[1][4:]])
    _assert_same_result(a(XS[1], YS[1]), b(x, y))
    with pytest.raises(gd.PlanError, match=r"splits into \[\[4, 8\], \[2, 8\]\].*global batch 8"):
        a(XS[1][:6], YS[1][:6])
    with pytest.raises(gd.PlanError, match="shaped"):
        a(XS[1])
    with pytest.raises(gd.PlanError, match="float32"):
        a(XS[1].astype(np.float64), YS[1])
    with pytest.raises(gd.PlanError, match="2 replica components"):
        a(gd.PerReplica([XS[1]] * 3), YS[1])


def test_backend_override(mirrored_plan) -> None:
    directory, _ = mirrored_plan
    ort, reference = gd.load_plan(directory), gd.load_plan(directory, backend="reference")
    assert reference.backend_name == "reference"
    _assert_same_result(ort(XS[1], YS[1]), reference(XS[1], YS[1]))
    _assert_same_variables(ort.variables, reference.variables)


Stats = collections.namedtuple("Stats", ["total", "scaled"])


def test_keyword_constant_arguments_and_namedtuple_results(tmp_path: Path) -> None:
    @gd.function
    def step(x, *, scale, mode="sum"):
        total = x.sum() if mode == "sum" else x.max()
        return Stats(total, {"a": x * scale, "b": None})

    x = XS[0]
    expected = step(x, scale=3, mode="sum")
    step.get_concrete_function(x, scale=3, mode="sum").export(tmp_path / "plan")
    loaded = gd.load_plan(tmp_path / "plan")
    result = loaded(x, scale=3, mode="sum")
    assert type(result).__name__ == "Stats" and result._fields == ("total", "scaled")
    np.testing.assert_allclose(result.total, expected.total, rtol=1e-5)
    np.testing.assert_allclose(result.scaled["a"], expected.scaled["a"])
    assert result.scaled["b"] is None
    assert loaded(x, scale=3.0, mode="sum").total == result.total  # an equal number is the same constant
    with pytest.raises(gd.PlanError, match="was the constant 'sum' when the step was traced"):
        loaded(x, scale=3, mode="max")
    with pytest.raises(gd.PlanError, match="shaped"):
        loaded(x, scale=3)


def test_loaded_graphs_and_summary(mirrored_plan) -> None:
    loaded = gd.load_plan(mirrored_plan[0])
    traced = loaded.graph("traced")  # one replica, cross-replica ops still abstract
    assert traced.find_nodes("ReplicaAllReduce", "graphdist") and not traced.find_nodes("AllReduce", "graphdist")
    sums = loaded.graph("rewritten").find_nodes("Sum")  # the gradients, summed where they are read
    assert sums and not loaded.graph("rewritten").find_nodes("AllReduce", "graphdist")
    assert {loaded.graph("partitioned").find_nodes("Sum")[i].device for i in range(len(sums))} == {"cpu:0", "cpu:1"}
    partitioned = loaded.graph("partitioned")
    assert partitioned.stage == "partitioned" and {n.device for n in partitioned.nodes} == {"cpu:0", "cpu:1"}
    assert "Transfer" in loaded.summary() and "cpu1" in loaded.summary()
    with pytest.raises(gd.PlanError, match="no 'optimized' graph"):
        loaded.graph("optimized")


def test_plan_without_step_exports_flat(tmp_path: Path) -> None:
    step = gd.function(lambda x, w: (np.tanh(x @ w), x.sum()), backend="reference")
    x, w = XS[0], np.ones((8, 3), np.float32)
    plan = Plan.from_graph(step.get_concrete_function(x, w).graph("partitioned").copy())
    plan.compile(gd.backends.get_backend("ort"))
    loaded = gd.load_plan(plan.export(tmp_path / "flat"))
    out = loaded(x, w)
    assert isinstance(out, list) and len(out) == 2
    np.testing.assert_allclose(out[0], np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    assert loaded.variables == {}


# ---------------------------------------------------------- bad directories
def _copy(source: Path, tmp_path: Path) -> Path:
    return Path(gd.load_plan(source).save(tmp_path / "plan"))


def _reseal(directory: Path) -> None:
    """Rewrites the manifest's checksums after an edit and drops the signature, which would name the forgery
    (so the edit reaches the deeper validation: an unsigned plan in a private folder loads).
    """
    manifest = json.loads((directory / "graphdist-manifest.json").read_text())
    manifest["files"] = {rel: plan_files.sha256_of((directory / rel).read_bytes()) for rel in manifest["files"]}
    (directory / "graphdist-manifest.json").write_text(json.dumps(manifest))
    (directory / "graphdist-signature.json").unlink(missing_ok=True)


def _edit_json(directory: Path, edit) -> None:
    doc = json.loads((directory / "plan.json").read_text())
    edit(doc)
    (directory / "plan.json").write_text(json.dumps(doc))
    _reseal(directory)


def _flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _segment(directory: Path) -> Path:
    return sorted((directory / "segments").iterdir())[0]


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: _segment(d).unlink(), r"segment cpu0\.p0: the file segments/000_cpu0\.p0\.onnx is missing"),
    (lambda d: ((d / "plan.json").write_text('{"format": "graphdist-plan", "vers'), _reseal(d)),
     "plan.json is corrupt.*JSON"),
    (lambda d: _edit_json(d, lambda doc: doc.update(version=99)), "schema version 99.*reads versions 1, 2, 3"),
    (lambda d: _flip_byte(_segment(d)), r"segments/000_cpu0\.p0\.onnx fails its SHA-256 checksum"),
    (lambda d: (d / "plan.json").unlink(), "plan.json is missing"),
    (lambda d: _flip_byte(d / "variables.npz", 200), "variables.npz fails its SHA-256 checksum"),
    (lambda d: _edit_json(d, lambda doc: doc.pop("segments")), "lacks the required key 'segments'"),
    (lambda d: _edit_json(d, lambda doc: doc.update(format="something")), "format 'something'"),
    (lambda d: _edit_json(d, lambda doc: doc["tasks"][-1].update(deps=[])), "'tasks' does not match"),
    (lambda d: _edit_json(d, lambda doc: doc["segments"][0].update(file="../../etc/passwd")), "outside the plan"),
], ids=["missing-segment", "corrupt-json", "version-99", "tampered-onnx", "no-plan-json", "tampered-variables",
        "missing-key", "wrong-format", "edited-tasks", "path-escape"])
def test_damaged_plan_fails_to_load_with_a_clear_error(mirrored_plan, tmp_path: Path, damage, message: str) -> None:
    directory = _copy(mirrored_plan[0], tmp_path)
    damage(directory)
    with pytest.raises(gd.PlanError, match=message) as info:
        gd.load_plan(directory)
    assert str(directory) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_invalid_onnx_with_matching_checksum(mirrored_plan, tmp_path: Path) -> None:
    directory = _copy(mirrored_plan[0], tmp_path)
    garbage = b"\x08\x07this is not an onnx model"
    segment = _segment(directory)
    segment.write_bytes(garbage)
    _edit_json(directory, lambda doc: doc["segments"][0].update(sha256=plan_files.sha256_of(garbage)))  # reseals
    with pytest.raises(gd.PlanError, match=r"000_cpu0\.p0\.onnx is not a valid ONNX model"):
        gd.load_plan(directory)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(gd.PlanError, match="does not exist"):
        gd.load_plan(tmp_path / "nowhere")


# ---------------------------------------------------------- atomic export
@pytest.fixture(scope="module")
def one_device_run() -> Run:
    run = Run("one_device", "ort")
    run(0)
    return run


def test_failed_rename_leaves_nothing(one_device_run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args, **kwargs):
        raise OSError("disk went away")

    monkeypatch.setattr(os, "rename", fail)
    with pytest.raises(OSError, match="disk went away"):
        one_device_run.concrete.export(tmp_path / "plan")
    assert list(tmp_path.iterdir()) == []


def test_export_interrupted_midway_leaves_nothing(one_device_run: Run, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    written = []
    original = savedir._write_file

    def write_some(path: Path, data: bytes) -> None:
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(path)
        original(path, data)

    monkeypatch.setattr(savedir, "_write_file", write_some)
    with pytest.raises(KeyboardInterrupt):
        one_device_run.concrete.export(tmp_path / "plan")
    assert len(written) == 3 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "rename-aside"])
def test_overwrite_is_atomic(one_device_run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             exchange: bool) -> None:
    directory = tmp_path / "plan"
    one_device_run.concrete.export(directory)
    before = (directory / "plan.json").read_bytes()
    with pytest.raises(gd.PlanError, match="already exists; pass overwrite=True"):
        one_device_run.concrete.export(directory)
    one_device_run(1)  # new variable values

    def fail_exchange(first: Path, second: Path) -> bool:
        raise OSError("interrupted")

    calls = []
    original = os.rename

    def fail_second(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # renaming the new plan in, the old one being aside
            raise OSError("interrupted")
        original(src, dst)

    if exchange:
        monkeypatch.setattr(savedir, "_exchange", fail_exchange)
    else:
        monkeypatch.setattr(savedir, "_exchange", lambda first, second: False)
        monkeypatch.setattr(os, "rename", fail_second)
    with pytest.raises(OSError, match="interrupted"):
        one_device_run.concrete.export(directory, overwrite=True)
    monkeypatch.undo()
    assert (directory / "plan.json").read_bytes() == before  # the old plan is back, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]
    gd.load_plan(directory)

    one_device_run.concrete.export(directory, overwrite=True)
    assert (directory / "plan.json").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]
    _assert_same_variables(one_device_run.variables(), gd.load_plan(directory).variables)


def test_overwrite_refuses_a_non_plan_directory(one_device_run: Run, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    with pytest.raises(gd.PlanError, match=r"not a directory graphdist wrote \(it has no graphdist-manifest.json; "
                                           r"it holds precious.txt\)"):
        one_device_run.concrete.export(tmp_path / "data", overwrite=True)
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()  # an existing empty directory is fine without overwrite
    one_device_run.concrete.export(tmp_path / "empty")
    assert (tmp_path / "empty" / "plan.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "empty"]
