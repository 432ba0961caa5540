"""PlaceVariablesPass: variables, their reads and their updates on one parameter device.

Used by ``CentralStorageStrategy``: variables have a single copy on the
parameter device, replicas compute on their own devices.

Invariant established (``p`` is the parameter device):

* the *update computation* is placed on ``p``: the largest set of nodes whose
  results (a) are used only by variable-update outputs (the last graph outputs,
  listed in ``graph.meta.variable_updates`` by ``LowerVariableUpdatesPass``)
  or by other nodes of the set, and (b) are computed only from variables,
  constants, results of collectives (the all-reduced gradients) or other such
  nodes;
* every variable-update output is produced on ``p``: an update whose producer
  is not part of the update computation gets an ``Identity`` on ``p``
  (``meta["variable_update"]``), so the value is moved to ``p`` before the
  runtime writes it back;
* an update node that reads a collective's result reads the participant on
  ``p`` when ``p`` runs a replica (all participants hold the same result), so
  the sum is consumed where the reduce-to-one algorithm left it;
* variables are read on ``p``: a variable input is the single copy (fed from
  the variable's buffer, which lives on ``p``); nodes on ``p`` read it
  directly, nodes that will run on another device (by ``AssignDevicesPass``'
  rule: their replica's device) read it through one ``graphdist.Transfer``
  per device (``meta["variable_read"]``). A transfer reads a graph input, so it
  is ready when the step starts and no replica waits for another device's
  computation (an ``Identity`` read node on ``p`` would share ``p``'s first
  segment with its replica's forward pass and make the other replicas wait).

Cases:

* optimizer step after ``apply_gradients``: the optimizer math (momentum,
  Adam moments and bias correction, the iteration counter) moves to ``p``; the
  gradients stay on their replicas up to the all-reduce;
* one replica: the collectives of one participant are still present when this
  pass runs (it runs before ``LowerCollectivesPass``), so the boundary is the
  same; the local gradient is then transferred to ``p``;
* an update computed from replica data without a collective (``v.assign(x)``
  in a replica): the computation stays on the replica (with ``MirroredStrategy``
  semantics: the last replica's value is written), only the final value moves;
* a node also read by other computation (forward pass, a returned value): left
  to ``AssignDevicesPass``;
* ``p`` may be a compute device or a separate device (``cpu:9``);
* a variable only the update reads (an optimizer slot): no transfer at all;
* no variables: unchanged; a second run: unchanged (nodes already on ``p``,
  transfers and update copies already present).

The pass runs after ``LowerVariableUpdatesPass`` and before
``AssignDevicesPass``, which places every node left unplaced on its replica's
device. Placement never changes numerics: partitioning inserts the transfers.
"""

from __future__ import annotations

from typing import Any

from graphdist.errors import GraphError
from graphdist.ir.comm_ops import is_communication
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.runtime.devices import parse_device

__all__ = ["PlaceVariablesPass"]


def _replica_of(node: Node) -> int | None:
    return node.replica


def _device_of(node: Node, ctx: PassContext) -> str:
    """Where the node is or will be placed (``AssignDevicesPass``' rule for unplaced nodes)."""
    if node.device is not None:
        return node.device
    replica = _replica_of(node) or 0
    return ctx.devices[replica] if replica < len(ctx.devices) else ctx.devices[0]


def _update_positions(graph: Graph) -> range:
    """Positions of the variable-update outputs: the last ``len(variable_updates)``
    graph outputs, in order (how the runtime writes them back).
    """
    updates = graph.meta.variable_updates
    start = len(graph.outputs) - len(updates)
    names = [v.name for v in graph.outputs[start:]] if start >= 0 else None
    if names != [name for name, _ in updates]:
        raise GraphError(f"graph {graph.name!r}: the last graph outputs {names} do not match "
                         f"meta.variable_updates {[name for name, _ in updates]}; run "
                         "LowerVariableUpdatesPass before PlaceVariablesPass and append user outputs before it")
    return range(start, len(graph.outputs))


class PlaceVariablesPass(PassBase):
    """Places variable reads and the variable-update computation on the parameter device.

    Args:
        parameter_device: Device string of the variables (default: the first
            replica's device, ``ctx.devices[0]``).
    """

    def __init__(self, parameter_device: Any = None) -> None:
        self.parameter_device = str(parse_device(parameter_device)) if parameter_device is not None else None

    def __repr__(self) -> str:
        return f"{self.name}(parameter_device={self.parameter_device!r})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        device = self.parameter_device or ctx.devices[0]
        positions = _update_positions(graph)
        region = self._update_region(graph, positions)
        modified = False
        for node in graph.nodes:
            if id(node) in region and (node.device != device or node.replica is not None):
                node.device, node.replica = device, None
                modified = True
        modified |= self._move_update_outputs(graph, positions, region, device)
        modified |= self._read_local_collectives(graph, region, device, ctx)
        modified |= self._transfer_reads(graph, device, ctx)
        return PassResult(graph, modified)

    # ------------------------------------------------------------ reads
    @staticmethod
    def _transfer_reads(graph: Graph, device: str, ctx: PassContext) -> bool:
        """Readers of a variable on another device read it through one ``Transfer`` per device."""
        made: list[Node] = []
        for value in graph.inputs:
            if value.meta.get("variable") is None:
                continue
            moved: dict[str, Value] = {}
            for user, index in list(value.uses):
                target = _device_of(user, ctx)
                if is_communication(user) or target == device:
                    continue
                copy = moved.get(target)
                if copy is None:
                    transfer = Node("Transfer", [value], domain=GRAPHDIST_DOMAIN)
                    transfer.name = graph.unique_name("transfer", node=True)
                    transfer.device, transfer.replica = target, _replica_of(user)
                    transfer.meta["variable_read"] = value.name
                    copy = Value(graph.unique_name(f"{value.name}_to_{target.replace(':', '')}"), value.dtype,
                                 value.shape)
                    transfer.add_output(copy)
                    made.append(transfer)
                    moved[target] = copy
                user.replace_input(index, copy)
        if made:  # they read graph inputs only: first in the node order
            graph.set_nodes(made + graph.nodes)
        return bool(made)

    # ------------------------------------------------------- update region
    @staticmethod
    def _update_region(graph: Graph, positions: range) -> set[int]:
        """Ids of the nodes of the update computation (see the module docstring)."""
        if not positions:
            return set()
        user_outputs = {id(v) for i, v in enumerate(graph.outputs) if i not in positions}
        update_outputs = {id(graph.outputs[i]) for i in positions}
        allowed = set(id(v) for v in graph.initializers.values())
        allowed |= {id(v) for v in graph.inputs if v.meta.get("variable") is not None}
        # (b) forward: computable from variables, constants and collective results.
        eligible: set[int] = set()
        for node in graph.nodes:
            if is_communication(node):
                allowed.update(id(v) for v in node.outputs)
                continue
            if all(v is None or id(v) in allowed for v in node.inputs):
                eligible.add(id(node))
                allowed.update(id(v) for v in node.outputs)
        # (a) backward: every use is an update output or another node of the region.
        region: set[int] = set()
        for node in reversed(graph.nodes):
            if id(node) not in eligible:
                continue
            uses = [user for out in node.outputs for user, _ in out.uses]
            feeds_update = any(id(out) in update_outputs for out in node.outputs)
            if any(id(out) in user_outputs for out in node.outputs) or not (uses or feeds_update):
                continue
            if all(id(user) in region for user in uses):
                region.add(id(node))
        return region

    # ---------------------------------------------------------- outputs
    @staticmethod
    def _move_update_outputs(graph: Graph, positions: range, region: set[int], device: str) -> bool:
        """An ``Identity`` on the parameter device for updates produced elsewhere."""
        updates = list(graph.meta.variable_updates)
        modified = False
        for entry, position in enumerate(positions):
            value = graph.outputs[position]
            producer = value.producer
            if producer is None or id(producer) in region or producer.device == device:
                continue
            copy = graph.add_node("Identity", [value], name="update")
            copy.device, copy.replica = device, None
            copy.meta["variable_update"] = value.name
            graph.outputs[position] = copy.outputs[0]
            updates[entry] = (copy.outputs[0].name, updates[entry][1])
            modified = True
        if modified:
            graph.meta.variable_updates = updates  # a new list: graph copies share the old one
        return modified

    # ------------------------------------------------------ collectives
    @staticmethod
    def _read_local_collectives(graph: Graph, region: set[int], device: str, ctx: PassContext) -> bool:
        """Update nodes read the all-reduce participant on the parameter device, if any."""
        local: dict[str, list[Value]] = {}
        for node in graph.nodes:
            if node.op_type == "AllReduce" and is_communication(node) and _device_of(node, ctx) == device:
                key = node.attrs.get("group_key")
                if key is not None:
                    local[key] = node.outputs
        if not local:
            return False
        modified = False
        for node in graph.nodes:
            if id(node) not in region and not node.meta.get("variable_update"):
                continue
            for index, value in enumerate(node.inputs):
                producer = value.producer if value is not None else None
                if producer is None or producer.op_type != "AllReduce" or not is_communication(producer):
                    continue
                twin = local.get(producer.attrs.get("group_key"))
                if twin is not None and twin[value.index] is not value:
                    node.replace_input(index, twin[value.index])
                    modified = True
        if modified:
            graph.topological_sort()  # the local participant may come later in the node order
        return modified
