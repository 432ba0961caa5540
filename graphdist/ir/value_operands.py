"""Operands whose values decide output shapes, and the graph inputs that feed them.

graphdist's graphs have static ranks and (mostly) static dimensions, so an
operand such as Reshape's ``shape`` or a reduction's ``axes`` must be a
constant when the graph is compiled. An imported model may take such an
operand as a graph input; :func:`static_inputs` finds those inputs, so that a
caller with concrete values (an eager call, the ONNX backend) binds them as
constants and compiles once per distinct value, as ``tf.function`` does for
Python values in its signature.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from graphdist.ir.graph import ONNX_DOMAIN, Graph
from graphdist.ir.subgraphs import free_names

__all__ = ["VALUE_OPERANDS", "CONTROL_OPERANDS", "static_inputs", "static_input_names", "bind_model_inputs",
           "with_input_shapes"]

_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

#: Per ``ai.onnx`` op, the input positions whose values decide the shape of an output.
VALUE_OPERANDS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(_REDUCTIONS, (1,)),
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Slice": (1, 2, 3, 4),
    "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "Pad": (1, 3), "Range": (0, 1, 2), "OneHot": (1,),
    "TopK": (1,), "Resize": (1, 2, 3), "Upsample": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2),
    "MaxUnpool": (2,), "DFT": (1, 2), "STFT": (1, 3), "MelWeightMatrix": (0, 1, 2, 3, 4),
    "BlackmanWindow": (0,), "HannWindow": (0,), "HammingWindow": (0,), "AffineGrid": (1,),
}

#: Per ``ai.onnx`` op, the input positions that decide which ops run: an ``If``'s condition, a ``Loop``'s
#: trip count and condition. A caller
#: with its value specialises on it (the taken branch is inlined, its shapes fold); a value known only
#: at run time keeps the node, unlike :data:`VALUE_OPERANDS`, which must be known.
CONTROL_OPERANDS: dict[str, tuple[int, ...]] = {
    "If": (0,),
    "Loop": (0, 1),  # trip count and condition: known, the loop unrolls; else its scan outputs' length is dynamic
}

#: Ops whose outputs depend on their inputs' shapes only: the search for static inputs stops there.
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def static_inputs(graph: Graph) -> list[int]:
    """Positions of the graph inputs that (through any ops) decide a value operand of some node.

    Returns:
        Sorted indices into ``graph.inputs``.
    """
    wanted = []
    for node in graph.nodes:
        if node.domain != ONNX_DOMAIN:
            continue
        for position in VALUE_OPERANDS.get(node.op_type, ()):
            if position < len(node.inputs) and node.inputs[position] is not None:
                wanted.append(node.inputs[position])
    seen: set[int] = set()
    while wanted:
        value = wanted.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if value.producer is not None and value.producer.op_type not in _SHAPE_ONLY:
            wanted.extend(v for v in value.producer.inputs if v is not None)
    return [index for index, value in enumerate(graph.inputs) if id(value) in seen]


def static_input_names(model: onnx.ModelProto,
                       operands: Mapping[str, tuple[int, ...]] = VALUE_OPERANDS) -> list[str]:
    """:func:`static_inputs` for an ONNX model, before import: the names of the graph inputs (not
    initializers) that decide a value operand, in input order.

    Args:
        model: The model.
        operands: The operands sought, per op (:data:`CONTROL_OPERANDS`: the inputs that decide an
            ``If`` of the main graph).
    """
    proto = model.graph
    producers = {name: node for node in proto.node for name in node.output if name}
    wanted = [node.input[p] for node in proto.node if node.domain in ("", "ai.onnx")
              for p in operands.get(node.op_type, ()) if p < len(node.input) and node.input[p]]
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        producer = producers.get(name)
        if producer is not None and producer.op_type not in _SHAPE_ONLY:
            wanted.extend(n for n in producer.input if n)
            wanted.extend(free_names(sub for attr in producer.attribute for sub in _graphs(attr)))
    initializers = {t.name for t in proto.initializer}
    return [vi.name for vi in proto.input if vi.name in seen and vi.name not in initializers]


def bind_model_inputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs named in ``values`` are initializers holding those values."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    kept = [vi for vi in bound.graph.input if vi.name not in values]
    del bound.graph.input[:]
    bound.graph.input.extend(kept)
    bound.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())
    return bound


def with_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int | str, ...]]) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs named in ``shapes`` declare those shapes (strings: symbolic)."""
    shaped = onnx.ModelProto()
    shaped.CopyFrom(model)
    for vi in shaped.graph.input:
        if vi.name in shapes and vi.type.HasField("tensor_type"):
            tensor = vi.type.tensor_type
            tensor.ClearField("shape")
            tensor.shape.SetInParent()  # a known rank, also for a scalar
            for dim in shapes[vi.name]:
                if isinstance(dim, str):
                    tensor.shape.dim.add().dim_param = dim
                else:
                    tensor.shape.dim.add().dim_value = int(dim)
    return shaped


def _graphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    return list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
