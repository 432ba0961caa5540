"""Neural-network functions for traced code (``gd.nn``).

Every function works on traced tensors (inside ``gd.trace``, ``gd.function``
and ``strategy.run``), where it records ONNX ops, and eagerly on numpy arrays
(or ``gd.Variable`` s), where it computes the same values with numpy. dtypes
follow numpy's rules: operands are combined with ``np.result_type`` (Python
scalars are weak, so ``batch_norm(x32, 0.0, 1.0)`` stays float32) and integer
inputs of floating point functions become floats as numpy ufuncs make them.

The traced forms are built from ops with simple gradients (``Exp``, ``Log``,
``ReduceMax``, ``ReduceSum``, ``Mul``, ``Equal``, ``Cast``...) wherever a
composite is as good as a fused op, so autodiff needs only elementwise rules;
``conv2d`` and the pools use ONNX ``Conv``/``MaxPool``/``AveragePool`` where
ONNX Runtime has a kernel for the dtype (float32; MaxPool also float64) and
the same im2col composite as the eager path otherwise (ONNX Runtime's CPU
provider has no float64 ``Conv`` or ``AveragePool``). For the same reason
float64 ``gelu`` uses an elementwise ``erf`` (series and continued fraction,
error below 1e-15) instead of ``Erf``.

Layouts follow TensorFlow by default: images are ``NHWC`` and ``conv2d``
weights ``(KH, KW, C_in/groups, C_out)``; with ``data_format="NCHW"`` images
are ``(N, C, H, W)`` and weights ``(C_out, C_in/groups, KH, KW)`` as in ONNX.
In traced code only the batch dimension of a convolution or pool input may be
symbolic.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError, TracingError
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.ir.ops import onnx_dtype
from graphdist.trace.checks import check_indices, check_label_dtype
from graphdist.trace.numpy_api import _as_tensor, _context, _result_dtype, cast_tensor
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import TraceContext, axis_tuple, current_trace

__all__ = [
    "relu",
    "gelu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "sparse_softmax_cross_entropy",
    "compute_average_loss",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "batch_norm",
    "moments",
    "layer_norm",
    "dropout",
    "embedding",
]

_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_ERF = np.frompyfunc(math.erf, 1, 1)
_MASK64 = (1 << 64) - 1
_FORMATS = ("NHWC", "NCHW")


# ---------------------------------------------------------------- operands
def _read(x: Any) -> Any:
    """A ``gd.Variable``'s value (a traced tensor inside a trace); anything else unchanged."""
    if x is None or isinstance(x, (Tensor, np.ndarray, np.generic, int, float)):
        return x
    from graphdist.trace.variables import Variable, read_variable

    return read_variable(x) if isinstance(x, Variable) else x


def _float_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a numpy float ufunc (``np.exp``) computes in for ``dtype``."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind == "f" else np.dtype(np.exp.resolve_dtypes((dtype, None))[-1])


def _coerce(what: str, *operands: Any, floating: bool = True) -> tuple[TraceContext | None, list[Any]]:
    """Brings operands to one dtype (numpy promotion, weak Python scalars).

    Returns the trace context (``None`` when every operand is concrete) and the
    operands as traced tensors or numpy arrays of the common dtype
    (``None`` stays ``None``).
    """
    operands = tuple(_read(v) for v in operands)
    present = [v for v in operands if v is not None]
    traced = any(isinstance(v, Tensor) for v in present)
    try:
        dtype = _result_dtype(*present, what=what)
    except TracingError as err:
        if traced:
            raise
        raise InvalidArgumentError(str(err)) from None
    if floating:
        dtype = _float_dtype(dtype)
    if not traced:
        return None, [None if v is None else np.asarray(v, dtype=dtype) for v in operands]
    ctx = _context(*present)
    converted = []
    for v in operands:
        if v is None:
            converted.append(None)
        elif isinstance(v, Tensor):
            converted.append(cast_tensor(v, dtype))
        else:
            converted.append(_as_tensor(ctx, np.asarray(v, dtype=dtype)))
    return ctx, converted


def _axes(axis: Any, rank: int, what: str) -> tuple[int, ...]:
    """Normalised axes (``None`` means all), raising ``gd.AxisError`` when out of range."""
    axes = axis_tuple(axis, rank, what)
    return tuple(range(rank)) if axes is None else axes


def _reduce_max(x: Any, axes: tuple[int, ...]) -> Any:
    """Max over ``axes`` keeping dims: a bare ``ReduceMax`` when traced.

    Used only as a numerical shift (softmax is invariant to it), so its
    gradient is exactly zero: a stop-gradient saves the backward ops.
    """
    if isinstance(x, Tensor):
        from graphdist.trace.tape import stop_gradient

        ctx = _context(x)
        return stop_gradient(ctx.emit1("ReduceMax", [x.value, ctx.int64s(axes)], {"keepdims": 1}))
    return np.max(x, axis=axes, keepdims=True, initial=-np.inf)


def _erf(x: Any) -> Any:
    """``erf``: ``math.erf`` eagerly, ONNX ``Erf`` when traced (float64: :func:`_erf_composite`)."""
    if not isinstance(x, Tensor):
        return np.asarray(_ERF(x), dtype=x.dtype)
    if x.dtype == np.float64:
        return _erf_composite(x)
    return _context(x).emit1("Erf", [x.value])


#: erf(t) = 2/sqrt(pi) t exp(-t^2) sum_n (2 t^2)^n / (2n+1)!!  (all terms positive); 40 terms reach
#: double precision for t < 2.5. The polynomial is evaluated in u = 2 t^2 / 16 (exact scaling) so that
#: no coefficient is tiny: ONNX Runtime's NoopElimination compares float64 scalars with 0 and 1 at float32
#: precision and drops "x + 1e-46" (1.31; the ort backend now disables that optimizer, see backends/ort.py).
#: Beyond, erfc(t) = exp(-t^2) / (sqrt(pi) (t + (1/2)/(t + 1/(t + (3/2)/...)))) (Laplace's continued
#: fraction), 30 levels deep.
_ERF_SPLIT = 2.5
_ERF_SCALE = 16.0
_ERF_SERIES = tuple(_ERF_SCALE**n / math.prod(range(1, 2 * n + 2, 2)) for n in range(41))
_ERFC_DEPTH = 30


def _erf_composite(x: Any) -> Any:
    """float64 ``erf`` from elementwise ops (ONNX Runtime's CPU provider has no float64 ``Erf``).

    Absolute error below 1e-15 against ``math.erf``. Each branch sees its
    input clamped to its own range, so the unused branch stays finite (no
    NaN reaches ``Where`` or its gradient).
    """
    t = np.abs(x)
    near = np.minimum(t, _ERF_SPLIT)
    w = near * near * (2.0 / _ERF_SCALE)
    poly = w * _ERF_SERIES[-1] + _ERF_SERIES[-2]
    for coefficient in reversed(_ERF_SERIES[:-2]):
        poly = poly * w + coefficient
    series = (2.0 / math.sqrt(math.pi)) * near * np.exp(-near * near) * poly
    far = np.maximum(t, _ERF_SPLIT)
    fraction = far
    for k in range(_ERFC_DEPTH, 0, -1):
        fraction = far + (k / 2.0) / fraction
    tail = 1.0 - np.exp(-far * far) / (math.sqrt(math.pi) * fraction)
    return np.sign(x) * np.where(t < _ERF_SPLIT, series, tail)


def _int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or isinstance(value, Tensor):
        raise InvalidArgumentError(f"{what} must be a Python int, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be an int, got {value!r} of type {type(value).__name__}") from None
    if number < minimum:
        raise InvalidArgumentError(f"{what} must be >= {minimum}, got {number}")
    return number


def _pair(value: Any, what: str) -> tuple[int, int]:
    """``s`` or ``(s_h, s_w)`` as a pair of positive ints."""
    values = value if isinstance(value, (tuple, list)) else (value, value)
    if len(values) != 2:
        raise InvalidArgumentError(f"{what} must be an int or a pair (height, width) of ints, got {value!r}")
    first, second = (_int(v, what, 1) for v in values)
    return first, second


def _format(data_format: Any, what: str) -> str:
    fmt = data_format.upper() if isinstance(data_format, str) else data_format
    if fmt not in _FORMATS:
        raise InvalidArgumentError(f"{what}: data_format must be 'NHWC' (TensorFlow's default: batch, height, "
                                   f"width, channels) or 'NCHW' (ONNX/PyTorch layout), got {data_format!r}")
    return fmt


def _static_spatial(x: Any, what: str, fmt: str) -> tuple[int, int, int]:
    """``(H, W, C)`` of a 4-D image batch; only the batch dimension may be symbolic."""
    if np.ndim(x) != 4:
        layout = "(N, H, W, C)" if fmt == "NHWC" else "(N, C, H, W)"
        raise InvalidArgumentError(f"{what}: x must be a 4-D image batch {layout} for data_format={fmt!r}; got "
                                   f"shape {tuple(x.shape)}")
    if fmt == "NHWC":
        height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    else:
        channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    if not all(isinstance(d, int) for d in (height, width, channels)):
        raise TracingError(f"{what}: x has shape {tuple(x.shape)}; in traced code only the batch dimension may "
                           "be symbolic (height, width and channels must be static)")
    return height, width, channels


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one axis: output ``ceil(size / stride)``, extra at the end."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _pads(padding: Any, size: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int],
          dilations: tuple[int, int], what: str, explicit: bool) -> tuple[int, int, int, int]:
    """``(top, bottom, left, right)`` for a padding argument."""
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return 0, 0, 0, 0
        if mode == "SAME":
            return (*_same_pads(size[0], kernel[0], strides[0], dilations[0]),
                    *_same_pads(size[1], kernel[1], strides[1], dilations[1]))
    elif explicit:
        try:
            if isinstance(padding, (tuple, list)) and all(isinstance(p, (tuple, list)) for p in padding):
                (top, bottom), (left, right) = padding
            else:
                pad_h, pad_w = padding if isinstance(padding, (tuple, list)) else (padding, padding)
                top, bottom, left, right = pad_h, pad_h, pad_w, pad_w
        except (TypeError, ValueError):
            pass
        else:
            top, bottom, left, right = (_int(p, f"{what}: padding", 0) for p in (top, bottom, left, right))
            return top, bottom, left, right
    accepted = ("'VALID', 'SAME', an int, (pad_h, pad_w) or ((top, bottom), (left, right))" if explicit
                else "'VALID' or 'SAME'")
    raise InvalidArgumentError(f"{what}: padding must be {accepted}; got {padding!r}")


def _out_size(size: int, begin: int, end: int, kernel: int, stride: int, dilation: int, what: str,
              axis: str) -> int:
    extent = (kernel - 1) * dilation + 1
    if size + begin + end < extent:
        raise InvalidArgumentError(
            f"{what}: the window ({extent} along {axis}, kernel {kernel}, dilation {dilation}) is larger than the "
            f"input ({size}, padded by {begin}+{end}); use padding='SAME' or a smaller window"
        )
    return (size + begin + end - extent) // stride + 1


# ------------------------------------------------------------ layout helpers
def _transpose(x: Any, perm: Sequence[int]) -> Any:
    """``np.transpose``; a traced constant (captured weights) is transposed at trace time."""
    if isinstance(x, Tensor) and x.value.const_value is not None:
        ctx = _context(x)
        return _as_tensor(ctx, np.ascontiguousarray(np.transpose(x.value.const_value, perm)))
    return np.transpose(x, perm)


def _pad_hw(x: Any, pads: tuple[int, int, int, int], value: float) -> Any:
    """Pads axes 1 and 2 of an NHWC batch by ``(top, bottom, left, right)`` with ``value``."""
    top, bottom, left, right = pads
    if not any(pads):
        return x
    if isinstance(x, Tensor):
        ctx = _context(x)
        amounts = ctx.int64s([0, top, left, 0, 0, bottom, right, 0], name="pads")
        fill = ctx.constant(np.asarray(value, dtype=x.dtype), name="pad_value")
        return ctx.emit1("Pad", [x.value, amounts, fill], {"mode": "constant"})
    return np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=value)


def _windows(padded: Any, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
             out: tuple[int, int]) -> Iterator[Any]:
    """The ``KH * KW`` strided views ``(N, OH, OW, C)`` of a padded NHWC batch, row-major over the kernel."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilations, out
    for i in range(kh):
        for j in range(kw):
            yield padded[:, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw, :]


def _conv_im2col(x: Any, w: Any, strides: tuple[int, int], dilations: tuple[int, int],
                 pads: tuple[int, int, int, int], out: tuple[int, int], groups: int) -> Any:
    """NHWC convolution with HWIO weights as one (batched) MatMul over image patches.

    Works on numpy arrays and on traced tensors (Pad, Slice, Concat, Reshape,
    Transpose, MatMul).
    """
    kh, kw, per_group, out_channels = (int(d) for d in w.shape)
    batch, (oh, ow) = x.shape[0], out
    patches = list(_windows(_pad_hw(x, pads, 0.0), (kh, kw), strides, dilations, out))
    cols = np.stack(patches, axis=3)  # (N, OH, OW, KH*KW, C_in)
    if groups == 1:
        cols = cols.reshape(batch, oh, ow, kh * kw * per_group)
        return cols @ w.reshape(kh * kw * per_group, out_channels)
    cols = cols.reshape(batch, oh, ow, kh * kw, groups, per_group)
    cols = _transpose(cols, (0, 1, 2, 4, 3, 5)).reshape(batch, oh, ow, groups, 1, kh * kw * per_group)
    grouped = _transpose(w.reshape(kh * kw * per_group, groups, out_channels // groups), (1, 0, 2))
    return (cols @ grouped).reshape(batch, oh, ow, out_channels)


# -------------------------------------------------------------- activations
def relu(x: Any) -> Any:
    """Rectified linear unit, ``max(x, 0)`` (NaN stays NaN).

    Args:
        x: Tensor or array of any numeric dtype (the dtype is kept).

    Returns:
        ``x`` with negative entries replaced by 0 (an ONNX ``Relu`` when traced).
    """
    ctx, (x,) = _coerce("relu", x, floating=False)
    if ctx is not None and x.dtype.kind == "f":
        return ctx.emit1("Relu", [x.value])
    return np.maximum(x, 0)


def gelu(x: Any, approximate: bool = False) -> Any:
    """Gaussian error linear unit, like ``tf.nn.gelu``.

    Args:
        x: Tensor or array (integers become floats as in numpy).
        approximate: ``False``: the exact ``0.5 x (1 + erf(x / sqrt(2)))``;
            ``True``: ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``.

    Returns:
        GELU of ``x``, same shape, floating dtype.
    """
    _, (x,) = _coerce("gelu", x)
    if approximate:
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + np.tanh(inner))
    return 0.5 * x * (1.0 + _erf(x * _SQRT_HALF))


def sigmoid(x: Any) -> Any:
    """Logistic function ``1 / (1 + exp(-x))`` (an ONNX ``Sigmoid`` when traced; overflow-free eagerly).

    Args:
        x: Tensor or array (integers become floats as in numpy).

    Returns:
        Values in [0, 1], same shape, floating dtype.
    """
    ctx, (x,) = _coerce("sigmoid", x)
    if ctx is not None:
        return ctx.emit1("Sigmoid", [x.value])
    small = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + small), small / (1.0 + small)).astype(x.dtype, copy=False)


def tanh(x: Any) -> Any:
    """Hyperbolic tangent (``np.tanh``; an ONNX ``Tanh`` when traced).

    Args:
        x: Tensor or array (integers become floats as in numpy).

    Returns:
        Values in [-1, 1], same shape, floating dtype.
    """
    _, (x,) = _coerce("tanh", x)
    return np.tanh(x)


def softmax(x: Any, axis: int | Sequence[int] = -1) -> Any:
    """Softmax along ``axis``, computed stably as ``exp(x - max) / sum(exp(x - max))``.

    Args:
        x: Tensor or array (integers become floats as in numpy).
        axis: Axis (or axes) to normalise over.

    Returns:
        Non-negative values summing to 1 along ``axis``.

    Raises:
        AxisError: ``axis`` is out of range.
    """
    _, (x,) = _coerce("softmax", x)
    axes = _axes(axis, np.ndim(x), "softmax axis")
    exps = np.exp(x - _reduce_max(x, axes))
    return exps / np.sum(exps, axis=axes, keepdims=True)


def log_softmax(x: Any, axis: int | Sequence[int] = -1) -> Any:
    """Log of :func:`softmax`: ``(x - max) - log(sum(exp(x - max)))``.

    Args:
        x: Tensor or array (integers become floats as in numpy).
        axis: Axis (or axes) to normalise over.

    Returns:
        Log-probabilities along ``axis``.

    Raises:
        AxisError: ``axis`` is out of range.
    """
    _, (x,) = _coerce("log_softmax", x)
    axes = _axes(axis, np.ndim(x), "log_softmax axis")
    shifted = x - _reduce_max(x, axes)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True))


# -------------------------------------------------------------------- losses
def sparse_softmax_cross_entropy(labels: Any, logits: Any) -> Any:
    """Per-example softmax cross entropy with integer class labels.

    ``loss[...] = logsumexp(logits[..., :]) - logits[..., labels[...]]``,
    computed as ``-sum(one_hot(labels) * log_softmax(logits), axis=-1)`` so
    that it is built from ``Equal``, ``Cast``, ``Mul``, ``ReduceSum``, ``Sub``,
    ``Exp``, ``Log`` and ``ReduceMax`` only. Logits must be finite (mask with a
    large negative number such as -1e9, not -inf: ``0 * -inf`` is NaN).

    Args:
        labels: Integer class indices of shape ``logits.shape[:-1]``.
        logits: Unnormalised scores ``(..., C)``; integers become floats.

    Returns:
        Losses of shape ``labels.shape`` in the logits' dtype.

    Raises:
        InvalidArgumentError: ``labels`` is not an integer array (or one of
            another dtype than int8, uint8, int32 and int64), shapes do not
            match, or a label is outside ``[0, C)``: eagerly at once, in traced
            code when the compiled step runs (a ``graphdist.CheckIndices``
            node; on every backend and replica, naming the replica).
    """
    labels = _read(labels)
    _, (logits,) = _coerce("sparse_softmax_cross_entropy", logits)
    traced = isinstance(logits, Tensor) or isinstance(labels, Tensor)
    if not isinstance(labels, Tensor):
        labels = np.asarray(labels)
    what = "sparse_softmax_cross_entropy"
    if labels.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: labels must be integer class indices, got dtype {labels.dtype}; use "
                                   "labels.astype(np.int64)")
    check_label_dtype(labels, what)
    logits_shape, labels_shape = tuple(logits.shape), tuple(labels.shape)
    if len(logits_shape) < 1 or len(labels_shape) != len(logits_shape) - 1 or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(labels_shape, logits_shape)):
        raise InvalidArgumentError(f"{what}: labels of shape {labels_shape} must have the shape of logits without "
                                   f"its last (class) axis; logits have shape {logits_shape}")
    classes = logits_shape[-1]
    if not isinstance(classes, int):
        raise TracingError(f"{what}: the number of classes (last axis of logits {logits_shape}) must be static")
    if isinstance(labels, np.ndarray) and labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise InvalidArgumentError(f"{what}: labels must be in [0, {classes}) (logits.shape[-1] = {classes} "
                                   f"classes); got values from {labels.min()} to {labels.max()}")
    if traced:
        ctx = _context(labels, logits)
        logits = _as_tensor(ctx, logits)
        if isinstance(labels, Tensor):  # an out-of-range label would match no class: a silent loss of 0
            check_indices(ctx, labels, 0, classes, op=what, argument="labels",
                          hint=f"logits.shape[-1] = {classes} classes")
        labels = _as_tensor(ctx, labels)
    one_hot = np.arange(classes, dtype=labels.dtype) == labels[..., None]
    picked = one_hot.astype(logits.dtype) * log_softmax(logits, axis=-1)
    return -np.sum(picked, axis=-1)


def compute_average_loss(per_example_loss: Any, global_batch_size: int | None = None) -> Any:
    """Sum of per-example losses divided by the global batch size, like ``tf.nn.compute_average_loss``.

    Gradients of this loss summed over replicas (what a sync strategy does)
    equal the gradient of the mean loss over the global batch.

    Args:
        per_example_loss: Floating point losses, rank >= 1, batch first.
        global_batch_size: Positive int. ``None``: ``per_example_loss.shape[0]``
            (this replica's batch) times the current strategy's
            ``num_replicas_in_sync``; a symbolic batch dimension is handled by
            averaging over it.

    Returns:
        A scalar of the loss dtype (0 for an empty batch).

    Raises:
        InvalidArgumentError: The loss is a scalar or not floating point,
            ``global_batch_size`` is not a positive int, or it is ``None`` in
            a strategy's cross-replica context (call this inside
            ``strategy.run`` or pass ``global_batch_size``).
    """
    loss = _read(per_example_loss)
    what = "compute_average_loss"
    if not isinstance(loss, Tensor):
        loss = np.asarray(loss)
    if loss.ndim == 0:
        raise InvalidArgumentError(f"{what}: per_example_loss must have rank >= 1 (one loss per example, batch "
                                   "first); got a scalar. Pass the unreduced losses")
    if loss.dtype.kind != "f":
        raise InvalidArgumentError(f"{what}: per_example_loss must be floating point, got {loss.dtype}; use "
                                   "loss.astype(np.float32)")
    if global_batch_size is not None:
        denominator = _int(global_batch_size, f"{what}: global_batch_size", 1)
        return np.sum(loss) / np.asarray(denominator, dtype=loss.dtype)
    from graphdist.trace import context

    strategy = context.current_strategy()
    stack = context.replica_stack()
    if strategy is not None and stack and stack[-1] is context.CROSS_REPLICA:
        raise InvalidArgumentError(
            f"{what} without global_batch_size was called in cross-replica context, where the batch is not a "
            "replica's batch; call it inside strategy.run(...) or pass global_batch_size"
        )
    replicas = _num_replicas(loss, strategy)
    batch = loss.shape[0]
    if isinstance(batch, int):
        count = max(batch, 1)  # the per-replica batch size (a symbol a re-planned step recomputes)
        count = loss.tracer.constant(count, dtype=loss.dtype) if isinstance(loss, Tensor) else \
            np.asarray(count, dtype=loss.dtype)
        return np.sum(loss) / (replicas * _tensor_of(loss, count))
    per_example = np.sum(loss, axis=tuple(range(1, loss.ndim))) if loss.ndim > 1 else loss
    return np.mean(per_example) / replicas


def _tensor_of(like: Any, value: Any) -> Any:
    """``value`` (a graph constant of ``like``'s trace, or an array) as an operand."""
    return Tensor(value, like.tracer) if isinstance(like, Tensor) else value


def _num_replicas(loss: Any, strategy: Any) -> Any:
    """The replicas in sync, in ``loss``'s dtype: a ``graphdist.NumReplicas`` node in a ``gd.function``
    trace (the step is traced once for any replica count), else the current strategy's count.
    """
    if isinstance(loss, Tensor) and loss.tracer.replicated:
        count = loss.tracer.emit1("NumReplicas", [], {}, domain=GRAPHDIST_DOMAIN, name="num_replicas")
        return count.astype(loss.dtype)
    return np.asarray(getattr(strategy, "num_replicas_in_sync", 1), dtype=loss.dtype)


# ------------------------------------------------------------ convolution
def conv2d(x: Any, w: Any, b: Any = None, stride: int | Sequence[int] = 1,
           padding: str | int | Sequence[Any] = "VALID", dilation: int | Sequence[int] = 1,
           data_format: str = "NHWC", groups: int = 1) -> Any:
    """2-D convolution (cross-correlation, as in TensorFlow and ONNX).

    Args:
        x: Images, ``(N, H, W, C_in)`` for ``"NHWC"`` or ``(N, C_in, H, W)`` for ``"NCHW"``.
        w: Filters, ``(KH, KW, C_in/groups, C_out)`` for ``"NHWC"`` (TensorFlow's
            layout) or ``(C_out, C_in/groups, KH, KW)`` for ``"NCHW"`` (ONNX's).
        b: Optional bias of shape ``(C_out,)``.
        stride: ``s`` or ``(s_h, s_w)``.
        padding: ``"VALID"`` (none), ``"SAME"`` (TensorFlow's: output
            ``ceil(size / stride)``, the odd pixel at the end), an int, a
            pair ``(pad_h, pad_w)`` or ``((top, bottom), (left, right))``.
        dilation: ``d`` or ``(d_h, d_w)``.
        data_format: ``"NHWC"`` or ``"NCHW"``; the output has the same layout.
        groups: Number of channel groups (``C_in`` for a depthwise convolution).

    Returns:
        The convolved batch in the dtype numpy promotion gives ``x``, ``w``
        and ``b`` (integers become floats, as ``np.exp`` makes them).

    Raises:
        InvalidArgumentError: Bad padding, data_format, stride, dilation or
            groups, wrong ranks, mismatched channels or bias, or a window
            larger than the padded input.
        TracingError: A non-batch dimension of ``x`` is symbolic.
    """
    what = "conv2d"
    fmt = _format(data_format, what)
    ctx, (x, w, b) = _coerce(what, x, w, b)
    height, width, channels = _static_spatial(x, what, fmt)
    if np.ndim(w) != 4 or not all(isinstance(d, int) for d in w.shape):
        layout = "(KH, KW, C_in/groups, C_out)" if fmt == "NHWC" else "(C_out, C_in/groups, KH, KW)"
        raise InvalidArgumentError(f"{what}: w must be a static 4-D filter {layout} for data_format={fmt!r}; got "
                                   f"shape {tuple(w.shape)}")
    groups = _int(groups, f"{what}: groups", 1)
    if fmt == "NHWC":
        kh, kw, per_group, out_channels = w.shape
    else:
        out_channels, per_group, kh, kw = w.shape
    if per_group * groups != channels or out_channels % groups:
        expected = "w.shape[2]" if fmt == "NHWC" else "w.shape[1]"
        raise InvalidArgumentError(
            f"{what}: x of shape {tuple(x.shape)} has {channels} input channels but w of shape {tuple(w.shape)} "
            f"has {per_group} x groups={groups}; {expected} must be C_in / groups and the output channels "
            f"({out_channels}) a multiple of groups (data_format={fmt!r})"
        )
    if b is not None and tuple(b.shape) != (out_channels,):
        raise InvalidArgumentError(f"{what}: b must have shape ({out_channels},) (one bias per output channel), "
                                   f"got {tuple(b.shape)}")
    strides, dilations = _pair(stride, f"{what}: stride"), _pair(dilation, f"{what}: dilation")
    pads = _pads(padding, (height, width), (kh, kw), strides, dilations, what, explicit=True)
    out = (_out_size(height, pads[0], pads[1], kh, strides[0], dilations[0], what, "height"),
           _out_size(width, pads[2], pads[3], kw, strides[1], dilations[1], what, "width"))
    if ctx is not None and x.dtype == np.float32:
        x_nchw = x if fmt == "NCHW" else _transpose(x, (0, 3, 1, 2))
        w_oihw = w if fmt == "NCHW" else _transpose(w, (3, 2, 0, 1))
        attrs = {"kernel_shape": [kh, kw], "strides": list(strides), "dilations": list(dilations),
                 "pads": [pads[0], pads[2], pads[1], pads[3]], "group": groups}
        inputs = [x_nchw.value, w_oihw.value] + ([b.value] if b is not None else [])
        y = ctx.emit1("Conv", inputs, attrs)
        return y if fmt == "NCHW" else _transpose(y, (0, 2, 3, 1))
    x_nhwc = x if fmt == "NHWC" else _transpose(x, (0, 2, 3, 1))
    w_hwio = w if fmt == "NHWC" else _transpose(w, (2, 3, 1, 0))
    y = _conv_im2col(x_nhwc, w_hwio, strides, dilations, pads, out, groups)
    if b is not None:
        y = y + b
    return y if fmt == "NHWC" else _transpose(y, (0, 3, 1, 2))


def _pool(kind: str, x: Any, pool_size: Any, strides: Any, padding: Any, data_format: Any) -> Any:
    what = f"{kind}_pool2d"
    fmt = _format(data_format, what)
    ctx, (x,) = _coerce(what, x)
    height, width, _ = _static_spatial(x, what, fmt)
    kernel = _pair(pool_size, f"{what}: pool_size")
    steps = kernel if strides is None else _pair(strides, f"{what}: strides")
    pads = _pads(padding, (height, width), kernel, steps, (1, 1), what, explicit=False)
    out = (_out_size(height, pads[0], pads[1], kernel[0], steps[0], 1, what, "height"),
           _out_size(width, pads[2], pads[3], kernel[1], steps[1], 1, what, "width"))
    if ctx is not None and (x.dtype == np.float32 or (kind == "max" and x.dtype == np.float64)):
        x_nchw = x if fmt == "NCHW" else _transpose(x, (0, 3, 1, 2))
        attrs: dict[str, Any] = {"kernel_shape": list(kernel), "strides": list(steps),
                                 "pads": [pads[0], pads[2], pads[1], pads[3]]}
        if kind == "avg":
            attrs["count_include_pad"] = 0
        y = ctx.emit1("MaxPool" if kind == "max" else "AveragePool", [x_nchw.value], attrs)
        return y if fmt == "NCHW" else _transpose(y, (0, 2, 3, 1))
    x_nhwc = x if fmt == "NHWC" else _transpose(x, (0, 2, 3, 1))
    if kind == "max":
        y = functools.reduce(np.maximum, _windows(_pad_hw(x_nhwc, pads, -np.inf), kernel, steps, (1, 1), out))
    else:
        total = functools.reduce(np.add, _windows(_pad_hw(x_nhwc, pads, 0.0), kernel, steps, (1, 1), out))
        ones = np.ones((1, height, width, 1), dtype=x.dtype)
        counts = functools.reduce(np.add, _windows(_pad_hw(ones, pads, 0.0), kernel, steps, (1, 1), out))
        y = total / counts
    return y if fmt == "NHWC" else _transpose(y, (0, 3, 1, 2))


def max_pool2d(x: Any, pool_size: int | Sequence[int], strides: int | Sequence[int] | None = None,
               padding: str = "VALID", data_format: str = "NHWC") -> Any:
    """2-D max pooling, like ``tf.nn.max_pool2d`` (padding never wins the max).

    Args:
        x: Images, ``(N, H, W, C)`` or ``(N, C, H, W)`` (integers become floats as in numpy).
        pool_size: Window ``k`` or ``(k_h, k_w)``.
        strides: ``s`` or ``(s_h, s_w)``; default: ``pool_size``.
        padding: ``"VALID"`` or ``"SAME"`` (TensorFlow's).
        data_format: ``"NHWC"`` or ``"NCHW"``.

    Returns:
        The pooled batch, same (floating) dtype and layout.

    Raises:
        InvalidArgumentError: Bad padding, data_format, sizes or rank.
        TracingError: A non-batch dimension of ``x`` is symbolic.
    """
    return _pool("max", x, pool_size, strides, padding, data_format)


def avg_pool2d(x: Any, pool_size: int | Sequence[int], strides: int | Sequence[int] | None = None,
               padding: str = "VALID", data_format: str = "NHWC") -> Any:
    """2-D average pooling, like ``tf.nn.avg_pool2d``: with ``"SAME"`` each
    window averages only its elements inside the image (padding is not counted).

    Args:
        x: Images, ``(N, H, W, C)`` or ``(N, C, H, W)`` (integers become floats as in numpy).
        pool_size: Window ``k`` or ``(k_h, k_w)``.
        strides: ``s`` or ``(s_h, s_w)``; default: ``pool_size``.
        padding: ``"VALID"`` or ``"SAME"`` (TensorFlow's).
        data_format: ``"NHWC"`` or ``"NCHW"``.

    Returns:
        The pooled batch, same (floating) dtype and layout.

    Raises:
        InvalidArgumentError: Bad padding, data_format, sizes or rank.
        TracingError: A non-batch dimension of ``x`` is symbolic.
    """
    return _pool("avg", x, pool_size, strides, padding, data_format)


# ---------------------------------------------------------- normalisation
def moments(x: Any, axes: int | Sequence[int], keepdims: bool = False) -> tuple[Any, Any]:
    """Mean and (biased) variance over ``axes``, like ``tf.nn.moments``.

    Args:
        x: Tensor or array (integers become floats as in ``np.mean``).
        axes: Axis or axes to reduce.
        keepdims: Keep the reduced axes with size 1.

    Returns:
        ``(mean, variance)``.

    Raises:
        AxisError: An axis is out of range or repeated.
    """
    _, (x,) = _coerce("moments", x)
    reduced = _axes(axes, np.ndim(x), "moments axes")
    mean = np.mean(x, axis=reduced, keepdims=True)
    centred = x - mean
    variance = np.mean(centred * centred, axis=reduced, keepdims=True)
    if keepdims:
        return mean, variance
    return np.squeeze(mean, axis=reduced), np.squeeze(variance, axis=reduced)


def _epsilon(value: Any, what: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
            value >= 0):
        raise InvalidArgumentError(f"{what} must be a non-negative Python float, got {value!r}")
    return float(value)


def batch_norm(x: Any, mean: Any, variance: Any, offset: Any = None, scale: Any = None,
               variance_epsilon: float = 1e-3) -> Any:
    """Batch normalisation with given statistics, like ``tf.nn.batch_normalization``.

    ``inv = scale / sqrt(variance + variance_epsilon)``;
    result ``x * inv + (offset - mean * inv)`` (elementwise, broadcasting).

    Args:
        x: Input.
        mean: Mean, broadcastable to ``x`` (e.g. per channel).
        variance: Variance, broadcastable to ``x``.
        offset: Optional shift (beta).
        scale: Optional scale (gamma).
        variance_epsilon: Non-negative float added to the variance.

    Returns:
        The normalised ``x`` in the promoted floating dtype.

    Raises:
        InvalidArgumentError: ``variance_epsilon`` is negative or not a number, or a statistic does not
            broadcast to ``x``'s shape.
    """
    eps = _epsilon(variance_epsilon, "batch_norm: variance_epsilon")
    _, (x, mean, variance, offset, scale) = _coerce("batch_norm", x, mean, variance, offset, scale)
    _check_broadcasts_to("batch_norm", x, mean=mean, variance=variance, offset=offset, scale=scale)
    inv = 1.0 / np.sqrt(variance + eps)
    if scale is not None:
        inv = inv * scale
    shift = -mean * inv if offset is None else offset - mean * inv
    return x * inv + shift


def _check_broadcasts_to(what: str, x: Any, **operands: Any) -> None:
    """Raises unless every operand broadcasts to ``x``'s shape (static shapes; symbolic ones are left to
    the tracer).
    """
    target = tuple(np.shape(x) if not isinstance(x, Tensor) else x.shape)
    for name, operand in operands.items():
        if operand is None:
            continue
        shape = tuple(operand.shape if isinstance(operand, Tensor) else np.shape(operand))
        if not all(isinstance(d, int) for d in (*target, *shape)):
            continue
        try:
            fits = np.broadcast_shapes(target, shape) == target
        except ValueError:
            fits = False
        if not fits:
            raise InvalidArgumentError(f"{what}: {name} of shape {shape} does not broadcast to x's shape {target}; "
                                       "give one value per channel (the last axis) or the shape of x")


def layer_norm(x: Any, gamma: Any = None, beta: Any = None, axis: int | Sequence[int] = -1,
               epsilon: float = 1e-5) -> Any:
    """Layer normalisation over ``axis``: ``(x - mean) / sqrt(var + epsilon) * gamma + beta``.

    Built from means and elementwise ops (no ``LayerNormalization`` op).

    Args:
        x: Input.
        gamma: Optional scale, broadcastable to ``x`` (usually shaped like the normalised axes).
        beta: Optional shift, broadcastable to ``x``.
        axis: Axis or axes to normalise over.
        epsilon: Non-negative float added to the variance.

    Returns:
        The normalised ``x`` in the promoted floating dtype.

    Raises:
        AxisError: ``axis`` is out of range.
        InvalidArgumentError: ``epsilon`` is negative, or ``gamma``/``beta``
            do not broadcast to the shape of ``x``.
    """
    eps = _epsilon(epsilon, "layer_norm: epsilon")
    _, (x, gamma, beta) = _coerce("layer_norm", x, gamma, beta)
    for name, param in (("gamma", gamma), ("beta", beta)):
        if param is None or not all(isinstance(d, int) for d in (*x.shape, *param.shape)):
            continue
        try:
            fits = np.broadcast_shapes(tuple(param.shape), tuple(x.shape)) == tuple(x.shape)
        except ValueError:
            fits = False
        if not fits:
            raise InvalidArgumentError(f"layer_norm: {name} of shape {tuple(param.shape)} does not broadcast to x "
                                       f"of shape {tuple(x.shape)}; give it the shape of the normalised axes")
    mean, variance = moments(x, axis, keepdims=True)
    y = (x - mean) * (1.0 / np.sqrt(variance + eps))
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


# ------------------------------------------------------------ regularisation
def _ort_seed(seed: int) -> float:
    """Scrambles ``seed`` (splitmix64) into ``[1, 2**24)``, exact in ONNX's float ``seed`` attribute.

    ONNX Runtime seeds a linear congruential engine with it, whose first draws
    for nearby seeds are nearly proportional; scrambling decorrelates them.
    """
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return float(z % (2**24 - 1) + 1)


def dropout(x: Any, rate: float, seed: int | None = None, training: bool = True) -> Any:
    """Inverted dropout, like ``tf.nn.dropout``: zero each element with
    probability ``rate`` and scale the kept ones by ``1 / (1 - rate)``.

    ``keep = (u >= rate)`` for ``u`` uniform in [0, 1); the result is
    ``x * (keep * (1 / (1 - rate)))``.

    Traced, ``u`` comes from an ONNX ``RandomUniformLike`` node, so every run
    of the compiled step draws a new mask. What the backends do (observed with
    ONNX Runtime 1.31 and onnx 1.23):

    * ONNX Runtime, ``seed`` given: each compiled session (one per compiled
      segment, e.g. per device) starts the same sequence, and successive runs
      of a session continue it (different masks per step; a fresh session or
      process repeats the sequence). Two dropout calls with the same seed in
      one graph draw identical masks.
    * ONNX Runtime, ``seed=None``: each node is seeded from a per-process
      seed: runs differ, processes differ, but sessions of one process
      start alike.
    * Reference backend (``onnx.reference``), ``seed`` given: the same mask
      on every run; ``seed=None``: a fresh mask on every run.

    A traced mask never equals the eager one (different generators); only
    its statistics do. The seed is scrambled (splitmix64) into ONNX's 24-bit
    exact float attribute, so nearby seeds give unrelated masks.

    Eagerly, ``u`` comes from ``np.random.default_rng(seed)``: a given seed
    gives the same mask on every call, ``None`` a fresh one.

    Args:
        x: Floating point tensor or array.
        rate: Python float in [0, 1): the probability of dropping an element.
        seed: Optional non-negative int.
        training: Python bool; ``False`` returns ``x`` unchanged (as does ``rate == 0``).

    Returns:
        ``x`` with dropped elements zeroed and the rest scaled, same dtype.

    Raises:
        InvalidArgumentError: ``rate`` is outside [0, 1) or not a number,
            ``seed`` is not a non-negative int, or ``x`` is not floating point.
        TracingError: ``rate`` or ``training`` is a traced tensor.
    """
    if isinstance(rate, Tensor) or isinstance(training, Tensor):
        raise TracingError("dropout: rate and training must be Python values, not traced tensors; a data-dependent "
                           "rate or mode cannot be traced")
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, float, np.integer, np.floating)) or not (
            0 <= rate < 1):
        raise InvalidArgumentError(f"dropout: rate must be a float in [0, 1) (the fraction of elements dropped); "
                                   f"got {rate!r}")
    if seed is not None:
        seed = _int(seed, "dropout: seed", 0)
    rate = float(rate)
    x = _read(x)
    if not training or rate == 0.0:
        return x if isinstance(x, Tensor) else np.asarray(x)
    ctx = _context(x) if isinstance(x, Tensor) else current_trace()
    if ctx is not None:
        x = _as_tensor(ctx, x)
    else:
        x = np.asarray(x)
    if x.dtype.kind != "f":
        raise InvalidArgumentError(f"dropout: x must be floating point, got {x.dtype}; use x.astype(np.float32)")
    scale = np.asarray(1.0 / (1.0 - rate), dtype=x.dtype)
    if ctx is not None:
        attrs: dict[str, Any] = {"dtype": onnx_dtype(x.dtype)}
        if seed is not None:
            attrs["seed"] = _ort_seed(seed)
        uniform = ctx.emit1("RandomUniformLike", [x.value], attrs)
    else:
        draw_dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.float32
        uniform = np.random.default_rng(seed).random(x.shape, dtype=draw_dtype)
    keep = (uniform >= rate).astype(x.dtype) * scale
    return x * keep


# --------------------------------------------------------------- embeddings
def embedding(ids: Any, table: Any) -> Any:
    """Rows of ``table`` selected by ``ids``: ``table[ids]`` (an ONNX ``Gather`` on axis 0).

    The argument order is ``(ids, table)``, the reverse of ``tf.nn.embedding_lookup(params, ids)``.

    Args:
        ids: Integer indices of any shape (int32 or int64; other integers are cast to int64).
        table: Embedding matrix ``(vocabulary, ...)``.

    Returns:
        Array of shape ``ids.shape + table.shape[1:]`` and the table's dtype.

    Raises:
        InvalidArgumentError: ``ids`` is not integer, ``table`` is a scalar,
            or an id is outside ``[0, vocabulary)``: for concrete ids at once,
            for traced ids when the compiled step runs (the lookup itself then
            reads row 0 for them, never outside the table).
    """
    ids, table = _read(ids), _read(table)
    if not isinstance(ids, Tensor):
        ids = np.asarray(ids)
    if not isinstance(table, Tensor):
        table = np.asarray(table)
    if ids.dtype.kind not in "iu":
        raise InvalidArgumentError(f"embedding: ids must be integers (int32 or int64), got dtype {ids.dtype}; use "
                                   "ids.astype(np.int64)")
    if table.ndim < 1:
        raise InvalidArgumentError("embedding: table must have rank >= 1 (vocabulary first), got a scalar")
    vocabulary = table.shape[0]
    if isinstance(ids, np.ndarray) and isinstance(vocabulary, int) and ids.size and (
            ids.min() < 0 or ids.max() >= vocabulary):
        raise InvalidArgumentError(f"embedding: ids must be in [0, {vocabulary}) (the rows of table, shape "
                                   f"{tuple(table.shape)}); got values from {ids.min()} to {ids.max()}")
    if not isinstance(ids, Tensor) and not isinstance(table, Tensor):
        return np.take(table, ids, axis=0)
    ctx = _context(ids, table)
    traced_ids = isinstance(ids, Tensor)
    ids = _as_tensor(ctx, ids)
    if ids.dtype not in (np.int32, np.int64):
        ids = cast_tensor(ids, np.int64)
    if traced_ids and isinstance(vocabulary, int):
        ids = check_indices(ctx, ids, 0, vocabulary, op="embedding", argument="ids",
                            hint=f"the rows of table, shape {tuple(table.shape)}")
    return ctx.emit1("Gather", [_as_tensor(ctx, table).value, ids.value], {"axis": 0})
