"""The OpDef registry: what graphdist knows about each op.

Ops are ONNX ops (opset :data:`OPSET`, ONNX semantics) plus the ``graphdist``
domain (collectives, placement, variables, replica ids). Each op has an
:class:`OpDef` with

* ``infer``: the shape/dtype rule, ``infer(node, num_outputs) -> [(dtype, shape)]``,
  raising :class:`~graphdist.errors.GraphError` on bad inputs;
* ``gradient``: the reverse-mode rule used by autodiff (filled in by the
  autodiff module; ``None`` means "not differentiable yet");
* ``reference``: a numpy implementation, required for ``graphdist`` ops (ONNX
  ops are executed by ``onnx.reference``).

Shape rules that need constant operands (Reshape's shape, reduction axes,
Slice bounds) read them from initializers; the tracer always emits those
operands as initializers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from graphdist.errors import GraphError
from graphdist.ir.batch import elements, with_batch
from graphdist.ir.graph import ONNX_DOMAIN, Dim, Graph, Node, Shape, Value
from graphdist.ir.op_registry import (
    _REGISTRY,  # noqa: F401 - tests reach the registry through this module
    GRAPHDIST_OPSET,
    OPSET,
    OpDef,
    get_opdef,
    has_opdef,
    install_generic_ops,
    register_op,
    registered_ops,
)

__all__ = [
    "OPSET",
    "GRAPHDIST_OPSET",
    "OpDef",
    "register_op",
    "get_opdef",
    "node_opdef",
    "install_generic_ops",
    "has_opdef",
    "registered_ops",
    "broadcast_shapes",
    "onnx_dtype",
    "numpy_dtype",
    "normalize_axis",
]

TypeList = list[tuple[np.dtype, Shape]]
InferFn = Callable[[Node, "int | None"], TypeList]


def node_opdef(node: Node, graph: Graph | None = None) -> OpDef:
    """The OpDef of ``node`` at its graph's opset (hand-written only when it is in no graph).

    ``graph``: the graph a node not yet inserted is built for (its opset is used).
    """
    graph = graph if graph is not None else node.graph
    opset = graph.opset_imports.get(node.domain) if graph is not None else None
    return get_opdef(node.op_type, node.domain, opset)


# ----------------------------------------------------------------- helpers
def onnx_dtype(dtype: Any) -> int:
    """ONNX ``TensorProto`` element type of a numpy dtype."""
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def numpy_dtype(elem_type: int) -> np.dtype:
    """Numpy dtype of an ONNX ``TensorProto`` element type."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """Maps a possibly negative axis into ``[0, rank)``.

    Raises:
        GraphError: ``axis`` is out of range.
    """
    if rank == 0:
        raise GraphError(f"{what} {axis} is out of range for a tensor of rank 0: a scalar has no axes")
    if not -rank <= axis < rank:
        raise GraphError(
            f"{what} {axis} is out of range for a tensor of rank {rank}; valid axes are {-rank}..{rank - 1}"
        )
    return axis % rank


def broadcast_shapes(*shapes: Shape) -> Shape:
    """Numpy broadcasting of static or symbolic shapes.

    Raises:
        GraphError: The shapes are not broadcast-compatible.
    """
    if shapes and all(s == shapes[0] for s in shapes[1:]):
        return tuple(shapes[0])  # the common case (same shapes); broadcasting a shape with itself gives it
    rank = max((len(s) for s in shapes), default=0)
    result: list[Dim] = []
    for position in range(rank):
        dims = [s[len(s) - rank + position] for s in shapes if len(s) - rank + position >= 0]
        chosen: Dim = 1
        for dim in dims:
            if dim == 1:
                continue
            if chosen == 1:
                chosen = dim
            elif dim != chosen:
                if isinstance(dim, str) or isinstance(chosen, str):
                    chosen = chosen if isinstance(chosen, int) else dim
                    continue
                raise GraphError(
                    "shapes " + " and ".join(str(tuple(s)) for s in shapes) + " cannot be broadcast together"
                )
        result.append(chosen)
    return tuple(result)


def _const(node: Node, index: int, what: str) -> np.ndarray | None:
    if index >= len(node.inputs) or node.inputs[index] is None:
        return None
    value = node.inputs[index]
    if value.const_value is None:
        raise GraphError(f"{node.op_type}: the {what} operand must be a constant (initializer), got %{value.name}")
    return np.asarray(value.const_value)


def _in(node: Node, index: int) -> Value:
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        raise GraphError(f"{node.op_type} ({node.name}): input {index} is missing")
    return value


def _same_dtype(node: Node, values: Sequence[Value]) -> np.dtype:
    dtypes = {v.dtype for v in values}
    if len(dtypes) != 1:
        listing = ", ".join(v.type_str() for v in values)
        raise GraphError(f"{node.op_type} ({node.name}) needs inputs of one dtype, got {listing}; insert a Cast")
    return dtypes.pop()


# ------------------------------------------------------------ shape rules
def _elementwise(out_dtype: Any = None) -> InferFn:
    def infer(node: Node, _: int | None) -> TypeList:
        values = [_in(node, i) for i in range(len(node.inputs))]
        dtype = _same_dtype(node, values)
        shape = broadcast_shapes(*(v.shape for v in values))
        return [(np.dtype(out_dtype) if out_dtype is not None else dtype, shape)]

    return infer


def _unary(out_dtype: Any = None) -> InferFn:
    def infer(node: Node, _: int | None) -> TypeList:
        x = _in(node, 0)
        return [(np.dtype(out_dtype) if out_dtype is not None else x.dtype, x.shape)]

    return infer


def _infer_pow(node: Node, _: int | None) -> TypeList:
    base, exponent = _in(node, 0), _in(node, 1)
    return [(base.dtype, broadcast_shapes(base.shape, exponent.shape))]


def _infer_where(node: Node, _: int | None) -> TypeList:
    cond, x, y = _in(node, 0), _in(node, 1), _in(node, 2)
    if cond.dtype != np.bool_:
        raise GraphError(f"Where ({node.name}): condition must be bool, got {cond.type_str()}")
    dtype = _same_dtype(node, [x, y])
    return [(dtype, broadcast_shapes(cond.shape, x.shape, y.shape))]


def _infer_matmul(node: Node, _: int | None) -> TypeList:
    a, b = _in(node, 0), _in(node, 1)
    dtype = _same_dtype(node, [a, b])
    if a.rank == 0 or b.rank == 0:
        raise GraphError(f"MatMul ({node.name}): operands must have rank >= 1, got {a.type_str()} and {b.type_str()}")
    a_shape = (1, *a.shape) if a.rank == 1 else a.shape
    b_shape = (*b.shape, 1) if b.rank == 1 else b.shape
    k_a, k_b = a_shape[-1], b_shape[-2]
    if isinstance(k_a, int) and isinstance(k_b, int) and k_a != k_b:
        raise GraphError(
            f"MatMul ({node.name}): inner dimensions differ: {a.type_str()} @ {b.type_str()} "
            f"({k_a} != {k_b})"
        )
    batch = broadcast_shapes(a_shape[:-2], b_shape[:-2])
    shape = (*batch, a_shape[-2], b_shape[-1])
    if a.rank == 1:
        shape = shape[:-2] + shape[-1:]
    if b.rank == 1:
        shape = shape[:-1]
    return [(dtype, tuple(shape))]


def _reduced_shape(node: Node, x: Value, axes: np.ndarray | None, keepdims: bool, noop_empty: bool) -> Shape:
    if axes is None or axes.size == 0:
        if noop_empty:
            return x.shape
        return tuple(1 for _ in x.shape) if keepdims else ()
    normalized = {normalize_axis(int(a), x.rank, f"{node.op_type} axis") for a in axes.reshape(-1)}
    if keepdims:
        return tuple(1 if i in normalized else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in normalized)


def _infer_reduce(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    axes = _const(node, 1, "axes")
    keepdims = bool(node.attrs.get("keepdims", 1))
    noop = bool(node.attrs.get("noop_with_empty_axes", 0))
    return [(x.dtype, _reduced_shape(node, x, axes, keepdims, noop))]


def _infer_arg_reduce(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    axis = np.array([node.attrs.get("axis", 0)])
    keepdims = bool(node.attrs.get("keepdims", 1))
    return [(np.dtype(np.int64), _reduced_shape(node, x, axis, keepdims, False))]


def _infer_reshape(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    # A target recorded as derived from the per-replica batch keeps the symbol (graphdist.ir.batch).
    requested = with_batch(_const(node, 1, "shape").reshape(-1).tolist(), elements(node.inputs[1].meta.get("batch")))
    target: list[Dim] = list(requested)
    if node.attrs.get("allowzero", 0) == 0:
        for i, d in enumerate(requested):
            if d == 0:
                if i >= x.rank:
                    raise GraphError(f"Reshape ({node.name}): 0 at position {i} copies a dimension that "
                                     f"{x.type_str()} does not have")
                target[i] = x.shape[i]
    if target.count(-1) > 1:
        raise GraphError(f"Reshape ({node.name}): at most one dimension may be -1, got {requested}")
    # Symbolic dimensions must be carried over unchanged (the same names on both sides);
    # the static dimensions then have to multiply out.
    symbolic_in = sorted(d for d in x.shape if isinstance(d, str))
    symbolic_out = sorted(d for d in target if isinstance(d, str))
    static_in = int(np.prod([d for d in x.shape if isinstance(d, int)], dtype=np.int64))
    static_out = int(np.prod([d for d in target if isinstance(d, int) and d != -1], dtype=np.int64))
    if symbolic_in != symbolic_out:
        raise GraphError(f"Reshape ({node.name}): cannot reshape {x.type_str()} into {tuple(requested)}: "
                         "symbolic dimensions must be kept with 0 (copy) at their position")
    if -1 in target:
        if static_out == 0 or static_in % static_out:
            raise GraphError(f"Reshape ({node.name}): cannot reshape {x.type_str()} into {tuple(requested)}")
        target[target.index(-1)] = static_in // static_out
    elif static_in != static_out:
        raise GraphError(f"Reshape ({node.name}): cannot reshape {x.type_str()} into {tuple(requested)}")
    return [(x.dtype, tuple(target))]


def _infer_transpose(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    perm = node.attrs.get("perm", list(range(x.rank))[::-1])
    if sorted(perm) != list(range(x.rank)):
        raise GraphError(f"Transpose ({node.name}): perm {list(perm)} is not a permutation of {x.rank} axes")
    return [(x.dtype, tuple(x.shape[p] for p in perm))]


def _infer_unsqueeze(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    axes = [int(a) for a in _const(node, 1, "axes").reshape(-1)]
    rank = x.rank + len(axes)
    normalized = sorted(normalize_axis(a, rank, "Unsqueeze axis") for a in axes)
    shape = list(x.shape)
    for axis in normalized:
        shape.insert(axis, 1)
    return [(x.dtype, tuple(shape))]


def _infer_squeeze(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    axes = _const(node, 1, "axes")
    if axes is None:
        return [(x.dtype, tuple(d for d in x.shape if d != 1))]
    normalized = {normalize_axis(int(a), x.rank, "Squeeze axis") for a in axes.reshape(-1)}
    for axis in normalized:
        if x.shape[axis] != 1:
            raise GraphError(f"Squeeze ({node.name}): axis {axis} of {x.type_str()} has size {x.shape[axis]}, not 1")
    return [(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in normalized))]


def _infer_concat(node: Node, _: int | None) -> TypeList:
    values = [_in(node, i) for i in range(len(node.inputs))]
    dtype = _same_dtype(node, values)
    rank = values[0].rank
    if any(v.rank != rank for v in values):
        raise GraphError(f"Concat ({node.name}): inputs have different ranks: {[v.type_str() for v in values]}")
    axis = normalize_axis(node.attrs["axis"], rank, "Concat axis")
    shape = list(values[0].shape)
    for v in values[1:]:
        for i, (a, b) in enumerate(zip(shape, v.shape)):
            if i != axis and isinstance(a, int) and isinstance(b, int) and a != b:
                raise GraphError(
                    f"Concat ({node.name}): shapes {[v.shape for v in values]} differ outside axis {axis}"
                )
    sizes = [v.shape[axis] for v in values]
    shape[axis] = sum(sizes) if all(isinstance(s, int) for s in sizes) else "+".join(map(str, sizes))
    return [(dtype, tuple(shape))]


def _infer_split(node: Node, num_outputs: int | None) -> TypeList:
    x = _in(node, 0)
    axis = normalize_axis(node.attrs.get("axis", 0), x.rank, "Split axis")
    split = _const(node, 1, "split")
    size = x.shape[axis]
    if split is not None:
        sizes = [int(s) for s in split.reshape(-1)]
        if isinstance(size, int) and sum(sizes) != size:
            raise GraphError(f"Split ({node.name}): sizes {sizes} do not add up to {size}")
    else:
        count = node.attrs.get("num_outputs", num_outputs)
        if count is None or not isinstance(size, int):
            raise GraphError(f"Split ({node.name}): needs num_outputs or constant split sizes")
        # ONNX (Split-18): ceil(size / count) per output, the last one smaller when it does not divide.
        chunk = -(-size // count)
        sizes = [min(chunk, max(0, size - i * chunk)) for i in range(count)]
        if count > size or sizes[-1] <= 0:
            raise GraphError(f"Split ({node.name}): axis of size {size} cannot be split into {count} non-empty "
                             f"parts of ceil({size}/{count}) = {chunk}; use fewer outputs or explicit split sizes")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append((x.dtype, tuple(shape)))
    return outs


def _infer_slice(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    starts = _const(node, 1, "starts").reshape(-1)
    ends = _const(node, 2, "ends").reshape(-1)
    axes = _const(node, 3, "axes")
    steps = _const(node, 4, "steps")
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes.reshape(-1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps.reshape(-1)]
    shape = list(x.shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = normalize_axis(axis, x.rank, "Slice axis")
        dim = shape[axis]
        if step == 0:
            raise GraphError(f"Slice ({node.name}): step of axis {axis} must not be 0")
        if not isinstance(dim, int):
            raise GraphError(f"Slice ({node.name}): cannot slice symbolic dimension {dim!r}")
        shape[axis] = len(range(*slice(int(start), int(end), step).indices(dim)))
    return [(x.dtype, tuple(shape))]


def _infer_gather(node: Node, _: int | None) -> TypeList:
    x, indices = _in(node, 0), _in(node, 1)
    if indices.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise GraphError(f"Gather ({node.name}): indices must be int32 or int64, got {indices.type_str()}")
    axis = normalize_axis(node.attrs.get("axis", 0), x.rank, "Gather axis")
    return [(x.dtype, x.shape[:axis] + indices.shape + x.shape[axis + 1 :])]


def _infer_cast(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    return [(numpy_dtype(node.attrs["to"]), x.shape)]


def _infer_expand(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    requested = _const(node, 1, "shape").reshape(-1).tolist()
    target = tuple(with_batch(requested, elements(node.inputs[1].meta.get("batch"))))
    return [(x.dtype, broadcast_shapes(x.shape, target))]


def _infer_clip(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    bounds = [v for v in node.inputs[1:] if v is not None]
    _same_dtype(node, [x, *bounds])
    return [(x.dtype, x.shape)]


def _infer_softmax(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    normalize_axis(node.attrs.get("axis", -1), x.rank, f"{node.op_type} axis")
    return [(x.dtype, x.shape)]


def _ints_attr(node: Node, name: str, default: Sequence[int], length: int) -> list[int]:
    values = [int(v) for v in node.attrs.get(name) or default]
    if len(values) != length:
        raise GraphError(f"{node.op_type} ({node.name}): attribute {name}={values} needs {length} values")
    return values


def _window_dim(dim: Dim, kernel: int, stride: int, dilation: int, begin: int, end: int, auto_pad: str,
                ceil_mode: bool) -> Dim:
    """Output size of one spatial axis of a sliding window op (Conv, MaxPool, AveragePool)."""
    if stride < 1 or dilation < 1:
        raise GraphError(f"strides and dilations must be >= 1, got stride {stride}, dilation {dilation}")
    extent = (kernel - 1) * dilation + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return -(-dim // stride) if isinstance(dim, int) else f"ceil({dim}/{stride})"
    if auto_pad == "VALID":
        begin = end = 0
    if not isinstance(dim, int):
        rounding = "ceil" if ceil_mode else "floor"
        return f"{rounding}(({dim}{begin + end - extent:+d})/{stride})+1"
    span = dim + begin + end - extent
    if span < 0:
        raise GraphError(f"window of extent {extent} (kernel {kernel}, dilation {dilation}) does not fit an axis of "
                         f"size {dim} padded by ({begin}, {end})")
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= dim + begin:
        out -= 1  # the last window would start inside the end padding
    return out


def _window_shape(node: Node, x: Value, kernel: Sequence[int]) -> tuple[Dim, ...]:
    """Spatial output dims of a sliding window op over ``x`` (N, C, *spatial)."""
    rank = x.rank - 2
    if rank < 1 or len(kernel) != rank:
        raise GraphError(f"{node.op_type} ({node.name}): input {x.type_str()} needs layout (N, C, spatial...) with "
                         f"{len(kernel)} spatial axes for kernel {list(kernel)}")
    strides = _ints_attr(node, "strides", [1] * rank, rank)
    dilations = _ints_attr(node, "dilations", [1] * rank, rank)
    pads = _ints_attr(node, "pads", [0] * 2 * rank, 2 * rank)
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise GraphError(f"{node.op_type} ({node.name}): unknown auto_pad {auto_pad!r}")
    ceil_mode = bool(node.attrs.get("ceil_mode", 0))
    try:
        return tuple(
            _window_dim(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[rank + i], auto_pad,
                        ceil_mode)
            for i in range(rank)
        )
    except GraphError as err:
        raise GraphError(f"{node.op_type} ({node.name}) on {x.type_str()}: {err}") from None


def _infer_conv(node: Node, _: int | None) -> TypeList:
    x, w = _in(node, 0), _in(node, 1)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    dtype = _same_dtype(node, [x, w] + ([bias] if bias is not None else []))
    if dtype.kind != "f":
        raise GraphError(f"Conv ({node.name}) needs floating point inputs, got {x.type_str()}")
    if x.rank < 3 or w.rank != x.rank:
        raise GraphError(f"Conv ({node.name}): input {x.type_str()} must be (N, C, spatial...) and weights "
                         f"{w.type_str()} of the same rank (C_out, C_in/group, kernel...)")
    group = int(node.attrs.get("group", 1))
    channels, out_channels, per_group = x.shape[1], w.shape[0], w.shape[1]
    if group < 1:
        raise GraphError(f"Conv ({node.name}): group must be >= 1, got {group}")
    if isinstance(channels, int) and isinstance(per_group, int) and channels != per_group * group:
        raise GraphError(f"Conv ({node.name}): input {x.type_str()} has {channels} channels but weights "
                         f"{w.type_str()} expect {per_group} per group x {group} group(s)")
    if isinstance(out_channels, int) and out_channels % group:
        raise GraphError(f"Conv ({node.name}): {out_channels} output channels are not divisible by group={group}")
    if bias is not None and (bias.rank != 1 or (isinstance(bias.shape[0], int) and isinstance(out_channels, int)
                                                 and bias.shape[0] != out_channels)):
        raise GraphError(f"Conv ({node.name}): bias {bias.type_str()} must have shape ({out_channels},)")
    kernel = list(w.shape[2:])
    if not all(isinstance(k, int) for k in kernel):
        raise GraphError(f"Conv ({node.name}): kernel dimensions of {w.type_str()} must be static")
    declared = node.attrs.get("kernel_shape")
    if declared is not None and [int(k) for k in declared] != kernel:
        raise GraphError(f"Conv ({node.name}): kernel_shape {list(declared)} differs from weights {w.type_str()}")
    return [(dtype, (x.shape[0], out_channels, *_window_shape(node, x, kernel)))]


def _infer_pool(node: Node, num_outputs: int | None) -> TypeList:
    x = _in(node, 0)
    if x.dtype.kind not in "fiu":
        raise GraphError(f"{node.op_type} ({node.name}) needs a numeric input, got {x.type_str()}")
    kernel = node.attrs.get("kernel_shape")
    if not kernel:
        raise GraphError(f"{node.op_type} ({node.name}) needs the kernel_shape attribute")
    shape = (*x.shape[:2], *_window_shape(node, x, [int(k) for k in kernel]))
    outs = [(x.dtype, shape)]
    if node.op_type == "MaxPool" and num_outputs == 2:
        outs.append((np.dtype(np.int64), shape))
    return outs


def _infer_pad(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    pads = [int(p) for p in _const(node, 1, "pads").reshape(-1)]
    axes = _const(node, 3, "axes")
    axes = list(range(x.rank)) if axes is None else [normalize_axis(int(a), x.rank, "Pad axis")
                                                     for a in axes.reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise GraphError(f"Pad ({node.name}): pads {pads} need 2 x {len(axes)} values (begins, then ends)")
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is not None and (value.dtype != x.dtype or value.rank > 1):
        raise GraphError(f"Pad ({node.name}): constant_value {value.type_str()} must be a {x.dtype} scalar")
    shape = list(x.shape)
    for position, axis in enumerate(axes):
        begin, end = pads[position], pads[len(axes) + position]
        dim = shape[axis]
        if isinstance(dim, int):
            if dim + begin + end < 0:
                raise GraphError(f"Pad ({node.name}): pads ({begin}, {end}) crop axis {axis} of {x.type_str()} "
                                 "below size 0")
            shape[axis] = dim + begin + end
        elif begin + end:
            shape[axis] = f"{dim}{begin + end:+d}"
    return [(x.dtype, tuple(shape))]


def _infer_random_like(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    dtype = numpy_dtype(node.attrs["dtype"]) if node.attrs.get("dtype") is not None else x.dtype
    if dtype.kind != "f":
        raise GraphError(f"{node.op_type} ({node.name}) produces floating point values; got dtype {dtype} "
                         "(set the dtype attribute when the input is not a float tensor)")
    return [(dtype, x.shape)]


#: The oldest opset whose form of each op the rules here model (later versions only added types),
#: from the ONNX changelog; ops not listed are modelled from their opset-18 form on.
_SINCE = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "And", "Or", "Xor",
                     "Sin", "Cos"), 7),
    **dict.fromkeys(("Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Relu", "Reciprocal", "Floor",
                     "Ceil", "Cast"), 6),
    **dict.fromkeys(("Identity", "Not", "Softplus", "Transpose", "Gather", "MatMul", "Conv",
                     "RandomUniformLike", "ConvTranspose"), 1),
    **dict.fromkeys(("Max", "Min", "Expand"), 8),
    **dict.fromkeys(("Sign", "Erf", "IsNaN", "Where"), 9),
    **dict.fromkeys(("Mod", "IsInf", "Slice"), 10),
    **dict.fromkeys(("Round", "ArgMax", "ArgMin", "Clip", "Pad"), 11),
    **dict.fromkeys(("LessOrEqual", "GreaterOrEqual"), 12),
    **dict.fromkeys(("ReduceSum", "Squeeze", "Unsqueeze", "Split", "Softmax", "LogSoftmax"), 13),
    "Reshape": 5, "Concat": 4, "MaxPool": 8, "AveragePool": 7,
}


def _register_defaults() -> None:
    onnx_ops: dict[str, InferFn] = {}
    for name in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Mod"):
        onnx_ops[name] = _elementwise()
    for name in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        onnx_ops[name] = _elementwise(np.bool_)
    for name in ("And", "Or", "Xor"):
        onnx_ops[name] = _elementwise(np.bool_)
    for name in ("Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Relu", "Reciprocal", "Floor",
                 "Ceil", "Sign", "Sin", "Cos", "Erf", "Identity", "Not", "Round", "Softplus"):
        onnx_ops[name] = _unary()
    for name in ("IsNaN", "IsInf"):
        onnx_ops[name] = _unary(np.bool_)
    for name in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"):
        onnx_ops[name] = _infer_reduce
    onnx_ops.update(
        Pow=_infer_pow, Where=_infer_where, MatMul=_infer_matmul, ArgMax=_infer_arg_reduce,
        ArgMin=_infer_arg_reduce, Reshape=_infer_reshape, Transpose=_infer_transpose,
        Unsqueeze=_infer_unsqueeze, Squeeze=_infer_squeeze, Concat=_infer_concat, Split=_infer_split,
        Slice=_infer_slice, Gather=_infer_gather, Cast=_infer_cast, Expand=_infer_expand, Clip=_infer_clip,
        Softmax=_infer_softmax, LogSoftmax=_infer_softmax,
    )
    for name, infer in onnx_ops.items():
        register_op(OpDef(name, ONNX_DOMAIN, infer, since=_SINCE.get(name)))
    # Ops used by graphdist.trace.nn.
    register_op(OpDef("Conv", ONNX_DOMAIN, _infer_conv, since=_SINCE["Conv"],
                      doc="N-d convolution, layout (N, C, spatial...), weights (C_out, C_in/group, kernel...)."))
    register_op(OpDef("MaxPool", ONNX_DOMAIN, _infer_pool, since=_SINCE["MaxPool"],
                      doc="Max over sliding windows (padding never wins)."))
    register_op(OpDef("AveragePool", ONNX_DOMAIN, _infer_pool, since=_SINCE["AveragePool"],
                      doc="Mean over sliding windows."))
    register_op(OpDef("Pad", ONNX_DOMAIN, _infer_pad, since=_SINCE["Pad"],
                      doc="Pads (or crops) axes by constant begin/end amounts."))
    register_op(OpDef("RandomUniformLike", ONNX_DOMAIN, _infer_random_like, since=_SINCE["RandomUniformLike"],
                      doc="Uniform random values in [low, high) with the shape of the input."))


_register_defaults()


# ------------------------------------------------------------------ ConvTranspose
# Emitted by the Conv gradient rule (graphdist.ir.gradients) for the gradient with respect to
# the input. Kept in its own block: graphdist.trace never emits it.
def _infer_conv_transpose(node: Node, _: int | None) -> TypeList:
    x, w = _in(node, 0), _in(node, 1)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    dtype = _same_dtype(node, [x, w] + ([bias] if bias is not None else []))
    if dtype.kind != "f":
        raise GraphError(f"ConvTranspose ({node.name}) needs floating point inputs, got {x.type_str()}")
    rank = x.rank - 2
    if rank < 1 or w.rank != x.rank:
        raise GraphError(f"ConvTranspose ({node.name}): input {x.type_str()} must be (N, C, spatial...) and weights "
                         f"{w.type_str()} of the same rank (C, C_out/group, kernel...)")
    group = int(node.attrs.get("group", 1))
    if group < 1:
        raise GraphError(f"ConvTranspose ({node.name}): group must be >= 1, got {group}")
    channels, per_group = x.shape[1], w.shape[1]
    if isinstance(channels, int) and isinstance(w.shape[0], int) and channels != w.shape[0]:
        raise GraphError(f"ConvTranspose ({node.name}): input {x.type_str()} has {channels} channels but weights "
                         f"{w.type_str()} expect {w.shape[0]}")
    if isinstance(channels, int) and channels % group:
        raise GraphError(f"ConvTranspose ({node.name}): {channels} input channels are not divisible by group={group}")
    out_channels = per_group * group if isinstance(per_group, int) else f"{per_group}*{group}"
    if bias is not None and (bias.rank != 1 or (isinstance(bias.shape[0], int) and isinstance(out_channels, int)
                                                 and bias.shape[0] != out_channels)):
        raise GraphError(f"ConvTranspose ({node.name}): bias {bias.type_str()} must have shape ({out_channels},)")
    kernel = list(w.shape[2:])
    if not all(isinstance(k, int) for k in kernel):
        raise GraphError(f"ConvTranspose ({node.name}): kernel dimensions of {w.type_str()} must be static")
    declared = node.attrs.get("kernel_shape")
    if declared is not None and [int(k) for k in declared] != kernel:
        raise GraphError(f"ConvTranspose ({node.name}): kernel_shape {list(declared)} differs from weights "
                         f"{w.type_str()}")
    strides = _ints_attr(node, "strides", [1] * rank, rank)
    dilations = _ints_attr(node, "dilations", [1] * rank, rank)
    pads = _ints_attr(node, "pads", [0] * 2 * rank, 2 * rank)
    output_padding = _ints_attr(node, "output_padding", [0] * rank, rank)
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise GraphError(f"ConvTranspose ({node.name}): unknown auto_pad {auto_pad!r}")
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise GraphError(f"ConvTranspose ({node.name}): strides {strides} and dilations {dilations} must be >= 1")
    if any(p < 0 or p >= max(s, d) for p, s, d in zip(output_padding, strides, dilations)):
        raise GraphError(f"ConvTranspose ({node.name}): output_padding {output_padding} must be >= 0 and less than "
                         f"the stride or dilation of its axis (strides {strides}, dilations {dilations})")
    explicit = node.attrs.get("output_shape")
    if explicit is not None:
        spatial: list[Dim] = [int(d) for d in explicit][-rank:]
        if len(spatial) != rank:
            raise GraphError(f"ConvTranspose ({node.name}): output_shape {list(explicit)} needs {rank} spatial sizes")
        return [(dtype, (x.shape[0], out_channels, *spatial))]
    spatial = []
    for i in range(rank):
        dim = x.shape[2 + i]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            spatial.append(dim * strides[i] if isinstance(dim, int) else f"{dim}*{strides[i]}")
            continue
        begin, end = (0, 0) if auto_pad == "VALID" else (pads[i], pads[rank + i])
        extra = output_padding[i] + (kernel[i] - 1) * dilations[i] + 1 - begin - end
        if not isinstance(dim, int):
            spatial.append(f"{strides[i]}*({dim}-1){extra:+d}")
            continue
        size = strides[i] * (dim - 1) + extra
        if size < 1:
            raise GraphError(f"ConvTranspose ({node.name}) on {x.type_str()}: pads ({begin}, {end}) leave no output "
                             f"along spatial axis {i}")
        spatial.append(size)
    return [(dtype, (x.shape[0], out_channels, *spatial))]


register_op(OpDef("ConvTranspose", ONNX_DOMAIN, _infer_conv_transpose, since=_SINCE["ConvTranspose"],
                  doc="Transposed N-d convolution (the input gradient of Conv), weights (C, C_out/group, kernel...)."))
