"""AutodiffPass: expand ``graphdist.Gradient`` nodes into backward ops.

Invariant established: no ``Gradient`` node remains; each output of a former
``Gradient(target, *sources)`` node is computed by ops that equal
d(sum(target))/d(source), built in reverse mode in one sweep over the nodes
that precede it, from the OpDef gradient rules.

Cases:
* source on the path to the target: the accumulated gradient (several uses
  of a value add up);
* source not connected to the target: zeros of the source's shape;
* an op on the path without a gradient rule (hand-written on its OpDef, or
  registered for an op with a generic OpDef: :func:`graphdist.ir.gradients.gradient_rule`):
  ``TracingError`` naming the op and the node and, for a node inlined from an
  imported model, the model and its own opset (not the trace's);
* several ``Gradient`` nodes (several tapes or calls): each expanded on its own.
"""

from __future__ import annotations

import numpy as np

from graphdist.errors import TracingError
from graphdist.ir import gradients, gradients_decomposed, gradients_ops  # noqa: F401 - registers the rules
from graphdist.ir.gradients import GradBuilder, gradient_rule
from graphdist.ir.graph import GRAPHDIST_DOMAIN, ONNX_DOMAIN, Graph, Node, Value
from graphdist.ir.ops import OPSET, get_opdef, has_opdef
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["AutodiffPass"]


def _depends_on_sources(forward: list[Node], sources: list[Value]) -> set[int]:
    reached = {id(s) for s in sources}
    for node in forward:
        if any(v is not None and id(v) in reached for v in node.inputs):
            reached.update(id(out) for out in node.outputs)
    return reached


def _accumulate(b: GradBuilder, grads: dict[int, Value], value: Value, grad: Value) -> None:
    if grad.dtype != value.dtype:
        grad = b.cast(grad, value.dtype)
    previous = grads.get(id(value))
    grads[id(value)] = grad if previous is None else b.add(previous, grad)


def _not_differentiable(node: Node) -> str:
    where = f"node {node.name!r}"
    opset = node.graph.opset if node.graph is not None else OPSET
    model = node.meta.get("model")
    if model is not None:  # inlined from an imported model: name the model's own opset, not the trace's
        where += f" of model {model!r} (opset {node.meta['model_opset']})"
    if "source" in node.meta:
        where += f", at {node.meta['source']}"
    fix = ("Rewrite that part with differentiable ops, stop the gradient before it (gd.stop_gradient), or "
           "freeze the variables it reaches (gd.onnx.load(..., frozen=[...])); the ops with gradients are "
           "listed in the README (\"ONNX models in\")")
    if node.domain == ONNX_DOMAIN and has_opdef(node.op_type) and get_opdef(node.op_type).gradient is not None:
        since = get_opdef(node.op_type).since or OPSET
        fix = (f"graphdist differentiates its form from opset {since} on, and this graph is at opset "
               f"{opset}: convert the model up (onnx.version_converter.convert_version(model, "
               f"{OPSET})) before loading it")
    at = f"opset {node.meta['model_opset']} (traced at {opset})" if model is not None else f"opset {opset}"
    return f"cannot differentiate through {node.qualified_op} ({where}): the op has no gradient rule at {at}. {fix}"


def _backward(graph: Graph, gradient_node: Node, b: GradBuilder) -> list[Value]:
    target, *sources = gradient_node.inputs
    forward = graph.nodes[: graph.nodes.index(gradient_node)]
    reached = _depends_on_sources(forward, sources)
    grads: dict[int, Value] = {id(target): b.const(np.ones(target.shape, target.dtype), target.dtype)}
    for node in reversed(forward):
        output_grads = [grads.get(id(out)) for out in node.outputs]
        if all(g is None for g in output_grads):
            continue
        if not any(v is not None and id(v) in reached for v in node.inputs):
            continue
        rule = gradient_rule(node)
        if rule is None:
            raise TracingError(_not_differentiable(node))
        input_grads = rule(b, node, output_grads)
        for value, grad in zip(node.inputs, input_grads):
            if value is not None and grad is not None and id(value) in reached:
                _accumulate(b, grads, value, grad)
    return [grads.get(id(s)) or b.zeros_like(s) for s in sources]


class AutodiffPass(PassBase):
    """Expands every ``graphdist.Gradient`` node (reverse mode)."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        gradient_nodes = graph.find_nodes("Gradient", GRAPHDIST_DOMAIN)
        if gradient_nodes and graph.opset < OPSET:
            raise TracingError(f"graph {graph.name!r} is at opset {graph.opset}: gradient rules emit ops in their "
                               f"opset-{OPSET} forms; differentiate a model called inside a step (gd.onnx.load, "
                               f"inline_graph convert it up) rather than one traced at its own opset")
        for gradient_node in gradient_nodes:
            builder = GradBuilder(graph)
            results = _backward(graph, gradient_node, builder)
            # Backward ops read only values defined before the Gradient node: place them there.
            for node in builder.created:  # backward ops run where their Gradient node was traced
                node.replica = gradient_node.replica
                node.meta.update({k: gradient_node.meta[k] for k in ("context", "variant", "micro")
                                  if k in gradient_node.meta})
            graph.insert_before(gradient_node, builder.created)
            for out, grad in zip(gradient_node.outputs, results):
                graph.replace_all_uses_with(out, grad)
            graph.remove(gradient_node)
        return PassResult(graph, modified=bool(gradient_nodes))
