"""LowerDeterministicReductionsPass: every float sum across replicas and workers follows one fixed pairwise tree.

With ``gd.config.experimental.enable_op_determinism()`` each replica holds a
whole subtree of the pairwise tree over the chunks of the global batch
(``SplitBatchChunksPass``), in replica order; this pass makes the sums
*across* replicas complete that same tree, ``((r0 + r1) + (r2 + r3)) + ...``,
whatever carries them. The algorithms it replaces fix no such order: the
ring all-reduce starts each slice of the buffer at another replica, ONNX's
``Sum`` of more than two inputs adds them in a chain, and MPI's
``Allreduce`` promises no order at all (MPICH picks its algorithm by message
size and rank count). With the replicas' and workers' counts powers of two
and global replica order worker-major, the tree over the workers' local
trees is the tree over all replicas, so a hierarchical reduction (local
devices first, then the workers) is still the one tree.

Requires: collectives lowered (``LowerCollectivesPass`` and, for several
workers, ``InsertCrossWorkerCollectivesPass`` ran), so their algorithm
attributes are final; run after ``BucketCollectivesPass`` too.

Invariant established (ensures): every floating-point ``SUM`` / ``MEAN``
reduction across replicas or workers is a pairwise tree in replica order:

* a local ``graphdist.AllReduce`` carries ``algorithm="hierarchical_copy"``
  (the local communicator's pairwise tree, ``((b0 + b1) + (b2 + b3)) + ...``;
  ``root`` dropped);
* a ``graphdist.CrossWorkerAllReduce`` carries ``algorithm="tree"`` (the MPI
  communicator gathers every worker's buffer and adds them in the same
  pairwise tree, in rank order, on every rank);
* the ``Sum`` of more than two inputs that ``LowerSingleReaderAllReducesPass``
  made for a group read by one replica (``meta["summed_group"]``) is a tree of
  ``Add`` over its inputs in replica order (two inputs: one addition, which is
  the same bits in either order, so it stays a ``Sum``).

Cases:

* ``MAX`` / ``MIN`` and integer reductions (exact in any order), gathers:
  unchanged;
* a ``ReduceScatter`` (ZeRO-1's sharded optimizer state): ``NotImplementedError``
  (its slices are summed in the ring's order);
* nothing to change (also a second run): unchanged, ``modified`` False.
"""

from __future__ import annotations

from typing import Any

from graphdist.errors import PostconditionError
from graphdist.ir.comm_ops import SUMMED_GROUP
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.runtime.comm.algorithms import check_algorithm

__all__ = ["LowerDeterministicReductionsPass", "LOCAL_TREE", "CROSS_WORKER_TREE"]

#: The local communicator's algorithm that sums in the pairwise tree (``graphdist.runtime.comm.local``).
LOCAL_TREE = check_algorithm("hierarchical_copy", "local").name
#: The MPI communicator's algorithm that gathers and sums in the pairwise tree (``graphdist.runtime.comm.mpi``).
CROSS_WORKER_TREE = check_algorithm("tree", "mpi").name

_WANTED = {"AllReduce": LOCAL_TREE, "CrossWorkerAllReduce": CROSS_WORKER_TREE}
_SCATTERS = ("ReduceScatter", "CrossWorkerReduceScatter")


class LowerDeterministicReductionsPass(PassBase):
    """Makes every float sum across replicas and workers one fixed pairwise tree (see the module docstring)."""

    runs_after = ("InsertCollectivesPass", "InsertCrossWorkerCollectivesPass", "LowerCollectivesPass",
                  "BucketCollectivesPass")

    def requires(self, graph: Graph, ctx: PassContext | None = None) -> None:
        """No reduce-scatter (its order is the ring's).

        Raises:
            NotImplementedError: The graph has one (naming the node and what to change).
        """
        for node in graph.nodes:
            if node.domain == GRAPHDIST_DOMAIN and node.op_type in _SCATTERS and _summed(node):
                raise NotImplementedError(
                    f"{self.name}: node {node.name} ({node.op_type}) reduce-scatters a sum for a sharded optimizer "
                    "state (ZeRO-1, shard_optimizer_state=True); op determinism does not cover it yet: drop "
                    "shard_optimizer_state, or gd.config.experimental.disable_op_determinism()")

    def ensures(self, graph: Graph, ctx: PassContext | None = None) -> None:
        """Every float sum across replicas or workers is a pairwise tree.

        Raises:
            PostconditionError: One is not (naming the pass and the node).
        """
        for node in graph.nodes:
            if _needs_algorithm(node) and node.attrs.get("algorithm") != _WANTED[node.op_type]:
                raise PostconditionError(f"{node.op_type} {node.name} still sums with algorithm "
                                         f"{node.attrs.get('algorithm')!r}")
            if _is_chained_sum(node):
                raise PostconditionError(f"Sum {node.name} still adds {len(node.inputs)} replicas in a chain")

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        modified = False
        for node in list(graph.nodes):
            if _needs_algorithm(node) and node.attrs.get("algorithm") != _WANTED[node.op_type]:
                node.attrs["algorithm"] = _WANTED[node.op_type]
                node.attrs.pop("root", None)
                modified = True
            elif _is_chained_sum(node):
                _lower_to_tree(graph, node)
                modified = True
        return PassResult(graph, modified=modified)


def _summed(node: Node) -> bool:
    """A float ``SUM`` or ``MEAN``."""
    op = str(node.attrs.get("reduce_op", "SUM")).upper()
    return op in ("SUM", "MEAN") and bool(node.inputs) and node.inputs[0] is not None \
        and node.inputs[0].dtype.kind == "f"


def _needs_algorithm(node: Node) -> bool:
    if node.domain != GRAPHDIST_DOMAIN or node.op_type not in _WANTED or not _summed(node):
        return False
    participants = node.attrs.get("group_size", 2) if node.op_type == "AllReduce" else node.attrs.get("num_workers", 2)
    return int(participants) > 1


def _is_chained_sum(node: Node) -> bool:
    return node.domain == "" and node.op_type == "Sum" and SUMMED_GROUP in node.meta and len(node.inputs) > 2


def _lower_to_tree(graph: Graph, node: Node) -> None:
    """Replaces ``Sum(x0, ..., xk)`` by the pairwise tree of ``Add`` over its inputs; the last ``Add`` produces
    the ``Sum``'s output value itself (its name and readers stay).
    """
    meta = dict(node.meta)

    def add(left: Value, right: Value) -> Value:
        made = graph.add_node("Add", [left, right], name=f"add_{node.name}")
        made.meta.update(meta)
        made.device, made.replica = node.device, node.replica
        return made.outputs[0]

    with graph.inserting_before(node):
        total = _pairwise(list(node.inputs), add)
    graph.replace_node(node, total.producer, keep_values=True)


def _pairwise(items: list[Any], combine: Any) -> Any:
    """Neighbours paired level by level, an odd one out moving up unchanged: the local communicator's tree."""
    level = list(items)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = paired + ([level[-1]] if len(level) % 2 else [])
    return level[0]
