"""Placement annotations of ``TPUStrategy``'s logical devices (``graphdist`` domain).

* ``LogicalDevice(value) -> value`` (attr ``logical_device``): the value is
  computed on that logical device of its replica
  (``strategy.experimental_assign_to_logical_device``).
* ``SplitToLogicalDevices(value) -> value`` (attr ``partition_dimensions``):
  the value is tiled over the replica's logical devices, ``partition_dimensions[a]``
  tiles along axis ``a`` (``strategy.experimental_split_to_logical_devices``).

Both are the identity on values (their reference implementation and their
gradient); ``PlaceLogicalDevicesPass`` and ``ShardLogicalDevicesPass`` turn
them into placement and per-device computation, and remove them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.ir.gradients import GradBuilder, register_gradient
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node, Value
from graphdist.ir.ops import OpDef, register_op

__all__ = ["LOGICAL_DEVICE", "SHARDING_CONSTRAINT", "SPLIT_TO_LOGICAL_DEVICES", "register_placement_ops"]

LOGICAL_DEVICE = "LogicalDevice"
SPLIT_TO_LOGICAL_DEVICES = "SplitToLogicalDevices"
SHARDING_CONSTRAINT = "ShardingConstraint"


def _same_type(node: Node, _: int | None) -> list[tuple[np.dtype, tuple]]:
    value = node.inputs[0]
    return [(value.dtype, value.shape)]


def _identity(value: np.ndarray, **_: Any) -> tuple[np.ndarray]:
    return (value,)


def _pass_gradient(b: GradBuilder, node: Node, g: list[Value | None]) -> list[Value | None]:
    return [g[0]]


def register_placement_ops() -> None:
    """Registers the annotations and their (identity) gradient rules."""
    register_op(OpDef(LOGICAL_DEVICE, GRAPHDIST_DOMAIN, _same_type, reference=_identity,
                      doc="Identity computed on a logical device of its replica.", attrs={"logical_device": 0}))
    register_op(OpDef(SPLIT_TO_LOGICAL_DEVICES, GRAPHDIST_DOMAIN, _same_type, reference=_identity,
                      doc="Identity tiled over its replica's logical devices.", attrs={"partition_dimensions": []}))
    register_op(OpDef(SHARDING_CONSTRAINT, GRAPHDIST_DOMAIN, _same_type, reference=_identity,
                      doc="Identity whose layout over the device mesh is pinned.", attrs={"layout": []}))
    register_gradient(LOGICAL_DEVICE, GRAPHDIST_DOMAIN)(_pass_gradient)
    register_gradient(SHARDING_CONSTRAINT, GRAPHDIST_DOMAIN)(_pass_gradient)
    register_gradient(SPLIT_TO_LOGICAL_DEVICES, GRAPHDIST_DOMAIN)(_pass_gradient)


register_placement_ops()
