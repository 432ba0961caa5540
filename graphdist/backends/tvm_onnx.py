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
  float-only; exact for every int32 result); of an integer base and a float
  exponent too (truncated, as ONNX Runtime); a float base's exponent of another
  type is cast to the base's type (TVM's frontend requires one type).
* ``ConvTranspose`` with unit strides and dilations, one group, explicit pads
  of at most ``kernel - 1`` and no output padding (a convolution's input
  gradient) -> ``Conv`` of the spatially flipped, in/out-swapped kernel with
  pads ``kernel - 1 - pad``: the same sums, but TVM's ``conv2d`` is scheduled
  where its ``conv2d_transpose`` is a serial loop nest.
* ``ConvTranspose`` with ``output_shape`` -> explicit ``pads`` (and
  ``output_padding`` where the output grows at the end), computed as the ONNX
  specification (and ``onnx.reference``) does: TVM's frontend ignores
  ``output_shape``.
* ``IsInf`` with ``detect_negative=0`` or ``detect_positive=0`` ->
  ``IsInf(x) and x > 0`` (``x < 0``): TVM's frontend ignores both attributes.
* ``LayerNormalization`` whose ``Mean`` or ``InvStdDev`` output is used -> its
  ONNX function body (``ReduceMean``, ``Sub``, ``Sqrt``...): TVM's frontend
  returns scalar placeholders for both.
* ``BatchNormalization`` in training mode -> ``momentum`` replaced by
  ``1 - momentum``: TVM's ``batch_norm`` weights the running statistics the
  other way round (PyTorch's convention).
* ``Dropout`` in inference mode (no ``training_mode``, a constant false one,
  or a constant ratio of 0) -> ``Identity`` and a constant all-true mask: TVM
  returns the mask as float32. Training-mode dropout is left to the fallback
  (:mod:`graphdist.backends.tvm_fallback`).
* ``Softplus`` and ``Mish`` of float32/float16 -> computed in float64 and cast
  back: TVM's ``log(1 + exp(-|x|))`` loses the low bits of ``exp`` in float32
  (relative error ~2e-3 at ``x = -10``; ONNX Runtime computes ``log1p``).
  ``Mish`` becomes ``x * tanh(softplus(x))`` with the stable softplus.
* ``Sinh`` and ``Cosh`` -> ``(exp(x) -/+ exp(-x)) / 2`` in float64: LLVM has
  no ``sinh``/``cosh`` intrinsic, so TVM cannot build them for the CPU.
* float16 ops that accumulate (``MatMul``, ``Gemm``, ``Conv``, ``Softmax``,
  the sum-like reductions, ... :data:`_ACCUMULATING`) -> computed in float32
  between casts: TVM accumulates in float16 (a float16 ``MatMul`` over 64
  products was off by 36% where ONNX Runtime, which accumulates in float32, is
  within float16 rounding). On CUDA this gives up float16 tensor-core speed
  for ONNX Runtime's values.

Types and shapes come from ONNX shape inference; a node whose input types are
unknown is left as it is (and, where TVM would get it wrong, routed to ONNX
Runtime by :func:`graphdist.backends.tvm_fallback.unsupported_nodes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.backends.base import prepare_model

__all__ = ["prepare_for_tvm"]

_FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_INT_TYPES = {2, 3, 4, 5, 6, 7, 12, 13}
_FLOAT = 1
_BOOL = 9
_FLOAT16 = 10
_DOUBLE = 11
#: Ops whose float16 form TVM accumulates in float16: computed in float32 instead.
_ACCUMULATING = frozenset({
    "MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "Softmax", "LogSoftmax", "ReduceSum", "ReduceMean",
    "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "AveragePool",
    "GlobalAveragePool", "CumSum", "LpNormalization", "InstanceNormalization", "LayerNormalization",
})
#: Shape of a value: one entry per dimension (``None``: symbolic), or ``None`` when the rank is unknown.
Shape = tuple[int | None, ...] | None


def prepare_for_tvm(model: Any) -> Any:
    """Returns a copy of ``model`` rewritten for TVM's ONNX frontend (see the module docstring)."""
    import onnx

    prepared = onnx.ModelProto()
    prepared.CopyFrom(prepare_model(model))
    graph = prepared.graph
    types, shapes = value_types(prepared)
    rewriter = _Rewriter(graph, types, shapes, default_opset(prepared))
    nodes = []
    for node in graph.node:
        nodes.extend(rewriter.rewrite(node))
    del graph.node[:]
    graph.node.extend(nodes)
    return prepared


def default_opset(model: Any) -> int:
    """The model's opset of the default (``ai.onnx``) domain."""
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def value_types(model: Any) -> tuple[dict[str, int], dict[str, Shape]]:
    """Element type and shape of every value ONNX shape inference can type.

    Returns:
        ``(types, shapes)``: ONNX element type by value name, and its shape (see :data:`Shape`).
    """
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - untyped values are simply not rewritten
        inferred = model
    graph = inferred.graph
    types = {init.name: init.data_type for init in graph.initializer}
    shapes: dict[str, Shape] = {init.name: tuple(int(d) for d in init.dims) for init in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.elem_type:
            types[value.name] = tensor.elem_type
            if tensor.HasField("shape"):
                shapes[value.name] = tuple(int(d.dim_value) if d.HasField("dim_value") else None
                                           for d in tensor.shape.dim)
    return types, shapes


class _Rewriter:
    """Rewrites one node at a time into the node list TVM gets."""

    def __init__(self, graph: Any, types: dict[str, int], shapes: dict[str, Shape], opset: int) -> None:
        self.graph = graph
        self.types = types
        self.shapes = shapes
        self.ranks = {name: len(shape) for name, shape in shapes.items() if shape is not None}
        self.opset = opset
        self.producers = {out: node for node in graph.node for out in node.output}
        self.constants = {init.name: init for init in graph.initializer}
        self.counter = 0

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}/tvm_{self.counter}"

    def rewrite(self, node: Any) -> list[Any]:
        if node.domain not in ("", "ai.onnx"):
            return [node]
        if node.op_type in _ACCUMULATING and self.types.get(node.output[0]) == _FLOAT16:
            return self._widen_float16(node)
        handler = {"MatMul": self._matmul, "Max": self._nan_max_min, "Min": self._nan_max_min,
                   "Clip": self._nan_unary, "Sign": self._nan_unary, "Equal": self._bool_equal,
                   "Pow": self._int_pow, "ConvTranspose": self._conv_transpose,
                   "IsInf": self._is_inf, "LayerNormalization": self._layer_norm_with_stats,
                   "BatchNormalization": self._batch_norm_momentum, "Dropout": self._inference_dropout,
                   "Softplus": self._in_float64, "Mish": self._in_float64, "Sinh": self._in_float64,
                   "Cosh": self._in_float64}.get(node.op_type)
        rewritten = handler(node) if handler is not None else None
        return rewritten if rewritten is not None else [node]

    def _widen_float16(self, node: Any) -> list[Any]:
        """A float16 node computed in float32: its float16 inputs cast up, its float16 outputs cast back."""
        from onnx import helper

        before, after, inputs, outputs = [], [], [], []
        for names, wide_names, up in ((node.input, inputs, True), (node.output, outputs, False)):
            for name in names:
                if not name or self.types.get(name) != _FLOAT16:
                    wide_names.append(name)
                    continue
                wide = self.fresh(f"{name}/f32")
                self.types[wide], self.shapes[wide] = _FLOAT, self.shapes.get(name)
                if self.shapes.get(name) is not None:
                    self.ranks[wide] = len(self.shapes[name])  # type: ignore[arg-type]
                wide_names.append(wide)
                if up:
                    before.append(helper.make_node("Cast", [name], [wide], name=self.fresh(node.name), to=_FLOAT))
                else:
                    after.append(helper.make_node("Cast", [wide], [name], name=self.fresh(node.name), to=_FLOAT16))
        inner = helper.make_node(node.op_type, inputs, outputs, name=f"{node.name}/f32")
        inner.attribute.extend(node.attribute)
        return [*before, *self.rewrite(inner), *after]

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
        base_type, exponent_type = (self.types.get(name) for name in node.input)
        numeric = _INT_TYPES | _FLOAT_TYPES
        if out_type in _FLOAT_TYPES and exponent_type in numeric and exponent_type != base_type:
            # A float base with an exponent of another type: TVM's power needs one type (ONNX casts).
            exponent = self.fresh(f"{node.input[1]}/as_base")
            return [helper.make_node("Cast", [node.input[1]], [exponent], name=self.fresh(node.name), to=out_type),
                    helper.make_node("Pow", [node.input[0], exponent], list(node.output), name=f"{node.name}/typed")]
        if out_type not in _INT_TYPES or base_type not in _INT_TYPES or exponent_type not in numeric:
            return None
        casts, doubles = [], []
        for name in node.input:
            double = self.fresh(f"{name}/f64")
            casts.append(helper.make_node("Cast", [name], [double], name=self.fresh(node.name), to=_DOUBLE))
            doubles.append(double)
        power = self.fresh(node.output[0])
        return [*casts, helper.make_node("Pow", doubles, [power], name=f"{node.name}/f64"),
                helper.make_node("Cast", [power], list(node.output), name=f"{node.name}/cast", to=out_type)]

    def _conv_transpose(self, node: Any) -> list[Any] | None:
        explicit = self._conv_transpose_output_shape(node) if any(
            a.name == "output_shape" for a in node.attribute) else node
        if explicit is None:
            return None  # left as it is: the fallback's denylist routes it to ONNX Runtime
        return self._conv_transpose_as_conv(explicit) or [explicit]

    def _conv_transpose_output_shape(self, node: Any) -> Any | None:
        """The node with ``output_shape`` replaced by ``pads`` and ``output_padding`` (``None``: not static).

        As the specification and ``onnx.reference``: ``total = stride * (in - 1) + output_padding +
        (kernel - 1) * dilation + 1 - output_shape``; ``SAME_UPPER`` pads ``total // 2`` at the start,
        otherwise ``total - total // 2`` (floor division); a negative end pad grows the output at the end,
        which is TVM's ``output_padding`` (it must stay below the stride).
        """
        from onnx import helper

        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        shape = self.shapes.get(node.input[0])
        if shape is None or any(d is None for d in shape[2:]):
            return None
        spatial = [int(d) for d in shape[2:]]  # type: ignore[arg-type]
        rank = len(spatial)
        kernel = list(attrs.get("kernel_shape", []))
        weight = self.shapes.get(node.input[1])
        if not kernel and weight is not None and all(d is not None for d in weight[2:]):
            kernel = [int(d) for d in weight[2:]]  # type: ignore[arg-type]
        output_shape = list(attrs["output_shape"])[-rank:]
        strides = list(attrs.get("strides", [1] * rank))
        dilations = list(attrs.get("dilations", [1] * rank))
        output_padding = list(attrs.get("output_padding", [0] * rank))
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if len(kernel) != rank or len(output_shape) != rank:
            return None
        begins, ends, paddings = [], [], []
        for i in range(rank):
            total = (strides[i] * (spatial[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1
                     - output_shape[i])
            begin, end = (total // 2, total - total // 2) if auto_pad == "SAME_UPPER" else (total - total // 2,
                                                                                             total // 2)
            padding = output_padding[i] + max(0, -end)
            if begin < 0 or padding >= max(strides[i], dilations[i]):
                return None
            begins.append(begin)
            ends.append(max(end, 0))
            paddings.append(padding)
        keep = [a for a in node.attribute if a.name not in ("output_shape", "auto_pad", "pads", "output_padding")]
        explicit = helper.make_node("ConvTranspose", list(node.input), list(node.output), name=f"{node.name}/pads",
                                    pads=begins + ends, output_padding=paddings)
        explicit.attribute.extend(keep)
        return explicit

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
        return self._constant(hint, np.asarray(values, np.int64))

    def _constant(self, hint: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def _scalar(self, hint: str, value: float, onnx_type: int) -> str:
        from onnx.helper import tensor_dtype_to_np_dtype

        return self._constant(hint, np.asarray(value, tensor_dtype_to_np_dtype(onnx_type)))

    def _is_inf(self, node: Any) -> list[Any] | None:
        """``IsInf`` with ``detect_negative=0`` / ``detect_positive=0`` -> ``IsInf(x) and x > 0`` (``x < 0``)."""
        from onnx import helper

        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        negative, positive = attrs.get("detect_negative", 1), attrs.get("detect_positive", 1)
        x, x_type = node.input[0], self.types.get(node.input[0])
        if negative and positive:
            return None
        if x_type not in _FLOAT_TYPES:
            return None  # untyped: left to the fallback's denylist
        if not (negative or positive):  # nothing detected: x < x is false everywhere, NaN included
            return [helper.make_node("Less", [x, x], list(node.output), name=f"{node.name}/none")]
        infinite, signed = self.fresh(f"{node.output[0]}/isinf"), self.fresh(f"{node.output[0]}/sign")
        zero = self._scalar(f"{node.name}/zero", 0.0, x_type)
        return [helper.make_node("IsInf", [x], [infinite], name=f"{node.name}/any"),
                helper.make_node("Greater" if positive else "Less", [x, zero], [signed], name=self.fresh(node.name)),
                helper.make_node("And", [infinite, signed], list(node.output), name=f"{node.name}/and")]

    def _layer_norm_with_stats(self, node: Any) -> list[Any] | None:
        """``LayerNormalization`` whose ``Mean``/``InvStdDev`` is used -> its ONNX function body."""
        from onnx import helper

        outputs = list(node.output) + [""] * (3 - len(node.output))
        rank = self.ranks.get(node.input[0])
        x_type = self.types.get(node.input[0])
        if not any(outputs[1:]) or rank is None or x_type not in _FLOAT_TYPES:
            return None
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis = attrs.get("axis", -1)
        axis = axis + rank if axis < 0 else axis
        stash = attrs.get("stash_type", _FLOAT)
        axes = list(range(axis, rank))
        names = {key: self.fresh(f"{outputs[0]}/{key}") for key in
                 ("x", "mean", "d", "dd", "var", "var_eps", "std", "inv", "norm", "norm_t", "scaled")}
        mean = outputs[1] or names["mean"]
        inv = outputs[2] or names["inv"]
        nodes = [self._cast(node.input[0], names["x"], x_type, stash, node.name)]
        nodes.append(self._reduce_mean(names["x"], mean, axes, node.name))
        nodes.append(helper.make_node("Sub", [names["x"], mean], [names["d"]], name=self.fresh(node.name)))
        nodes.append(helper.make_node("Mul", [names["d"], names["d"]], [names["dd"]], name=self.fresh(node.name)))
        nodes.append(self._reduce_mean(names["dd"], names["var"], axes, node.name))
        epsilon = self._scalar(f"{node.name}/epsilon", attrs.get("epsilon", 1e-5), stash)
        nodes.append(helper.make_node("Add", [names["var"], epsilon], [names["var_eps"]], name=self.fresh(node.name)))
        nodes.append(helper.make_node("Sqrt", [names["var_eps"]], [names["std"]], name=self.fresh(node.name)))
        nodes.append(helper.make_node("Reciprocal", [names["std"]], [inv], name=self.fresh(node.name)))
        nodes.append(helper.make_node("Mul", [names["d"], inv], [names["norm"]], name=self.fresh(node.name)))
        nodes.append(self._cast(names["norm"], names["norm_t"], stash, x_type, node.name))
        has_bias = len(node.input) > 2 and bool(node.input[2])
        scaled = names["scaled"] if has_bias else outputs[0]
        nodes.append(helper.make_node("Mul", [names["norm_t"], node.input[1]], [scaled], name=self.fresh(node.name)))
        if has_bias:
            nodes.append(helper.make_node("Add", [scaled, node.input[2]], [outputs[0]], name=self.fresh(node.name)))
        return nodes

    def _cast(self, source: str, target: str, from_type: int, to_type: int, hint: str) -> Any:
        from onnx import helper

        if from_type == to_type:
            return helper.make_node("Identity", [source], [target], name=self.fresh(hint))
        return helper.make_node("Cast", [source], [target], name=self.fresh(hint), to=to_type)

    def _reduce_mean(self, source: str, target: str, axes: list[int], hint: str) -> Any:
        from onnx import helper

        if self.opset >= 18:
            return helper.make_node("ReduceMean", [source, self._int64s(f"{hint}/axes", axes)], [target],
                                    name=self.fresh(hint), keepdims=1)
        return helper.make_node("ReduceMean", [source], [target], name=self.fresh(hint), axes=axes, keepdims=1)

    def _batch_norm_momentum(self, node: Any) -> list[Any] | None:
        """Training-mode ``BatchNormalization``: ``momentum`` -> ``1 - momentum`` (TVM's convention)."""
        from onnx import helper

        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if not attrs.get("training_mode", 0):
            return None
        keep = [a for a in node.attribute if a.name != "momentum"]
        swapped = helper.make_node("BatchNormalization", list(node.input), list(node.output),
                                   name=f"{node.name}/tvm_momentum", momentum=1.0 - attrs.get("momentum", 0.9))
        swapped.attribute.extend(keep)
        return [swapped]

    def _inference_dropout(self, node: Any) -> list[Any] | None:
        """``Dropout`` that cannot drop anything -> ``Identity`` (and a constant all-true mask)."""
        from onnx import helper

        if not dropout_is_identity(node, self.opset, self.constants):
            return None
        nodes = [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=f"{node.name}/identity")]
        if len(node.output) > 1 and node.output[1]:
            shape = self.shapes.get(node.output[1]) or self.shapes.get(node.input[0])
            mask_type = self.types.get(node.output[1], _BOOL)
            if shape is None or any(d is None for d in shape):
                return None
            from onnx.helper import tensor_dtype_to_np_dtype

            ones = np.ones([int(d) for d in shape], tensor_dtype_to_np_dtype(mask_type))  # type: ignore[arg-type]
            nodes.append(helper.make_node("Identity", [self._constant(f"{node.name}/mask", ones)], [node.output[1]],
                                          name=f"{node.name}/mask"))
        return nodes

    def _in_float64(self, node: Any) -> list[Any] | None:
        """``Softplus``/``Mish``/``Sinh``/``Cosh``: computed in float64 (float32/float16 cast there and back)."""
        from onnx import helper

        x_type = self.types.get(node.input[0])
        if x_type not in (_FLOAT, _FLOAT16, _DOUBLE):
            return None
        if node.op_type == "Softplus" and x_type == _DOUBLE:
            return None  # TVM's log(1 + exp(-|x|)) + max(x, 0) is accurate enough in float64
        x = node.input[0]
        nodes = []
        if x_type != _DOUBLE:
            x = self.fresh(f"{node.input[0]}/f64")
            nodes.append(helper.make_node("Cast", [node.input[0]], [x], name=self.fresh(node.name), to=_DOUBLE))
        result = node.output[0] if x_type == _DOUBLE else self.fresh(f"{node.output[0]}/f64")
        op = node.op_type
        if op == "Softplus":
            nodes.append(helper.make_node("Softplus", [x], [result], name=f"{node.name}/f64"))
        elif op == "Mish":  # x * tanh(softplus(x)), with TVM's stable softplus
            soft, tanh = self.fresh(f"{node.output[0]}/softplus"), self.fresh(f"{node.output[0]}/tanh")
            nodes += [helper.make_node("Softplus", [x], [soft], name=self.fresh(node.name)),
                      helper.make_node("Tanh", [soft], [tanh], name=self.fresh(node.name)),
                      helper.make_node("Mul", [x, tanh], [result], name=self.fresh(node.name))]
        else:  # (exp(x) -/+ exp(-x)) / 2
            neg, up, down, total = (self.fresh(f"{node.output[0]}/{key}") for key in ("neg", "exp", "exp_neg", "sum"))
            half = self._scalar(f"{node.name}/half", 0.5, _DOUBLE)
            nodes += [helper.make_node("Neg", [x], [neg], name=self.fresh(node.name)),
                      helper.make_node("Exp", [x], [up], name=self.fresh(node.name)),
                      helper.make_node("Exp", [neg], [down], name=self.fresh(node.name)),
                      helper.make_node("Sub" if op == "Sinh" else "Add", [up, down], [total],
                                       name=self.fresh(node.name)),
                      helper.make_node("Mul", [total, half], [result], name=self.fresh(node.name))]
        if x_type != _DOUBLE:
            nodes.append(helper.make_node("Cast", [result], [node.output[0]], name=f"{node.name}/cast", to=x_type))
        return nodes


def dropout_is_identity(node: Any, opset: int, constants: dict[str, Any]) -> bool:
    """Whether a ``Dropout`` node cannot drop anything: inference mode, or a ratio of 0, known statically.

    Opsets 7-11 have no training mode (always the identity); opsets 1-6 train unless ``is_test=1``;
    from opset 12 the mode and ratio are inputs (absent mode: inference).
    """
    from onnx import helper, numpy_helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if opset < 7:
        return bool(attrs.get("is_test", 0)) or attrs.get("ratio", 0.5) == 0
    if opset < 12:
        return True

    def constant(index: int) -> np.ndarray | None:
        if len(node.input) <= index or not node.input[index]:
            return None
        tensor = constants.get(node.input[index])
        return None if tensor is None else numpy_helper.to_array(tensor)

    has_mode = len(node.input) > 2 and bool(node.input[2])
    mode, ratio = constant(2), constant(1)
    if not has_mode:
        return True
    if mode is not None and not bool(mode):
        return True
    return ratio is not None and float(ratio) == 0.0
