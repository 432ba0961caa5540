"""Lowering of graphdist graphs to ONNX and import of ONNX graphs.

Ops are ONNX ops already, so both directions are near-identity. Lowering
declares the ``graphdist`` domain whenever a graphdist op remains (such a model
is valid ONNX and opens in Netron, but only graphdist can execute it) and sets
an IR version ONNX Runtime accepts (onnx 1.23 writes IR 14 by default, ORT
1.31 reads at most 13).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphdist.errors import GraphError
from graphdist.ir.comm_ops import SUMMED_GROUP, SUMMED_REPLICAS
from graphdist.ir.fold import fold_node
from graphdist.ir.graph import GRAPHDIST_DOMAIN, ONNX_DOMAIN, Graph, Node, Value, register_view
from graphdist.ir.onnx_attributes import attribute_proto, node_attributes
from graphdist.ir.onnx_checks import check_single_assignment, tensor_array
from graphdist.ir.onnx_schema_ops import generic_opdef, type_of
from graphdist.ir.ops import GRAPHDIST_OPSET, OPSET, get_opdef, numpy_dtype, onnx_dtype
from graphdist.ir.subgraphs import CAPTURES_ATTR, free_names, split_captures, subgraphs_of

__all__ = ["to_onnx", "from_onnx", "attribute_proto", "ORT_IR_VERSION", "MAX_OPSET"]

#: Least IR version written into every model (more when the opsets need it); ONNX Runtime 1.31
#: accepts at most 13.
ORT_IR_VERSION = 10
#: The newest default-domain opset ONNX Runtime 1.31 loads: imported models may use any opset up to it.
MAX_OPSET = 26


def _value_info(value: Value) -> onnx.ValueInfoProto:
    dims = [d if isinstance(d, (int, str)) else None for d in value.shape]
    return helper.make_tensor_value_info(value.name, onnx_dtype(value.dtype), dims)


#: graphdist ops that are the identity at run time: written as ONNX Identity (tagged, their attributes as
#: JSON in ``graphdist_attrs``) so any runtime can execute a traced graph; import restores them from the tag.
#: ``ShardingConstraint`` reaches a segment only under a strategy without layouts, where it pins nothing.
_RUNTIME_IDENTITIES = frozenset({"StopGradient", "ShardingConstraint"})


def _node_proto(node: Node, keep_meta: bool = False) -> onnx.NodeProto:
    as_identity = node.domain == GRAPHDIST_DOMAIN and node.op_type in _RUNTIME_IDENTITIES
    inputs, captured, captured_names = split_captures(node.inputs, node.attrs)
    proto = helper.make_node(
        "Identity" if as_identity else node.op_type,
        ["" if v is None else v.name for v in inputs],
        [v.name for v in node.outputs],
        name=node.name,
        domain="" if as_identity else node.domain,
    )
    if not as_identity:  # ONNX's Identity takes no attributes
        proto.attribute.extend(node_attributes(node.attrs, dict(zip(captured_names, (v.name for v in captured)))))
    if as_identity:
        entry = proto.metadata_props.add()
        entry.key, entry.value = "graphdist_op", node.op_type
        if node.attrs:
            entry = proto.metadata_props.add()
            entry.key, entry.value = "graphdist_attrs", json.dumps(node.attrs)
    for key, text in (("device", node.device), ("replica", node.replica)):
        if text is not None:
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, str(text)
    for key in (*_KEPT_META, *_SUMMED_META) if keep_meta else _SUMMED_META:
        if node.meta.get(key) not in (None, False):
            entry = proto.metadata_props.add()
            entry.key, entry.value = f"graphdist.{key}", str(node.meta[key])
    return proto


#: ``node.meta`` entries a traced graph writes as node metadata (``graphdist.<key>``) and import reads
#: back: a traced graph stored in a plan directory keeps which nodes each replica computes and which
#: must always run. (Other stages leave them out: segments' bytes key the compile cache.)
_KEPT_META = ("context", "variant", "side_effect", "source")
#: Written at every stage: which all-reduce group a sum on its reader replaced
#: (``LowerSingleReaderAllReducesPass``), so a loaded plan's summary lists it like the compiled one's.
_SUMMED_META = (SUMMED_GROUP, SUMMED_REPLICAS)


def _restore_meta(node: Node, proto: onnx.NodeProto) -> None:
    for prop in proto.metadata_props:
        key = prop.key.removeprefix("graphdist.")
        if prop.key.startswith("graphdist.") and key in (*_KEPT_META, *_SUMMED_META):
            value: Any = prop.value
            if key == "side_effect":
                value = True
            elif key == SUMMED_REPLICAS:
                value = int(prop.value)
            node.meta[key] = value


def to_onnx(graph: Graph, *, opset: int | None = None, doc: str = "") -> onnx.ModelProto:
    """Lowers ``graph`` to a checked ``onnx.ModelProto``.

    Args:
        graph: Graph to lower.
        opset: Default-domain opset version (default: the graph's, ``graph.opset``).
        doc: Model doc string.

    Returns:
        A model that passes ``onnx.checker.check_model``.
    """
    initializers = [numpy_helper.from_array(np.asarray(v.const_value), v.name) for v in graph.initializers.values()]
    outputs = {id(v) for v in graph.outputs}
    graph_proto = helper.make_graph(
        [_node_proto(n, keep_meta=graph.stage == "traced") for n in graph.nodes],
        graph.name,
        [_value_info(v) for v in graph.inputs],
        [_value_info(v) for v in graph.outputs],
        initializer=initializers,
        value_info=[_value_info(out) for n in graph.nodes for out in n.outputs if id(out) not in outputs],
    )
    versions = {**graph.opset_imports, ONNX_DOMAIN: opset if opset is not None else graph.opset}
    if any(n.domain == GRAPHDIST_DOMAIN for n in graph.nodes):
        versions[GRAPHDIST_DOMAIN] = GRAPHDIST_OPSET
    opsets = [helper.make_opsetid(domain, version) for domain, version in sorted(versions.items())]
    model = helper.make_model(graph_proto, opset_imports=opsets, producer_name="graphdist", doc_string=doc)
    model.ir_version = max(ORT_IR_VERSION, helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    return model


# ------------------------------------------------------------------ import
#: Attribute kinds imported as Python values; the others (graphs, type protos, sparse tensors) stay
#: ``AttributeProto`` objects that lowering writes back unchanged.
_PYTHON_ATTRIBUTES = frozenset({onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING,
                                onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS,
                                onnx.AttributeProto.TENSOR})


def _python_attr(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if attr.type not in _PYTHON_ATTRIBUTES or (isinstance(value, list) and not value):
        return attr  # kept as is: lowering writes it back with its own type
    if isinstance(value, bytes):
        return value.decode()
    if attr.type == onnx.AttributeProto.STRINGS:
        return [v.decode() for v in value]
    if isinstance(value, onnx.TensorProto):
        return tensor_array(value, f"attribute {attr.name!r}")
    return value


def _load_model_file(path: str) -> onnx.ModelProto:
    if not os.path.isfile(path):
        raise GraphError(f"ONNX file {path!r} does not exist")
    try:
        model = onnx.load(path)
    except Exception as err:  # noqa: BLE001 - protobuf raises several unrelated types
        raise GraphError(f"{path!r} is not a readable ONNX model ({type(err).__name__}: {err})") from err
    if not model.graph.node and not model.graph.output:
        raise GraphError(f"{path!r} holds no ONNX graph (empty or not an ONNX file)")
    return model


def model_opsets(model: onnx.ModelProto) -> dict[str, int]:
    """The model's opset per domain (``""`` for ``ai.onnx``), checked against what graphdist can run.

    Raises:
        GraphError: The default-domain opset is newer than ONNX Runtime loads.
    """
    versions = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    versions.setdefault(ONNX_DOMAIN, OPSET)
    if versions[ONNX_DOMAIN] > MAX_OPSET:
        raise GraphError(f"the model uses opset {versions[ONNX_DOMAIN]} of ai.onnx; ONNX Runtime (and so "
                         f"graphdist) runs opsets up to {MAX_OPSET}: export it with opset {MAX_OPSET} or older")
    return versions


def from_onnx(model: onnx.ModelProto | str | os.PathLike[str]) -> Graph:
    """Imports an ONNX model (or a path to one) into a graphdist graph, at the model's own opsets.

    ``Constant`` nodes become initializers. Ops with a hand-written OpDef that
    models their form at the model's opset use it; every other op of an ONNX
    domain gets a generic OpDef from ONNX's schema
    (:mod:`graphdist.ir.onnx_schema_ops`). Nothing is converted to another opset.

    Raises:
        GraphError: The file is missing, unreadable or not an ONNX model, is
            empty, has an opset newer than ONNX Runtime runs, uses an op no
            ONNX domain defines, or holds non-tensor values or subgraphs.
    """
    if isinstance(model, (str, os.PathLike)):
        model = _load_model_file(os.fspath(model))
    opsets = model_opsets(model)
    check_single_assignment(model.graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - custom domains can defeat ONNX inference; our rules still run
        inferred = model
    proto = inferred.graph
    graph = Graph(proto.name or "imported", stage="traced", opset_imports=opsets)
    values: dict[str, Value] = {}
    types = {vi.name: vi for vi in [*proto.value_info, *proto.output]}
    init_names = {t.name for t in proto.initializer}
    for tensor in proto.initializer:
        values[tensor.name] = _import_initializer(graph, tensor.name, tensor_array(tensor))
    for vi in proto.input:
        if vi.name in init_names:
            continue
        dtype, shape = type_of(vi.type, f"graph input {vi.name!r}", lambda axis: f"d{axis}")
        value = Value(vi.name, dtype, shape)
        graph._names.add(vi.name)
        graph.inputs.append(value)
        values[vi.name] = value
    fold = model.producer_name != "graphdist"  # graphdist's own graphs are imported exactly as written
    for node_proto in proto.node:
        _import_node(graph, node_proto, values, types, fold)
    for vi in proto.output:
        if vi.name not in values:
            raise GraphError(f"graph output {vi.name!r} is not computed by any node")
        type_of(vi.type, f"graph output {vi.name!r}", lambda axis: f"d{axis}")
    graph.outputs = [_named_output(graph, values[o.name], o.name) for o in proto.output]
    return graph


def _named_output(graph: Graph, value: Value, name: str) -> Value:
    """``value`` as the graph output ``name``: through an Identity when it has another name (a folded
    If's branch result) or is not computed by a node.
    """
    if value.name == name and value.producer is not None:
        return value
    if value.name == name and graph.initializers.get(name) is value:
        # A Constant as the output (an If branch's): the constant takes another name, the output keeps its own.
        del graph.initializers[name]
        value.name = graph.unique_name(f"{name}_constant")
        graph.initializers[value.name] = value
        out_name = name
    else:
        out_name = name if name not in graph._names else graph.unique_name(name)
    node = Node("Identity", [value], {})
    node.name = graph.unique_name(f"{name}_identity", node=True)
    out = Value(out_name, value.dtype, value.shape, producer=node, index=0)
    graph._names.add(out.name)
    node.outputs.append(out)
    graph.append(node)
    return out


_CONSTANT_FORMS = {
    "value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64,
}


def _import_initializer(graph: Graph, name: str, array: np.ndarray) -> Value:
    value = Value(name, array.dtype, array.shape, const_value=array)
    graph._names.add(name)
    graph.initializers[name] = value
    return value


def _constant_value(proto: onnx.NodeProto, where: str) -> np.ndarray:
    attrs = {a.name: a for a in proto.attribute}
    if "value" in attrs:
        return tensor_array(attrs["value"].t, where)
    if len(attrs) == 1 and next(iter(attrs)) in _CONSTANT_FORMS:
        key, attr = next(iter(attrs.items()))
        return np.asarray(helper.get_attribute_value(attr), dtype=_CONSTANT_FORMS[key])
    if len(attrs) == 1 and next(iter(attrs)) in ("value_string", "value_strings"):
        key, attr = next(iter(attrs.items()))
        raw = helper.get_attribute_value(attr)
        return np.asarray([v.decode() for v in raw] if isinstance(raw, list) else raw.decode(), dtype=object)
    raise GraphError(f"{where}: Constant with attribute(s) {sorted(attrs)} is not supported; use "
                     f"'value' or one of {', '.join(_CONSTANT_FORMS)}")


def _import_node(graph: Graph, proto: onnx.NodeProto, values: dict[str, Value], types: dict, fold: bool) -> None:
    domain = "" if proto.domain == "ai.onnx" else proto.domain
    tagged = {p.key: p.value for p in proto.metadata_props}.get("graphdist_op")
    if tagged in _RUNTIME_IDENTITIES and proto.op_type == "Identity":
        proto = onnx.NodeProto.FromString(proto.SerializeToString())
        proto.op_type, proto.domain, domain = tagged, GRAPHDIST_DOMAIN, GRAPHDIST_DOMAIN
    where = f"node {proto.name!r} ({proto.op_type})" if proto.name else f"a {proto.op_type} node"
    if proto.op_type == "Constant" and domain == "":
        values[proto.output[0]] = _import_initializer(graph, proto.output[0], _constant_value(proto, where))
        return
    try:
        opdef = get_opdef(proto.op_type, domain, graph.opset_imports.get(domain))
        attrs = {a.name: _python_attr(a) for a in proto.attribute}
        if tagged in _RUNTIME_IDENTITIES:
            attrs.update(json.loads({p.key: p.value for p in proto.metadata_props}.get("graphdist_attrs", "{}")))
    except GraphError as err:
        raise GraphError(f"cannot import {where}: {err}") from None
    try:
        inputs = [values[name] if name else None for name in proto.input]
    except KeyError as err:
        raise GraphError(f"node {proto.name!r} reads undefined value {err.args[0]!r}") from None
    while inputs and inputs[-1] is None:
        inputs.pop()  # trailing omitted optional inputs: ONNX allows both spellings
    captured = free_names(subgraphs_of(attrs))
    if captured:  # control flow: the outer values its subgraphs read become explicit (extra) inputs
        missing = [name for name in captured if name not in values]
        if missing:
            raise GraphError(f"{where}: its subgraph reads {missing}, which the enclosing graph does not define")
        attrs[CAPTURES_ATTR] = captured
        inputs += [values[name] for name in captured]
    if fold and proto.op_type == "If" and domain == "" and inputs[0].const_value is not None:
        _import_taken_branch(graph, proto, attrs, values, types)  # as ORT's constant folding does
        return
    folded = fold_node(proto.op_type, domain, attrs, inputs, len(proto.output), graph.opset_imports) if fold else None
    if folded is not None and all(proto.output):
        # Computed shapes (Shape -> Gather -> Concat -> Reshape) become constants when the shapes are static.
        for name, array in zip(proto.output, folded):
            values[name] = _import_initializer(graph, name, array)
        return
    node = Node(proto.op_type, inputs, attrs, domain=domain)
    node.name = graph.unique_name(proto.name or proto.op_type.lower(), node=True)
    _restore_meta(node, proto)
    out_types = _output_types(node, proto, opdef, types, where, graph.opset_imports.get(domain, OPSET))
    for index, (name, (dtype, shape)) in enumerate(zip(proto.output, out_types)):
        if not name:
            name = graph.unique_name(f"{node.name}_unused_{index}")
        out = Value(name, dtype, shape, producer=node, index=index)
        graph._names.add(name)
        node.outputs.append(out)
        values[name] = out
    graph.append(node)


def _import_taken_branch(graph: Graph, proto: onnx.NodeProto, attrs: dict[str, Any], values: dict[str, Value],
                         types: dict) -> None:
    """An ``If`` on a constant condition: the taken branch's nodes join the graph in its place."""
    condition = bool(np.asarray(values[proto.input[0]].const_value).reshape(-1)[0])
    branch = attrs["then_branch" if condition else "else_branch"].g
    types = {**types, **{vi.name: vi for vi in [*branch.value_info, *branch.output]}}
    for tensor in branch.initializer:
        values[tensor.name] = _import_initializer(graph, tensor.name, tensor_array(tensor))
    for node_proto in branch.node:
        _import_node(graph, node_proto, values, types, True)
    for name, result in zip(proto.output, branch.output):
        if name:
            values[name] = values[result.name]


def _output_types(node: Node, proto: onnx.NodeProto, opdef: Any, types: dict, where: str, node_opset: int) -> list:
    """The node's output types: ONNX's whole-model inference when it gives static shapes, else the OpDef's
    rule (which sees folded constants and static shapes ONNX's pass did not), else ONNX's partial answer.
    """
    known = [types.get(name) for name in proto.output]
    for vi in known:
        if vi is not None and vi.type.WhichOneof("value") not in (None, "tensor_type"):
            type_of(vi.type, f"output {vi.name!r} of {where}", lambda axis: "")  # raises: not a tensor
    onnx_types = None
    if all(vi is not None and vi.type.tensor_type.elem_type and vi.type.tensor_type.HasField("shape")
           for vi in known):
        onnx_types = [type_of(vi.type, vi.name, lambda axis, n=vi.name: f"{n}_d{axis}") for vi in known]
        if all(isinstance(d, int) for _, shape in onnx_types for d in shape):
            return onnx_types
    try:
        return _rule_types(node, opdef, len(proto.output), node_opset)
    except GraphError as err:
        if onnx_types is not None:
            return onnx_types
        ranked = _types_of_known_rank(node, len(proto.output), known)
        if ranked is not None:
            return ranked
        raise GraphError(f"cannot import {where}: {err}") from None


def _types_of_known_rank(node: Node, count: int, known: list) -> list | None:
    """Output types of ops whose output *rank* is known although their shape operand is computed at run time
    (a Reshape to Concat(Shape(x)[0:2], [-1]) with a symbolic batch): every dimension symbolic.

    Inlined with the call's static shapes, the shape computation folds to constants and the real
    dimensions follow (:func:`graphdist.trace.inline.inline_graph`).
    """
    inputs = node.inputs
    if not inputs or inputs[0] is None:
        return None

    def length(position: int) -> int | None:
        operand = inputs[position] if position < len(inputs) else None
        if operand is None or len(operand.shape) != 1 or not isinstance(operand.shape[0], int):
            return None
        return int(operand.shape[0])

    data = inputs[0]
    op = node.op_type
    if op == "Reshape":
        rank = length(1)
    elif op == "Expand":
        rank = None if length(1) is None else max(length(1), len(data.shape))
    elif op == "ConstantOfShape":
        rank = length(0)
    elif op in ("Tile", "Slice", "Pad", "Resize", "Upsample", "TopK", "Split", "CenterCropPad"):
        rank = len(data.shape)
    elif op == "Unsqueeze":
        rank = None if length(1) is None else len(data.shape) + length(1)
    elif op == "Squeeze" and len(inputs) > 1:
        rank = None if length(1) is None else len(data.shape) - length(1)
    else:
        return None
    if rank is None or rank < 0:
        return None
    if op == "ConstantOfShape":
        value = node.attrs.get("value")
        dtype = np.asarray(value).dtype if value is not None else np.dtype(np.float32)
    else:
        dtype = data.dtype
    types = []
    for index in range(count):
        vi = known[index] if index < len(known) else None
        elem = vi.type.tensor_type.elem_type if vi is not None else 0
        out_dtype = numpy_dtype(elem) if elem else (np.dtype(np.int64) if op == "TopK" and index == 1 else dtype)
        types.append((out_dtype, tuple(f"{node.name}_{index}_d{axis}" for axis in range(rank))))
    return types


def _rule_types(node: Node, opdef: Any, count: int, node_opset: int) -> list:
    try:
        return opdef.infer(node, count)
    except GraphError:
        generic = generic_opdef(node.op_type, node.domain, node_opset)
        if generic is None or generic is opdef:
            raise
    # A hand-written rule needs constants (a Reshape's shape) that the model computes at run time: ONNX's
    # inference gives the rank here; inlined with static shapes, the computation folds to constants.
    return generic.infer(node, count)


register_view("to_onnx", to_onnx)
