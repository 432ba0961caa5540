"""What an ONNX model must satisfy before graphdist imports it, as ONNX Runtime and ``onnx.checker`` require.

A file must mean one thing: where ONNX Runtime refuses a model, graphdist
refuses it too, with a :class:`~graphdist.errors.GraphError` naming the value
and the nodes; where ONNX Runtime warns, graphdist warns the same way.

* :func:`check_single_assignment`: every value has one definition: graph
  inputs are distinct, and no node writes a name that a graph input, an
  initializer, an earlier node (of this graph or of an enclosing one, for a
  subgraph) already defines. ONNX Runtime refuses such models ("Duplicate
  definition of name"), as does ``onnx.checker`` ("Graph must be in single
  static assignment (SSA) form").
* :func:`drop_duplicate_initializers`: several initializers of one name are
  accepted with a warning and the last one is used, as ONNX Runtime does
  ("the model will use the latest encountered initializer").
* :func:`check_tensor_data`: a tensor's stored data holds as many elements as
  its dims say (ONNX Runtime: "raw_data size ... does not match expected
  size").
* :func:`tensor_array`: a tensor as a numpy array; malformed data or data
  still in an external file is a ``GraphError`` naming the tensor, never
  numpy's ``ValueError`` nor a read relative to the current directory.

Every check is linear in the size of the model.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from graphdist.errors import GraphError

__all__ = ["check_single_assignment", "drop_duplicate_initializers", "check_tensor_data", "check_model_tensors",
           "model_tensors", "tensor_array"]


_T = onnx.TensorProto
#: Bits per element of the element types ONNX packs below a byte in ``raw_data``.
_PACKED_BITS = {_T.INT4: 4, _T.UINT4: 4, _T.FLOAT4E2M1: 4, _T.INT2: 2, _T.UINT2: 2, _T.FLOAT6E2M3: 6,
                _T.FLOAT6E3M2: 6}
#: Element type -> (typed field, values per element) for tensors without ``raw_data``; packed types,
#: which share ``int32_data`` several elements to an entry, are left to :func:`tensor_array`.
_TYPED_FIELDS = {_T.FLOAT: ("float_data", 1), _T.COMPLEX64: ("float_data", 2), _T.DOUBLE: ("double_data", 1),
                 _T.COMPLEX128: ("double_data", 2), _T.INT64: ("int64_data", 1), _T.UINT32: ("uint64_data", 1),
                 _T.UINT64: ("uint64_data", 1), _T.STRING: ("string_data", 1)}
_TYPED_FIELDS.update({t: ("int32_data", 1) for t in (
    _T.INT32, _T.INT16, _T.INT8, _T.UINT16, _T.UINT8, _T.BOOL, _T.FLOAT16, _T.BFLOAT16, _T.FLOAT8E4M3FN,
    _T.FLOAT8E4M3FNUZ, _T.FLOAT8E5M2, _T.FLOAT8E5M2FNUZ, _T.FLOAT8E8M0)})


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"node {node.name!r} ({node.op_type})" if node.name else f"node #{index} ({node.op_type})"


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def check_single_assignment(graph: onnx.GraphProto, what: str = "the ONNX model") -> None:
    """Refuses a graph (and its subgraphs) in which a value name has two definitions.

    Follows ``onnx.checker``'s rules, which ONNX Runtime shares: graph inputs
    are distinct within a graph; an initializer may repeat a graph input's
    name (it is then the input's default value) and may repeat another
    initializer (see :func:`drop_duplicate_initializers`); a node output may
    not repeat a graph input, an initializer, or an output of an earlier node
    of this graph or of the graphs enclosing it.

    Args:
        graph: The graph to check.
        what: How the message names the model (``"ONNX file 'm.onnx'"``).

    Raises:
        GraphError: Naming the value and the inputs or nodes that define it.
    """
    _check_scope(graph, what, [], "")


def _check_scope(graph: onnx.GraphProto, what: str, outer: list[dict[str, str]], where: str) -> None:
    defined: dict[str, str] = {}  # value name -> what defines it
    for vi in graph.input:
        if vi.name in defined:
            raise GraphError(f"{what}{where}: graph input {vi.name!r} is declared twice; ONNX Runtime refuses a "
                             "model whose inputs repeat a name (\"Duplicate definition-site\"): rename or remove "
                             "one and export the model again")
        defined[vi.name] = f"graph input {vi.name!r}"
    for tensor in graph.initializer:
        defined.setdefault(tensor.name, f"initializer {tensor.name!r}")
    scopes = [*outer, defined]
    for index, node in enumerate(graph.node):
        label = _node_label(node, index)
        for sub in _subgraphs(node):
            _check_scope(sub, what, scopes, f"{where}, in the subgraph {sub.name!r} of {label}")
        for name in node.output:
            if not name:
                continue
            first = next((scope[name] for scope in reversed(scopes) if name in scope), None)
            if first is not None:
                raise GraphError(
                    f"{what}{where}: value {name!r} is defined twice, by {first} and by {label}; ONNX values are "
                    "assigned once (ONNX Runtime and onnx.checker refuse the model: \"Duplicate definition of "
                    "name\"), so which one a reader sees is undefined: rename one output (and its readers) and "
                    "export the model again")
            defined[name] = label


def drop_duplicate_initializers(graph: onnx.GraphProto, what: str = "the ONNX model") -> list[str]:
    """Keeps only the last initializer of each name (in place), warning once per model, as ONNX Runtime does.

    Subgraphs' initializers are treated the same way.

    Args:
        graph: The graph to clean (changed in place).
        what: How the warning names the model.

    Returns:
        The names that were repeated (empty: the graph is unchanged).
    """
    repeated = _drop_repeated(graph)
    if repeated:
        names = sorted(set(repeated))
        shown = ", ".join(map(repr, names[:8])) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        message = (f"{what}: initializer(s) {shown} are defined more than once; the last definition of each is "
                   "used, as ONNX Runtime does; fix the exporter so that each weight is written once")
        warnings.warn(message, UserWarning, stacklevel=3)
    return repeated


def _drop_repeated(graph: onnx.GraphProto) -> list[str]:
    last = {tensor.name: index for index, tensor in enumerate(graph.initializer)}
    repeated = []
    if len(last) != len(graph.initializer):
        dropped = [i for i, tensor in enumerate(graph.initializer) if last[tensor.name] != i]
        repeated = [graph.initializer[i].name for i in dropped]
        for index in reversed(dropped):
            del graph.initializer[index]
    for node in graph.node:
        for sub in _subgraphs(node):
            repeated += _drop_repeated(sub)
    return repeated


def _element_count(tensor: onnx.TensorProto, where: str) -> int:
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise GraphError(f"{where}: tensor {tensor.name!r} has negative dims {dims}; the model is corrupt: export "
                         "it again")
    return math.prod(dims)


def _type_name(tensor: onnx.TensorProto) -> str:
    try:
        return onnx.TensorProto.DataType.Name(tensor.data_type).lower()
    except ValueError:
        return f"element type {tensor.data_type}"


def check_tensor_data(tensor: onnx.TensorProto, where: str = "the ONNX model") -> None:
    """Refuses a tensor whose stored data does not hold the number of elements its dims give.

    Tensors whose data is in an external file are checked when that data is
    read (:func:`tensor_array`); so are the packed sub-byte types stored in
    ``int32_data``.

    Args:
        tensor: An initializer or a tensor attribute.
        where: How the message names the model.

    Raises:
        GraphError: Naming the tensor, its dims and element type, and what its data holds.
    """
    count = _element_count(tensor, where)
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.HasField("segment"):
        return
    if tensor.data_type == onnx.TensorProto.UNDEFINED:
        raise GraphError(f"{where}: tensor {tensor.name!r} has no element type (UNDEFINED); the model is corrupt: "
                         "export it again")
    if tensor.HasField("raw_data"):
        if tensor.data_type == onnx.TensorProto.STRING:
            raise GraphError(f"{where}: tensor {tensor.name!r} holds strings in raw_data, which ONNX does not "
                             "allow (strings go in string_data): export the model again")
        bits = _PACKED_BITS.get(tensor.data_type)
        try:
            expected = (count * bits + 7) // 8 if bits else \
                count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            raise GraphError(f"{where}: tensor {tensor.name!r} has an unknown {_type_name(tensor)}; the model is "
                             "corrupt or newer than this onnx package") from None
        held = len(tensor.raw_data)
        if held != expected:
            raise GraphError(f"{where}: tensor {tensor.name!r} ({_type_name(tensor)}, dims "
                             f"{list(tensor.dims)}) holds {held} bytes of raw_data, but its dims need {expected}; "
                             "ONNX Runtime refuses it too: the model is corrupt or was edited by hand, export it "
                             "again")
        return
    field = _TYPED_FIELDS.get(tensor.data_type)
    if field is None:
        return  # packed types in int32_data: tensor_array reads them
    name, per_element = field
    held = len(getattr(tensor, name))
    if held != count * per_element:
        raise GraphError(f"{where}: tensor {tensor.name!r} ({_type_name(tensor)}, dims {list(tensor.dims)}) "
                         f"holds {held} value(s) in {name}, but its dims need {count * per_element}; ONNX Runtime "
                         "refuses it too: the model is corrupt or was edited by hand, export it again")


def model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of the model: initializers and tensor attributes, subgraphs' included."""
    return external_data_helper._get_all_tensors(model)


def check_model_tensors(model: onnx.ModelProto, what: str = "the ONNX model") -> None:
    """:func:`check_tensor_data` on every tensor of the model (initializers, ``Constant`` values, subgraphs')."""
    for tensor in model_tensors(model):
        check_tensor_data(tensor, what)


def tensor_array(tensor: onnx.TensorProto, where: str = "the ONNX model") -> np.ndarray:
    """``numpy_helper.to_array(tensor)``, whose failures are graphdist errors naming the tensor.

    A tensor whose data is still in an external file is refused: its location
    would otherwise be read relative to the current directory. The model's
    loader reads external data from the model's own directory first
    (:func:`graphdist.onnx.load`, :func:`graphdist.onnx.backend.prepare`).

    Raises:
        GraphError: The data is external, or does not match the tensor's dims or element type.
    """
    if external_data_helper.uses_external_data(tensor):
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        raise GraphError(f"{where}: tensor {tensor.name!r} is stored in the external-data file {location!r}, which "
                         "was not read: load the model from its path (gd.onnx.load(path)), or pass the directory "
                         "holding its data files as base_dir=")
    check_tensor_data(tensor, where)
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError, KeyError) as err:
        raise GraphError(f"{where}: tensor {tensor.name!r} ({_type_name(tensor)}, dims {list(tensor.dims)}) cannot "
                         f"be read ({type(err).__name__}: {err}); the model is corrupt: export it again") from None
