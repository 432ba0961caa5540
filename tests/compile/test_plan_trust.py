"""Plans and saved models are code: they load only when signed with this user's key or from a folder no other
user can write, unless the caller trusts them; a forged signature is always refused; the signing key is kept
like ssh's."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import graphdist as gd
from graphdist.compile import plan_files
from graphdist.fsutil import private, trust
from graphdist.models.mlp import MLP

RNG = np.random.default_rng(4)
X = RNG.standard_normal((8, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 8)
SIGNATURE = "graphdist-signature.json"
MANIFEST = "graphdist-manifest.json"
LEARNING_RATE = 0.1
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user (uid 65534)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan directory of an MLP training step (SGD, learning rate 0.1), signed with this user's key."""
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = MLP(sizes=(6, 8, 3), trainable=True, seed=0)
        replica_step = model.make_train_step(gd.optimizers.SGD(LEARNING_RATE), global_batch_size=8)

    @gd.function
    def step(x, y):
        return strategy.run(replica_step, args=(x, y))

    return Path(step.get_concrete_function(X, Y).export(tmp_path_factory.mktemp("source") / "plan"))


@pytest.fixture(scope="module")
def expected_loss(exported: Path) -> float:
    return float(gd.load_plan(exported)(X, Y))


def _copy(source: Path, where: Path, signed: bool = True) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    directory = where / "plan"
    shutil.copytree(source, directory)
    if not signed:  # a plan exported by someone else, or before signatures
        (directory / SIGNATURE).unlink(missing_ok=True)
    return directory


def _refused(directory: Path, *words: str) -> str:
    with pytest.raises(gd.PlanError) as caught:
        gd.load_plan(directory)
    message = str(caught.value)
    assert "gd.load_plan: refusing" in message and "trust=True" in message, message
    for word in words:
        assert word in message, message
    return message


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("graphdist")]


# ------------------------------------------------------------------ folders
def test_a_plan_in_a_private_folder_loads_signed_or_not(exported: Path, tmp_path: Path, expected_loss: float) -> None:
    assert (exported / SIGNATURE).is_file()
    for signed in (True, False):   # unsigned: exported before signatures, or by someone else
        directory = _copy(exported, tmp_path / f"signed-{signed}", signed=signed)
        np.testing.assert_allclose(gd.load_plan(directory)(X, Y), expected_loss, rtol=1e-6)


def test_a_world_writable_plan_folder_is_refused_unless_trusted(exported: Path, tmp_path: Path,
                                                                 expected_loss: float) -> None:
    directory = _copy(exported, tmp_path, signed=False)
    directory.chmod(0o777)
    _refused(directory, str(directory), "writable by", "others (mode 777)", "chmod go-w")
    np.testing.assert_allclose(gd.load_plan(directory, trust=True)(X, Y), expected_loss, rtol=1e-6)


@pytest.mark.parametrize("how", ["segment-file-world-writable", "subfolder-world-writable", "parent-world-writable",
                                 "symlinked-segment"])
def test_a_plan_others_could_change_is_refused(exported: Path, tmp_path: Path, how: str) -> None:
    directory = _copy(exported, tmp_path / "shared", signed=False)
    segment = next((directory / "segments").iterdir())
    if how == "segment-file-world-writable":
        segment.chmod(0o666)
        _refused(directory, str(segment), "writable by")
    elif how == "subfolder-world-writable":
        (directory / "segments").chmod(0o777)
        _refused(directory, "segments is writable by")
    elif how == "parent-world-writable":
        directory.parent.chmod(0o777)   # anyone may rename the plan away and put another in its place
        _refused(directory, "without the sticky bit")
    else:
        elsewhere = tmp_path / "elsewhere.onnx"
        shutil.move(segment, elsewhere)
        segment.symlink_to(elsewhere)
        _refused(directory, "is a symbolic link")


@needs_root
def test_a_foreign_owned_plan_folder_is_refused(exported: Path, tmp_path: Path, expected_loss: float) -> None:
    directory = _copy(exported, tmp_path, signed=False)
    os.chown(directory, 65534, 65534)
    _refused(directory, "belongs to user id 65534")
    np.testing.assert_allclose(gd.load_plan(directory, trust=True)(X, Y), expected_loss, rtol=1e-6)


def test_a_plan_under_a_sticky_world_writable_folder_loads(exported: Path, tmp_path: Path) -> None:
    shared = tmp_path / "tmp-like"
    shared.mkdir()
    shared.chmod(0o777 | stat.S_ISVTX)   # as /tmp: others cannot rename or delete what this user owns there
    gd.load_plan(_copy(exported, shared, signed=False))


def test_a_plan_signed_by_this_user_loads_from_any_folder(exported: Path, tmp_path: Path, expected_loss: float,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    directory = _copy(exported, tmp_path)
    directory.chmod(0o777)
    directory.parent.chmod(0o777)
    caplog.set_level(logging.WARNING)
    np.testing.assert_allclose(gd.load_plan(directory)(X, Y), expected_loss, rtol=1e-6)
    assert _warnings(caplog) == []


@pytest.mark.parametrize("kind", ["plan", "model"])
def test_a_signed_directory_in_a_shared_folder_reads_regular_files_only(exported: Path, tmp_path: Path,
                                                                        kind: str) -> None:
    # Its signature lets it load from a folder others can write, so a file there could be replaced by a link to
    # /dev/zero or by a FIFO: either is refused at once (not read forever, not waited on).
    if kind == "plan":
        directory = _copy(exported, tmp_path)
        victim, load, error = next((directory / "segments").iterdir()), gd.load_plan, gd.PlanError
    else:
        model = gd.keras.Sequential([gd.keras.layers.Dense(3, input_shape=(6,))])
        directory = Path(model.save(tmp_path / "model"))
        victim, load, error = directory / "variables.npz", gd.keras.load_model, gd.CheckpointError
    directory.chmod(0o777)
    victim.unlink()
    victim.symlink_to("/dev/zero")
    with pytest.raises(error, match="cannot be read"):
        load(directory)
    victim.unlink()
    os.mkfifo(victim)
    with pytest.raises(error, match="cannot be read .*not a regular file"):
        load(directory)


def test_a_plan_signed_by_another_user_needs_a_private_folder(exported: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _copy(exported, tmp_path)
    monkeypatch.setenv(trust.KEY_ENV, str(tmp_path / "other-user" / "signing-key"))
    gd.load_plan(directory)   # private: loads (the signature is another key's, so the folder decides)
    directory.chmod(0o777)
    _refused(directory, "not signed with your key")


# --------------------------------------------------------------- signatures
def _forge(directory: Path, factor: float = -10000.0) -> Path:
    """Multiplies the learning rate in the plan's segment by ``factor`` (0.1 -> -1000), then rewrites every
    checksum (plan.json's and the manifest's) so that the directory verifies; the signature stays.
    """
    doc = json.loads((directory / "plan.json").read_text())
    for entry in doc["segments"]:
        path = directory / entry["file"]
        model = onnx.load_from_string(path.read_bytes())
        for tensor in model.graph.initializer:
            value = numpy_helper.to_array(tensor)
            if value.dtype == np.float32 and value.size == 1 and np.isclose(value, LEARNING_RATE):
                tensor.CopyFrom(numpy_helper.from_array(value * np.float32(factor), tensor.name))
                data = model.SerializeToString()
                path.write_bytes(data)
                entry["sha256"] = plan_files.sha256_of(data)
                break
        else:
            continue
        break
    else:
        raise AssertionError("no learning rate found in the plan's segments")
    (directory / "plan.json").write_text(json.dumps(doc, indent=1) + "\n")
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"] = {rel: plan_files.sha256_of((directory / rel).read_bytes()) for rel in manifest["files"]}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return directory


@pytest.mark.parametrize("folder", ["private", "world-writable"])
def test_a_forged_plan_signature_is_rejected(exported: Path, tmp_path: Path, folder: str) -> None:
    directory = _forge(_copy(exported, tmp_path))
    if folder == "world-writable":
        directory.chmod(0o777)
    with pytest.raises(gd.PlanError) as caught:
        gd.load_plan(directory)
    message = str(caught.value)
    assert str(directory / SIGNATURE) in message and "forged signature" in message, message
    assert "trust=True" in message
    # The forgery is real: loaded anyway, it trains with a learning rate of -1000 (the loss after one step).
    forged, genuine = gd.load_plan(directory, trust=True), gd.load_plan(exported)
    forged(X, Y), genuine(X, Y)
    assert forged(X, Y) > 100 * genuine(X, Y)


def test_a_forged_plan_without_its_signature_is_refused_where_others_write(exported: Path, tmp_path: Path) -> None:
    # The attack: in a folder anyone can write, change the learning rate and fix the checksums.
    directory = _forge(_copy(exported, tmp_path, signed=False))
    directory.chmod(0o777)
    _refused(directory, "writable by")


def test_a_malformed_signature_is_refused(exported: Path, tmp_path: Path) -> None:
    directory = _copy(exported, tmp_path)
    (directory / SIGNATURE).write_text('{"format": "graphdist-signature"}')
    with pytest.raises(gd.PlanError, match="is not a graphdist signature"):
        gd.load_plan(directory)
    gd.load_plan(directory, trust=True)


def test_a_replanned_and_resaved_plan_is_signed(exported: Path, tmp_path: Path) -> None:
    loaded = gd.load_plan(exported)
    directory = Path(loaded.replan(gd.MirroredStrategy(["cpu:0", "cpu:1"])).save(tmp_path / "replanned"))
    directory.chmod(0o777)
    gd.load_plan(directory)   # signed by this user: loads from a world-writable folder


# --------------------------------------------------------------------- Keras
def test_a_saved_model_follows_the_same_rules(tmp_path: Path) -> None:
    keras = gd.keras
    model = keras.Sequential([keras.layers.Dense(3, input_shape=(6,))])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(X, np.zeros((8, 3), np.float32), batch_size=8, epochs=1, verbose=0)
    directory = Path(model.save(tmp_path / "shared" / "model"))
    assert (directory / SIGNATURE).is_file() and (directory / "serving" / SIGNATURE).is_file()
    directory.parent.chmod(0o777)
    weights = [v.numpy() for v in keras.load_model(directory).trainable_variables]   # signed: loads
    np.testing.assert_array_equal(weights[0], model.trainable_variables[0].numpy())
    gd.load_plan(directory / "serving")   # the serving plan is signed too

    (directory / SIGNATURE).unlink()
    with pytest.raises(gd.CheckpointError, match=r"gd.keras.load_model: refusing to load .*without the sticky bit"):
        keras.load_model(directory)
    keras.load_model(directory, trust=True)
    directory.parent.chmod(0o700)
    keras.load_model(directory)   # unsigned in a private folder: as before signatures


def test_a_forged_saved_model_signature_is_rejected(tmp_path: Path) -> None:
    keras = gd.keras
    model = keras.Sequential([keras.layers.Dense(3, input_shape=(6,))])
    model.compile(optimizer="sgd", loss="mse")
    directory = Path(model.save(tmp_path / "model"))
    config = json.loads((directory / "model.json").read_text())
    config["compile"]["optimizer"]["config"]["learning_rate"] = -1000.0
    (directory / "model.json").write_text(json.dumps(config))
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"] = {rel: plan_files.sha256_of((directory / rel).read_bytes()) for rel in manifest["files"]}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(gd.CheckpointError, match="forged signature"):
        keras.load_model(directory)


# ---------------------------------------------------------------- the key
def _key_path() -> Path:
    return Path(os.environ[trust.KEY_ENV])


def test_the_signing_key_is_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            exported: Path) -> None:
    path = tmp_path / "config" / "graphdist" / "signing-key"
    monkeypatch.setenv(trust.KEY_ENV, str(path))
    first = trust.signing_key(create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert first is not None and len(first.secret) == 32 and trust.signing_key() == first   # created once
    assert first.secret.hex() not in (exported / SIGNATURE).read_text()


@pytest.mark.parametrize("how", ["group-readable", "in-a-world-writable-folder", "symlink", "foreign-owned", "garbage"])
def test_an_unsafe_signing_key_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture, how: str) -> None:
    if how == "foreign-owned" and os.getuid() != 0:
        pytest.skip("needs root to give the key to another user")
    path = tmp_path / "config" / "signing-key"
    monkeypatch.setenv(trust.KEY_ENV, str(path))
    monkeypatch.setattr(trust, "_warned", set())
    assert trust.signing_key(create=True) is not None
    if how == "group-readable":
        path.chmod(0o640)
    elif how == "in-a-world-writable-folder":
        path.parent.chmod(0o777)
    elif how == "symlink":
        shutil.move(path, tmp_path / "real-key")
        path.symlink_to(tmp_path / "real-key")
    elif how == "foreign-owned":
        os.chown(path, 65534, 65534)
    else:
        path.write_text("not a key\n")
    caplog.set_level(logging.WARNING)
    assert trust.signing_key() is None
    assert trust.signature_file(b"manifest") is None   # saves are written unsigned
    warned = _warnings(caplog)
    assert len(warned) == 1 and f"ignoring the signing key {path}" in warned[0], warned


def test_an_unsafe_key_writes_unsigned_plans(exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = gd.load_plan(exported)
    path = tmp_path / "key"
    monkeypatch.setenv(trust.KEY_ENV, str(path))
    assert trust.signing_key(create=True) is not None
    path.chmod(0o644)
    monkeypatch.setattr(trust, "_warned", set())
    directory = Path(loaded.save(tmp_path / "plan"))
    assert not (directory / SIGNATURE).exists() and (directory / MANIFEST).is_file()


def test_signing_can_be_turned_off(exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(trust.KEY_ENV, "off")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    directory = Path(gd.load_plan(exported).save(tmp_path / "plan"))
    assert not (directory / SIGNATURE).exists() and not (tmp_path / "home").exists()
    gd.load_plan(directory)


def test_private_groups_count_as_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "group-writable"
    directory.mkdir()
    directory.chmod(0o770)
    if os.getuid() == 0:
        os.chown(directory, -1, 65534)
    monkeypatch.setattr(private, "_private_group", lambda gid, uid: False)
    assert "writable by group" in private.private_problem(directory, directory)
    monkeypatch.setattr(private, "_private_group", lambda gid, uid: True)   # the user's own group (umask 002)
    assert private.private_problem(directory, directory) is None


# ----------------------------------------------------------------------- CLI
def test_the_cli_refuses_an_untrusted_plan_and_takes_trust(exported: Path, tmp_path: Path) -> None:
    from graphdist.cli.main import main

    directory = _copy(exported, tmp_path, signed=False)
    directory.chmod(0o777)
    np.savez(tmp_path / "inputs.npz", arg0=X, arg1=Y)
    for command in ("run", "replan"):
        extra = ["--inputs", str(tmp_path / "inputs.npz")] if command == "run" else [
            "--strategy", "one_device", "-o", str(tmp_path / "out")]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            assert main([command, str(directory), *extra]) == 2
            assert "refusing to load" in err.getvalue() and "--trust" in err.getvalue()
            assert main([command, str(directory), *extra, "--trust"]) == 0, err.getvalue()
