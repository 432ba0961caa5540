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

from graphdist.ir.graph import ONNX_DOMAIN, Graph

__all__ = ["VALUE_OPERANDS", "static_inputs"]

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
