"""``model.summary()``: the table of layers, output shapes and parameter counts.

Output shapes come from one eager pass of the model over a zero example with
each tracked layer's ``call`` recording its output's shape (a subclassed model
has no other record of them); a functional model's layers have symbolic shapes
already. A layer called with several shapes shows ``multiple``, as in Keras.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from graphdist import nest

__all__ = ["summary_text", "traced_output_shapes", "symbolic_output_shapes"]

logger = logging.getLogger(__name__)


def summary_text(model: Any, shapes: dict[int, str]) -> str:
    """The summary table of ``model`` with ``shapes`` (``id(layer) -> text``; ``?`` where missing)."""
    rows = [("Layer (type)", "Output Shape", "Param #")]
    rows += [(f"{layer.name} ({type(layer).__name__})", shapes.get(id(layer), "?"), f"{layer.count_params():,}")
             for layer in model.layers]
    first, second = (max(len(r[i]) for r in rows) + 2 for i in (0, 1))
    lines = [f'Model: "{model.name}" on {model.distribute_strategy!r}',
             *(f"{a:<{first}}{b:<{second}}{c:>12}" for a, b, c in rows), f"Total params: {model.count_params():,}"]
    if model._output_shape is not None:
        lines.append(f"Output shape: {(None, *model._output_shape[1:])}")
    return "\n".join(lines)


def traced_output_shapes(model: Any) -> dict[int, str]:
    """``id(layer) -> output shape text`` for ``model``'s tracked layers, from one eager pass over a zero
    example (nothing before the model is built, or when the pass fails, e.g. a subclassed model with
    several inputs).
    """
    layers = model.layers
    if model._build_input_shape is None or not layers:
        return {}
    seen: dict[int, list[str]] = {}
    for layer in layers:
        layer.call = _recording_call(layer, seen)  # an instance attribute: shadows the method for this pass
    try:
        with model._scope():
            model(model._example_batch(1), training=False)
    except Exception:  # noqa: BLE001 - the table still shows, with '?' shapes
        logger.debug("summary: no output shapes for %s", model.name, exc_info=True)
        return {}
    finally:
        for layer in layers:
            del layer.call
    return _one_per_layer(seen)


def symbolic_output_shapes(calls: Any) -> dict[int, str]:
    """``id(layer) -> output shape text`` from a functional model's recorded calls (KerasTensors)."""
    seen: dict[int, list[str]] = {}
    for tensor in calls:
        seen.setdefault(id(tensor.layer), []).append(str(tensor.shape))
    return _one_per_layer(seen)


def _one_per_layer(seen: dict[int, list[str]]) -> dict[int, str]:
    return {key: texts[0] if len(set(texts)) == 1 else "multiple" for key, texts in seen.items()}


def _shape_text(output: Any) -> str:
    """``(None, 10)`` for one output, ``[(None, 3), (None, 4)]`` for several (batch axis shown as ``None``)."""
    shapes = [str((None, *tuple(np.shape(leaf))[1:])) for leaf in nest.flatten(output)[0]]
    return shapes[0] if len(shapes) == 1 else f"[{', '.join(shapes)}]"


def _recording_call(layer: Any, seen: dict[int, list[str]]) -> Any:
    """``layer.call`` that also records its output's shape in ``seen[id(layer)]``."""
    call = type(layer).call.__get__(layer)

    def recording(inputs: Any, training: bool = False) -> Any:
        output = call(inputs, training=training)
        seen.setdefault(id(layer), []).append(_shape_text(output))
        return output

    return recording
