"""The OpDef registry: the record of each op graphdist knows, and its lookup.

Ops are ONNX ops (opset :data:`OPSET`, ONNX semantics) plus the ``graphdist`` domain. The ops' rules are
registered by the modules that define them (:mod:`graphdist.ir.ops` and its siblings; the generic OpDefs
made from ONNX's schemas by :mod:`graphdist.ir.onnx_schema_ops`), all imported by the package's
``__init__``. This module imports no other IR module, so :class:`~graphdist.ir.graph.Graph` can infer
the types of the nodes it adds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphdist.errors import GraphError

__all__ = ["OPSET", "GRAPHDIST_OPSET", "ONNX_DOMAIN", "GRAPHDIST_DOMAIN", "OpDef", "InferFn", "register_op",
           "get_opdef", "install_generic_ops", "has_opdef", "registered_ops"]

ONNX_DOMAIN = ""
GRAPHDIST_DOMAIN = "graphdist"
OPSET = 18
GRAPHDIST_OPSET = 1

#: ``infer(node, num_outputs) -> [(dtype, shape)]`` (typed against ``Node`` as :data:`graphdist.ir.ops.InferFn`).
InferFn = Callable[[Any, "int | None"], list[tuple[np.dtype, tuple[int | str, ...]]]]


@dataclass
class OpDef:
    """Description of one op.

    Attributes:
        op_type: Op name.
        domain: ``""`` (ONNX) or ``"graphdist"``.
        infer: Shape/dtype rule.
        gradient: Reverse-mode rule (set by autodiff), or ``None``.
        reference: numpy implementation ``(*inputs, **attrs) -> tuple``.
        doc: One-line description.
        attrs: Attribute defaults.
        since: For ONNX ops, the oldest default-domain opset whose form of the op this OpDef models
            (inputs, attributes, semantics); ``None`` means the op's form at :data:`OPSET` and
            later. A graph at an older opset (an imported model) gets the generic OpDef made from
            ONNX's own schema instead (see :func:`get_opdef`).
    """

    op_type: str
    domain: str
    infer: InferFn
    gradient: Callable[..., Any] | None = None
    reference: Callable[..., tuple[np.ndarray, ...]] | None = None
    doc: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    since: int | None = None


_REGISTRY: dict[tuple[str, str], OpDef] = {}

#: Makes the OpDef of an op without a hand-written one from ONNX's schemas
#: (:mod:`graphdist.ir.onnx_schema_ops` installs it): ``(op_type, domain, opset) -> OpDef | None``.
_generic: Callable[[str, str, int], OpDef | None] | None = None
#: The since-version of ``domain.op_type``'s schema at an opset: ``(op_type, domain, opset) -> int | None``.
_schema_since: Callable[[str, str, int], int | None] | None = None


def register_op(opdef: OpDef) -> OpDef:
    """Adds (or replaces) an op in the registry."""
    _REGISTRY[(opdef.domain, opdef.op_type)] = opdef
    return opdef


def install_generic_ops(make: Callable[[str, str, int], OpDef | None],
                        since: Callable[[str, str, int], int | None]) -> None:
    """Installs the maker of generic OpDefs for ONNX ops without a hand-written one."""
    global _generic, _schema_since
    _generic, _schema_since = make, since


def _load_generic_ops() -> None:
    if _generic is None:  # graphdist.ir's __init__ imports onnx_schema_ops, which installs it
        raise GraphError("the generic ONNX OpDefs are not installed: import graphdist.ir (its package "
                         "imports graphdist.ir.onnx_schema_ops), not graphdist.ir.op_registry alone")


def _models(opdef: OpDef, opset: int) -> bool:
    """Whether the hand-written ``opdef`` models its op's form at ``opset``."""
    _load_generic_ops()
    here = _schema_since(opdef.op_type, opdef.domain, opset)
    if here is None:
        return False
    floor = _schema_since(opdef.op_type, opdef.domain, opdef.since or OPSET)
    return floor is None or here >= floor


def get_opdef(op_type: str, domain: str = ONNX_DOMAIN, opset: int | None = None) -> OpDef:
    """Returns the OpDef of ``domain.op_type`` (at ``opset``, the domain's version in the graph).

    The hand-written OpDef when there is one that models the op's form at
    ``opset`` (see :attr:`OpDef.since`); otherwise, for ops with an ONNX
    schema, a generic OpDef made from it (shapes from ONNX's shape inference,
    lowered unchanged, no gradient). ``opset=None`` asks for the hand-written
    OpDef only.

    Raises:
        GraphError: No such op (at that opset).
    """
    opdef = _REGISTRY.get((domain, op_type))
    if opdef is not None and (opset is None or domain == GRAPHDIST_DOMAIN or _models(opdef, opset)):
        return opdef
    _load_generic_ops()
    if opset is not None:
        generic = _generic(op_type, domain, opset)
        if generic is not None:
            return generic
    raise GraphError(_unknown_op_message(op_type, domain, opset))


def _unknown_op_message(op_type: str, domain: str, opset: int | None) -> str:
    qualified = f"{domain + '.' if domain else ''}{op_type}"
    if opset is None or domain == GRAPHDIST_DOMAIN:
        known = sorted(o for d, o in _REGISTRY if d == domain)
        return f"op {qualified} is not supported by graphdist; supported ops in this domain: {', '.join(known)}"
    domain_name = domain or "ai.onnx"
    removed = _schema_since(op_type, domain, opset)
    if removed is not None:
        return (f"op {qualified} was removed from {domain_name!r} at opset {removed} (the model uses opset "
                f"{opset}); export the model with an opset older than {removed} or replace the op")
    first = _schema_since(op_type, domain, 10**4)
    if first is None:
        return (f"op {qualified} is not an op graphdist knows: no ONNX schema in domain "
                f"{domain_name!r} (custom and contrib domains are not supported)")
    return (f"op {qualified} does not exist at opset {opset} of domain {domain_name!r} (it is newer): raise the "
            f"model's opset_import for {domain_name!r}")


def has_opdef(op_type: str, domain: str = ONNX_DOMAIN) -> bool:
    """True when ``domain.op_type`` has a hand-written OpDef."""
    return (domain, op_type) in _REGISTRY


def registered_ops() -> list[tuple[str, str]]:
    """Every registered ``(domain, op_type)`` pair."""
    return sorted(_REGISTRY)
