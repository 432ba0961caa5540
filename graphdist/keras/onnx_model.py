"""``gd.keras.models.from_onnx``: a Keras model whose forward pass is an ONNX graph.

::

    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.keras.models.from_onnx("mlp.onnx")   # initializers -> MirroredVariables
    model.compile(optimizer="adam", loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x, y, epochs=5, batch_size=64)
    model.save("trained")                                # gd.keras.load_model("trained") rebuilds it
    model.onnx.save("trained.onnx")                      # or back to ONNX, trained weights included

The model wraps a :class:`graphdist.onnx.OnnxModel` (``model.onnx``): its
weights are that model's variables (named by initializer names), ``call``
runs its graph, with ``training=True`` in ``fit`` (Dropout drops,
BatchNormalization uses batch statistics; see :mod:`graphdist.onnx.model`).
One ONNX input takes an array; several take a list in input order or a dict
by input name. ``fit`` and ``evaluate`` need a model with one output
(``predict`` returns a tuple for several).

``model.save(dir)`` stores the ONNX model (``model.onnx``, its current
weights as initializers) with the usual checkpoint and serving plan, so
``gd.keras.load_model(dir)`` rebuilds it in the current strategy's scope.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx

from graphdist.errors import GraphError, InvalidArgumentError
from graphdist.keras.models import Model
from graphdist.onnx.model import OnnxModel, load

__all__ = ["from_onnx", "OnnxKerasModel", "ONNX_FILE"]

#: The ONNX model's file in a saved model directory.
ONNX_FILE = "model.onnx"


def from_onnx(model: onnx.ModelProto | str | os.PathLike[str] | OnnxModel, trainable: bool = True,
              name: str | None = None) -> OnnxKerasModel:
    """A ``gd.keras.Model`` whose forward pass is the ONNX graph ``model``.

    Create it inside ``strategy.scope()``: its weights (the model's float
    initializers) become that strategy's variables, and ``compile`` /
    ``fit`` / ``evaluate`` / ``predict`` / ``save`` run under it.

    Args:
        model: Path of an ``.onnx`` file, an ``onnx.ModelProto``, or a model
            from :func:`graphdist.onnx.load` (used as is: its variables are shared;
            load it with ``batch_norm="update"`` for ``fit`` to normalise with
            batch statistics and move the running ones; by default they stay frozen).
        trainable: ``False`` keeps every weight out of training (Keras'
            ``model.trainable = False``; they still exist, are saved and restored).
        name: Model name (default: the ONNX graph's name).

    Raises:
        GraphError: The model cannot be loaded (see :func:`graphdist.onnx.load`).
    """
    onnx_model = model if isinstance(model, OnnxModel) else load(model)
    keras_model = OnnxKerasModel(onnx_model, name=name)
    keras_model.trainable = bool(trainable)
    return keras_model


def _float_dtype(onnx_model: OnnxModel) -> np.dtype:
    floats = [dtype for _, dtype in onnx_model.input_specs() if np.dtype(dtype).kind == "f"]
    return np.dtype(floats[0]) if floats else np.dtype(np.float32)


def _keras_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "_." else "_" for c in text) or "onnx_model"


class OnnxKerasModel(Model):
    """A Keras model around an :class:`~graphdist.onnx.OnnxModel` (make it with :func:`from_onnx`).

    Args:
        onnx_model: The loaded ONNX model (its variables become the weights).
        name: Model name.

    Attributes:
        onnx: The wrapped :class:`~graphdist.onnx.OnnxModel` (``model.onnx.save(path)`` writes it back).
    """

    def __init__(self, onnx_model: OnnxModel, name: str | None = None) -> None:
        super().__init__(name=name or _keras_name(onnx_model.name), dtype=_float_dtype(onnx_model))
        self.onnx = onnx_model
        self._strategy = onnx_model.distribute_strategy
        self._weights = list(onnx_model.variables)
        self._weight_names = [v._name for v in onnx_model.variables]
        shape, _ = onnx_model.input_specs()[0] if onnx_model.input_names else ((None,), None)
        self._build_input_shape = (None, *shape[1:])
        outputs = onnx_model.output_shapes()
        if outputs and all(isinstance(d, int) for d in outputs[0][1:]):
            self._output_shape = (1, *outputs[0][1:])
        self.built = True

    def call(self, inputs: Any, training: bool = False) -> Any:
        names = self.onnx.input_names
        if isinstance(inputs, dict):
            return self.onnx(training=training, **inputs)
        if len(names) > 1:
            if not isinstance(inputs, (list, tuple)) or len(inputs) != len(names):
                raise InvalidArgumentError(f"{self.name}: the ONNX model takes {len(names)} inputs "
                                           f"({', '.join(names)}); give a list in that order or a dict by name")
            return self.onnx(*inputs, training=training)
        return self.onnx(inputs, training=training)

    def __call__(self, inputs: Any, training: bool = False) -> Any:
        return self.call(inputs, training=training)

    def _record_output(self, example: Any) -> None:
        if self._output_shape is None:
            super()._record_output(example)

    def _example_batch(self, rows: int) -> Any:
        arrays = [np.zeros((rows, *[1 if d is None else d for d in shape[1:]]), dtype)
                  for shape, dtype in self.onnx.input_specs()]
        return arrays[0] if len(arrays) == 1 else list(arrays)

    def summary(self, print_fn: Any = print) -> str:
        text = "\n".join([
            f'Model: "{self.name}" (ONNX graph {self.onnx.name!r}) on {self._strategy!r}',
            f"inputs: {', '.join(self.onnx.input_names)}; outputs: {', '.join(self.onnx.output_names)}",
            f"weights: {len(self._weights)} ({len(self.trainable_weights)} trainable)",
            f"Total params: {self.count_params():,}"])
        if print_fn is not None:
            print_fn(text)
        return text

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "trainable": self.trainable}

    def _saved_files(self) -> dict[str, bytes]:
        """Extra files of ``model.save``: the ONNX model with its current weights."""
        return {ONNX_FILE: self.onnx.to_onnx().SerializeToString()}

    @classmethod
    def _from_saved(cls, directory: str | os.PathLike[str], config: dict[str, Any],
                    files: dict[str, bytes] | None = None) -> OnnxKerasModel:
        """Rebuilds a saved model (in the current strategy's scope) from its ``model.onnx`` (its bytes in
        ``files`` when the caller has read and verified them).
        """
        source: Any = os.path.join(directory, ONNX_FILE)
        if files is not None and ONNX_FILE in files:
            try:
                source = onnx.ModelProto.FromString(files[ONNX_FILE])
            except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends
                raise GraphError(f"{source}: cannot be parsed as an ONNX model ({err})") from None
        return from_onnx(source, trainable=bool(config.get("trainable", True)), name=config.get("name"))

    def __repr__(self) -> str:
        return (f"<OnnxKerasModel {self.name!r} onnx={self.onnx.name!r} weights={len(self._weights)} "
                f"strategy={self._strategy!r}>")
