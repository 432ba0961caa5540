"""ONNX models in: load an ONNX model as trainable, distributable graphdist code.

* :func:`load` -> :class:`OnnxModel` (``graphdist.onnx.model``): the model's
  float initializers become variables of the current strategy; call it
  eagerly (numpy in, numpy out) or inside ``strategy.run`` / ``gd.function`` /
  ``gd.GradientTape``; ``save(path)`` writes it back with the trained weights.
* :mod:`graphdist.onnx.backend`: ``onnx.backend.base.Backend`` for graphdist,
  so ONNX's own backend test suite runs through it.

The submodules are imported on first use (``gd.onnx.load`` imports the model
module), which keeps ``import graphdist`` light.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load", "OnnxModel"]

_EXPORTS = {"load": "graphdist.onnx.model", "OnnxModel": "graphdist.onnx.model"}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'graphdist.onnx' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
