"""``model.save(dir)`` and ``gd.keras.load_model(dir)``: checkpoint + plan formats, no pickle.

A saved model is a directory, written atomically by the chief only (staged
under a hidden name next to the target and swapped in, see
:mod:`graphdist.fsutil.savedir`):

* ``model.json``: format and version, the model class, its architecture
  (for ``Sequential``: every layer's class and constructor arguments; for a
  functional model also its inputs and which layer is called on what), the
  input shape it was built for, and the compile settings (optimizer class
  and hyper-parameters, loss, metrics, weighted metrics);
* ``variables.npz``: a ``gd.train.Checkpoint`` of the model's weights (keys
  by layer position) and, when compiled, the optimizer's state (step count,
  slots keyed by their variable's layer path), so training can continue
  where it stopped;
* ``model.onnx``: for a model made by ``gd.keras.models.from_onnx``, its
  ONNX graph (with the weights at save time), from which it is rebuilt;
* ``serving/``: the compiled predict step exported as a plan
  (``gd.load_plan(dir + "/serving")`` runs it without this code, for global
  batches of ``serving_batch_size`` rows);
* ``graphdist-manifest.json``: the SHA-256 of every other file, so
  ``load_model`` rejects any edited, truncated or missing file;
* ``graphdist-signature.json`` (and ``serving/graphdist-signature.json``): the
  manifest signed with this user's key (:mod:`graphdist.fsutil.trust`), so the
  model loads from any folder for this user; unsigned or signed by someone
  else, it loads only from a folder no other user can write, or with
  ``trust=True``.

``model.save`` replaces an earlier save but never a directory holding files
graphdist did not write, nor the working directory. ``load_model`` checks
every file against the manifest and ``model.json`` against its schema,
rebuilds the architecture in the current strategy's scope (so a model saved
under one strategy loads under another), restores the variables and
compiles it again. Subclassed models have no architecture config: pass their
class in ``custom_objects`` (it is called without arguments), or run the
exported plan.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from graphdist import optimizers as optimizers_lib
from graphdist.checkpoint import Checkpoint
from graphdist.compile.export import concrete_files
from graphdist.compile.plan_files import PLAN_KIND, write_plan_directory
from graphdist.errors import CheckpointError, GraphdistError, InvalidArgumentError
from graphdist.fsutil import MANIFEST_FILE, manifest_digests, recover_directory, verify_directory, with_manifest
from graphdist.fsutil.trust import check_trusted
from graphdist.keras import losses as losses_lib
from graphdist.keras import metrics as metrics_lib
from graphdist.keras.callbacks import is_chief

__all__ = ["save_model", "load_model", "FORMAT", "VERSION", "SERVING_BATCH_SIZE"]

logger = logging.getLogger(__name__)

FORMAT = "graphdist-keras-model"
#: Version 2 directories hold a manifest with every file's SHA-256 (version 1 loads without one, warned).
VERSION = 2
READABLE_VERSIONS = (1, 2)
#: The kind recorded in a saved model's manifest.
KIND = "graphdist-keras-model"
#: Global batch size of the exported predict plan.
SERVING_BATCH_SIZE = 32
_CONFIG = "model.json"
_VARIABLES = "variables.npz"
_SERVING = "serving"


def _optimizer_config(optimizer: Any) -> dict[str, Any]:
    return {"class_name": type(optimizer).__name__, "config": optimizer.get_config()}


def _compile_config(model: Any) -> dict[str, Any] | None:
    if model.loss is None:
        return None
    return {"optimizer": _optimizer_config(model.optimizer), "loss": losses_lib.serialize(model.loss),
            "metrics": [metrics_lib.serialize(m) for m in model.compiled_metrics],
            "weighted_metrics": [metrics_lib.serialize(m) for m in model.compiled_weighted_metrics]}


def _trackables(model: Any) -> dict[str, Any]:
    return {"model": model, **({"optimizer": model.optimizer} if model.optimizer is not None else {})}


def save_model(model: Any, filepath: str | os.PathLike[str], overwrite: bool = True,
               serving_batch_size: int = SERVING_BATCH_SIZE) -> str:
    """Writes ``model`` to the directory ``filepath`` (see the module docstring); returns its path.

    Raises:
        InvalidArgumentError: The model is not built, or the directory exists
            and ``overwrite`` is false.
        PlanError: ``filepath`` holds files graphdist did not write (or another kind of directory), is a
            file, or is the working directory.
    """
    from graphdist.keras.models import FunctionalModel, Sequential

    if model._build_input_shape is None:
        raise InvalidArgumentError("model.save: the model is not built yet; fit it, call it, or give the first layer "
                                   "an input_shape")
    dest = Path(filepath)
    if dest.exists() and not overwrite:
        raise InvalidArgumentError(f"model.save: {dest} exists; pass overwrite=True to replace it")
    if not is_chief(model.distribute_strategy):
        Checkpoint(**_trackables(model))._gather_sharded()  # the chief's save gathers slots sharded across workers
        return str(dest.resolve())
    saved_files = getattr(model, "_saved_files", None)  # models with files of their own (from_onnx: model.onnx)
    config = {
        "format": FORMAT, "version": VERSION, "class_name": type(model).__name__,
        "config": model.get_config() if isinstance(model, (Sequential, FunctionalModel)) or saved_files else None,
        "build_input_shape": list(model._build_input_shape[1:]),
        "compile": _compile_config(model), "serving_batch_size": serving_batch_size,
    }
    files = {_CONFIG: json.dumps(config, indent=1).encode(),
             _VARIABLES: Checkpoint(**_trackables(model))._serialize(what="model.save")}
    for rel, data in with_manifest(_serving_files(model, serving_batch_size), PLAN_KIND, sign=True).items():
        files[f"{_SERVING}/{rel}"] = data
    files.update(saved_files() if saved_files else {})
    written = write_plan_directory(dest, files, overwrite=True, kind=KIND, what="model.save")
    return str(written)


def _serving_files(model: Any, batch: int) -> dict[str, bytes]:
    """The plan directory of the predict step for global batches of ``batch`` rows (in memory)."""
    from graphdist.keras.training import Engine, split_global_batch

    engine = model._engine or model._predict_engine or Engine(model, None, None, [])
    example = model._example_batch(batch)
    distributed = split_global_batch(model.distribute_strategy, example)
    with model._scope():
        concrete = engine.serving_function.get_concrete_function(distributed)
    return concrete_files(concrete)


def _bad_config(directory: Path, message: str) -> CheckpointError:
    return CheckpointError(f"load_model: {directory / _CONFIG} {message}; save the model again")


def _check_config(config: Any, directory: Path) -> dict[str, Any]:
    """``model.json`` checked against its schema (types of every key ``load_model`` reads)."""
    if not isinstance(config, dict):
        raise _bad_config(directory, "is not a JSON object")
    if config.get("format") != FORMAT or config.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"load_model: {directory} has format {config.get('format')!r} version "
                              f"{config.get('version')!r}; this graphdist reads {FORMAT} versions "
                              f"{', '.join(map(str, READABLE_VERSIONS))}")
    shape = config.get("build_input_shape")
    checks = [
        (isinstance(config.get("class_name"), str), "'class_name' must be a string"),
        (config.get("config") is None or isinstance(config.get("config"), dict), "'config' must be an object"),
        (isinstance(shape, list) and all(d is None or (type(d) is int and d > 0) for d in shape),
         "'build_input_shape' must be a list of sizes"),
        (type(config.get("serving_batch_size", 1)) is int and config.get("serving_batch_size", 1) > 0,
         "'serving_batch_size' must be a positive integer"),
    ]
    compiled = config.get("compile")
    if compiled is not None:
        checks += [
            (isinstance(compiled, dict), "'compile' must be an object or null"),
            (isinstance(compiled, dict) and isinstance(compiled.get("optimizer"), dict)
             and isinstance(compiled.get("loss"), dict), "'compile' needs 'optimizer' and 'loss' objects"),
            (isinstance(compiled, dict) and isinstance(compiled.get("metrics"), list)
             and isinstance(compiled.get("weighted_metrics", []), list),
             "'compile.metrics' and 'compile.weighted_metrics' must be lists"),
        ]
    for ok, message in checks:
        if not ok:
            raise _bad_config(directory, f"is malformed: {message}")
    return config


def _read_config(directory: Path, trust: bool) -> tuple[dict[str, Any], dict[str, bytes] | None]:
    """Checks that the directory may be loaded (:func:`graphdist.fsutil.trust.check_trusted`), verifies every
    file against the manifest, and returns the checked ``model.json`` and the verified files (``None`` for a
    directory saved before manifests).
    """
    recover_directory(directory)  # an overwrite cut between its renames left the previous save aside
    if not (directory / _CONFIG).is_file():
        raise CheckpointError(f"load_model: {directory} is not a saved model (it has no {_CONFIG}); pass the "
                              "directory model.save wrote")
    where = f"load_model: {directory}"
    manifest = manifest_digests(directory, kind=KIND, error=CheckpointError, where=where)
    check_trusted(directory, manifest, trust=trust, error=CheckpointError, what="gd.keras.load_model")
    files = verify_directory(directory, kind=KIND, error=CheckpointError, where=where, manifest=manifest)
    data = files[_CONFIG] if files is not None and _CONFIG in files else (directory / _CONFIG).read_bytes()
    try:
        config = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise _bad_config(directory, f"is not valid JSON ({err})") from None
    config = _check_config(config, directory)
    if files is None:
        if config["version"] >= 2:
            raise CheckpointError(f"load_model: {directory} has no {MANIFEST_FILE}, which lists the checksums of "
                                  "its files; the directory is incomplete or was edited: save the model again")
        logger.warning("load_model: %s was saved by an older graphdist (no %s): its model.json is not covered by "
                       "a checksum; save it again to add one", directory, MANIFEST_FILE)
    return config, files


def _rebuild(config: dict[str, Any], directory: Path, custom_objects: dict[str, type] | None,
             files: dict[str, bytes] | None) -> Any:
    from graphdist.keras.models import FunctionalModel, Sequential

    class_name = config["class_name"]
    if class_name == "Sequential":
        model = Sequential.from_config(config["config"])
    elif class_name == "FunctionalModel":
        model = FunctionalModel.from_config(config["config"])
    elif class_name == "OnnxKerasModel":
        from graphdist.keras.onnx_model import OnnxKerasModel

        model = OnnxKerasModel._from_saved(directory, config["config"], files)
    elif custom_objects and class_name in custom_objects:
        model = custom_objects[class_name]()
    else:
        raise InvalidArgumentError(
            f"load_model: {directory} holds a subclassed model ({class_name}) whose architecture is Python code; pass "
            f"custom_objects={{'{class_name}': {class_name}}}, or run its exported predict plan with "
            f"gd.load_plan('{directory / _SERVING}')")
    if not model.built:
        model.build((None, *config["build_input_shape"]))
    return model


def _compile(model: Any, compiled: dict[str, Any], directory: Path) -> None:
    with model._scope():
        try:
            optimizer = optimizers_lib.deserialize(compiled["optimizer"])
        except InvalidArgumentError as err:
            raise CheckpointError(f"load_model: {directory / _CONFIG}: {err}") from err
    model.compile(optimizer=optimizer, loss=losses_lib.deserialize(compiled["loss"]),
                  metrics=[metrics_lib.deserialize(m) for m in compiled["metrics"]],
                  weighted_metrics=[metrics_lib.deserialize(m) for m in compiled.get("weighted_metrics", [])])


def load_model(filepath: str | os.PathLike[str], custom_objects: dict[str, type] | None = None,
               compile: bool = True, *, trust: bool = False) -> Any:  # noqa: A002 - Keras' argument name
    """Rebuilds a model saved with ``model.save`` in the current strategy's scope.

    A saved model is code (a ``from_onnx`` model's graph runs; its plan does), so it loads under the rules
    of :func:`graphdist.load_plan`: with ``trust=True``; signed with this user's key (every ``model.save``
    signs) from any folder, but never with a signature of this user's key that does not verify; otherwise
    only from a folder no other user can write.

    Args:
        filepath: The saved directory.
        custom_objects: ``{class name: class}`` for subclassed models.
        compile: Compile with the saved optimizer, loss and metrics (and
            restore the optimizer's state).
        trust: Load it even from a folder others can write, signed by someone else or with a signature that
            does not verify: only for models from people you trust.

    Raises:
        CheckpointError: Missing, corrupt or edited files (every file is checked against the directory's
            manifest), a malformed ``model.json``, an unknown format version; a directory not trusted (the
            message names the folder, why, and the fix).
        InvalidArgumentError: A subclassed model without its class in ``custom_objects``.
    """
    directory = Path(filepath)
    config, files = _read_config(directory, trust)
    compiled = config.get("compile") if compile else None
    try:
        model = _rebuild(config, directory, custom_objects, files)
        if compiled is not None:
            _compile(model, compiled, directory)
    except GraphdistError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise _bad_config(directory, f"does not describe a model this graphdist can build "
                                     f"({type(err).__name__}: {err})") from None
    checkpoint = Checkpoint(**_trackables(model)) if compiled is not None else Checkpoint(model=model)
    checkpoint._restore(directory / _VARIABLES, data=files.get(_VARIABLES) if files is not None else None)
    return model
