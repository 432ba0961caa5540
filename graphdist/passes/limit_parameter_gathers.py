"""LimitParameterGathersPass: gather one layer's sharded weights at a time (FSDP's ``limit_all_gathers``).

:class:`~graphdist.passes.shard_parameters.ShardParametersPass` stores weights in shards and gathers each
before its readers; but a gather reads only the replica's shard, a graph input, so nothing keeps it from
running at the start of the step, and a plan cut into segments by communication phase would gather every
weight of the forward pass before the first layer computes. At the peak a replica would then hold every
gathered weight, as a replicated strategy does.

This pass orders each replica's gathers by *unit* (the weights of one layer: the variables whose names
share everything up to the last ``/`` or ``.``, e.g. ``mlp/dense_0/kernel`` and ``mlp/dense_0/bias``, as
FSDP wraps a module; the forward and the backward gathers are separate units). Units are taken in the
order their weights are first read, and the first collective of each gather of unit ``k`` waits for the
readers of unit ``k - 1``'s gathered weights: ``attrs["after"]`` lists the values those readers produce.
``PartitionPass`` puts the gather in a later phase than them and names their segments in
``attrs["after_segments"]``; the scheduler starts the gather once those segments have run and frees a
value once its last reader has run. So a replica holds one unit's gathered weights at a time (plus a
reader of the previous unit that is still running), the memory FSDP promises, at the cost of one segment
per unit and phase.

Invariant established: for every unit but a replica's first, each first collective of its gathers lists
in ``attrs["after"]`` the outputs of the previous unit's weight readers that do not depend on the unit's
own gathers (a reader that does, e.g. a tied weight read again after the next layer, is not waited for:
waiting would be a cycle); all members of a collective group list the same values.

Cases:
* a graph without marked gathers (no FSDP, or one replica in all): unchanged;
* one unit per replica: unchanged (nothing to wait for);
* units ``u0, u1, ...`` per replica (forward then backward): ``u1``'s gathers wait for ``u0``'s readers,
  and so on; with ``prefetch=p``, ``u(k)``'s wait for ``u(k-1-p)``'s readers (the first ``p + 1`` units
  wait for nothing); across workers the first collective is the ``CrossWorkerAllGather``, which keeps the order
  every worker issues its collectives in the same (all workers wait for the same readers);
* a second run: the same lists, unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from graphdist.errors import GraphError, InvalidArgumentError
from graphdist.ir.graph import Graph, Node
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.shard_parameters import GATHER_META, WEIGHT_META

__all__ = ["LimitParameterGathersPass", "AFTER_ATTR", "ordering_edges", "unit_of"]

#: Collective attribute: names of the values whose segments must have run before the collective starts.
AFTER_ATTR = "after"

_PREFIX = re.compile(r"^fsdp\.(?P<variable>.+)\.(?P<phase>forward|backward)$")


def unit_of(gather_key: str) -> tuple[str, str]:
    """The unit a gather belongs to: ``(layer, phase)`` from its key ``fsdp.<variable>.<phase>``.

    The layer is the variable's name up to its last ``/`` or ``.`` (the whole name when it has neither).
    """
    match = _PREFIX.match(gather_key)
    variable, phase = (match["variable"], match["phase"]) if match else (gather_key, "")
    cut = max(variable.rfind("/"), variable.rfind("."))
    return (variable[:cut] if cut > 0 else variable), phase


class LimitParameterGathersPass(PassBase):
    """Makes each unit's weight gathers wait for the readers of the unit ``prefetch + 1`` before it.

    Args:
        prefetch: Units gathered ahead of the one computing (FSDP's prefetch): ``0`` (default) holds one
            unit's gathered weights at a time and a gather waits for the previous unit's readers; ``1`` lets
            the next unit's gathers run while a unit computes (overlapping communication with computation)
            and holds two.

    Raises:
        InvalidArgumentError: ``prefetch`` is not a non-negative integer.
    """

    runs_after = ("ShardParametersPass", "EliminateDeadNodesPass")

    def __init__(self, prefetch: int = 0) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise InvalidArgumentError(f"LimitParameterGathersPass: prefetch must be an integer >= 0 (units "
                                       f"gathered ahead), got {prefetch!r}")
        self.prefetch = prefetch

    def __repr__(self) -> str:
        return self.name if not self.prefetch else f"{self.name}(prefetch={self.prefetch})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        heads, weights = _marked(graph)
        if not heads:
            return PassResult(graph, modified=False)
        position = {id(n): i for i, n in enumerate(graph.nodes)}
        waits: dict[str, set[str]] = {}
        for replica in sorted({r for r, _ in heads}, key=lambda r: -1 if r is None else r):
            units = sorted((u for r, u in heads if r == replica),
                           key=lambda u: _first_read(weights.get((replica, u), []), position))
            for previous, unit in zip(units, units[1 + self.prefetch:]):
                unit_heads = heads[(replica, unit)]
                after = _awaited(weights.get((replica, previous), []), _descendants(unit_heads))
                for head in unit_heads:
                    waits.setdefault(_group(head), set()).update(after)
        modified = False
        for unit_heads in heads.values():
            for head in unit_heads:
                names = sorted(waits.get(_group(head), ()))
                if names and head.attrs.get(AFTER_ATTR) != names:
                    head.attrs[AFTER_ATTR] = names
                    modified = True
        return PassResult(graph, modified)  # PartitionPass orders the nodes by these edges where it reads them


def ordering_edges(graph: Graph) -> dict[int, list[Node]]:
    """Node id -> the nodes producing the values its ``attrs["after"]`` names (for ordering and phases).

    Raises:
        GraphError: A named value is produced by no node (a pass removed a reader a gather waits for).
    """
    waiting = [n for n in graph.nodes if n.attrs.get(AFTER_ATTR)]
    if not waiting:
        return {}
    producer = {out.name: n for n in graph.nodes for out in n.outputs}
    edges: dict[int, list[Node]] = {}
    for node in waiting:
        missing = [name for name in node.attrs[AFTER_ATTR] if name not in producer]
        if missing:
            raise GraphError(f"{node.name} waits for {missing}, which no node produces")
        edges[id(node)] = [producer[name] for name in node.attrs[AFTER_ATTR]]
    return edges


def _marked(graph: Graph) -> tuple[dict[tuple[int | None, tuple[str, str]], list[Node]],
                                   dict[tuple[int | None, tuple[str, str]], list[Node]]]:
    """``(replica, unit)`` -> the first collectives of its gathers, and -> the nodes making its weights."""
    heads: dict[tuple[int | None, tuple[str, str]], list[Node]] = {}
    weights: dict[tuple[int | None, tuple[str, str]], list[Node]] = {}
    for node in graph.nodes:
        if GATHER_META in node.meta:
            heads.setdefault((node.replica, unit_of(str(node.meta[GATHER_META]))), []).append(node)
        if WEIGHT_META in node.meta:
            weights.setdefault((node.replica, unit_of(str(node.meta[WEIGHT_META]))), []).append(node)
    return heads, weights


def _readers(weight_nodes: Iterable[Node]) -> list[Node]:
    return [user for node in weight_nodes for out in node.outputs for user, _ in out.uses]


def _first_read(weight_nodes: list[Node], position: dict[int, int]) -> int:
    """Graph position of the first reader of a unit's weights (units are taken in this order)."""
    return min((position[id(n)] for n in _readers(weight_nodes)), default=len(position))


def _awaited(weight_nodes: list[Node], later: set[int]) -> set[str]:
    """The values the readers of a unit's weights produce, but for readers that depend on ``later``."""
    return {reader.outputs[0].name for reader in _readers(weight_nodes)
            if id(reader) not in later and reader.outputs}


def _descendants(roots: list[Node]) -> set[int]:
    """Ids of the nodes that read, directly or not, what ``roots`` produce (the roots included)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(user for out in node.outputs for user, _ in out.uses)
    return seen


def _group(node: Node) -> str:
    return str(node.attrs.get("group_key") or node.name)
