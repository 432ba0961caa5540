"""LowerSingleReaderAllReducesPass: an all-reduce whose result one replica reads becomes a sum on that replica.

After :class:`graphdist.passes.balance_variable_updates.BalanceVariableUpdatesPass`
each gradient's ``AllReduce`` group is still run for every replica, but only
the replica chosen to update the variable reads its member's result: the other
replicas' copies of the update are dead. Broadcasting the sum to every replica
is then wasted, and so is running it as a collective: in one process the
communicator reduces on the coordinating thread, one group after the other,
while every device waits (the serial tail of a Mirrored step, BENCHMARKS.md
"Overlap"). This pass turns such a group into ONNX arithmetic on the reading
replica: ``Sum(x_0, ..., x_{N-1})`` placed on that replica (a reduce to one
device, like TensorFlow's ``ReductionToOneDevice``, with the reader as the
destination). PartitionPass then reads the other replicas' inputs through
``Transfer`` nodes (free between logical devices of one process), and the sum
joins the reader's update segment, so the devices sum and update their own
variables in parallel.

Invariant established: no local ``AllReduce`` group (every member in this
process) has exactly one member whose result is *read*, i.e. used by a node
that some graph output or side effect depends on, or itself a graph output.

Cases:

* ``SUM`` of floating-point values: ``Sum`` of the members' inputs, in
  replica order; of integers: a chain of ``Add``;
* ``MEAN`` of floating-point values: the ``Sum`` divided by the member count;
* ``MAX`` / ``MIN``: a chain of ``Max`` / ``Min``;
* the last new node produces the read member's result value itself (same name
  and readers, graph outputs included), and
  every member of the group is removed, with the nodes reading the unread
  members (dead copies of the update, which nothing live reads); the new
  nodes take the read member's context and replica (so ``AssignDevicesPass``
  places them on its device), ``meta["summed_group"]`` (the group's key) and
  ``meta["summed_replicas"]`` (its members), which the summaries list;
* a group spanning other workers (``group_size`` above its members here,
  MultiWorkerMirrored), read by several replicas, read by none, of one member,
  with another reduce op, ``MEAN`` of integers, or of booleans: unchanged;
* the node order: the new nodes go where the read member was, then the order
  is made topological again (stable), so a replica's update still follows
  the values it sums;
* nothing to lower (also a second run): unchanged.

Numerics: for two replicas ``x_0 + x_1`` is the bits the ring all-reduce
gives (one addition, which is commutative); for more, the sum is taken in
replica order instead of the ring's order (float rounding may differ by an
ulp, well within the single-device oracle's tolerance).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from graphdist.ir.comm_ops import SUMMED_GROUP, SUMMED_REPLICAS
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.liveness import live_nodes
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["LowerSingleReaderAllReducesPass", "SUMMED_GROUP", "SUMMED_REPLICAS"]

logger = logging.getLogger(__name__)

_CHAINED = {"SUM": "Add", "MAX": "Max", "MIN": "Min"}


class LowerSingleReaderAllReducesPass(PassBase):
    """Lowers every local ``AllReduce`` group that one replica reads to arithmetic on that replica."""

    runs_after = ("InsertCollectivesPass",)

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        groups = _local_groups(graph)
        if not groups:
            return PassResult(graph, modified=False)
        # A member counts only through its readers; a live member needs every member's input.
        group_of = {id(m): members for members in groups.values() for m in members}
        live = live_nodes(graph, through_readers=group_of.keys(), together=group_of)
        outputs = {id(v) for v in graph.outputs}
        lowered = 0
        for key, members in groups.items():
            read = [m for m in members if _is_read(m.outputs[0], live, outputs)]
            if len(read) != 1:
                logger.debug("all-reduce %s is read by %d replicas: kept", key, len(read))
                continue
            _lower(graph, members, read[0])
            lowered += 1
        if lowered:
            graph.topological_sort()
            logger.debug("lowered %d single-reader all-reduce group(s) to sums on their readers", lowered)
        return PassResult(graph, modified=bool(lowered))


def _local_groups(graph: Graph) -> dict[str, list[Node]]:
    """The ``AllReduce`` groups this pass may lower, by group key (members in replica order)."""
    groups: dict[str, list[Node]] = {}
    for node in graph.nodes:
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "AllReduce":
            groups.setdefault(str(node.attrs.get("group_key", node.name)), []).append(node)
    return {key: sorted(members, key=lambda m: int(m.replica or 0))
            for key, members in groups.items() if _lowerable(members)}


def _lowerable(members: list[Node]) -> bool:
    first = members[0]
    op = str(first.attrs.get("reduce_op", "SUM")).upper()
    dtype = first.inputs[0].dtype
    if len(members) < 2 or int(first.attrs.get("group_size", len(members))) != len(members):
        return False  # one member (LowerCollectivesPass removes it) or members in other workers
    if len({-1 if m.replica is None else int(m.replica) for m in members}) != len(members):
        return False
    if dtype.kind == "b" or dtype.kind not in "fiu" or (op == "MEAN" and dtype.kind != "f"):
        return False
    if op not in ("SUM", "MEAN", "MAX", "MIN"):
        return False
    return all(str(m.attrs.get("reduce_op", "SUM")).upper() == op and m.inputs[0].dtype == dtype
               and m.inputs[0].shape == first.inputs[0].shape for m in members)


def _is_read(value: Value, live: set[int], outputs: set[int]) -> bool:
    return id(value) in outputs or any(id(node) in live for node, _ in value.uses)


def _lower(graph: Graph, members: list[Node], reader: Node) -> None:
    """Replaces the group by arithmetic on ``reader``'s replica; the other members' results are unread."""
    op = str(reader.attrs.get("reduce_op", "SUM")).upper()
    inputs = [m.inputs[0] for m in members]
    meta = {k: v for k, v in reader.meta.items() if k != "side_effect"}
    meta.update({SUMMED_GROUP: str(reader.attrs.get("group_key", reader.name)), SUMMED_REPLICAS: len(members)})

    def add(op_type: str, operands: Iterable[Value]) -> Value:
        node = graph.add_node(op_type, list(operands), name=f"{op_type.lower()}_{reader.name}")
        node.meta.update(meta)
        node.replica = reader.replica
        return node.outputs[0]

    with graph.inserting_before(reader):  # where the read member was
        if op in ("SUM", "MEAN") and inputs[0].dtype.kind == "f":
            result = add("Sum", inputs)
            if op == "MEAN":
                count = graph.add_initializer(graph.unique_name(f"{reader.name}_count"),
                                              np.array(len(members), dtype=inputs[0].dtype))
                result = add("Div", [result, count])
        else:
            result = inputs[0]
            for operand in inputs[1:]:
                result = add(_CHAINED[op], [result, operand])
    # The last node produces the read member's result value itself (its name, readers and output position stay).
    graph.replace_node(reader, result.producer, keep_values=True)
    _remove_unread(graph, [m for m in members if m is not reader])


def _remove_unread(graph: Graph, members: list[Node]) -> None:
    """Removes ``members`` and the nodes reading them (the dead copies of the other replicas' updates).

    Nothing live reads these nodes (else the member would be read), so the whole cone goes.
    """
    cone: dict[int, Node] = {}
    stack = list(members)
    while stack:
        node = stack.pop()
        if id(node) not in cone:
            cone[id(node)] = node
            stack.extend(user for out in node.outputs for user, _ in out.uses)
    graph.remove(cone.values())
