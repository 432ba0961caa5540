"""The tvm backend's ONNX Runtime fallback: segments TVM cannot compile, or compiles wrong.

As ONNX Runtime hands the nodes one execution provider lacks to the next, the
tvm backend hands a whole segment to the ``ort`` backend when TVM 0.27 cannot
run it correctly:

* TVM's Relax ONNX frontend raises converting one of its ops (no converter:
  ``LSTM``, ``GRU``, ``RNN``, ``TfIdfVectorizer``, ``Swish``,
  ``SoftmaxCrossEntropyLoss``, ``Upsample``, ...; or a converter that rejects
  the node's attributes);
* or an op of the segment is on the denylist below (:func:`unsupported_nodes`):
  forms of ops whose TVM conversion computes wrong values (silently) or fails
  to build, which graphdist cannot rewrite into a form TVM gets right
  (:mod:`graphdist.backends.tvm_onnx` rewrites the ones it can).

The segment then runs on ONNX Runtime (:class:`FallbackExecutable`), and the
tvm backend logs a warning naming the op and the segment, once per op type per
process. A segment on a TPU-like device (``tpu:N``) cannot fall back (ONNX
Runtime does not run there): it raises a :class:`BackendError` naming the op.

The denylist is applied to the segment after :func:`prepare_for_tvm`'s
rewrites, with ONNX shape inference's types and shapes. Each entry names the
reason; keep them in step with README.md's "TVM: ONNX Runtime fallback" list.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphdist import stats
from graphdist.backends.base import get_backend
from graphdist.backends.tvm_onnx import Shape, default_opset, dropout_is_identity, value_types
from graphdist.errors import BackendError

if TYPE_CHECKING:
    import onnx

    from graphdist.runtime.devices import Device

__all__ = [
    "DENYLIST",
    "FALLBACK_CACHE",
    "FallbackExecutable",
    "TvmConversionError",
    "Unsupported",
    "compile_on_ort",
    "fallback_note",
    "unsupported_nodes",
]

#: The tvm backend's logger: fallback warnings come from the backend users configured.
logger = logging.getLogger("graphdist.backends.tvm")

#: Subdirectory of a segment's cache directory where its ONNX Runtime fallback keeps its artefacts.
FALLBACK_CACHE = "ort-fallback"

_STRING = 8
_BFLOAT16 = 16
#: Element types TVM cannot run, with why (any node reading or writing one falls back).
_TYPES = {
    _BFLOAT16: "bfloat16 values: TVM 0.27 computes them as float32 (a Cast to bfloat16 does not round) "
               "and cannot exchange bfloat16 arrays with numpy",
    _STRING: "string tensors: TVM has no string type",
}


@dataclass(frozen=True)
class Unsupported:
    """A node TVM cannot run correctly.

    Attributes:
        op: The node's op type.
        node: The node's name.
        reason: Why (what TVM does wrong, or that its frontend cannot convert it).
    """

    op: str
    node: str
    reason: str


class TvmConversionError(BackendError):
    """TVM cannot convert a segment correctly: its frontend raises, or an op is on the denylist.

    ``TvmBackend.compile`` runs such a segment on ONNX Runtime instead (except on ``tpu:N``).

    Attributes:
        unsupported: The nodes concerned (empty when TVM's error names no op).
    """

    def __init__(self, message: str, unsupported: tuple[Unsupported, ...] = ()) -> None:
        super().__init__(message)
        self.unsupported = unsupported


_warned_ops: set[str] = set()
_warned_lock = threading.Lock()


@dataclass
class _Segment:
    """What a denylist rule may look at: the segment's types, shapes, constants and opset."""

    types: dict[str, int]
    shapes: dict[str, Shape]
    constants: dict[str, Any]
    opset: int

    def constant(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        tensor = self.constants.get(name) if name else None
        return None if tensor is None else numpy_helper.to_array(tensor)

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        shape = self.shapes.get(name)
        if shape is None or any(d is None for d in shape):
            return None
        return tuple(int(d) for d in shape)  # type: ignore[arg-type]


Rule = Callable[[Any, dict[str, Any], _Segment], "str | None"]


def _attr_text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _non_max_suppression(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    return ("TVM 0.27's frontend reads max_output_boxes_per_class, iou_threshold and score_threshold as 0 "
            "unless they are constants (no box is selected), and it keeps boxes whose IoU equals the threshold")


def _resize(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    mode = _attr_text(attrs.get("mode"), "nearest")
    coordinates = _attr_text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    if attrs.get("antialias", 0):
        return "TVM 0.27's Resize ignores antialias=1"
    if coordinates == "half_pixel_symmetric":
        return "TVM 0.27's Resize has no half_pixel_symmetric coordinate mode (it fails to build)"
    if "axes" in attrs or "keep_aspect_ratio_policy" in attrs:
        return None  # the frontend rejects these itself (a conversion error: the fallback too)
    source, target = segment.static_shape(node.input[0]), segment.static_shape(node.output[0])
    if source is None or target is None or len(source) != len(target):
        return "TVM 0.27's Resize is right only for some static size ratios; this one's sizes are not static"
    ratios = [(i, o) for i, o in zip(source, target) if i != o]
    scales = segment.constant(node.input[2]) if len(node.input) > 2 else None
    if len(node.input) > 2 and node.input[2] and scales is None:
        return "TVM 0.27's Resize is right only for some constant scales; these are computed at run time"
    if scales is not None and scales.size and coordinates not in ("align_corners", "tf_crop_and_resize"):
        if any(i and not np.isclose(o / i, s, rtol=1e-6, atol=0) for i, o, s in zip(source, target, scales.ravel())):
            return ("TVM 0.27's Resize uses the output/input size ratio where ONNX uses the given scales "
                    "(they differ when input size x scale is not an integer)")
    nearest = _attr_text(attrs.get("nearest_mode"), "round_prefer_floor")
    if mode == "nearest" and nearest.startswith("round_prefer") and not all(
            i and (o % i == 0 or i % o == 0) for i, o in ratios):
        return ("TVM 0.27's Resize computes nearest-neighbour coordinates with a rounded float32 scale, "
                "so ties (round_prefer_floor/ceil) of non-integer size ratios go the other way")
    return None


def _conv_transpose(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    if "output_shape" in attrs:
        return ("TVM 0.27's frontend ignores ConvTranspose's output_shape (graphdist rewrites it to pads only "
                "for static shapes and an output growth below the stride)")
    return None


def _is_inf(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    if not attrs.get("detect_negative", 1) or not attrs.get("detect_positive", 1):
        return ("TVM 0.27's frontend ignores IsInf's detect_negative/detect_positive (graphdist rewrites them "
                "only for typed inputs)")
    return None


def _layer_norm(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    if any(node.output[1:]):
        return ("TVM 0.27's frontend returns scalar placeholders for LayerNormalization's Mean and InvStdDev "
                "(graphdist expands the op only for typed inputs of known rank)")
    return None


def _dropout(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    if dropout_is_identity(node, segment.opset, segment.constants):
        return None
    return "TVM 0.27 runs Dropout as the identity in training mode (no random mask)"


def _rms_norm(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    shape = segment.shapes.get(node.input[0])
    axis = attrs.get("axis", -1)
    if shape is not None and (axis if axis >= 0 else axis + len(shape)) == 0:
        return "TVM 0.27 fails to build RMSNormalization over every axis (axis 0)"
    return None


def _max_pool(node: Any, attrs: dict[str, Any], segment: _Segment) -> str | None:
    if len(node.output) > 1 and node.output[1]:
        return "TVM 0.27's frontend has no MaxPool Indices output (its conversion fails: missing outputs)"
    return None


#: Op type -> rule: the reason a node of that type must run on ONNX Runtime, or ``None`` when TVM gets it
#: right. Only forms TVM 0.27 computes wrongly or cannot build, and that tvm_onnx cannot rewrite.
DENYLIST: dict[str, Rule] = {
    # Wrong values: non-constant thresholds read as 0, IoU ties kept.
    "NonMaxSuppression": _non_max_suppression,
    # Wrong values: antialias ignored, size ratio used instead of scales, nearest ties; no half_pixel_symmetric.
    "Resize": _resize,
    # Wrong values: output_shape ignored (rewritten to pads where static).
    "ConvTranspose": _conv_transpose,
    # Wrong values: detect_negative/detect_positive ignored (rewritten where typed).
    "IsInf": _is_inf,
    # Wrong values: Mean/InvStdDev are placeholders (expanded where typed).
    "LayerNormalization": _layer_norm,
    # Wrong values: training-mode Dropout is the identity.
    "Dropout": _dropout,
    # Build failure: rms_norm over all axes.
    "RMSNormalization": _rms_norm,
    # Conversion failure without the op's name: MaxPool's Indices output.
    "MaxPool": _max_pool,
}


def unsupported_nodes(model: onnx.ModelProto) -> list[Unsupported]:
    """The nodes of a (prepared) segment that TVM 0.27 cannot run correctly, by the denylist and types.

    Args:
        model: The segment as :func:`~graphdist.backends.tvm_onnx.prepare_for_tvm` returns it.

    Returns:
        One entry per such node, in graph order (empty: TVM may compile the segment).
    """
    from onnx import helper

    types, shapes = value_types(model)
    constants = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = value
    segment = _Segment(types, shapes, constants, default_opset(model))
    found = []
    for node in model.graph.node:
        typed = [_TYPES[types[name]] for name in [*node.input, *node.output] if types.get(name) in _TYPES]
        if typed:
            found.append(Unsupported(node.op_type, node.name, typed[0]))
            continue
        rule = DENYLIST.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        reason = rule(node, attrs, segment)
        if reason is not None:
            found.append(Unsupported(node.op_type, node.name, reason))
    return found


#: Control-flow ops graphdist removes while tracing when the values deciding them are known.
_CONTROL_FLOW_HINTS = {
    "Loop": "a Loop stays a node when its trip count or condition is not known when tracing (or it runs more "
            "than 64 iterations); give the trip count as a numpy value or a constant, so that graphdist unrolls "
            "it",
    "If": "an If stays a node when its condition is not known when tracing; give the inputs deciding it as "
          "numpy values, so that graphdist inlines the branch taken",
}


def _control_flow_hint(ops: tuple[str, ...]) -> str:
    hints = [_CONTROL_FLOW_HINTS[op] for op in ops if op in _CONTROL_FLOW_HINTS]
    return "".join(f" ({hint[0].upper()}{hint[1:]}.)" for hint in hints)


def compile_on_ort(model: onnx.ModelProto, device: Device, threads: int, cache_dir: Path | None,
                   err: TvmConversionError) -> FallbackExecutable:
    """Compiles a segment TVM cannot convert with the ``ort`` backend (see the module docstring).

    Args:
        model: The segment.
        device: Its device.
        threads: Its thread budget.
        cache_dir: The tvm compile's cache directory (ONNX Runtime's artefacts go to ``ort-fallback`` in it).
        err: Why TVM cannot run it.

    Raises:
        BackendError: ``device`` is a ``tpu:N`` (no fallback there), or ONNX Runtime fails too.
    """
    name = model.graph.name or "<unnamed>"
    ops = tuple(sorted({u.op for u in err.unsupported}))
    described = "; ".join(dict.fromkeys(f"{u.op}: {u.reason}" for u in err.unsupported)) or str(err)
    if device.kind == "tpu":
        named = ", ".join(map(repr, ops)) or "an op"
        raise BackendError(
            f"segment {name!r} on {device} uses {named}, which TVM cannot run ({described}). Segments on TPU-like "
            "devices are compiled by TVM only (ONNX Runtime cannot run there, so there is no fallback): "
            f"compute this part on a cpu device, or replace the op.{_control_flow_hint(ops)}"
        ) from err
    with _warned_lock:
        new = [op for op in ops or ("<unknown op>",) if op not in _warned_ops]
        _warned_ops.update(new)
    level = logging.WARNING if new else logging.DEBUG
    logger.log(level, "TVM cannot run %s of segment %r (%s); the segment runs on ONNX Runtime instead (backend "
               "'ort')", "op " + ", ".join(ops) if ops else "an op", name, described.rstrip(". "))
    try:
        inner = get_backend("ort").compile(model, device, threads=threads,
                                           cache_dir=None if cache_dir is None else cache_dir / FALLBACK_CACHE)
    except BackendError as ort_err:
        raise BackendError(f"{err} ONNX Runtime, the tvm backend's fallback for such segments, cannot run it "
                           f"either: {ort_err}") from ort_err
    stats.increment("tvm_fallbacks")
    return FallbackExecutable(inner, device, ops, described)


class FallbackExecutable:
    """A tvm segment running on ONNX Runtime (see the module docstring).

    Attributes:
        name: The segment's graph name.
        device: The device it runs on.
        input_names: Graph input names, in order.
        output_names: Graph output names, in order.
        backend: ``"ort"``: the backend that runs it.
        fallback_from: ``"tvm"``: the backend it was compiled for.
        fallback_ops: The op types TVM cannot run, sorted.
        fallback_reason: Why, one line (TVM's conversion error or the denylist's reasons).
        inner: The ONNX Runtime executable.
    """

    backend = "ort"
    fallback_from = "tvm"

    def __init__(self, inner: Any, device: Device, ops: tuple[str, ...], reason: str) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "<unnamed>")
        self.device = device
        self.input_names = list(inner.input_names)
        self.output_names = list(inner.output_names)
        self.fallback_ops = ops
        self.fallback_reason = reason

    def __repr__(self) -> str:
        return (f"FallbackExecutable({self.name!r}, device={str(self.device)!r}, backend='ort', "
                f"ops={list(self.fallback_ops)})")

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the segment on ONNX Runtime.

        Raises:
            BackendError: ONNX Runtime rejected the feeds or failed (its message names the segment).
        """
        return self.inner.run(feeds)


def fallback_note(executable: Any) -> str | None:
    """``"ort fallback (LSTM)"`` for an executable of a tvm segment that runs on ONNX Runtime, else ``None``.

    For plan summaries: ``fallback_note(executable)`` per compiled segment.
    """
    ops = getattr(executable, "fallback_ops", None)
    if ops is None:
        return None
    return f"{executable.backend} fallback ({', '.join(ops) or 'unknown op'})"
