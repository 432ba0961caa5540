"""Communication ops of the ``graphdist`` domain, and the one list of them.

Communication ops move values between devices or processes; a communicator
runs them between the backends' segments, never a backend:

* ``AllReduce(x) -> y`` (``reduce_op``, ``group_key``, ``group_size``,
  ``algorithm``): one node per participant of a replica group; every
  participant gets the reduction;
* ``AllGather(x) -> y`` (``axis``, ``group_key``, ``group_size``): the
  participants' values concatenated along ``axis`` in replica order;
* ``ReduceScatter(x) -> y`` (``reduce_op``, ``group_key``, ``group_size``,
  ``shard``): the participants' values reduced, and participant ``shard``
  gets elements ``[shard * k, (shard + 1) * k)`` of the result flattened in
  row-major order (``k = x.size / group_size``; a value of rank above 1 is
  read flat, which costs the communicator nothing and spares a segment the
  copy a flattened output would be);
* ``AllToAll(x) -> y`` (``split_axis``, ``concat_axis``, ``group_key``,
  ``group_size``): each participant cuts its value into ``group_size`` equal
  chunks along ``split_axis`` and sends chunk ``j`` to participant ``j``,
  which concatenates the chunks it receives along ``concat_axis`` in
  participant order (``split_axis`` shrinks ``group_size`` times,
  ``concat_axis`` grows as much). It moves a value split over one dimension
  to a split over another: each participant sends ``(n-1)/n`` of its block,
  where an all-gather and a slice would send all of it ``n-1`` times;
* ``CrossWorkerAllReduce`` / ``CrossWorkerAllGather`` / ``CrossWorkerReduceScatter``
  (``num_workers``, ``sequence``, ``comm_group``): the same between worker
  processes, through MPI (worker ``w`` of a reduce-scatter gets chunk ``w``);
* ``PSPull`` / ``PSPush`` (``ps``, ``key``, ``row_start``, ``row_stop``): read a
  variable shard from its parameter-server task, add an update to it;
* ``Transfer(x) -> x``: copies a value to the node's device.

:data:`COMMUNICATION_OPS` lists them (and the op names reserved for point to
point and rooted collectives); :func:`is_communication` is the test every
pass, the verifier, the plan builder and the renderer use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Node
from graphdist.ir.ops import OpDef, TypeList, _in, _unary, normalize_axis, register_op

__all__ = ["COMMUNICATION_OPS", "CROSS_WORKER_OPS", "RUNTIME_CHECK_OPS", "SUMMED_GROUP", "SUMMED_REPLICAS",
           "is_communication", "is_runtime_check", "register_comm_ops"]

#: graphdist ops run by a communicator; the only nodes that may read values placed on another device.
COMMUNICATION_OPS = frozenset({"AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Broadcast", "Send", "Recv",
                               "Transfer",
                               # between processes (graphdist.runtime.comm.mpi, graphdist.runtime.ps_server)
                               "CrossWorkerAllReduce", "CrossWorkerAllGather", "CrossWorkerReduceScatter",
                               "PSPull", "PSPush",
                               # run-time assertions the scheduler runs between segments (graphdist.ir.check_ops)
                               "AssertInRange"})

#: The collectives between worker processes (run through MPI by ``graphdist.runtime.comm.mpi``).
CROSS_WORKER_OPS = ("CrossWorkerAllReduce", "CrossWorkerAllGather", "CrossWorkerReduceScatter")

#: ``node.meta`` keys of the nodes that replace an ``AllReduce`` group read by one replica (a sum on that
#: replica, ``LowerSingleReaderAllReducesPass``): the group key they sum, and its member count. Summaries
#: list them; plan files keep them.
SUMMED_GROUP, SUMMED_REPLICAS = "summed_group", "summed_replicas"

#: The tasks of :data:`COMMUNICATION_OPS` that check values instead of moving them: scheduled like
#: communication (between segments), but summaries list them apart from the collectives.
RUNTIME_CHECK_OPS = frozenset({"AssertInRange"})


def is_communication(node: Node) -> bool:
    """True for collectives, transfers and ps pulls/pushes (run by a communicator, not a backend)."""
    return node.domain == GRAPHDIST_DOMAIN and node.op_type in COMMUNICATION_OPS


def is_runtime_check(node: Node) -> bool:
    """True for run-time assertions (``AssertInRange``): tasks between segments that move no data."""
    return node.domain == GRAPHDIST_DOMAIN and node.op_type in RUNTIME_CHECK_OPS


def gathered(count_attr: str) -> Any:
    """The shape rule of a gather over ``node.attrs[count_attr]`` participants along ``axis``."""
    def infer(node: Node, _: int | None) -> TypeList:
        x = _in(node, 0)
        count = int(node.attrs.get(count_attr, 1))
        axis = normalize_axis(node.attrs.get("axis", 0), x.rank, f"{node.op_type} axis")
        shape = list(x.shape)
        dim = shape[axis]
        shape[axis] = dim * count if isinstance(dim, int) else f"{dim}*{count}"
        return [(x.dtype, tuple(shape))]

    return infer


def _infer_shard(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    start, stop = int(node.attrs.get("row_start", 0)), node.attrs.get("row_stop")
    shape = list(x.shape)
    if shape and stop is not None:
        shape[0] = int(stop) - start
    return [(x.dtype, tuple(shape))]


def _infer_scatter(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    cross = node.op_type.startswith("CrossWorker")
    count = int(node.attrs.get("num_workers" if cross else "group_size", 1))
    if x.rank != 1 and (cross or x.rank == 0 or not x.is_static):
        raise GraphError(f"{node.op_type} {node.name} takes a rank-1 value{'' if cross else ' (or a static shape)'}, "
                         f"got {x.type_str()}; flatten it first")
    size = x.shape[0] if x.rank == 1 else int(np.prod(x.shape, dtype=np.int64))
    if isinstance(size, int) and size % count:
        raise GraphError(f"{node.op_type} {node.name}: {size} elements do not split into {count} equal shards; "
                         "pad the value to a multiple of the group size first")
    return [(x.dtype, (size // count if isinstance(size, int) else f"{size}/{count}",))]


_REDUCERS = {"SUM": np.add, "MEAN": np.add, "MAX": np.maximum, "MIN": np.minimum}


def _reference_all_reduce(*values: np.ndarray, reduce_op: str = "SUM", **_: Any) -> tuple[np.ndarray, ...]:
    """All-reduce over the given participants; every participant gets the result."""
    total = values[0]
    for other in values[1:]:
        total = _REDUCERS[reduce_op](total, other)
    if reduce_op == "MEAN":
        # Integer means floor, as Strategy.reduce and the local communicator do.
        total = total // len(values) if total.dtype.kind in "iu" else (total / len(values)).astype(total.dtype)
    return tuple(np.array(total, copy=True) for _ in values)


def _reference_all_gather(*values: np.ndarray, axis: int = 0, **_: Any) -> tuple[np.ndarray, ...]:
    """All-gather over the given participants."""
    joined = np.concatenate(values, axis=axis)
    return tuple(np.array(joined, copy=True) for _ in values)


def _reference_reduce_scatter(*values: np.ndarray, reduce_op: str = "SUM", **_: Any) -> tuple[np.ndarray, ...]:
    """Reduce-scatter over the given participants (participant ``i`` gets shard ``i`` of the reduction)."""
    total = _reference_all_reduce(*values, reduce_op=reduce_op)[0]
    return tuple(np.array(part, copy=True) for part in np.split(total.reshape(-1), len(values)))


def _infer_all_to_all(node: Node, _: int | None) -> TypeList:
    x = _in(node, 0)
    count = int(node.attrs.get("group_size", 1))
    if x.rank == 0:
        raise GraphError(f"AllToAll {node.name} needs a value of rank >= 1, got {x.type_str()}")
    split = normalize_axis(node.attrs.get("split_axis", 0), x.rank, "AllToAll split_axis")
    concat = normalize_axis(node.attrs.get("concat_axis", 0), x.rank, "AllToAll concat_axis")
    shape = list(x.shape)
    dim = shape[split]
    if isinstance(dim, int) and dim % count:
        raise GraphError(f"AllToAll {node.name}: dimension {split} of {x.type_str()} does not split into {count} "
                         "equal chunks; pad it to a multiple of the group size first")
    shape[split] = dim // count if isinstance(dim, int) else f"{dim}/{count}"
    dim = shape[concat]
    shape[concat] = dim * count if isinstance(dim, int) else f"{dim}*{count}"
    return [(x.dtype, tuple(shape))]


def _reference_all_to_all(*values: np.ndarray, split_axis: int = 0, concat_axis: int = 0,
                          **_: Any) -> tuple[np.ndarray, ...]:
    """All-to-all over the given participants: participant ``j`` joins chunk ``j`` of every participant's value."""
    chunks = [np.split(value, len(values), axis=split_axis) for value in values]
    return tuple(np.concatenate([mine[j] for mine in chunks], axis=concat_axis) for j in range(len(values)))


def _reference_identity(value: np.ndarray, **_: Any) -> tuple[np.ndarray]:
    return (value,)


def _between_processes(what: str) -> Any:
    def unavailable(*_: Any, **__: Any) -> tuple:
        raise NotImplementedError(f"{what} run between processes, not in a backend; run the plan with the "
                                  "scheduler under graphdist launch")

    return unavailable


def register_comm_ops() -> None:
    """Registers every communication op in the OpDef registry."""
    register_op(OpDef("AllReduce", GRAPHDIST_DOMAIN, _unary(), reference=_reference_all_reduce,
                      doc="Reduce a value over a replica group; every member gets the result.",
                      attrs={"reduce_op": "SUM", "group_size": 1}))
    register_op(OpDef("AllGather", GRAPHDIST_DOMAIN, gathered("group_size"), reference=_reference_all_gather,
                      doc="Concatenate a value over a replica group along `axis`.",
                      attrs={"axis": 0, "group_size": 1}))
    register_op(OpDef("ReduceScatter", GRAPHDIST_DOMAIN, _infer_scatter, reference=_reference_reduce_scatter,
                      doc="Reduce values over a replica group; member `shard` gets that equal shard of it (flat).",
                      attrs={"reduce_op": "SUM", "group_size": 1, "shard": 0}))
    register_op(OpDef("AllToAll", GRAPHDIST_DOMAIN, _infer_all_to_all, reference=_reference_all_to_all,
                      doc="Member i sends chunk j of its value along `split_axis` to member j, which joins "
                          "the chunks along `concat_axis` in member order.",
                      attrs={"split_axis": 0, "concat_axis": 0, "group_size": 1}))
    register_op(OpDef("Transfer", GRAPHDIST_DOMAIN, _unary(), reference=_reference_identity,
                      doc="Moves a value to the node's device (inserted by PartitionPass)."))
    cross_worker = _between_processes("cross-worker collectives (the MPI communicator)")
    register_op(OpDef("CrossWorkerAllReduce", GRAPHDIST_DOMAIN, _unary(), reference=cross_worker,
                      doc="Reduce a value over the workers (processes) through MPI; every worker gets the result.",
                      attrs={"reduce_op": "SUM", "num_workers": 1}))
    register_op(OpDef("CrossWorkerAllGather", GRAPHDIST_DOMAIN, gathered("num_workers"), reference=cross_worker,
                      doc="Concatenate a value over the workers along `axis` (worker order) through MPI.",
                      attrs={"axis": 0, "num_workers": 1}))
    register_op(OpDef("CrossWorkerReduceScatter", GRAPHDIST_DOMAIN, _infer_scatter, reference=cross_worker,
                      doc="Reduce rank-1 values over the workers through MPI; worker `w` gets chunk `w` of the result.",
                      attrs={"reduce_op": "SUM", "num_workers": 1}))
    parameter_servers = _between_processes("PSPull/PSPush (parameter server processes)")
    register_op(OpDef("PSPull", GRAPHDIST_DOMAIN, _infer_shard, reference=parameter_servers,
                      doc="Fetch a variable shard (rows row_start:row_stop) from its ps task.",
                      attrs={"ps": 0, "key": ""}))
    register_op(OpDef("PSPush", GRAPHDIST_DOMAIN, _infer_shard, reference=parameter_servers,
                      doc="Add an update to a variable shard on its ps task; returns the shard's new value.",
                      attrs={"ps": 0, "key": ""}))


register_comm_ops()
