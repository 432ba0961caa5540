"""Graph lowerings registered per op, as TVM's ``register_legalize`` registers legalizations.

A lowering rewrites the nodes of one op into other nodes that compute the
same values. It is registered under the op's type and a name, and
:class:`graphdist.passes.lower_ops.LowerOpsPass` applies the ones a pipeline
asks for. A lowering is a function ``(graph, group) -> replacements``:
``group`` is the nodes the op's occurrence consists of (for a collective,
every participant of one ``group_key``, in participant order; otherwise one
node); it appends the new nodes to ``graph`` (:meth:`Graph.add_node`) and
returns one value per node of ``group``, the value that replaces that node's
output, or ``None`` to leave the group alone (a case it does not lower).

Registered here:

* ``AllReduce`` ``"reduce_scatter_all_gather"``: every participant's value,
  read flat, is reduce-scattered (participant ``i`` gets shard ``i`` of the
  reduction), the shards are all-gathered, and the result is reshaped back:
  the ring all-reduce's two phases as two plan tasks, so a later pass can
  put work between them. Groups whose element count does not split evenly
  into the participants stay whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value

__all__ = ["Lowering", "get_lowering", "lowering_names", "register_lowering", "participants"]

Lowering = Callable[[Graph, Sequence[Node]], "list[Value] | None"]

_LOWERINGS: dict[str, dict[str, Lowering]] = {}


def register_lowering(op_type: str, name: str) -> Callable[[Lowering], Lowering]:
    """Decorator: registers ``function`` as lowering ``name`` of ``op_type`` (replacing one of that name)."""

    def register(function: Lowering) -> Lowering:
        _LOWERINGS.setdefault(op_type, {})[name] = function
        return function

    return register


def lowering_names(op_type: str) -> tuple[str, ...]:
    """The names of the lowerings registered for ``op_type``."""
    return tuple(_LOWERINGS.get(op_type, {}))


def get_lowering(op_type: str, name: str) -> Lowering:
    """The lowering ``name`` of ``op_type``.

    Raises:
        InvalidArgumentError: None is registered under that name (the message lists the ones that are).
    """
    found = _LOWERINGS.get(op_type, {}).get(name)
    if found is None:
        choices = ", ".join(lowering_names(op_type)) or "none is registered"
        raise InvalidArgumentError(f"no lowering {name!r} for op {op_type!r}; choose one of: {choices}")
    return found


def participants(nodes: Sequence[Node]) -> list[Node]:
    """The members of one collective group in participant order (replica order, as the plan orders them)."""
    return sorted(nodes, key=lambda n: n.replica if n.replica is not None else 0)


@register_lowering("AllReduce", "reduce_scatter_all_gather")
def _all_reduce_as_reduce_scatter_all_gather(graph: Graph, group: Sequence[Node]) -> list[Value] | None:
    first = group[0]
    count = len(group)
    value = first.inputs[0]
    size = int(np.prod([int(d) for d in value.shape])) if value.is_static else 0
    if count < 2 or count != int(first.attrs.get("group_size", 1)) or not size or size % count:
        return None
    key = first.attrs.get("group_key", first.name)
    common = {k: v for k, v in first.attrs.items() if k not in ("group_key", "algorithm", "root")}
    shape = graph.add_initializer(f"{key}_shape", np.asarray([int(d) for d in value.shape], np.int64))
    results = []
    for shard, node in enumerate(group):
        scatter = graph.add_node("ReduceScatter", [node.inputs[0]],
                                 {**common, "group_key": f"{key}.scatter", "shard": shard},
                                 domain=GRAPHDIST_DOMAIN, name=f"{node.name}_scatter")
        gather = graph.add_node("AllGather", [scatter.outputs[0]],
                                {"axis": 0, "group_key": f"{key}.gather", "group_size": count},
                                domain=GRAPHDIST_DOMAIN, name=f"{node.name}_gather")
        unflat = graph.add_node("Reshape", [gather.outputs[0], shape], name=f"{node.name}_unflat")
        for new in (scatter, gather, unflat):
            new.device, new.replica = node.device, node.replica
            new.meta.update({k: v for k, v in node.meta.items() if k in ("replica", "context")})
        for half in (scatter, gather):
            # Every member of a group must run for any to finish: the all-reduce's "side_effect" mark keeps a
            # member whose result no one reads alive (EliminateDeadNodesPass), and so must its two halves.
            half.meta.update({k: v for k, v in node.meta.items() if k == "side_effect"})
        results.append(unflat.outputs[0])
    return results
