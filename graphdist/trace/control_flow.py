"""``If`` nodes of an inlined graph: the taken branch when the condition is known, else the node.

An imported model's ``If`` often decides on something the trace knows: a
sample rate given as a numpy value, a batch size (``Shape -> Gather ->
Equal``), a constant. When the condition is a constant of the trace, the
taken branch is imported with the types its outer values have in the trace
(so its own shape computations and nested ``If`` s fold in turn) and inlined
in the node's place, as ONNX Runtime's constant folding does: the replica's
graph then holds ordinary ops that every pass and backend handles.

When the condition is only known at run time, the node stays, and each
branch is imported the same way and written back as a subgraph: nested
``If`` s on static shapes are gone from it, so ONNX Runtime, which types
subgraphs against the static shapes of a replica's segment, accepts it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphdist.errors import GraphError, TracingError
from graphdist.ir.graph import ONNX_DOMAIN, Graph, Value
from graphdist.ir.onnx_io import ORT_IR_VERSION, from_onnx, to_onnx
from graphdist.ir.ops import onnx_dtype
from graphdist.ir.subgraphs import CAPTURES_ATTR, free_names, split_captures

__all__ = ["BRANCHES", "known_condition", "taken_branch", "specialised_branches"]

logger = logging.getLogger(__name__)

#: The ``If`` attributes holding its branches, by the condition's value.
BRANCHES = {True: "then_branch", False: "else_branch"}


def known_condition(op_type: str, domain: str, inputs: Sequence[Value | None]) -> bool | None:
    """The value of an ``If`` node's condition when it is a constant of the trace, else ``None``."""
    if op_type != "If" or domain != ONNX_DOMAIN or not inputs or inputs[0] is None:
        return None
    value = inputs[0].const_value
    if value is None or np.size(value) != 1:
        return None
    return bool(np.asarray(value).reshape(-1)[0])


def taken_branch(graph: Graph, node_name: str, attrs: Mapping[str, Any], inputs: Sequence[Value],
                 condition: bool) -> tuple[Graph, list[Value]]:
    """The branch an ``If`` on a known condition takes, as a graph, and the trace values it reads.

    Returns:
        ``(branch, arguments)``: a graph whose inputs are the outer values the
        branch reads (typed as ``arguments``, the trace values in their place),
        ready for :func:`graphdist.trace.inline.inline_graph`.
    """
    _, captured, names = split_captures(inputs, attrs)
    branch = _branch_graph(graph, node_name, BRANCHES[condition], attrs, names, captured)
    used = {value.name for value in branch.inputs}
    arguments = [value for name, value in zip(names, captured) if name in used]
    return branch, arguments


def specialised_branches(graph: Graph, node_name: str, attrs: dict[str, Any],
                         inputs: Sequence[Value]) -> dict[str, Any]:
    """``attrs`` of an ``If`` kept for run time, each branch imported with the trace's types of the values
    it reads and written back: what folds on static shapes (nested ``If`` s on a batch size) is folded.

    A branch that cannot be imported (an op graphdist cannot type) is kept as written.
    """
    _, captured, names = split_captures(inputs, attrs)
    result = dict(attrs)
    for name in BRANCHES.values():
        try:
            branch = _branch_graph(graph, node_name, name, attrs, names, captured)
        except GraphError as err:
            logger.debug("If %s: %s kept as written (%s)", node_name, name, err)
            continue
        proto = to_onnx(branch).graph
        outer = {value.name for value in proto.input}
        del proto.input[:]  # a branch takes no inputs: it reads the captured values by name
        result[name] = helper.make_attribute(name, proto)
        stray = set(free_names([proto])) - outer - set(names)
        if stray:
            raise TracingError(f"If {node_name}: its specialised {name} reads {sorted(stray)}, which it does not "
                               "capture")
    result[CAPTURES_ATTR] = list(names)
    return result


def _branch_graph(graph: Graph, node_name: str, which: str, attrs: Mapping[str, Any], names: Sequence[str],
                  captured: Sequence[Value]) -> Graph:
    """Branch ``which`` of the ``If`` node ``node_name`` of ``graph`` imported with ``captured``'s types
    (cached on ``graph`` per types: a graph is inlined once per trace, and traced again per input shape).
    """
    types = tuple((name, value.dtype.str, tuple(value.shape)) for name, value in zip(names, captured))
    cache = graph.meta.setdefault("branches", {})
    key = (node_name, which, types)
    if key not in cache:
        cache[key] = _import_branch(graph, node_name, attrs[which].g, names, captured)
    return cache[key]


def _import_branch(graph: Graph, node_name: str, branch: onnx.GraphProto, names: Sequence[str],
                   captured: Sequence[Value]) -> Graph:
    reads = set(free_names([branch]))
    inputs = [helper.make_tensor_value_info(name, onnx_dtype(value.dtype), list(value.shape))
              for name, value in zip(names, captured) if name in reads]
    body = helper.make_graph(list(branch.node), f"{graph.name}/{node_name}/{branch.name}", inputs,
                             list(branch.output), initializer=list(branch.initializer),
                             value_info=list(branch.value_info))
    opsets = [helper.make_opsetid(domain, version) for domain, version in sorted(graph.opset_imports.items())]
    model = helper.make_model(body, opset_imports=opsets, producer_name="graphdist.control_flow")
    model.ir_version = max(ORT_IR_VERSION, helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    try:
        imported = from_onnx(model)
    except GraphError as err:
        raise GraphError(f"branch {branch.name!r} of If {node_name}: {err}") from None
    imported.name = body.name
    return imported
