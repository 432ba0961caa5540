"""ONNX attributes of graphdist nodes: a Python/numpy attribute value as an ``AttributeProto``.

Shared by the ONNX export (:mod:`graphdist.ir.onnx_io`), the one-node reference runs of constant
folding (:mod:`graphdist.ir.fold`) and ONNX's shape inference of generic ops
(:mod:`graphdist.ir.onnx_schema_ops`); it imports none of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphdist.ir.subgraphs import CAPTURES_ATTR, renamed_attribute

__all__ = ["attribute_proto", "node_attributes"]


def attribute_proto(name: str, value: Any) -> onnx.AttributeProto:
    """The ONNX attribute ``name`` holding ``value`` (a Python/numpy value, or an ``AttributeProto`` kept
    from an imported model for attribute kinds graphdist does not interpret).
    """
    if isinstance(value, onnx.AttributeProto):
        proto = onnx.AttributeProto()
        proto.CopyFrom(value)
        proto.name = name
        return proto
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and not value:
        # make_attribute cannot infer the type of an empty list; ONNX list attributes are ints
        # (perm, axes, pads...) far more often than anything else.
        return helper.make_attribute(name, value, attr_type=onnx.AttributeProto.INTS)
    return helper.make_attribute(name, value)


def node_attributes(attrs: dict[str, Any], captures: dict[str, str] | None = None) -> list[onnx.AttributeProto]:
    """A node's ONNX attributes; subgraphs read the captured outer values by their current names
    (``captures``: the name a subgraph uses -> the value's name now).
    """
    protos = []
    for key, value in sorted(attrs.items()):
        if value is None or key == CAPTURES_ATTR:
            continue
        proto = attribute_proto(key, value)
        protos.append(renamed_attribute(proto, captures) if captures else proto)
    return protos
