"""Callbacks of ``fit`` (``gd.keras.callbacks``): History, ModelCheckpoint, EarlyStopping, BackupAndRestore,
TerminateOnNaN.

A callback's hooks get the epoch (0-based) and the logs of the epoch
(``{"loss": ..., "accuracy": ..., "val_loss": ...}``). Files are written
by the chief only (the single process of a one-worker strategy; in a
multi-worker cluster the ``chief`` task, else worker 0) and atomically
(temporary file or directory, then a rename), so an interrupted save never
leaves a half-written checkpoint; they never replace a file or directory
graphdist did not write.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from graphdist.checkpoint import Checkpoint
from graphdist.errors import CheckpointError, InvalidArgumentError

__all__ = ["Callback", "CallbackList", "History", "ModelCheckpoint", "EarlyStopping", "BackupAndRestore",
           "TerminateOnNaN", "is_chief"]

logger = logging.getLogger(__name__)


def is_chief(strategy: Any) -> bool:
    """Whether this process writes checkpoints for ``strategy`` (chief, else worker 0; always for one process)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return True
    task_type, task_id = getattr(resolver, "task_type", None), getattr(resolver, "task_id", 0)
    if task_type in (None, "chief"):
        return True
    try:
        has_chief = "chief" in resolver.cluster_spec().as_dict()
    except Exception:  # noqa: BLE001 - a resolver without a spec is a single worker
        has_chief = False
    return task_type == "worker" and not has_chief and int(task_id or 0) == 0


class Callback:
    """Base class; override the hooks you need. ``self.model`` is set by ``fit``."""

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict[str, Any] = {}

    def set_model(self, model: Any) -> None:
        """Called by ``fit`` before training."""
        self.model = model

    def set_params(self, params: dict[str, Any]) -> None:
        """``epochs``, ``steps`` and ``verbose`` of the ``fit`` call."""
        self.params = params

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        """Before the first epoch."""

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        """After the last epoch (also after ``stop_training``)."""

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        """Before epoch ``epoch`` (0-based)."""

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        """After epoch ``epoch`` with its logs (validation included)."""

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        """After training batch ``batch`` of the epoch, with the running logs."""


class CallbackList:
    """Calls every callback's hook in order."""

    def __init__(self, callbacks: list[Callback], model: Any, params: dict[str, Any]) -> None:
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise InvalidArgumentError(f"fit: callbacks must be gd.keras.callbacks.Callback objects, got "
                                           f"{type(callback).__name__}")
            callback.set_model(model)
            callback.set_params(params)
        self.callbacks = callbacks

    def __getattr__(self, hook: str) -> Any:
        if not hook.startswith("on_"):
            raise AttributeError(hook)

        def call(*args: Any) -> None:
            for callback in self.callbacks:
                getattr(callback, hook)(*args)

        return call


class History(Callback):
    """Records the logs of every epoch: ``history.history["loss"]`` is the list of epoch losses.

    Attributes:
        history: Metric name -> one value per epoch.
        epoch: The epochs recorded (0-based).
    """

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self.history, self.epoch = {}, []

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self.epoch.append(epoch)
        for name, value in (logs or {}).items():
            self.history.setdefault(name, []).append(float(value))

    def __repr__(self) -> str:
        return f"<History epochs={len(self.epoch)} keys={sorted(self.history)}>"


def _monitor_mode(monitor: str, mode: str, what: str) -> Any:
    if mode not in ("auto", "min", "max"):
        raise InvalidArgumentError(f"{what}: mode must be 'auto', 'min' or 'max', got {mode!r}")
    if mode == "auto":
        mode = "max" if "acc" in monitor else "min"
    return np.greater if mode == "max" else np.less


class ModelCheckpoint(Callback):
    """Saves the model (or its weights) after epochs.

    Args:
        filepath: Target path; may contain ``{epoch}`` (1-based) and log
            names, e.g. ``"ckpt/model-{epoch:02d}-{val_loss:.2f}"``. A whole
            model is a directory (``model.save``); weights only
            (``save_weights_only=True``) go to one ``.npz`` checkpoint.
        monitor: Log compared when ``save_best_only``.
        save_best_only: Save only when ``monitor`` improved.
        save_weights_only: Save ``model.save_weights(path)`` instead of ``model.save(path)``.
        mode: ``"auto"``, ``"min"`` or ``"max"``.
        verbose: 1 prints a line when saving.
    """

    def __init__(self, filepath: str | os.PathLike[str], monitor: str = "val_loss", save_best_only: bool = False,
                 save_weights_only: bool = False, mode: str = "auto", verbose: int = 0) -> None:
        super().__init__()
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.save_best_only = bool(save_best_only)
        self.save_weights_only = bool(save_weights_only)
        self._better = _monitor_mode(monitor, mode, "ModelCheckpoint")
        self.best = -math.inf if self._better is np.greater else math.inf
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        if self.save_best_only:
            current = logs.get(self.monitor)
            if current is None:
                logger.warning("ModelCheckpoint: %r is not in the logs (%s); saving every epoch", self.monitor,
                               ", ".join(logs))
            elif not self._better(current, self.best):
                return
            else:
                self.best = float(current)
        if not is_chief(self.model.distribute_strategy):
            if not self.save_weights_only:  # the chief's save gathers optimizer slots sharded across workers
                optimizer = self.model.optimizer
                Checkpoint(model=self.model, **({"optimizer": optimizer} if optimizer is not None else {})
                           )._gather_sharded()
            return
        try:
            path = self.filepath.format(epoch=epoch + 1, **logs)
        except (KeyError, ValueError, IndexError) as err:
            raise InvalidArgumentError(f"ModelCheckpoint: filepath {self.filepath!r} names a value the logs do not "
                                       f"have ({err}); the logs have epoch, {', '.join(logs)}") from err
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save(path, overwrite=True)
        if self.verbose:
            print(f"Epoch {epoch + 1}: saved to {path}")


class EarlyStopping(Callback):
    """Stops training when ``monitor`` has not improved for ``patience`` epochs.

    Args:
        monitor: Log watched (``"val_loss"`` by default).
        min_delta: Smallest change that counts as an improvement.
        patience: Epochs without improvement before stopping.
        mode: ``"auto"``, ``"min"`` or ``"max"``.
        baseline: Value the monitor must beat.
        restore_best_weights: Put back the weights of the best epoch when stopping.
        start_from_epoch: Epochs to wait before watching.
    """

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0, mode: str = "auto",
                 baseline: float | None = None, restore_best_weights: bool = False, start_from_epoch: int = 0
                 ) -> None:
        super().__init__()
        self.monitor = monitor
        self._better = _monitor_mode(monitor, mode, "EarlyStopping")
        self.min_delta = abs(float(min_delta)) * (1 if self._better is np.greater else -1)
        self.patience = int(patience)
        self.baseline = baseline
        self.restore_best_weights = bool(restore_best_weights)
        self.start_from_epoch = int(start_from_epoch)
        self.stopped_epoch = 0

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self.wait = 0
        self.stopped_epoch = 0
        self.best = self.baseline if self.baseline is not None else (
            -math.inf if self._better is np.greater else math.inf)
        self.best_weights: list[np.ndarray] | None = None

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        current = (logs or {}).get(self.monitor)
        if current is None:
            logger.warning("EarlyStopping: %r is not in the logs (%s)", self.monitor, ", ".join(logs or {}))
            return
        if epoch < self.start_from_epoch:
            return
        if self._better(current - self.min_delta, self.best):
            self.best = float(current)
            self.wait = 0
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            return
        self.wait += 1
        if self.wait > self.patience:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                self.model.set_weights(self.best_weights)


class TerminateOnNaN(Callback):
    """Stops ``fit`` after the batch whose loss is NaN or infinite (Keras' ``TerminateOnNaN``).

    The loss checked is the one ``fit`` reports after each batch (the epoch's
    running mean, as in Keras: once one batch's loss is NaN or Inf, so is the
    mean). It prints ``Batch N: Invalid loss, terminating training`` and sets
    ``model.stop_training``: ``fit`` ends that epoch after the batch (its
    ``on_epoch_end`` callbacks and validation still run, as in Keras) and runs
    no further epoch. To find the op that made the NaN, and to keep its update
    out of the weights, use ``gd.debugging.enable_check_numerics()``.
    """

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        print(f"Batch {batch}: Invalid loss, terminating training", flush=True)
        logger.warning("TerminateOnNaN: the loss of batch %d is %s; training stops", batch, loss)
        self.model.stop_training = True


class BackupAndRestore(Callback):
    """Lets an interrupted ``fit`` resume from its last finished epoch.

    After every epoch the model's and optimizer's variables, the epoch, the
    history so far and the shuffling seed are written to
    ``backup_dir/variables.npz``: one checkpoint file, written atomically,
    so the weights and the epoch they belong to are always replaced
    together. When ``fit`` starts and a backup exists, it is restored and
    training continues with the next epoch, so a run killed after epoch
    ``k`` and started again ends with the weights of an uninterrupted run
    (optimizer slots are matched to their variables by layer path, so a
    model rebuilt with other layer names resumes exactly too). A ``fit`` that
    completes deletes the backup file (unless ``delete_checkpoint=False``)
    and ``backup_dir`` if that leaves it empty: nothing else in it is touched.

    Args:
        backup_dir: Directory of the backup (created when needed).
        delete_checkpoint: Remove the backup when training completes.
    """

    _CHECKPOINT = "variables.npz"
    _METADATA = "backup_and_restore"

    def __init__(self, backup_dir: str | os.PathLike[str], delete_checkpoint: bool = True) -> None:
        super().__init__()
        if not backup_dir:
            raise InvalidArgumentError("BackupAndRestore: backup_dir must be a directory path")
        self.backup_dir = Path(backup_dir)
        self.delete_checkpoint = bool(delete_checkpoint)

    def _checkpoint(self) -> Checkpoint:
        return Checkpoint(model=self.model, optimizer=self.model.optimizer)

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        path = self.backup_dir / self._CHECKPOINT
        if not path.is_file():
            return
        state = self._checkpoint()._restore(path, require=self._METADATA)[self._METADATA]
        try:
            epoch, seed = int(state["epoch"]), int(state["shuffle_seed"])
            history = dict(state.get("history", {}))
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"BackupAndRestore: {path} holds no epoch state ({type(err).__name__}: {err}); it "
                                  f"is not a backup this callback wrote: delete it to start training from scratch"
                                  ) from None
        self._check_slots = True
        self.model._resume_from(epoch + 1, history, seed)
        logger.info("BackupAndRestore: resumed from the end of epoch %d (%s)", epoch + 1, self.backup_dir)

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        if not getattr(self, "_check_slots", False):
            return
        self._check_slots = False
        # Restored optimizer slots wait until the first step creates their slots; values left over belong to
        # variables the first step did not update (frozen since the backup) or, in backups of an older
        # graphdist, to variables named otherwise (a model rebuilt in the same process).
        optimizer = self.model.optimizer
        unused = sorted(getattr(optimizer, "_pending", {})) + sorted(
            f"{variable.name}/{kind}" for variable, kind in
            ((v, k) for (_, k), (v, _) in getattr(optimizer, "_restored", {}).items()))
        if unused:
            logger.warning("BackupAndRestore: optimizer state %s from %s matched no variable the first step updated "
                           "(variables frozen since the backup, or a backup of an older graphdist whose layers had "
                           "other names: call gd.keras.backend.clear_session() before rebuilding the model); those "
                           "slots restarted from zero", ", ".join(unused[:3]), self.backup_dir)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        if not is_chief(self.model.distribute_strategy):
            self._checkpoint()._gather_sharded()  # the chief's save gathers slots sharded across workers
            return
        history = self.model.history.history if self.model.history is not None else {}
        state = {"epoch": epoch, "history": history, "shuffle_seed": self.model._shuffle_seed}
        self._checkpoint()._save(self.backup_dir / self._CHECKPOINT, {self._METADATA: state})

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        if not (self.delete_checkpoint and is_chief(self.model.distribute_strategy)):
            return
        (self.backup_dir / self._CHECKPOINT).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # only when empty: the directory may hold the user's files
            self.backup_dir.rmdir()
