"""gd.keras callbacks: BackupAndRestore resumes exactly, EarlyStopping, ModelCheckpoint (chief, atomic)."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.models.datasets import digits

keras = gd.keras


class _KilledError(Exception):
    pass


class _KillAfter(keras.callbacks.Callback):
    """Simulates a crash at the end of an epoch (after the backup of that epoch was written)."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if epoch == self.epoch:
            raise _KilledError(f"killed after epoch {epoch + 1}")


def _model(strategy: gd.Strategy) -> keras.Model:
    keras.backend.clear_session()   # same layer names as a fresh process would give
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("strategy_name", ["one", "mirrored"])
def test_backup_and_restore_resumes_a_killed_fit_to_the_uninterrupted_weights(tmp_path, strategy_name,
                                                                             caplog) -> None:
    def strategy() -> gd.Strategy:
        return gd.OneDeviceStrategy("cpu:0") if strategy_name == "one" else gd.MirroredStrategy(["cpu:0", "cpu:1"])

    data = digits()
    x, y = data.x_train[:200], data.y_train[:200]
    uninterrupted = _model(strategy())
    full = uninterrupted.fit(x, y, batch_size=32, epochs=3, verbose=0)

    backup = tmp_path / "backup"
    crashed = _model(strategy())
    with pytest.raises(_KilledError):
        crashed.fit(x, y, batch_size=32, epochs=3, verbose=0,
                    callbacks=[keras.callbacks.BackupAndRestore(backup), _KillAfter(0)])
    assert (backup / "variables.npz").is_file()

    restarted = _model(strategy())   # a new model and optimizer, as a restarted process builds them
    epochs_run = []
    logger = keras.callbacks.Callback()
    logger.on_epoch_begin = lambda epoch, logs=None: epochs_run.append(epoch)
    history = restarted.fit(x, y, batch_size=32, epochs=3, verbose=0,
                            callbacks=[keras.callbacks.BackupAndRestore(backup), logger])
    assert epochs_run == [1, 2]
    for got, want in zip(restarted.get_weights(), uninterrupted.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.history["loss"], full.history["loss"], rtol=1e-5)
    assert not backup.exists()  # deleted once training completed
    assert "matched no variable" not in caplog.text   # Adam's moments went back into their slots


def test_without_backup_a_second_fit_continues_from_the_current_weights(tmp_path) -> None:
    data = digits()
    model = _model(gd.OneDeviceStrategy("cpu:0"))
    first = model.fit(data.x_train[:128], data.y_train[:128], batch_size=32, epochs=1, verbose=0)
    second = model.fit(data.x_train[:128], data.y_train[:128], batch_size=32, epochs=1, verbose=0)
    assert second.history["loss"][0] < first.history["loss"][0]


def test_early_stopping_stops_and_restores_best_weights() -> None:
    model = _model(gd.OneDeviceStrategy("cpu:0"))
    data = digits()
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((epoch, logs["val_loss"], model.get_weights()))

    # Validation data whose labels are shuffled: its loss stops improving after an epoch or two.
    wrong = np.random.default_rng(0).permutation(data.y_test)
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    history = model.fit(data.x_train, data.y_train, batch_size=64, epochs=30, verbose=0,
                        validation_data=(data.x_test, wrong), callbacks=[Spy(), stopper])
    epochs = len(history.history["loss"])
    assert epochs < 30 and stopper.stopped_epoch == epochs - 1
    best = min(seen, key=lambda entry: entry[1])
    for got, want in zip(model.get_weights(), best[2]):
        np.testing.assert_array_equal(got, want)


def test_model_checkpoint_saves_best_only_weights_and_whole_models(tmp_path) -> None:
    model = _model(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    data = digits()
    weights = keras.callbacks.ModelCheckpoint(tmp_path / "w-{epoch:02d}.npz", monitor="loss", save_best_only=True,
                                              save_weights_only=True)
    whole = keras.callbacks.ModelCheckpoint(str(tmp_path / "model-{epoch}"), save_best_only=False)
    model.fit(data.x_train[:256], data.y_train[:256], batch_size=64, epochs=2, verbose=0, callbacks=[weights, whole])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-1", "model-2", "w-01.npz", "w-02.npz"]
    restored = _model(gd.OneDeviceStrategy("cpu:0"))
    restored.load_weights(tmp_path / "w-02.npz")
    for got, want in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
    loaded = keras.load_model(tmp_path / "model-2")
    np.testing.assert_allclose(loaded.predict(data.x_test), model.predict(data.x_test), rtol=1e-5, atol=1e-6)


def test_checkpoint_filepath_with_an_unknown_log_name_is_a_clear_error(tmp_path) -> None:
    model = _model(gd.OneDeviceStrategy("cpu:0"))
    bad = keras.callbacks.ModelCheckpoint(str(tmp_path / "m-{val_acc:.2f}"), monitor="loss")
    with pytest.raises(gd.InvalidArgumentError, match="val_acc"):
        model.fit(np.zeros((4, 64)), np.zeros(4, np.int64), epochs=1, verbose=0, callbacks=[bad])


def test_only_the_chief_writes(tmp_path, monkeypatch) -> None:
    class Resolver:
        task_type, task_id = "worker", 1

        def cluster_spec(self):
            class Spec:
                def as_dict(self):
                    return {"worker": ["a:1", "b:1"]}
            return Spec()

    model = _model(gd.OneDeviceStrategy("cpu:0"))
    assert keras.callbacks.is_chief(model.distribute_strategy)
    monkeypatch.setattr(type(model.distribute_strategy), "cluster_resolver", property(lambda self: Resolver()))
    assert not keras.callbacks.is_chief(model.distribute_strategy)
    saver = keras.callbacks.ModelCheckpoint(str(tmp_path / "m.npz"), save_weights_only=True)
    model.fit(np.zeros((4, 64)), np.zeros(4, np.int64), epochs=1, verbose=0, callbacks=[saver])
    assert list(tmp_path.iterdir()) == []


def test_backup_restored_into_differently_named_layers_resumes_exactly(tmp_path, caplog) -> None:
    data = digits()
    x, y = data.x_train[:64], data.y_train[:64]
    uninterrupted = _model(gd.OneDeviceStrategy("cpu:0"))
    uninterrupted.fit(x, y, batch_size=32, epochs=2, verbose=0)
    backup = tmp_path / "backup"
    with pytest.raises(_KilledError):
        _model(gd.OneDeviceStrategy("cpu:0")).fit(x, y, batch_size=32, epochs=2, verbose=0,
                                                  callbacks=[keras.callbacks.BackupAndRestore(backup), _KillAfter(0)])
    keras.utils.set_random_seed(7)
    with gd.OneDeviceStrategy("cpu:0").scope():   # no clear_session: the layers get new names
        model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert [v.name for v in model.trainable_variables] != [v.name for v in uninterrupted.trainable_variables]
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup)])
    # Adam's moments were matched to the weights by layer path, not by the generated names.
    for got, want in zip(model.get_weights(), uninterrupted.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "matched no variable" not in caplog.text
