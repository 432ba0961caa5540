"""ONNX rewrites that make a segment compile, fast and numpy-exact, with TVM's ONNX frontend.

:func:`prepare_for_tvm` returns a rewritten copy of a segment. Each rewrite
keeps ONNX semantics and fixes one difference between TVM 0.27 and ONNX
Runtime / numpy (found by running every traced op through both):

* ``MatMul`` of a 2-D ``Transpose`` -> one ``Einsum`` (``ki,kj->ij`` or
  ``ik,jk->ij``): the transpose becomes an access pattern of the matmul's
  loop nest instead of a copy (a dense layer's backward pass has two).
* Floating ``Max``/``Min`` (two inputs), ``Clip`` and ``Sign`` propagate NaN:
  TVM lowers them to LLVM's ``maxnum``/``minnum`` (which return the non-NaN
  operand) and to comparisons (``Sign(NaN)`` would be 0).
  ``Where(IsNaN(x), x, op(...))`` is added for every operand that is not a
  NaN-free constant; ``Max``/``Min`` of a value and a NaN-free constant
  (``np.maximum(x, 0)``) becomes ``Where(Less(x, c), c, x)``
  (``Greater`` for ``Min``), which keeps a NaN ``x`` and fuses into the
  producing kernel.
* ``Equal`` of booleans -> ``Not(Xor(a, b))``: TVM emits a float compare on
  ``i1`` values, which LLVM rejects.
* ``Pow`` of integers -> computed in float64 and cast back (TVM's power is
  float-only; exact for every int32 result).
* ``ConvTranspose`` with unit strides and dilations, one group, explicit pads
  of at most ``kernel - 1`` and no output padding (a convolution's input
  gradient) -> ``Conv`` of the spatially flipped, in/out-swapped kernel with
  pads ``kernel - 1 - pad``: the same sums, but TVM's ``conv2d`` is scheduled
  where its ``conv2d_transpose`` is a serial loop nest.

Types come from ONNX shape inference; a node whose input types are unknown is
left as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.backends.base import prepare_model

__all__ = ["prepare_for_tvm"]

_FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_INT_TYPES = {2, 3, 4, 5, 6, 7, 12, 13}
_BOOL = 9
_DOUBLE = 11


def prepare_for_tvm(model: Any) -> Any:
    """Returns a copy of ``model`` rewritten for TVM's ONNX frontend (see the module docstring)."""
    import onnx

    prepared = onnx.ModelProto()
    prepared.CopyFrom(prepare_model(model))
    graph = prepared.graph
    types, ranks = _value_types(prepared)
    rewriter = _Rewriter(graph, types, ranks)
    nodes = []
    for node in graph.node:
        nodes.extend(rewriter.rewrite(node))
    del graph.node[:]
    graph.node.extend(nodes)
    return prepared


def _value_types(model: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Element type and rank of every value ONNX shape inference can type."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - untyped values are simply not rewritten
        inferred = model
    graph = inferred.graph
    types = {init.name: init.data_type for init in graph.initializer}
    ranks = {init.name: len(init.dims) for init in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.elem_type:
            types[value.name] = tensor.elem_type
            if tensor.HasField("shape"):
                ranks[value.name] = len(tensor.shape.dim)
    return types, ranks


class _Rewriter:
    """Rewrites one node at a time into the node list TVM gets."""

    def __init__(self, graph: Any, types: dict[str, int], ranks: dict[str, int]) -> None:
        self.graph = graph
        self.types = types
        self.ranks = ranks
        self.producers = {out: node for node in graph.node for out in node.output}
        self.constants = {init.name: init for init in graph.initializer}
        self.counter = 0

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}/tvm_{self.counter}"

    def rewrite(self, node: Any) -> list[Any]:
        handler = {"MatMul": self._matmul, "Max": self._nan_max_min, "Min": self._nan_max_min,
                   "Clip": self._nan_unary, "Sign": self._nan_unary, "Equal": self._bool_equal,
                   "Pow": self._int_pow, "ConvTranspose": self._conv_transpose_as_conv}.get(node.op_type)
        rewritten = handler(node) if handler is not None else None
        return rewritten if rewritten is not None else [node]

    def _transposed_source(self, name: str) -> str | None:
        node = self.producers.get(name)
        if node is None or node.op_type != "Transpose":
            return None
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        return node.input[0] if perm == [1, 0] else None

    def _matmul(self, node: Any) -> list[Any] | None:
        from onnx import helper

        if len(node.input) != 2 or any(self.ranks.get(name) != 2 for name in node.input):
            return None
        sources = [self._transposed_source(name) for name in node.input]
        if not any(sources):
            return None
        a = "ki" if sources[0] else "ik"
        b = "jk" if sources[1] else "kj"
        inputs = [src or name for src, name in zip(sources, node.input)]
        return [helper.make_node("Einsum", inputs, list(node.output), name=f"{node.name}/einsum",
                                 equation=f"{a},{b}->ij")]

    def _may_be_nan(self, name: str) -> bool:
        constant = self.constants.get(name)
        if constant is None:
            return True
        from onnx import numpy_helper

        return bool(np.isnan(numpy_helper.to_array(constant)).any())

    def _propagate_nan(self, node: Any, operands: list[str]) -> list[Any] | None:
        """``node`` computes into a fresh value; NaN operands are selected over it, last first."""
        from onnx import helper

        operands = [name for name in operands if name and self._may_be_nan(name)]
        if self.types.get(node.output[0]) not in _FLOAT_TYPES or not operands:
            return None
        result = self.fresh(node.output[0])
        inner = helper.make_node(node.op_type, list(node.input), [result], name=f"{node.name}/op")
        inner.attribute.extend(node.attribute)
        nodes = [inner]
        for index, operand in enumerate(reversed(operands)):
            is_nan = self.fresh(f"{operand}/isnan")
            last = index == len(operands) - 1
            out = node.output[0] if last else self.fresh(node.output[0])
            nodes.append(helper.make_node("IsNaN", [operand], [is_nan], name=self.fresh(node.name)))
            nodes.append(helper.make_node("Where", [is_nan, operand, result], [out], name=self.fresh(node.name)))
            result = out
        return nodes

    def _nan_max_min(self, node: Any) -> list[Any] | None:
        if len(node.input) != 2:
            return None
        return self._clamp_to_constant(node) or self._propagate_nan(node, list(node.input))

    def _clamp_to_constant(self, node: Any) -> list[Any] | None:
        """``Max(x, c)`` with a NaN-free constant ``c`` -> ``Where(Less(x, c), c, x)`` (``Min``: ``Greater``).

        NaN compares false, so ``x`` (NaN) is kept; one compare and select, which vectorizes and fuses
        into the producer's kernel (``IsNaN`` + ``Where`` became a separate, slow pass: ``np.maximum(h,
        0)`` of a 256x512 layer cost ~200 us).
        """
        from onnx import helper

        nan_free = [not self._may_be_nan(name) for name in node.input]
        if self.types.get(node.output[0]) not in _FLOAT_TYPES or nan_free.count(True) != 1:
            return None
        constant, x = (node.input[0], node.input[1]) if nan_free[0] else (node.input[1], node.input[0])
        past = self.fresh(f"{node.output[0]}/past")
        compare = "Less" if node.op_type == "Max" else "Greater"
        return [helper.make_node(compare, [x, constant], [past], name=self.fresh(node.name)),
                helper.make_node("Where", [past, constant, x], list(node.output), name=self.fresh(node.name))]

    def _nan_unary(self, node: Any) -> list[Any] | None:
        return self._propagate_nan(node, [node.input[0]])

    def _bool_equal(self, node: Any) -> list[Any] | None:
        from onnx import helper

        if any(self.types.get(name) != _BOOL for name in node.input):
            return None
        differ = self.fresh(node.output[0])
        return [helper.make_node("Xor", list(node.input), [differ], name=f"{node.name}/xor"),
                helper.make_node("Not", [differ], list(node.output), name=f"{node.name}/not")]

    def _int_pow(self, node: Any) -> list[Any] | None:
        from onnx import helper

        out_type = self.types.get(node.output[0])
        if out_type not in _INT_TYPES or any(self.types.get(name) not in _INT_TYPES for name in node.input):
            return None
        casts, doubles = [], []
        for name in node.input:
            double = self.fresh(f"{name}/f64")
            casts.append(helper.make_node("Cast", [name], [double], name=self.fresh(node.name), to=_DOUBLE))
            doubles.append(double)
        power = self.fresh(node.output[0])
        return [*casts, helper.make_node("Pow", doubles, [power], name=f"{node.name}/f64"),
                helper.make_node("Cast", [power], list(node.output), name=f"{node.name}/cast", to=out_type)]

    def _conv_transpose_as_conv(self, node: Any) -> list[Any] | None:
        from onnx import helper

        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kernel = list(attrs.get("kernel_shape", []))
        rank = len(kernel)
        pads = list(attrs.get("pads", [0] * 2 * rank))
        simple = (rank > 0 and attrs.get("group", 1) == 1 and "auto_pad" not in attrs and "output_shape" not in attrs
                  and all(v == 1 for v in attrs.get("strides", [1] * rank))
                  and all(v == 1 for v in attrs.get("dilations", [1] * rank))
                  and not any(attrs.get("output_padding", [])) and len(pads) == 2 * rank
                  and all(0 <= p <= k - 1 for p, k in zip(pads, kernel * 2)))
        if not simple or self.ranks.get(node.input[1]) != rank + 2:
            return None
        swapped, flipped = self.fresh(f"{node.input[1]}/swapped"), self.fresh(f"{node.input[1]}/flipped")
        axes = list(range(2, rank + 2))
        constants = {name: self._int64s(name, values) for name, values in
                     (("starts", [-1] * rank), ("ends", [-(2 ** 63)] * rank), ("axes", axes), ("steps", [-1] * rank))}
        conv_pads = [k - 1 - p for p, k in zip(pads, kernel * 2)]
        return [
            helper.make_node("Transpose", [node.input[1]], [swapped], name=self.fresh(node.name),
                             perm=[1, 0, *axes]),
            helper.make_node("Slice", [swapped, *constants.values()], [flipped], name=self.fresh(node.name)),
            helper.make_node("Conv", [node.input[0], flipped, *node.input[2:]], list(node.output),
                             name=f"{node.name}/as_conv", kernel_shape=kernel, pads=conv_pads),
        ]

    def _int64s(self, hint: str, values: list[int]) -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name
