"""graphdist's intermediate representation: values, nodes, graphs and ops."""

from graphdist.ir import (
    check_ops,  # noqa: F401,E402 - registers CheckIndices and AssertInRange (run-time index checks)
    comm_ops,  # noqa: F401,E402 - registers collectives, transfers, ps pulls/pushes
    gradients,  # noqa: F401,E402 - attaches gradient rules to the OpDefs
    gradients_decomposed,  # noqa: F401,E402 - LSTM, GRU, RNN, GroupNormalization, ...: gradients by decomposition
    gradients_nn,  # noqa: F401,E402 - gradient rules of the nn ops (imports nn_ops first)
    gradients_ops,  # noqa: F401,E402 - gradient rules of ops with generic (schema) OpDefs: Resize, Einsum, ...
    nn_ops,  # noqa: F401,E402 - registers Gemm, BatchNormalization, LayerNormalization, ... (imported models)
    onnx_schema_ops,  # noqa: F401,E402 - installs the generic OpDefs made from ONNX's schemas
    placement_ops,  # noqa: F401,E402 - registers TPUStrategy's logical-device annotations
    replica_ops,  # noqa: F401,E402 - registers ReplicaId and the cross-replica ops
    state_ops,  # noqa: F401,E402 - registers AssignVariable and Gradient
)
from graphdist.ir.compare import assert_structural_equal, structural_diff
from graphdist.ir.graph import GRAPHDIST_DOMAIN, ONNX_DOMAIN, Graph, Node, Value
from graphdist.ir.graph_meta import GraphMeta, Replication
from graphdist.ir.networkx_view import graph_to_networkx
from graphdist.ir.onnx_io import from_onnx, to_onnx
from graphdist.ir.ops import OPSET, OpDef, get_opdef, register_op, registered_ops
from graphdist.ir.render import graph_summary, graph_to_dot, render_graph
from graphdist.ir.verify import verify

__all__ = [
    "Value",
    "Node",
    "Graph",
    "graph_summary",
    "graph_to_dot",
    "render_graph",
    "graph_to_networkx",
    "GraphMeta",
    "Replication",
    "OpDef",
    "OPSET",
    "ONNX_DOMAIN",
    "GRAPHDIST_DOMAIN",
    "get_opdef",
    "register_op",
    "registered_ops",
    "verify",
    "to_onnx",
    "from_onnx",
    "structural_diff",
    "assert_structural_equal",
]
