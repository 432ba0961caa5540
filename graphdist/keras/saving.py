"""``model.save(dir)`` and ``gd.keras.load_model(dir)``: checkpoint + plan formats, no pickle.

A saved model is a directory, written atomically (staged in a temporary
directory, then renamed into place) by the chief only:

* ``model.json``: format and version, the model class, its architecture
  (for ``Sequential``: every layer's class and constructor arguments; for a
  functional model also its inputs and which layer is called on what), the
  input shape it was built for, and the compile settings (optimizer class
  and hyper-parameters, loss, metrics, weighted metrics);
* ``variables.npz``: a ``gd.train.Checkpoint`` of the model's weights (keys
  by layer position) and, when compiled, the optimizer's state (step count,
  slots), so training can continue where it stopped;
* ``model.onnx``: for a model made by ``gd.keras.models.from_onnx``, its
  ONNX graph (with the weights at save time), from which it is rebuilt;
* ``serving/``: the compiled predict step exported as a plan
  (``gd.load_plan(dir + "/serving")`` runs it without this code, for global
  batches of ``serving_batch_size`` rows).

``load_model`` rebuilds the architecture in the current strategy's scope
(so a model saved under one strategy loads under another), restores the
variables and compiles it again. Subclassed models have no architecture
config: pass their class in ``custom_objects`` (it is called without
arguments), or run the exported plan.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from graphdist import optimizers as optimizers_lib
from graphdist.checkpoint import Checkpoint
from graphdist.compile.plan_files import write_plan_directory
from graphdist.errors import CheckpointError, InvalidArgumentError
from graphdist.keras import losses as losses_lib
from graphdist.keras import metrics as metrics_lib
from graphdist.keras.callbacks import is_chief

__all__ = ["save_model", "load_model", "FORMAT", "VERSION", "SERVING_BATCH_SIZE"]

FORMAT = "graphdist-keras-model"
VERSION = 1
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
    """
    from graphdist.keras.models import FunctionalModel, Sequential

    if model._build_input_shape is None:
        raise InvalidArgumentError("model.save: the model is not built yet; fit it, call it, or give the first layer "
                                   "an input_shape")
    dest = Path(filepath)
    if dest.exists() and not overwrite:
        raise InvalidArgumentError(f"model.save: {dest} exists; pass overwrite=True to replace it")
    if not is_chief(model.distribute_strategy):
        return str(dest.resolve())
    saved_files = getattr(model, "_saved_files", None)  # models with files of their own (from_onnx: model.onnx)
    config = {
        "format": FORMAT, "version": VERSION, "class_name": type(model).__name__,
        "config": model.get_config() if isinstance(model, (Sequential, FunctionalModel)) or saved_files else None,
        "build_input_shape": list(model._build_input_shape[1:]),
        "compile": _compile_config(model), "serving_batch_size": serving_batch_size,
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.stage-"))
    try:
        Checkpoint(**_trackables(model)).save(staging / _VARIABLES)
        _export_serving(model, staging / _SERVING, serving_batch_size)
        (staging / _CONFIG).write_text(json.dumps(config, indent=1))
        for name, data in (saved_files() if saved_files else {}).items():
            (staging / name).write_bytes(data)
        files = {str(p.relative_to(staging)): p.read_bytes() for p in sorted(staging.rglob("*")) if p.is_file()}
        write_plan_directory(dest, files, overwrite=True, marker=_CONFIG)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(dest.resolve())


def _export_serving(model: Any, directory: Path, batch: int) -> None:
    """Exports the predict step for global batches of ``batch`` rows."""
    from graphdist.keras.training import Engine, split_global_batch

    engine = model._engine or model._predict_engine or Engine(model, None, None, [])
    example = model._example_batch(batch)
    distributed = split_global_batch(model.distribute_strategy, example)
    with model._scope():
        concrete = engine.serving_function.get_concrete_function(distributed)
    concrete.export(directory)


def load_model(filepath: str | os.PathLike[str], custom_objects: dict[str, type] | None = None,
               compile: bool = True) -> Any:  # noqa: A002 - Keras' argument name
    """Rebuilds a model saved with ``model.save`` in the current strategy's scope.

    Args:
        filepath: The saved directory.
        custom_objects: ``{class name: class}`` for subclassed models.
        compile: Compile with the saved optimizer, loss and metrics (and
            restore the optimizer's state).

    Raises:
        CheckpointError: Missing or corrupt files, unknown format version.
        InvalidArgumentError: A subclassed model without its class in ``custom_objects``.
    """
    from graphdist.keras.models import FunctionalModel, Sequential

    directory = Path(filepath)
    try:
        config = json.loads((directory / _CONFIG).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"load_model: {directory} is not a saved model ({directory / _CONFIG}: {err}); pass "
                              "the directory model.save wrote") from err
    if config.get("format") != FORMAT or config.get("version") != VERSION:
        raise CheckpointError(f"load_model: {directory} has format {config.get('format')!r} version "
                              f"{config.get('version')!r}; this graphdist reads {FORMAT} version {VERSION}")
    class_name = config["class_name"]
    if class_name == "Sequential":
        model = Sequential.from_config(config["config"])
    elif class_name == "FunctionalModel":
        model = FunctionalModel.from_config(config["config"])
    elif class_name == "OnnxKerasModel":
        from graphdist.keras.onnx_model import OnnxKerasModel

        model = OnnxKerasModel._from_saved(directory, config["config"])
    elif custom_objects and class_name in custom_objects:
        model = custom_objects[class_name]()
    else:
        raise InvalidArgumentError(
            f"load_model: {directory} holds a subclassed model ({class_name}) whose architecture is Python code; pass "
            f"custom_objects={{'{class_name}': {class_name}}}, or run its exported predict plan with "
            f"gd.load_plan('{directory / _SERVING}')")
    if not model.built:
        model.build((None, *config["build_input_shape"]))
    compiled = config.get("compile")
    if compile and compiled is not None:
        with model._scope():
            try:
                optimizer = optimizers_lib.deserialize(compiled["optimizer"])
            except InvalidArgumentError as err:
                raise CheckpointError(f"load_model: {directory / _CONFIG}: {err}") from err
        model.compile(optimizer=optimizer, loss=losses_lib.deserialize(compiled["loss"]),
                      metrics=[metrics_lib.deserialize(m) for m in compiled["metrics"]],
                      weighted_metrics=[metrics_lib.deserialize(m) for m in compiled.get("weighted_metrics", [])])
    checkpoint = Checkpoint(**_trackables(model)) if compile and compiled is not None else Checkpoint(model=model)
    checkpoint.restore(directory / _VARIABLES)
    return model
