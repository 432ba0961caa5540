"""graphdist-domain ops for state, transfers and differentiation.

* ``AssignVariable(value) -> value`` (attr ``variable``): a variable update;
  its output is the variable's new value for later reads in the same step.
  ``LowerVariableUpdatesPass`` turns updates into plan outputs.
* ``StopGradient(value) -> value``: the identity, treated as a constant by
  autodiff (``gd.stop_gradient``); removed after ``AutodiffPass``.
* ``Gradient(target, *sources) -> *grads`` : d(sum(target))/d(source) for each
  source; ``AutodiffPass`` expands it into backward ops from the OpDef
  gradient rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node
from graphdist.ir.ops import OpDef, register_op

__all__ = ["register_state_ops"]


def _infer_assign(node: Node, _: int | None) -> list[tuple[np.dtype, tuple]]:
    value = node.inputs[0]
    return [(value.dtype, value.shape)]


def _infer_gradient(node: Node, _: int | None) -> list[tuple[np.dtype, tuple]]:
    if len(node.inputs) < 2:
        raise GraphError(f"Gradient ({node.name}) needs a target and at least one source")
    target = node.inputs[0]
    if target.dtype.kind != "f":
        raise GraphError(f"Gradient ({node.name}): the target must be floating point, got {target.type_str()}")
    return [(v.dtype, v.shape) for v in node.inputs[1:]]


def _reference_assign(value: np.ndarray, **_: Any) -> tuple[np.ndarray]:
    return (value,)


def _reference_gradient(*_: Any, **__: Any) -> tuple[np.ndarray, ...]:
    raise GraphError("a graphdist.Gradient node cannot be evaluated directly: run AutodiffPass (part of every "
                     "strategy pipeline) to expand it into backward ops first")


def register_state_ops() -> None:
    """Registers ``StopGradient``, ``AssignVariable`` and ``Gradient`` in the OpDef registry."""
    register_op(OpDef("StopGradient", GRAPHDIST_DOMAIN, _infer_assign, reference=_reference_assign,
                      doc="Identity whose gradient is zero (lowered to nothing after autodiff)."))
    register_op(OpDef("AssignVariable", GRAPHDIST_DOMAIN, _infer_assign, reference=_reference_assign,
                      doc="Update of a variable; output is the new value.", attrs={"variable": ""}))
    register_op(OpDef("Gradient", GRAPHDIST_DOMAIN, _infer_gradient, reference=_reference_gradient,
                      doc="Gradients of sum(target) w.r.t. each source (expanded by AutodiffPass)."))


register_state_ops()
