"""Which elements of a folded shape computation come from the per-replica batch size.

An imported model computes shapes at run time: ``Shape(x) -> Slice -> Concat
-> Reshape``. Traced with static shapes, the computation folds to a constant
(:func:`graphdist.ir.fold.fold_node`), and where ``x``'s first dimension is
the per-replica batch (:class:`graphdist.ir.batch.BatchDim`) the constant
must remember which of its elements are ``scale * B + offset``, so that
``RebatchPass`` can recompute them for another replica count; otherwise the
batch the step was traced with is baked into the plan.

:func:`folded_provenance` follows that record through the ops shape
computations are made of:

* ``Shape``: the ``BatchDim`` dimensions of its input;
* ops that only move, select or repeat elements (``Identity``, ``Cast`` to an
  integer type, ``Reshape``, ``Squeeze``, ``Unsqueeze``, ``Flatten``, ``Gather``,
  ``Slice``, ``Concat``, ``Expand``, ``Tile``, ``Transpose``): found by running
  the same op on the element indices;
* ``Add``, ``Sub``, ``Mul`` (by a plain integer), ``Neg``: affine arithmetic.

Any other op on a recorded element gives an unrecorded constant: the exporter's
re-batch check (tracing again at another batch size) then refuses to re-plan
the step, rather than letting it be silently wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphdist.ir import batch
from graphdist.ir.fold import run_node
from graphdist.ir.graph import ONNX_DOMAIN, Value

__all__ = ["folded_provenance"]

Provenance = list[tuple[int, int] | None]

#: Ops whose output elements are copies of their data inputs' elements, and which inputs are data.
_MOVING = {"Identity": (0,), "Cast": (0,), "Reshape": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,),
           "Gather": (0,), "Slice": (0,), "Expand": (0,), "Tile": (0,), "Transpose": (0,), "Concat": None}
_ARITHMETIC = ("Add", "Sub", "Mul", "Neg")


def _provenance_of(value: Value | None) -> Provenance | None:
    if value is None:
        return None
    return batch.elements(value.meta.get("batch"))


def folded_provenance(op_type: str, domain: str, attrs: Mapping[str, Any], inputs: Sequence[Value | None],
                      outputs: Sequence[np.ndarray], opset_imports: Mapping[str, int]) -> list[Provenance | None]:
    """Per folded output: which elements are affine in the per-replica batch size (``None``: none is).

    Args:
        op_type: The folded node's op.
        domain: Its domain (only ``ai.onnx`` ops are followed).
        attrs: Its attributes.
        inputs: Its inputs: constants, or the value whose ``Shape`` was taken.
        outputs: The folded arrays.
        opset_imports: The graph's opsets (to run the op on element indices).
    """
    nothing: list[Provenance | None] = [None] * len(outputs)
    if domain not in ("", ONNX_DOMAIN) or len(outputs) != 1 or np.asarray(outputs[0]).dtype.kind not in "iu":
        return nothing
    if op_type == "Shape":
        return [_shape_provenance(attrs, inputs[0])]
    known = [_provenance_of(v) for v in inputs]
    if not any(known):
        return nothing
    if op_type in _MOVING:
        return [_moved(op_type, attrs, inputs, known, outputs[0], opset_imports)]
    if op_type in _ARITHMETIC:
        return [_affine(op_type, inputs, known, outputs[0])]
    return nothing


def _shape_provenance(attrs: Mapping[str, Any], value: Value | None) -> Provenance | None:
    if value is None:
        return None
    rank = len(value.shape)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    end = rank if end is None else int(end)
    start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
    items = [batch.affine(d) for d in value.shape[start:end]]
    return items if any(items) else None


def _moved(op_type: str, attrs: Mapping[str, Any], inputs: Sequence[Value | None], known: list[Provenance | None],
           output: np.ndarray, opset_imports: Mapping[str, int]) -> Provenance | None:
    """Runs the op on element indices (offset per data input) to learn where each output element came from."""
    data = _MOVING[op_type] or tuple(range(len(inputs)))
    arrays: list[Any] = [None if v is None else np.asarray(v.const_value) for v in inputs]
    sources: Provenance = []
    for position in data:
        array = arrays[position]
        if array is None:
            return None
        size = int(np.size(array))
        arrays[position] = np.arange(len(sources), len(sources) + size, dtype=np.int64).reshape(np.shape(array))
        sources.extend(known[position] or [None] * size)
    call_attrs = dict(attrs)
    if op_type == "Cast":
        call_attrs["to"] = 7  # int64: the indices survive any integer Cast of the real values
    results = run_node(op_type, "", call_attrs, arrays, 1, opset_imports)
    if results is None or np.shape(results[0]) != np.shape(output):
        return None
    items = [sources[int(i)] for i in np.asarray(results[0]).reshape(-1)]
    return items if any(items) else None


def _affine(op_type: str, inputs: Sequence[Value | None], known: list[Provenance | None],
            output: np.ndarray) -> Provenance | None:
    """Elementwise ``Add`` / ``Sub`` / ``Mul`` / ``Neg`` of affine elements; a product of two is not affine."""
    operands = []
    for value, items in zip(inputs, known):
        if value is None:
            return None
        array = np.asarray(value.const_value).astype(np.int64)
        flat = array.reshape(-1)
        affine = [items[i] if items and items[i] is not None else (0, int(flat[i])) for i in range(flat.size)]
        pairs = np.array(affine, dtype=np.int64).reshape((*array.shape, 2))
        operands.append(pairs)
    try:
        shape = np.broadcast_shapes(*(o.shape[:-1] for o in operands))
    except ValueError:
        return None
    if shape != np.shape(output):
        return None
    expanded = [np.broadcast_to(o, (*shape, 2)).reshape(-1, 2) for o in operands]
    items: Provenance = []
    for parts in zip(*expanded):
        scale, offset = _combine(op_type, [(int(p[0]), int(p[1])) for p in parts])
        items.append(None if scale is None or scale == 0 else (scale, offset))
    return items if any(items) else None


def _combine(op_type: str, parts: list[tuple[int, int]]) -> tuple[int | None, int]:
    if op_type == "Neg":
        return -parts[0][0], -parts[0][1]
    (a_scale, a_offset), (b_scale, b_offset) = parts
    if op_type == "Add":
        return a_scale + b_scale, a_offset + b_offset
    if op_type == "Sub":
        return a_scale - b_scale, a_offset - b_offset
    if a_scale and b_scale:  # B * B
        return None, 0
    return a_scale * b_offset + b_scale * a_offset, a_offset * b_offset
