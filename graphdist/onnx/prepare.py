"""The forms of an ONNX model that :class:`graphdist.onnx.OnnxModel` imports.

* :func:`clean_model`: the model as written, less the unused optional outputs
  ONNX cannot type (``Dropout``-7's ``mask``, whose shape inference ONNX never
  wrote), which graphdist's import would refuse.
* :func:`variable_initializers`: which initializers become variables: the
  floating-point ones, except those that decide shapes (a ``Resize``'s
  ``scales``), which must stay constants for graphdist's static shapes.
* :func:`with_variables_as_inputs`: the model with those initializers turned
  into graph inputs after the model's own, so that import folds nothing that
  depends on a weight (a ``Transpose`` or ``Unsqueeze`` of a weight stays an
  op, and its gradient reaches the weight) and a trace feeds them from the
  variables.
* :func:`training_model`: the training form: ``Dropout`` with
  ``training_mode=True`` (and a ``mask`` output, which its gradient reads)
  and, with ``batch_norm="update"``, ``BatchNormalization`` with
  ``training_mode=1`` (batch statistics), whose new running mean and
  variance become extra graph outputs (the caller assigns them to the
  variables); with ``batch_norm="frozen"`` (the default) BatchNormalization
  keeps its inference form. Models older than those forms are converted up
  first with ONNX's version converter.
* :func:`promote_constants`: float ``Constant`` nodes that hold weights
  (Paddle2ONNX writes every weight so) become initializers, so that
  :func:`variable_initializers` makes them variables.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphdist.errors import GraphError
from graphdist.ir.ops import OPSET
from graphdist.ir.value_operands import static_input_names

__all__ = ["clean_model", "variable_initializers", "with_variables_as_inputs", "training_model", "TrainingForm",
           "model_opset", "promote_constants", "Promotion", "running_statistics", "BATCH_NORM_MODES"]

logger = logging.getLogger(__name__)

_OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional

#: The first opsets with Dropout's ``training_mode`` input and BatchNormalization's ``training_mode`` attribute.
DROPOUT_TRAINING_SINCE = 12
BATCH_NORM_TRAINING_SINCE = 15
#: What ``training=True`` does to BatchNormalization (see :func:`training_model`).
BATCH_NORM_MODES = ("frozen", "update")


def model_opset(model: onnx.ModelProto) -> int:
    """The model's ``ai.onnx`` opset."""
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def clean_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` less its unused trailing optional node outputs that ONNX's inference leaves untyped.

    Leaving out an unused optional output does not change what a node
    computes for the outputs kept (ONNX allows either spelling); the others
    stay, so ``BatchNormalization``-9's training outputs keep it in training
    mode. Returns ``model`` itself when nothing is removed.
    """
    graph = model.graph
    used = {name for node in graph.node for name in node.input} | {vi.name for vi in graph.output}
    opset = model_opset(model)
    candidates = []
    for index, node in enumerate(graph.node):
        if len(node.output) > 1 and node.output[-1] not in used and node.domain in ("", "ai.onnx"):
            try:
                schema = onnx.defs.get_schema(node.op_type, opset, "")
            except onnx.defs.SchemaError:
                continue
            candidates.append((index, schema))
    if not candidates:
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - import reports the model's own problems
        return model
    typed = {vi.name for vi in [*inferred.graph.value_info, *inferred.graph.output]
             if vi.type.tensor_type.HasField("shape")}
    cleaned = _copy(model)
    removed = []
    for index, schema in candidates:
        node = cleaned.graph.node[index]
        outputs = list(node.output)
        while (len(outputs) > 1 and outputs[-1] not in used and outputs[-1] not in typed
               and len(outputs) <= len(schema.outputs) and schema.outputs[len(outputs) - 1].option == _OPTIONAL):
            removed.append(f"{node.op_type} {node.name or index}: {outputs.pop()}")
        del node.output[:]
        node.output.extend(outputs)
    if not removed:
        return model
    logger.debug("left out unused optional outputs ONNX cannot type: %s", "; ".join(removed))
    return cleaned


def variable_initializers(model: onnx.ModelProto) -> list[str]:
    """Names of the floating-point initializers that do not decide shapes, in initializer order."""
    floats = [t.name for t in model.graph.initializer
              if onnx.helper.tensor_dtype_to_np_dtype(t.data_type).kind == "f"]
    if not floats:
        return []
    probe = with_variables_as_inputs(model, floats)
    static = set(static_input_names(probe))
    if static:
        logger.info("initializer(s) %s decide shapes: they stay constants", ", ".join(sorted(static)))
    return [name for name in floats if name not in static]


def with_variables_as_inputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers ``names`` are graph inputs (appended in that order) instead."""
    if not names:
        return model
    wanted = set(names)
    copy = _copy(model)
    graph = copy.graph
    tensors = {t.name: t for t in graph.initializer if t.name in wanted}
    kept = [t for t in graph.initializer if t.name not in wanted]
    inputs = [vi for vi in graph.input if vi.name not in wanted]  # IR < 4 lists initializers as inputs too
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.input[:]
    graph.input.extend(inputs)
    graph.input.extend(helper.make_tensor_value_info(name, tensors[name].data_type, list(tensors[name].dims))
                       for name in names)
    return copy


@dataclass
class TrainingForm:
    """The training form of a model.

    Attributes:
        model: The model in training form (variables as inputs, as given).
        updates: ``(extra output name, variable initializer name)`` for each
            running statistic a BatchNormalization computes; the extra
            outputs follow the model's own outputs, in this order.
    """

    model: onnx.ModelProto
    updates: list[tuple[str, str]]


def training_model(model: onnx.ModelProto, variables: Sequence[str],
                   batch_norm: str = "frozen") -> TrainingForm | None:
    """The training form of ``model`` (see the module docstring); ``None`` when nothing changes.

    Args:
        model: The model with its variables as inputs.
        variables: The names of those variable inputs (running statistics
            that are not variables stay as they are: constants cannot move).
        batch_norm: ``"frozen"``: BatchNormalization keeps its inference
            form (running statistics, which do not move); ``"update"``:
            batch statistics, and the running ones move.

    Raises:
        GraphError: The model needs converting to a newer opset and ONNX's
            version converter fails.
    """
    if batch_norm not in BATCH_NORM_MODES:
        raise ValueError(f"batch_norm must be one of {BATCH_NORM_MODES}, got {batch_norm!r}")
    ops = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
    if batch_norm == "frozen":
        ops.discard("BatchNormalization")
    if not ops & {"Dropout", "BatchNormalization"}:
        return None
    needed = BATCH_NORM_TRAINING_SINCE if "BatchNormalization" in ops else DROPOUT_TRAINING_SINCE
    opset = model_opset(model)
    copy = _copy(model)
    if opset < needed:
        from onnx import version_converter

        target = max(needed, OPSET)
        try:
            copy = version_converter.convert_version(copy, target)
        except Exception as err:  # noqa: BLE001 - the converter raises assorted errors
            raise GraphError(f"the model is at opset {opset}; its training form (training=True) needs "
                             f"Dropout/BatchNormalization of opset {needed} or newer, and ONNX's version converter "
                             f"failed ({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''})"
                             f"; export the model at opset {target} or newer") from None
        logger.info("converted the model from opset %d to %d for its training form", opset, target)
    graph = copy.graph
    taken = {name for node in graph.node for name in [*node.input, *node.output]}
    taken |= {t.name for t in graph.initializer} | {vi.name for vi in graph.input}
    variable_set = set(variables)
    input_types = {vi.name: vi.type for vi in graph.input}
    updates: list[tuple[str, str]] = []

    def fresh(hint: str) -> str:
        name, index = hint, 0
        while name in taken:
            index += 1
            name = f"{hint}_{index}"
        taken.add(name)
        return name

    true_name = None
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Dropout":
            if true_name is None:
                true_name = fresh("graphdist_training_mode")
                graph.initializer.append(numpy_helper.from_array(np.array(True), true_name))
            inputs = list(node.input) + [""] * (3 - len(node.input))
            inputs[2] = true_name
            del node.input[:]
            node.input.extend(inputs)
            if len(node.output) < 2:  # the gradient needs the mask of the elements kept
                node.output.append(fresh(f"{node.output[0]}_mask"))
        elif node.op_type == "BatchNormalization" and batch_norm == "update":
            _set_attribute(node, "training_mode", 1)
            outputs = list(node.output[:1])
            for position in (3, 4):  # input_mean, input_var -> running_mean, running_var
                source = node.input[position]
                output = fresh(f"{source}_running")
                outputs.append(output)
                if source in variable_set:
                    graph.output.append(helper.make_value_info(output, input_types[source]))
                    updates.append((output, source))
            del node.output[:]
            node.output.extend(outputs)
    return TrainingForm(copy, updates)


def _set_attribute(node: onnx.NodeProto, name: str, value: int) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


# ------------------------------------------------------------ Constant weights
#: Inputs that hold an op's learned weights, by position: a float ``Constant`` feeding one is promoted.
WEIGHT_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (0, 1), "BatchNormalization": (1, 2),
    "LayerNormalization": (1, 2), "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2), "PRelu": (1,),
}
#: BatchNormalization's running mean and variance: promoted too, as frozen (non-trainable) variables.
STATISTICS_INPUTS: dict[str, tuple[int, ...]] = {"BatchNormalization": (3, 4)}
#: Ops whose output a following ``Add`` of a constant biases (exporters write ``MatMul -> Add(bias)``).
BIASED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
#: Ops a weight may pass through (as their first input) on its way to the op that uses it.
PASS_THROUGH = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Transpose", "Identity", "Flatten"})


@dataclass
class Promotion:
    """The result of :func:`promote_constants`.

    Attributes:
        model: The model with the promoted ``Constant`` nodes replaced by initializers of the same names
            (``model`` itself when nothing was promoted).
        weights: Names of the promoted weights (trainable variables), in node order.
        statistics: Names of the promoted running statistics (frozen variables), in node order.
    """

    model: onnx.ModelProto
    weights: list[str]
    statistics: list[str]

    @property
    def names(self) -> list[str]:
        """Every promoted name."""
        return [*self.weights, *self.statistics]


def _float_constant(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor of a ``Constant`` node's ``value`` attribute when it is floating point, else ``None``."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return None
    attribute = node.attribute[0]
    if attribute.name != "value" or attribute.type != onnx.AttributeProto.TENSOR:
        return None
    kind = helper.tensor_dtype_to_np_dtype(attribute.t.data_type).kind
    return attribute.t if kind == "f" else None


def _uses(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node, position))
    return uses


def _role(name: str, uses: dict[str, list[tuple[onnx.NodeProto, int]]],
          producers: dict[str, onnx.NodeProto]) -> str | None:
    """``"weight"``, ``"statistics"`` or ``None``: what the value ``name`` is to the ops it reaches."""
    role = None
    for node, position in uses.get(name, []):
        if node.domain not in ("", "ai.onnx"):
            continue
        if position in STATISTICS_INPUTS.get(node.op_type, ()):
            role = role or "statistics"
        elif position in WEIGHT_INPUTS.get(node.op_type, ()):
            return "weight"
        elif node.op_type == "Add" and len(node.input) == 2:
            other = producers.get(node.input[1 - position])
            if other is not None and other.op_type in BIASED_OPS:
                return "weight"
        elif node.op_type in PASS_THROUGH and position == 0:
            if _role(node.output[0], uses, producers) == "weight":
                return "weight"
    return role


def promote_constants(model: onnx.ModelProto) -> Promotion:
    """Turns the floating-point ``Constant`` nodes that hold weights into initializers (Paddle2ONNX's way).

    A ``Constant`` is promoted when it feeds (directly, or through a
    ``Reshape``/``Unsqueeze``/``Transpose``/...) a weight input of an op in
    :data:`WEIGHT_INPUTS`, or is the bias ``Add`` ed to a Conv/MatMul/Gemm
    output; one feeding BatchNormalization's mean or variance is promoted as
    running statistics. Constants of the main graph only (not subgraphs).
    Everything the model computes is unchanged: the initializer has the
    Constant's name and value.
    """
    graph = model.graph
    uses = _uses(graph)
    producers = {out: node for node in graph.node for out in node.output}
    weights: list[str] = []
    statistics: list[str] = []
    tensors: dict[int, onnx.TensorProto] = {}
    for index, node in enumerate(graph.node):
        tensor = _float_constant(node)
        if tensor is None:
            continue
        role = _role(node.output[0], uses, producers)
        if role is not None:
            (weights if role == "weight" else statistics).append(node.output[0])
            tensors[index] = tensor
    if not tensors:
        return Promotion(model, [], [])
    promoted = _copy(model)
    kept = [node for index, node in enumerate(promoted.graph.node) if index not in tensors]
    del promoted.graph.node[:]
    promoted.graph.node.extend(kept)
    for index, tensor in tensors.items():
        initializer = promoted.graph.initializer.add()
        initializer.CopyFrom(tensor)
        initializer.name = graph.node[index].output[0]
        if promoted.ir_version < 4:  # before IR 4, every initializer is also a graph input
            promoted.graph.input.append(helper.make_tensor_value_info(initializer.name, initializer.data_type,
                                                                      list(initializer.dims)))
    return Promotion(promoted, weights, statistics)


def running_statistics(model: onnx.ModelProto) -> set[str]:
    """Names of the values that are some BatchNormalization's running mean or variance."""
    return {node.input[position] for node in model.graph.node if node.domain in ("", "ai.onnx")
            for position in STATISTICS_INPUTS.get(node.op_type, ()) if position < len(node.input)}
