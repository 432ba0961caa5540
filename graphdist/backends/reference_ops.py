"""``onnx.reference`` implementations of the ``graphdist`` domain, built from
the OpDef registry's numpy reference functions.

A graph evaluated by the reference backend is one participant's view, so a
collective sees a single member: ``AllReduce``/``AllGather`` of one value and
``ReplicaId`` of replica ``attrs["replica"]`` (default 0). This lets tests run
a graph before and after a pass and compare numerics.
"""

from __future__ import annotations

from typing import Any

from onnx.reference.op_run import OpRun

from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.ir.ops import get_opdef, registered_ops

__all__ = ["graphdist_reference_ops"]


def _make_op(op_type: str) -> type[OpRun]:
    opdef = get_opdef(op_type, GRAPHDIST_DOMAIN)

    def _run(self: OpRun, *inputs: Any, **attrs: Any) -> tuple[Any, ...]:
        attrs = {k: v for k, v in attrs.items() if v is not None}
        outputs = opdef.reference(*inputs, **attrs)
        return tuple(outputs[: len(self.output)])

    return type(op_type, (OpRun,), {"op_domain": GRAPHDIST_DOMAIN, "_run": _run})


def graphdist_reference_ops() -> list[type[OpRun]]:
    """One ``OpRun`` class per graphdist op that has a numpy reference."""
    return [_make_op(op) for domain, op in registered_ops()
            if domain == GRAPHDIST_DOMAIN and get_opdef(op, domain).reference is not None]
