"""FoldConstantsPass: compute small arithmetic on constants once, at compile time.

A step traced once for any replica count reads the replica count through
``graphdist.NumReplicas`` and its replica id through ``graphdist.ReplicaId``;
``ReplicatePass`` turns both into constants, which leaves scalar arithmetic
on constants (``compute_average_loss``'s ``batch * replicas``) to run on
every step. This pass folds it.

Invariant established: no node of :data:`FOLDABLE` has only constant
(initializer) inputs and an output of at most :data:`MAX_ELEMENTS` elements:
each such node is replaced by an initializer holding its value, computed
with numpy in the node's dtypes (the same IEEE operation ONNX Runtime runs).

Cases:

* ``Cast``, ``Identity``, ``Neg`` of a constant; ``Add``, ``Sub``, ``Mul`` of
  constants; ``Div`` of floating-point constants (ONNX integer division
  truncates where numpy floors: integer ``Div`` is left alone);
* chains fold in one run (nodes are visited in order);
* an output larger than :data:`MAX_ELEMENTS` (a weight-sized computation),
  a node with side effects, or one whose output is a graph output: left
  alone (an output must stay produced by a node);
* nothing to fold: unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphdist.ir.graph import ONNX_DOMAIN, Graph, Node
from graphdist.ir.ops import numpy_dtype
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["FoldConstantsPass", "FOLDABLE", "MAX_ELEMENTS"]

MAX_ELEMENTS = 64

_BINARY: dict[str, Callable[[Any, Any], Any]] = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
                                                 "Div": np.divide}
FOLDABLE = frozenset({"Cast", "Identity", "Neg", *_BINARY})


def _fold(node: Node) -> np.ndarray | None:
    """The node's value, or ``None`` when it cannot be folded exactly."""
    values = [np.asarray(v.const_value) for v in node.inputs if v is not None]
    out = node.outputs[0]
    if node.op_type == "Cast":
        return values[0].astype(numpy_dtype(int(node.attrs["to"])))
    if node.op_type == "Identity":
        return values[0]
    if node.op_type == "Neg":
        return np.negative(values[0])
    if node.op_type == "Div" and out.dtype.kind != "f":
        return None
    return np.asarray(_BINARY[node.op_type](values[0], values[1]), dtype=out.dtype)


class FoldConstantsPass(PassBase):
    """Replaces small arithmetic on constants by its value."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        outputs = {id(v) for v in graph.outputs}
        folded: list[Node] = []
        for node in list(graph.nodes):
            if node.domain != ONNX_DOMAIN or node.op_type not in FOLDABLE or node.meta.get("side_effect"):
                continue
            out = node.outputs[0]
            if id(out) in outputs or not out.is_static or int(np.prod(out.shape, dtype=np.int64)) > MAX_ELEMENTS:
                continue
            if not all(v is not None and v.const_value is not None for v in node.inputs):
                continue
            value = _fold(node)
            if value is None:
                continue
            constant = graph.add_initializer(f"{out.name}_folded", value.reshape(out.shape))
            graph.replace_all_uses_with(out, constant)
            node.detach_inputs()  # so that a node folded next may be removed with it
            folded.append(node)
        graph.remove_nodes(folded)  # one pass over the node list
        return PassResult(graph, modified=bool(folded))
