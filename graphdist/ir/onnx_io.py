"""Lowering of graphdist graphs to ONNX and import of ONNX graphs.

Ops are ONNX ops already, so both directions are near-identity. Lowering
declares the ``graphdist`` domain whenever a graphdist op remains (such a model
is valid ONNX and opens in Netron, but only graphdist can execute it) and sets
an IR version ONNX Runtime accepts (onnx 1.23 writes IR 14 by default, ORT
1.31 reads at most 13).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.ops import GRAPHDIST_OPSET, OPSET, get_opdef, numpy_dtype, onnx_dtype

__all__ = ["to_onnx", "from_onnx", "ORT_IR_VERSION"]

#: IR version written into every model; ONNX Runtime 1.31 accepts at most 13.
ORT_IR_VERSION = 10


def _value_info(value: Value) -> onnx.ValueInfoProto:
    dims = [d if isinstance(d, (int, str)) else None for d in value.shape]
    return helper.make_tensor_value_info(value.name, onnx_dtype(value.dtype), dims)


def _attribute(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and not value:
        # make_attribute cannot infer the type of an empty list; ONNX list attributes are ints
        # (perm, axes, pads...) far more often than anything else.
        return helper.make_attribute(name, value, attr_type=onnx.AttributeProto.INTS)
    return helper.make_attribute(name, value)


#: graphdist ops that are the identity at run time: written as ONNX Identity (tagged) so any
#: runtime can execute a traced graph; import restores them from the tag.
_RUNTIME_IDENTITIES = frozenset({"StopGradient"})


def _node_proto(node: Node, keep_meta: bool = False) -> onnx.NodeProto:
    as_identity = node.domain == GRAPHDIST_DOMAIN and node.op_type in _RUNTIME_IDENTITIES
    proto = helper.make_node(
        "Identity" if as_identity else node.op_type,
        ["" if v is None else v.name for v in node.inputs],
        [v.name for v in node.outputs],
        name=node.name,
        domain="" if as_identity else node.domain,
    )
    if as_identity:
        entry = proto.metadata_props.add()
        entry.key, entry.value = "graphdist_op", node.op_type
    proto.attribute.extend(_attribute(k, v) for k, v in sorted(node.attrs.items()) if v is not None)
    for key, text in (("device", node.device), ("replica", node.replica)):
        if text is not None:
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, str(text)
    for key in _KEPT_META if keep_meta else ():
        if node.meta.get(key) not in (None, False):
            entry = proto.metadata_props.add()
            entry.key, entry.value = f"graphdist.{key}", str(node.meta[key])
    return proto


#: ``node.meta`` entries a traced graph writes as node metadata (``graphdist.<key>``) and import reads
#: back: a traced graph stored in a plan directory keeps which nodes each replica computes and which
#: must always run. (Other stages leave them out: segments' bytes key the compile cache.)
_KEPT_META = ("context", "variant", "side_effect", "source")


def _restore_meta(node: Node, proto: onnx.NodeProto) -> None:
    for prop in proto.metadata_props:
        key = prop.key.removeprefix("graphdist.")
        if prop.key.startswith("graphdist.") and key in _KEPT_META:
            node.meta[key] = True if key == "side_effect" else prop.value


def to_onnx(graph: Graph, *, opset: int = OPSET, doc: str = "") -> onnx.ModelProto:
    """Lowers ``graph`` to a checked ``onnx.ModelProto``.

    Args:
        graph: Graph to lower.
        opset: Default-domain opset version.
        doc: Model doc string.

    Returns:
        A model that passes ``onnx.checker.check_model``.
    """
    initializers = [numpy_helper.from_array(np.asarray(v.const_value), v.name) for v in graph.initializers.values()]
    graph_proto = helper.make_graph(
        [_node_proto(n, keep_meta=graph.stage == "traced") for n in graph.nodes],
        graph.name,
        [_value_info(v) for v in graph.inputs],
        [_value_info(v) for v in graph.outputs],
        initializer=initializers,
        value_info=[_value_info(out) for n in graph.nodes for out in n.outputs if out not in graph.outputs],
    )
    opsets = [helper.make_opsetid("", opset)]
    if any(n.domain == GRAPHDIST_DOMAIN for n in graph.nodes):
        opsets.append(helper.make_opsetid(GRAPHDIST_DOMAIN, GRAPHDIST_OPSET))
    model = helper.make_model(graph_proto, opset_imports=opsets, producer_name="graphdist", doc_string=doc)
    model.ir_version = ORT_IR_VERSION
    return model


# ------------------------------------------------------------------ import
def _shape_of(type_proto: onnx.TypeProto, name: str = "") -> tuple[int | str, ...]:
    if not type_proto.tensor_type.HasField("shape"):
        raise GraphError(f"value {name!r} has no shape (unknown rank); graphdist needs the rank of every "
                         "graph input and output: give the model a typed input/output with a shape")
    dims = []
    for index, dim in enumerate(type_proto.tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or f"d{index}")
    return tuple(dims)


def _python_attr(attr: onnx.AttributeProto) -> Any:
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise GraphError(
            f"ONNX attribute {attr.name!r} holds a subgraph (If/Loop/Scan); graphdist imports only "
            "straight-line graphs"
        )
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
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


def from_onnx(model: onnx.ModelProto | str | os.PathLike[str]) -> Graph:
    """Imports an ONNX model (or a path to one) into a graphdist graph.

    ``Constant`` nodes become initializers; every other op must be registered.

    Raises:
        GraphError: The file is missing, unreadable or not an ONNX model, is
            empty, or uses an unsupported op or construct.
    """
    if isinstance(model, (str, os.PathLike)):
        model = _load_model_file(os.fspath(model))
    model = _at_opset(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - custom domains can defeat ONNX inference; our rules still run
        inferred = model
    proto = inferred.graph
    graph = Graph(proto.name or "imported", stage="traced")
    values: dict[str, Value] = {}
    types = {vi.name: vi for vi in [*proto.value_info, *proto.output]}
    init_names = {t.name for t in proto.initializer}
    for tensor in proto.initializer:
        values[tensor.name] = _import_initializer(graph, tensor.name, numpy_helper.to_array(tensor))
    for vi in proto.input:
        if vi.name in init_names:
            continue
        value = Value(vi.name, numpy_dtype(vi.type.tensor_type.elem_type), _shape_of(vi.type, vi.name))
        graph._names.add(vi.name)
        graph.inputs.append(value)
        values[vi.name] = value
    for node_proto in proto.node:
        _import_node(graph, node_proto, values, types)
    graph.outputs = [values[o.name] for o in proto.output]
    return graph


def _at_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` converted to the default-domain opset graphdist's shape rules follow.

    Older opsets pass axes, split sizes and clip bounds as attributes rather than inputs.
    """
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    if version == OPSET:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, OPSET)
    except Exception as err:  # noqa: BLE001 - the converter raises assorted errors
        raise GraphError(
            f"cannot import an ONNX model with opset {version}: converting it to opset {OPSET} failed "
            f"({type(err).__name__}: {err}); re-export it with opset {OPSET}"
        ) from None


_CONSTANT_FORMS = {
    "value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64,
}


def _import_initializer(graph: Graph, name: str, array: np.ndarray) -> Value:
    value = Value(name, array.dtype, array.shape, const_value=array)
    graph._names.add(name)
    graph.initializers[name] = value
    return value


def _import_node(graph: Graph, proto: onnx.NodeProto, values: dict[str, Value], types: dict) -> None:
    domain = "" if proto.domain == "ai.onnx" else proto.domain
    tagged = {p.key: p.value for p in proto.metadata_props}.get("graphdist_op")
    if tagged in _RUNTIME_IDENTITIES and proto.op_type == "Identity":
        proto = onnx.NodeProto.FromString(proto.SerializeToString())
        proto.op_type, proto.domain, domain = tagged, GRAPHDIST_DOMAIN, GRAPHDIST_DOMAIN
    where = f"node {proto.name!r} ({proto.op_type})" if proto.name else f"a {proto.op_type} node"
    if proto.op_type == "Constant" and domain == "":
        attrs = {a.name: _python_attr(a) for a in proto.attribute}
        if "value" in attrs:
            array = np.asarray(attrs["value"])
        elif len(attrs) == 1 and next(iter(attrs)) in _CONSTANT_FORMS:
            key, raw = next(iter(attrs.items()))
            array = np.asarray(raw, dtype=_CONSTANT_FORMS[key])
        else:
            raise GraphError(f"{where}: Constant with attribute(s) {sorted(attrs)} is not supported; use "
                             f"'value' or one of {', '.join(_CONSTANT_FORMS)}")
        values[proto.output[0]] = _import_initializer(graph, proto.output[0], array)
        return
    try:
        get_opdef(proto.op_type, domain)
        attrs = {a.name: _python_attr(a) for a in proto.attribute}
    except GraphError as err:
        raise GraphError(f"cannot import {where}: {err}") from None
    try:
        inputs = [values[name] if name else None for name in proto.input]
    except KeyError as err:
        raise GraphError(f"node {proto.name!r} reads undefined value {err.args[0]!r}") from None
    node = Node(proto.op_type, inputs, attrs, domain=domain)
    node.name = graph.unique_name(proto.name or proto.op_type.lower(), node=True)
    _restore_meta(node, proto)
    known = [types.get(name) for name in proto.output]
    if all(vi is not None and vi.type.tensor_type.elem_type and vi.type.tensor_type.HasField("shape")
           for vi in known):
        out_types = [(numpy_dtype(vi.type.tensor_type.elem_type), _shape_of(vi.type, vi.name)) for vi in known]
    else:
        out_types = get_opdef(proto.op_type, domain).infer(node, len(proto.output))
    for index, (name, (dtype, shape)) in enumerate(zip(proto.output, out_types)):
        out = Value(name, dtype, shape, producer=node, index=index)
        graph._names.add(name)
        node.outputs.append(out)
        values[name] = out
    graph.append(node)
