"""InsertCrossWorkerCollectivesPass: extend every collective from this worker's replicas to all workers.

Invariant established: every ``graphdist.AllReduce`` / ``AllGather`` group
of the step (this worker's local replicas) has ``group_size`` equal to its
number of local participants and is followed, on each participant, by a
``graphdist.CrossWorkerAllReduce`` / ``CrossWorkerAllGather`` node that
combines the local result with the other workers' (hierarchical reduction:
local devices first, then across workers through MPI). Every reader of the
local result reads the cross-worker result instead. The cross-worker groups
are numbered (``attrs["sequence"]``) in graph order, which is the same in
every worker, so every worker issues them in the same order.

Cases:
* one worker: only ``group_size`` is set (nothing crosses processes);
* ``AllReduce`` with ``SUM`` / ``MAX`` / ``MIN``: the same op across workers;
  ``MEAN``: the local mean, then the mean over workers (equal replica
  counts per worker make it the global mean);
* ``AllGather`` along ``axis``: the local concatenation, then the workers'
  concatenated in worker order (global replica order is worker-major);
* a group with one local participant: its local collective becomes the
  identity in ``LowerCollectivesPass``; the cross-worker node remains;
* nodes already followed by a cross-worker node: unchanged (idempotent);
* cross-worker nodes another pass made (ZeRO-1's ``CrossWorkerReduceScatter``
  and ``CrossWorkerAllGather``): numbered with the others, every group in
  graph order; a local group reading their results is not extended again;
* a traced value whose type does not fit the worker count (the step was
  traced for another number of replicas in sync): ``GraphError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphdist.errors import GraphError
from graphdist.ir.comm_ops import CROSS_WORKER_OPS
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.ops import get_opdef
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.runtime.comm.algorithms import check_algorithm

__all__ = ["InsertCrossWorkerCollectivesPass", "number_cross_worker_groups"]


_CROSS = {"AllReduce": "CrossWorkerAllReduce", "AllGather": "CrossWorkerAllGather"}


class InsertCrossWorkerCollectivesPass(PassBase):
    """Appends a cross-worker collective to every local collective group.

    Args:
        num_workers: Number of workers (processes) in sync.
        comm_group: Name of the communicator the runtime uses for them
            (see :func:`graphdist.runtime.comm.mpi.register_group`).
        algorithm: One of the registry's MPI algorithms (``graphdist.runtime.comm.algorithms``:
            ``"auto"``, ``"ring"``, ``"tree"``).

    Raises:
        InvalidArgumentError: ``algorithm`` does not run between worker processes (the message lists
            the ones that do); raised when the pass, hence the pipeline, is built.
    """

    runs_after = ("InsertCollectivesPass",)

    def __init__(self, num_workers: int, comm_group: str = "", algorithm: str = "auto") -> None:
        self.num_workers = int(num_workers)
        self.comm_group = comm_group
        self.algorithm = check_algorithm(algorithm, "mpi", "InsertCrossWorkerCollectivesPass").name

    def __repr__(self) -> str:
        return (f"{self.name}(num_workers={self.num_workers}, comm_group={self.comm_group!r}, "
                f"algorithm={self.algorithm!r})")

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        locals_ = [n for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN and n.op_type in _CROSS]
        groups: dict[str, list[Node]] = {}
        for node in locals_:
            groups.setdefault(node.attrs.get("group_key", node.name), []).append(node)
        modified = False
        for members in groups.values():
            for node in members:
                if int(node.attrs.get("group_size", 1)) != len(members):
                    node.attrs["group_size"] = len(members)
                    modified = True
        if self.num_workers == 1:
            return PassResult(graph, modified)
        for key, members in groups.items():
            if any(user.op_type in _CROSS.values() for m in members for user, _ in m.outputs[0].uses):
                continue
            if any(_crossed(m.inputs[0]) for m in members):
                continue  # it gathers values already combined across the workers (ZeRO-1's weight shards)
            for node in members:
                self._append_cross(graph, node, key)
            modified = True
        return PassResult(graph, number_cross_worker_groups(graph) or modified)

    def _append_cross(self, graph: Graph, node: Node, key: str) -> None:
        local = node.outputs[0]
        attrs: dict[str, Any] = {"num_workers": self.num_workers, "group_key": f"{key}/workers",
                                 "group_size": int(node.attrs.get("group_size", 1))}  # numbered below
        if node.op_type == "AllReduce":
            attrs["reduce_op"] = node.attrs.get("reduce_op", "SUM")
            attrs["algorithm"] = self.algorithm
        else:
            attrs["axis"] = node.attrs.get("axis", 0)
        if self.comm_group:
            attrs["comm_group"] = self.comm_group
        op_type = _CROSS[node.op_type]
        # The traced value (typed for all replicas in sync) becomes the cross-worker node's output, so its
        # readers are untouched; the local collective gets a new output typed for its local participants.
        combined = node.outputs[0]
        (dtype, shape), = get_opdef(node.op_type, GRAPHDIST_DOMAIN).infer(node, 1)
        local = Value(graph.unique_name(f"{node.name}_local"), dtype, shape, producer=node, index=0)
        node.outputs[0] = local
        cross = Node(op_type, [local], attrs, domain=GRAPHDIST_DOMAIN)
        cross.name = graph.unique_name(f"{op_type.lower()}", node=True)
        cross.device, cross.replica, cross.meta = node.device, node.replica, dict(node.meta)
        cross.meta["side_effect"] = True
        ((_, expected),) = get_opdef(op_type, GRAPHDIST_DOMAIN).infer(cross, 1)
        if _static(expected) != _static(combined.shape):
            raise GraphError(
                f"{node.qualified_op} {key} produces {combined.type_str()} for {self.num_workers} worker(s), but "
                f"{int(node.attrs.get('group_size', 1))} local participant(s) give {list(expected)} across them; "
                "the step was traced for a different number of replicas in sync")
        cross.add_output(combined)
        graph.insert_after(node, cross)


def _crossed(value: Value | None) -> bool:
    producer = value.producer if value is not None else None
    return producer is not None and producer.domain == GRAPHDIST_DOMAIN and producer.op_type in CROSS_WORKER_OPS


def number_cross_worker_groups(graph: Graph, phase: Mapping[int, int] | None = None) -> bool:
    """Numbers every cross-worker group (also those other passes made); True if any changed.

    The groups are numbered in graph order, or with ``phase`` (node id -> the partition's phase) by
    phase first, then graph order. Both are the same in every worker, so every worker issues the MPI
    calls in one order. The graph order is topological, but the scheduler runs *segments*, each all the
    nodes of one device and phase: a segment can hold the update read by group ``k`` and one that waits
    for a later group (ZeRO-1 with SGD: the weight all-gather of the first variable, then the gradient
    reduce-scatter of the second). Numbering by phase first keeps every group after the groups its
    segments wait for, so ``PartitionPass`` numbers them again that way. ``BucketCollectivesPass``
    numbers them again after packing the gradients' groups.
    """
    nodes = [n for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN and n.op_type in CROSS_WORKER_OPS]
    if phase is not None:
        group_phase: dict[str, int] = {}
        for node in nodes:
            key = str(node.attrs.get("group_key", node.name))
            group_phase[key] = max(group_phase.get(key, 0), phase.get(id(node), 0))
        position = {id(n): i for i, n in enumerate(nodes)}
        nodes.sort(key=lambda n: (group_phase[str(n.attrs.get("group_key", n.name))], position[id(n)]))
    numbers: dict[str, int] = {}
    changed = False
    for node in nodes:
        sequence = numbers.setdefault(str(node.attrs.get("group_key", node.name)), len(numbers))
        wanted = {"sequence": sequence, "name": f"step collective {sequence}"}
        if any(node.attrs.get(k) != v for k, v in wanted.items()):
            node.attrs.update(wanted)
            changed = True
    return changed


def _static(shape: Any) -> tuple:
    return tuple(d if isinstance(d, int) else "?" for d in shape)
