"""Evaluating one ONNX node on constant inputs, for folding it into a constant.

Imported models compute shapes at run time (``Shape -> Gather -> Concat ->
Reshape``) where graphdist's shape rules need constants. When an imported
graph is inlined into a trace every input has a static shape, so such chains
have known values: :func:`fold_node` computes them with ``onnx.reference``
(ONNX's own reference implementation, at the graph's opset), and the caller
uses the values as constants instead of emitting the nodes.

Cases folded: ``Shape`` and ``Size`` of a value with a static shape; any
deterministic op of an ONNX domain whose inputs are all constants and whose
outputs are small (at most :data:`MAX_FOLDED_ELEMENTS` elements each).
Random ops, ops with subgraphs and large outputs (weights computed from a
``ConstantOfShape``) are left to run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnx import helper, numpy_helper

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Value
from graphdist.ir.onnx_attributes import node_attributes
from graphdist.ir.subgraphs import split_captures

__all__ = ["fold_node", "run_node", "MAX_FOLDED_ELEMENTS"]

logger = logging.getLogger(__name__)

#: Outputs larger than this stay computed at run time (a weight-sized ConstantOfShape, say).
MAX_FOLDED_ELEMENTS = 1 << 16

#: Loops may run long: never folded (an If on a constant condition is).
_LOOPS = frozenset({"Loop", "Scan"})
_RANDOM = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
                     "Multinomial", "Dropout"})


def fold_node(op_type: str, domain: str, attrs: Mapping[str, Any], inputs: Sequence[Value | None],
              num_outputs: int, opset_imports: Mapping[str, int]) -> list[np.ndarray] | None:
    """The outputs of the node ``domain.op_type(inputs)`` when they can be computed now, else ``None``."""
    if domain == GRAPHDIST_DOMAIN or op_type in _RANDOM or op_type in _LOOPS:
        return None
    if op_type in ("Shape", "Size") and domain == "" and inputs and inputs[0] is not None:
        return _shape_or_size(op_type, attrs, inputs[0])
    present = [v for v in inputs if v is not None]
    if not present or any(v.const_value is None for v in present):
        return None
    if any(np.size(v.const_value) > MAX_FOLDED_ELEMENTS for v in present):
        return None
    return _evaluate(op_type, domain, attrs, inputs, num_outputs, opset_imports)


def _shape_or_size(op_type: str, attrs: Mapping[str, Any], value: Value) -> list[np.ndarray] | None:
    if not all(isinstance(d, int) for d in value.shape):
        return None
    if op_type == "Size":
        return [np.asarray(int(np.prod(value.shape)), dtype=np.int64)]
    rank = len(value.shape)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    end = rank if end is None else int(end)
    start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
    return [np.asarray(value.shape[start:end], dtype=np.int64)]


def _evaluate(op_type: str, domain: str, attrs: Mapping[str, Any], inputs: Sequence[Value | None],
              num_outputs: int, opset_imports: Mapping[str, int]) -> list[np.ndarray] | None:
    arrays = [None if v is None else np.asarray(v.const_value) for v in inputs]
    results = run_node(op_type, domain, attrs, arrays, num_outputs, opset_imports)
    if results is None or any(a.size > MAX_FOLDED_ELEMENTS for a in results):
        return None
    return results


def run_node(op_type: str, domain: str, attrs: Mapping[str, Any], arrays: Sequence[np.ndarray | None],
             num_outputs: int, opset_imports: Mapping[str, int]) -> list[np.ndarray] | None:
    """Runs one node in ``onnx.reference`` on ``arrays``; ``None`` when the reference cannot."""
    from onnx.reference import ReferenceEvaluator


    real, captured, captured_names = split_captures(arrays, attrs)
    names = ["" if a is None else f"i{i}" for i, a in enumerate(real)]
    node = helper.make_node(op_type, names, [f"o{i}" for i in range(num_outputs)], domain=domain)
    node.attribute.extend(node_attributes(dict(attrs), {n: f"i{len(real) + j}" for j, n in enumerate(captured_names)}))
    initializers = [numpy_helper.from_array(a, f"i{i}") for i, a in enumerate(arrays) if a is not None]
    outputs = [helper.make_empty_tensor_value_info(f"o{i}") for i in range(num_outputs)]
    graph = helper.make_graph([node], "run", [], outputs, initializer=initializers)
    opsets = [helper.make_opsetid(d, v) for d, v in opset_imports.items() if d != GRAPHDIST_DOMAIN]
    try:
        with np.errstate(all="ignore"):
            results = ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(None, {})
    except Exception as err:  # noqa: BLE001 - the reference raises anything; the caller falls back
        logger.debug("onnx.reference cannot run %s: %s: %s", op_type, type(err).__name__, err)
        return None
    return [np.asarray(r) for r in results]
