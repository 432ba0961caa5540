"""PlacePSVariablesPass: read and update parameter-server variables through their ps tasks.

Invariant established: every graph input that feeds a variable stored on
parameter servers (placement kind ``"ps"`` in the graph's placement spec,
``graph.meta.placement``, with one shard per ps part) is read only through
``graphdist.PSPull`` nodes (one per shard, concatenated along axis 0 when
the variable is sharded), and its update output (from
``LowerVariableUpdatesPass``) is replaced by the values the ps tasks return
after ``graphdist.PSPush`` of the update (new value minus pulled value, one
push per shard). ``graph.meta.variable_updates`` names the new outputs,
so the worker's local copy caches what the ps holds after its push.

Pulls and pushes sit on the first local device (replica 0), where the
strategy's single update per worker is read back; partitioning inserts the
transfers to the other local devices.

Cases:
* variable read and updated (trainable weights, the optimizer's iterations
  and slots): pulls at step start, pushes after the update;
* variable only read: pulls only;
* variable only assigned (not read): the pull still happens (the update is a
  delta against the pulled value);
* variables not placed on ps tasks: unchanged;
* graph already rewritten (no raw variable inputs left with readers): unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.ops import get_opdef
from graphdist.ir.placement import Shard, placement_of
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["PlacePSVariablesPass"]


class PlacePSVariablesPass(PassBase):
    """Routes reads and updates of ps variables through ``PSPull`` / ``PSPush``."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        inputs = {v.name: v for v in graph.inputs}
        updates = list(graph.meta.variable_updates)
        update_of = {uid: name for name, uid in updates}
        placements = placement_of(graph)
        modified = False
        for name, variable in graph.meta.variables:
            placement = placements.get(name)
            value = inputs.get(name)
            if placement is None or placement.kind != "ps" or value is None or self._already_pulled(value):
                continue
            device = ctx.devices[0]
            shards = list(placement.shards)
            pulled = self._pull(graph, value, variable.name, shards, device)
            update_name = update_of.get(variable.uid)
            if update_name is not None:
                fresh = self._push(graph, update_name, pulled, variable.name, shards, device)
                updates = [(fresh.name if uid == variable.uid else n, uid) for n, uid in updates]
            modified = True
        graph.meta.variable_updates = updates
        return PassResult(graph, modified)

    @staticmethod
    def _already_pulled(value: Value) -> bool:
        return bool(value.uses) and all(user.op_type == "PSPull" for user, _ in value.uses)

    def _pull(self, graph: Graph, value: Value, variable: str, shards: list[Shard], device: str) -> Value:
        readers = [user for user, _ in value.uses]
        parts = [self._comm_node(graph, "PSPull", value, variable, shard, shards, device) for shard in shards]
        pulled = parts[0] if len(parts) == 1 else self._concat(graph, parts, device)
        for user in readers:
            for index, current in enumerate(user.inputs):
                if current is value:
                    user.replace_input(index, pulled)
        return pulled

    def _push(self, graph: Graph, update_name: str, pulled: Value, variable: str, shards: list[Shard],
              device: str) -> Value:
        position = max(i for i, v in enumerate(graph.outputs) if v.name == update_name)
        new = graph.outputs[position]
        delta = self._node(graph, "Sub", [new, pulled], {}, device, "ps_update").outputs[0]
        parts = [self._comm_node(graph, "PSPush", delta, variable, shard, shards, device) for shard in shards]
        fresh = parts[0] if len(parts) == 1 else self._concat(graph, parts, device)
        graph.outputs[position] = fresh
        return fresh

    def _comm_node(self, graph: Graph, op: str, source: Value, variable: str, shard: Shard, shards: list[Shard],
                   device: str) -> Value:
        attrs = {"ps": int(shard.ps), "key": shard.key, "variable": variable,
                 "group_key": graph.unique_name(f"{op.lower()}_{shard.key}", node=True)}
        if len(shards) > 1:
            attrs.update(row_start=int(shard.start), row_stop=int(shard.stop))
        return self._node(graph, op, [source], attrs, device, op.lower(), domain=GRAPHDIST_DOMAIN).outputs[0]

    def _concat(self, graph: Graph, parts: list[Value], device: str) -> Value:
        return self._node(graph, "Concat", parts, {"axis": 0}, device, "ps_concat").outputs[0]

    @staticmethod
    def _node(graph: Graph, op: str, inputs: list[Value], attrs: dict[str, Any], device: str, hint: str,
              domain: str = "") -> Node:
        node = Node(op, inputs, attrs, domain=domain)
        node.name = graph.unique_name(hint, node=True)
        node.device, node.replica = device, 0
        if domain == GRAPHDIST_DOMAIN:
            node.meta["side_effect"] = True
        for index, (dtype, shape) in enumerate(get_opdef(op, domain).infer(node, None)):
            out = Value(graph.unique_name(node.name if index == 0 else f"{node.name}_{index}"), np.dtype(dtype),
                        shape, producer=node, index=index)
            node.outputs.append(out)
        _insert_after_inputs(graph, node)
        return node


def _insert_after_inputs(graph: Graph, node: Node) -> None:
    """Inserts ``node`` right after the last producer of its inputs (topological order)."""
    producers = {id(v.producer) for v in node.inputs if v is not None and v.producer is not None}
    position = 0
    for index, other in enumerate(graph.nodes):
        if id(other) in producers:
            position = index + 1
    if position < len(graph.nodes):
        graph.insert_before(graph.nodes[position], node)
    else:
        graph.append(node)
