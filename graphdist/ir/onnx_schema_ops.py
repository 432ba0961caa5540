"""Generic OpDefs for ONNX ops that have no hand-written one, made from ONNX's own schemas.

graphdist writes OpDefs by hand for the ops it traces from numpy or
differentiates (:mod:`graphdist.ir.ops`, :mod:`graphdist.ir.nn_ops`). Every
other op of an ONNX domain (``ai.onnx``, ``ai.onnx.ml``, ...) at the opset a
model imports it at still works: its OpDef is made here from the op's schema
(``onnx.defs.get_schema``):

* shapes and dtypes come from ONNX's shape inference for one node
  (``onnx.shape_inference.infer_node_outputs``), given the input types and the
  values of small constant inputs (so a constant ``shape`` or ``axes`` operand
  gives exact output shapes);
* a dimension ONNX cannot infer (a data-dependent size, as NonZero's) becomes
  a symbolic dimension named after the node and output;
* it is lowered unchanged, executed by ONNX Runtime / ``onnx.reference``, and
  has no gradient (asking for one raises ``TracingError`` naming the op).

Values that are not tensors (sequences, optionals, maps) are refused with a
:class:`~graphdist.errors.GraphError` naming the op: graphdist's values are
tensors.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphdist.errors import GraphError
from graphdist.ir.fold import run_node
from graphdist.ir.graph import Node, Value
from graphdist.ir.onnx_attributes import node_attributes
from graphdist.ir.ops import OpDef, TypeList, install_generic_ops, numpy_dtype, onnx_dtype
from graphdist.ir.subgraphs import control_flow_types, split_captures, subgraphs_of

__all__ = ["schema_since", "generic_opdef", "MAX_DATA_ELEMENTS", "tensor_type_proto", "type_of", "UNKNOWN_RANK"]

#: Constant inputs up to this many elements are handed to ONNX's inference as values (shape-like operands).
MAX_DATA_ELEMENTS = 4096

_DOMAIN_NAMES = {"": "ai.onnx", "ai.onnx": "ai.onnx"}


@functools.cache
def _schema(op_type: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def schema_since(op_type: str, domain: str, opset: int) -> int | None:
    """The since-version of ``domain.op_type``'s schema in effect at ``opset`` (``None``: no such op)."""
    schema = _schema(op_type, domain, opset)
    return None if schema is None else schema.since_version


#: Words of the import error for a value whose rank ONNX cannot infer (a model imported per call's shapes).
UNKNOWN_RANK = "has an unknown rank"


@functools.cache
def generic_opdef(op_type: str, domain: str, opset: int) -> OpDef | None:
    """The generic OpDef of ``domain.op_type`` at ``opset``, or ``None`` when ONNX has no such op."""
    schema = _schema(op_type, domain, opset)
    if schema is None or schema.deprecated:
        return None
    return OpDef(op_type, domain, _infer_from_schema(schema, domain, opset),
                 doc=f"ONNX {_DOMAIN_NAMES.get(domain, domain)}.{op_type}-{schema.since_version} "
                     "(generic: ONNX shape inference, no gradient)",
                 since=schema.since_version)


def tensor_type_proto(value: Value) -> onnx.TypeProto:
    """An ONNX tensor type for ``value`` (symbolic dimensions as ``dim_param``)."""
    return helper.make_tensor_type_proto(onnx_dtype(value.dtype), list(value.shape))


def type_of(type_proto: onnx.TypeProto, what: str, fresh_dim: Any) -> tuple[np.dtype, tuple]:
    """``(dtype, shape)`` of a tensor ``type_proto``; unknown dimensions from ``fresh_dim(axis)``.

    Raises:
        GraphError: Not a tensor type, or a tensor of unknown rank.
    """
    kind = type_proto.WhichOneof("value")
    if kind != "tensor_type":
        raise GraphError(f"{what} is a{'n' if (kind or 'x')[0] in 'aeiou' else ''} "
                         f"{(kind or 'untyped').replace('_type', '')} value; graphdist supports tensor values "
                         "only (no sequences, optionals or maps): keep this part of the model outside graphdist")
    tensor = type_proto.tensor_type
    if not tensor.elem_type:
        raise GraphError(f"{what} has no element type; give the model typed values")
    if not tensor.HasField("shape"):
        raise GraphError(f"{what} {UNKNOWN_RANK}: ONNX cannot infer it from the inputs; make the operands "
                         "that decide it (a shape or axes input) constants")
    dims = []
    for axis, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value >= 0:  # exporters write -1 for "any size"
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or fresh_dim(axis))
    return numpy_dtype(tensor.elem_type), tuple(dims)


def _input_data(node: Node) -> dict[str, onnx.TensorProto]:
    data = {}
    for index, value in enumerate(node.inputs):
        if value is not None and value.const_value is not None and np.size(value.const_value) <= MAX_DATA_ELEMENTS:
            data[f"i{index}"] = numpy_helper.from_array(np.asarray(value.const_value), f"i{index}")
    return data


def _node_proto(node: Node, num_outputs: int) -> onnx.NodeProto:
    """The node with inputs ``i0, i1, ...`` and outputs ``o0, ...`` (captured outer values: the last ``i``)."""
    inputs, captured, names = split_captures(node.inputs, node.attrs)
    proto = helper.make_node(node.op_type, ["" if v is None else f"i{i}" for i, v in enumerate(inputs)],
                             [f"o{i}" for i in range(num_outputs)], domain=node.domain)
    renames = {name: f"i{len(inputs) + j}" for j, name in enumerate(names)}
    proto.attribute.extend(node_attributes(node.attrs, renames))
    return proto


def _output_count(schema: onnx.defs.OpSchema, node: Node, num_outputs: int | None) -> int:
    if node.outputs:
        return len(node.outputs)
    if num_outputs is not None:
        return num_outputs
    formal = schema.outputs
    if formal and formal[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        raise GraphError(f"{node.op_type} ({node.name}) has a variadic output: say how many outputs it has")
    return sum(1 for p in formal if p.option == onnx.defs.OpSchema.FormalParameterOption.Single)


def _infer_from_schema(schema: onnx.defs.OpSchema, domain: str, opset: int):
    opsets = [helper.make_opsetid(domain, opset)]

    def infer(node: Node, num_outputs: int | None) -> TypeList:
        count = _output_count(schema, node, num_outputs)
        where = f"{node.op_type} ({node.name})"
        types = {f"i{i}": tensor_type_proto(v) for i, v in enumerate(node.inputs) if v is not None}
        try:
            inferred = onnx.shape_inference.infer_node_outputs(schema, _node_proto(node, count), types,
                                                               _input_data(node), opset_imports=opsets)
        except onnx.shape_inference.InferenceError as err:
            raise GraphError(f"{where}: {_first_line(err)}") from None
        except Exception as err:  # noqa: BLE001 - the C++ checker raises assorted types
            raise GraphError(f"{where}: ONNX shape inference failed ({type(err).__name__}: "
                             f"{_first_line(err)})") from None
        if subgraphs_of(node.attrs) or schema.has_function or schema.has_context_dependent_function:
            if any(not _has_shape(inferred.get(f"o{i}")) for i in range(count)):
                inferred = _infer_through_function(node, count, types, opsets) or inferred
        if subgraphs_of(node.attrs) and any(not _has_shape(inferred.get(f"o{i}")) for i in range(count)):
            inferred = {**inferred, **_control_flow_types(node, count, types)}
        if any(not _has_shape(inferred.get(f"o{i}")) for i in range(count)):
            inferred = {**inferred, **_infer_by_running(node, count, opsets)}
        result = []
        for index in range(count):
            type_proto = inferred.get(f"o{index}")
            if type_proto is None:
                raise GraphError(f"{where}: ONNX shape inference gives no type for output {index}; check the "
                                 "node's inputs and attributes against the op's schema")
            result.append(type_of(type_proto, f"output {index} of {where}",
                                  lambda axis, i=index: f"{node.name}_{i}_d{axis}"))
        return result

    return infer


def _control_flow_types(node: Node, count: int, types: dict[str, onnx.TypeProto]) -> dict[str, onnx.TypeProto]:
    """An If's or Loop's output types from its subgraphs' (ONNX's inference leaves a Loop run on static
    shapes, or an If whose branches differ in a dimension, untyped).
    """
    inputs, _, _ = split_captures(node.inputs, node.attrs)
    trips = None
    if node.op_type == "Loop" and inputs and inputs[0] is not None and inputs[0].const_value is not None \
            and (len(inputs) < 2 or inputs[1] is None):
        trips = int(np.asarray(inputs[0].const_value).reshape(-1)[0])
    found = control_flow_types(node.op_type, node.attrs, [types.get(f"i{i}") for i in range(len(inputs))],
                               trips, count)
    return {f"o{i}": t for i, t in enumerate(found) if t is not None}


def _has_shape(type_proto: onnx.TypeProto | None) -> bool:
    return (type_proto is not None and type_proto.WhichOneof("value") == "tensor_type"
            and type_proto.tensor_type.HasField("shape"))


def _infer_through_function(node: Node, count: int, types: dict[str, onnx.TypeProto],
                            opsets: list[onnx.OperatorSetIdProto]) -> dict[str, onnx.TypeProto] | None:
    """Output types from ONNX's model-level inference, which expands a function op's body (per-node
    inference of some function ops, such as GroupNormalization-18, gives no shapes).
    """
    inputs = [helper.make_value_info(name, type_proto) for name, type_proto in types.items()]
    data = _input_data(node)
    graph = helper.make_graph([_node_proto(node, count)], "infer", [i for i in inputs if i.name not in data],
                              [helper.make_empty_tensor_value_info(f"o{i}") for i in range(count)],
                              initializer=list(data.values()))
    model = helper.make_model(graph, opset_imports=opsets)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - the per-node answer stands
        return None
    found = {vi.name: vi.type for vi in [*inferred.graph.output, *inferred.graph.value_info]}
    return {f"o{i}": found[f"o{i}"] for i in range(count) if _has_shape(found.get(f"o{i}"))}


#: Inputs up to this many elements in all may be run through onnx.reference to learn output shapes.
MAX_RUN_ELEMENTS = 1 << 20


def _infer_by_running(node: Node, count: int, opsets: list[onnx.OperatorSetIdProto]) -> dict[str, onnx.TypeProto]:
    """Output types found by running the node in ``onnx.reference`` on ones and twos (constants as they are).

    The last resort for ops whose ONNX inference gives no rank (MeanVarianceNormalization, the ``ai.onnx.ml``
    Scaler or ArrayFeatureExtractor): symbolic input dimensions are given two different sizes, and an output
    dimension that follows them stays symbolic. Only the outputs whose shapes do not depend on the fill (same
    types on every run) are answered.
    """
    present = [v for v in node.inputs if v is not None]
    symbols = sorted({d for v in present for d in v.shape if not isinstance(d, int)}, key=str)
    trials = [(fill, {s: size + i for i, s in enumerate(symbols)}) for fill, size in ((1, 2), (2, 3))]
    sizes = [[_concrete(v.shape, dims) for v in present] for _, dims in trials]
    if sum(int(np.prod(shape)) for shape in sizes[0]) > MAX_RUN_ELEMENTS:
        return {}
    versions = {o.domain: o.version for o in opsets}
    results = []
    for fill, dims in trials:  # numbers that differ (value-dependent shapes differ), booleans both True
        arrays = [None if v is None else (np.asarray(v.const_value) if v.const_value is not None
                                          else np.full(_concrete(v.shape, dims), fill, dtype=v.dtype))
                  for v in node.inputs]
        results.append(run_node(node.op_type, node.domain, node.attrs, arrays, count, versions))
    if results[0] is None or results[1] is None:
        return {}
    found = {}
    for i, (a, b) in enumerate(zip(*results)):
        if a.dtype != b.dtype or a.ndim != b.ndim:
            continue
        shape = [x if x == y else _symbol_of(x, y, trials) for x, y in zip(a.shape, b.shape)]
        if all(d is not None for d in shape):
            found[f"o{i}"] = helper.make_tensor_type_proto(onnx_dtype(a.dtype), shape)
    return found


def _concrete(shape: tuple, sizes: dict[Any, int]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else sizes[d] for d in shape)


def _symbol_of(first: int, second: int, trials: list[tuple[int, dict]]) -> str | None:
    """The input symbol an output dimension followed (its sizes in both runs), else ``None``."""
    for symbol, size in trials[0][1].items():
        if size == first and trials[1][1][symbol] == second:
            return str(symbol)
    return None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


install_generic_ops(generic_opdef, schema_since)
