"""OpDefs of the ONNX neural-network ops that imported models use.

graphdist's tracer never emits these ops; models exported by other frameworks
(PyTorch, Keras, ONNX model zoo) do. Each OpDef has a shape/dtype rule that
follows ONNX's own shape inference (same output types, and a
:class:`~graphdist.errors.GraphError` naming the op, the argument and the fix
where ONNX rejects the node) and an honest :attr:`OpDef.since`: the oldest
default-domain opset whose form of the op (inputs, attributes, semantics) the
rule models. Their gradient rules live in :mod:`graphdist.ir.gradients_nn`.

Ops: Gemm, BatchNormalization, LRN, Sum, Mean, Flatten, Dropout,
GlobalAveragePool, GlobalMaxPool, LayerNormalization, Gelu, HardSigmoid,
LeakyRelu, Elu, Selu (:data:`NN_OPS`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.graph import ONNX_DOMAIN, Dim, Node, Shape, Value
from graphdist.ir.ops import (
    InferFn,
    OpDef,
    TypeList,
    _elementwise,
    _in,
    _same_dtype,
    broadcast_shapes,
    normalize_axis,
    numpy_dtype,
    register_op,
)

__all__ = ["NN_OPS"]

#: The ops this module registers, in registration order.
NN_OPS: tuple[str, ...] = (
    "Gemm", "BatchNormalization", "LRN", "Sum", "Mean", "Flatten", "Dropout", "GlobalAveragePool",
    "GlobalMaxPool", "LayerNormalization", "Gelu", "HardSigmoid", "LeakyRelu", "Elu", "Selu",
)


# ----------------------------------------------------------------- helpers
def _where(node: Node) -> str:
    return f"{node.op_type} ({node.name})"


def _float_in(node: Node, index: int, what: str) -> Value:
    """Input ``index`` of ``node``, which must be a floating point tensor."""
    value = _in(node, index)
    if value.dtype.kind != "f":
        raise GraphError(f"{_where(node)}: {what} must be a floating point tensor, got {value.type_str()}; "
                         "insert a Cast to float32 or float64")
    return value


def _optional(node: Node, index: int) -> Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _output_count(node: Node, num_outputs: int | None, allowed: Sequence[int], default: int, why: str) -> int:
    """The number of outputs ``node`` gets: ``num_outputs`` (checked against ``allowed``) or ``default``."""
    count = default if num_outputs is None else num_outputs
    if count not in allowed:
        raise GraphError(f"{_where(node)} has {' or '.join(map(str, allowed))} output(s) here ({why}), "
                         f"got {count}; drop or add the optional outputs")
    return count


def _product(dims: Sequence[Dim]) -> Dim:
    """Product of static or symbolic dimensions (a symbolic product is spelled ``a*b``)."""
    static = int(np.prod([d for d in dims if isinstance(d, int)], dtype=np.int64))
    symbolic = [d for d in dims if isinstance(d, str)]
    if not symbolic:
        return static
    return "*".join(symbolic + ([str(static)] if static != 1 else []))


def _needs_channels(node: Node, x: Value, what: str = "X") -> None:
    if x.rank < 2:
        raise GraphError(f"{_where(node)}: {what} {x.type_str()} needs layout (N, C, ...) of rank >= 2; "
                         "add the batch axis with Unsqueeze")


def _per_channel(node: Node, x: Value, index: int, what: str) -> Value:
    """Input ``index``: a float vector with one entry per channel of ``x`` (N, C, ...)."""
    value = _float_in(node, index, what)
    channels = x.shape[1]
    if value.rank != 1 or (isinstance(value.shape[0], int) and isinstance(channels, int)
                           and value.shape[0] != channels):
        raise GraphError(f"{_where(node)}: {what} {value.type_str()} must have shape ({channels},), one value per "
                         f"channel of X {x.type_str()}")
    return value


def _fits(shape: Shape, target: Shape) -> bool:
    """True when ``shape`` broadcasts to ``target`` without changing it (unidirectional broadcasting)."""
    if len(shape) > len(target):
        return False
    try:
        return broadcast_shapes(shape, target) == tuple(target)
    except GraphError:
        return False


def _float_attr(node: Node, name: str, default: float) -> float:
    return float(node.attrs.get(name, default))


# ------------------------------------------------------------- shape rules
def _infer_gemm(node: Node, _: int | None) -> TypeList:
    a, b, c = _in(node, 0), _in(node, 1), _optional(node, 2)
    dtype = _same_dtype(node, [a, b] + ([c] if c is not None else []))
    if dtype.kind not in "fiu":
        raise GraphError(f"{_where(node)} needs numeric inputs, got A {a.type_str()}; insert a Cast")
    if a.rank != 2 or b.rank != 2:
        raise GraphError(f"{_where(node)}: A {a.type_str()} and B {b.type_str()} must be matrices (rank 2); "
                         "use MatMul for vectors and batched products")
    m, k = a.shape[::-1] if node.attrs.get("transA", 0) else a.shape
    k_b, n = b.shape[::-1] if node.attrs.get("transB", 0) else b.shape
    if isinstance(k, int) and isinstance(k_b, int) and k != k_b:
        raise GraphError(f"{_where(node)}: inner dimensions differ: A {a.type_str()} (transA="
                         f"{node.attrs.get('transA', 0)}) gives K={k}, B {b.type_str()} (transB="
                         f"{node.attrs.get('transB', 0)}) gives K={k_b}; check transA/transB")
    if c is not None and not _fits(c.shape, (m, n)):
        raise GraphError(f"{_where(node)}: C {c.type_str()} must broadcast to the output shape ({m}, {n}) "
                         "(unidirectional broadcasting); reshape C to (N,), (1, N), (M, 1) or (M, N)")
    return [(dtype, (m, n))]


def _infer_batch_norm(node: Node, num_outputs: int | None) -> TypeList:
    x = _float_in(node, 0, "X")
    _needs_channels(node, x)
    scale, bias = _per_channel(node, x, 1, "scale"), _per_channel(node, x, 2, "B")
    mean, var = _per_channel(node, x, 3, "input_mean"), _per_channel(node, x, 4, "input_var")
    _same_dtype(node, [scale, bias])
    _same_dtype(node, [mean, var])
    training = bool(node.attrs.get("training_mode", 0))
    count = 3 if training else 1
    _output_count(node, num_outputs, [count], count,
                  "Y, running_mean, running_var in training mode" if training else "Y only when training_mode=0")
    return [(x.dtype, x.shape)] + [(mean.dtype, mean.shape)] * (count - 1)


def _infer_lrn(node: Node, _: int | None) -> TypeList:
    x = _float_in(node, 0, "X")
    if x.rank != 4:
        # ONNX's schema allows (N, C, D1, ..., Dk); ONNX Runtime and onnx.reference run 4-D only.
        raise GraphError(f"{_where(node)}: X {x.type_str()} must be 4-D (N, C, H, W), the only rank ONNX Runtime "
                         "and onnx.reference run; reshape it to 4-D around the LRN")
    size = node.attrs.get("size")
    if size is None or int(size) < 1:
        raise GraphError(f"{_where(node)} needs the size attribute (the number of channels summed over, >= 1), "
                         f"got {size}")
    return [(x.dtype, x.shape)]


def _infer_variadic_mean_sum(node: Node, num_outputs: int | None) -> TypeList:
    if not node.inputs:
        raise GraphError(f"{_where(node)} needs at least one input")
    for index in range(len(node.inputs)):
        _float_in(node, index, f"input {index}")
    return _elementwise()(node, num_outputs)


def _infer_flatten(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    axis = int(node.attrs.get("axis", 1))
    if not -x.rank <= axis <= x.rank:
        raise GraphError(f"{_where(node)}: axis {axis} is out of range for {x.type_str()}; valid axes are "
                         f"{-x.rank}..{x.rank}")
    if axis < 0:
        axis += x.rank
    return [(x.dtype, (_product(x.shape[:axis]), _product(x.shape[axis:])))]


def _infer_dropout(node: Node, num_outputs: int | None) -> TypeList:
    x = _float_in(node, 0, "data")
    ratio, training = _optional(node, 1), _optional(node, 2)
    if ratio is not None:
        if ratio.dtype.kind != "f" or ratio.rank != 0:
            raise GraphError(f"{_where(node)}: ratio {ratio.type_str()} must be a float scalar")
        if ratio.const_value is not None and not 0 <= float(ratio.const_value) < 1:
            raise GraphError(f"{_where(node)}: ratio {float(ratio.const_value)} must be in [0, 1)")
    if training is not None and (training.dtype != np.bool_ or training.rank != 0):
        raise GraphError(f"{_where(node)}: training_mode {training.type_str()} must be a bool scalar")
    count = _output_count(node, num_outputs, [1, 2], 1, "output and the optional mask")
    return [(x.dtype, x.shape), (np.dtype(np.bool_), x.shape)][:count]


def _infer_global_pool(node: Node, _: int | None) -> TypeList:
    x = _float_in(node, 0, "X")
    _needs_channels(node, x)
    return [(x.dtype, (*x.shape[:2], *[1] * (x.rank - 2)))]


def _infer_layer_norm(node: Node, num_outputs: int | None) -> TypeList:
    x = _float_in(node, 0, "X")
    scale, bias = _float_in(node, 1, "Scale"), _optional(node, 2)
    _same_dtype(node, [x, scale] + ([bias] if bias is not None else []))
    axis = normalize_axis(int(node.attrs.get("axis", -1)), x.rank, "LayerNormalization axis")
    normalized = x.shape[axis:]
    for what, value in (("Scale", scale), ("B", bias)):
        if value is not None and not _fits(value.shape, normalized):
            raise GraphError(f"{_where(node)}: {what} {value.type_str()} must broadcast to the normalized shape "
                             f"{tuple(normalized)} (axes {axis}.. of X {x.type_str()}); reshape it to that shape")
    stash = numpy_dtype(int(node.attrs.get("stash_type", 1)))
    if stash.kind != "f":
        raise GraphError(f"{_where(node)}: stash_type {node.attrs.get('stash_type')} must be a float type "
                         "(1 = float32, 11 = float64)")
    count = _output_count(node, num_outputs, [1, 2, 3], 1, "Y and the optional Mean, InvStdDev")
    stats = (*x.shape[:axis], *[1] * (x.rank - axis))
    return [(x.dtype, x.shape), (stash, stats), (stash, stats)][:count]


def _float_unary(node: Node, _: int | None) -> TypeList:
    x = _float_in(node, 0, "X")
    return [(x.dtype, x.shape)]


def _infer_gelu(node: Node, num_outputs: int | None) -> TypeList:
    approximate = node.attrs.get("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        raise GraphError(f"{_where(node)}: approximate={approximate!r} is not supported; use 'none' or 'tanh'")
    return _float_unary(node, num_outputs)


# ---------------------------------------------------------------- registry
def _register(op_type: str, infer: InferFn, since: int, doc: str, **attrs: object) -> None:
    register_op(OpDef(op_type, ONNX_DOMAIN, infer, doc=doc, attrs=dict(attrs), since=since))


def register_nn_ops() -> None:
    """Registers every op of :data:`NN_OPS`.

    ``since`` per op: the first opset of the form modelled, where later versions only add types.
    """
    _register("Gemm", _infer_gemm, 11, "alpha * A' @ B' + beta * C, C optional and unidirectionally broadcast.",
              alpha=1.0, beta=1.0, transA=0, transB=0)
    _register("BatchNormalization", _infer_batch_norm, 15,
              "Per-channel normalization; training_mode=1 uses the batch statistics and outputs running stats.",
              epsilon=1e-5, momentum=0.9, training_mode=0)
    _register("LRN", _infer_lrn, 1, "Local response normalization across channels.",
              alpha=1e-4, beta=0.75, bias=1.0)
    _register("Sum", _infer_variadic_mean_sum, 8, "Elementwise sum of its inputs (numpy broadcasting).")
    _register("Mean", _infer_variadic_mean_sum, 8, "Elementwise mean of its inputs (numpy broadcasting).")
    _register("Flatten", _infer_flatten, 11, "Reshape to 2-D: (prod(shape[:axis]), prod(shape[axis:])).", axis=1)
    _register("Dropout", _infer_dropout, 12,
              "Random zeroing with scaling 1/(1-ratio) in training mode, identity otherwise; optional mask output.",
              seed=None)
    _register("GlobalAveragePool", _infer_global_pool, 1, "Mean over the spatial axes of (N, C, spatial...).")
    _register("GlobalMaxPool", _infer_global_pool, 1, "Max over the spatial axes of (N, C, spatial...).")
    _register("LayerNormalization", _infer_layer_norm, 17,
              "Normalization over axes axis.. ; optional Mean and InvStdDev outputs in stash_type.",
              axis=-1, epsilon=1e-5, stash_type=1)
    _register("Gelu", _infer_gelu, 20, "Gaussian error linear unit, exact (erf) or tanh approximation.",
              approximate="none")
    _register("HardSigmoid", _float_unary, 6, "max(0, min(1, alpha * x + beta)).", alpha=0.2, beta=0.5)
    _register("LeakyRelu", _float_unary, 6, "x if x >= 0 else alpha * x.", alpha=0.01)
    _register("Elu", _float_unary, 6, "x if x > 0 else alpha * (exp(x) - 1).", alpha=1.0)
    _register("Selu", _float_unary, 6, "gamma * (x if x > 0 else alpha * (exp(x) - 1)).",
              alpha=1.67326319217681884765625, gamma=1.05070102214813232421875)


register_nn_ops()
