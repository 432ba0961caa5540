"""LowerCollectivesPass: turn collective nodes into executable form.

Invariant established: no single-participant ``graphdist.AllReduce`` /
``AllGather`` remains, and every multi-participant one carries the algorithm
the runtime executes (``attrs["algorithm"]``, from the strategy's
``cross_device_ops``), plus ``attrs["root"]`` for reduce-to-one.

Cases:
* group of one participant: the identity (SUM, MEAN, MAX or MIN of one value
  is the value; gathering one value is the value): output rewired to the
  input, node removed;
* group of several participants: annotated with ``algorithm``, one of the
  registry's local algorithms (``graphdist.runtime.comm.algorithms``: ``ring``,
  ``hierarchical_copy``, ``reduce_to_one``), and ``root`` where the algorithm
  accumulates on one device; the local communicator runs it. An algorithm
  that does not run between logical devices is refused when the pass (so the
  pipeline) is built, with the choices;
* already annotated nodes: unchanged (the pass is idempotent).
"""

from __future__ import annotations

from typing import Any

from graphdist.errors import GraphError
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.runtime.comm.algorithms import check_algorithm

__all__ = ["LowerCollectivesPass", "COLLECTIVE_OPS"]

COLLECTIVE_OPS = ("AllReduce", "AllGather")


def _collectives(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.domain == GRAPHDIST_DOMAIN and n.op_type in COLLECTIVE_OPS]


class LowerCollectivesPass(PassBase):
    """Lowers collectives for the strategy's cross-device algorithm.

    Args:
        collective_attrs: Attributes for multi-participant collectives, e.g.
            ``{"algorithm": "ring"}`` or ``{"algorithm": "reduce_to_one",
            "reduce_to_device": "cpu:1"}``.

    Raises:
        InvalidArgumentError: The algorithm is not one the local communicator runs (the message lists them).
    """

    runs_after = ("InsertCollectivesPass", "InsertCrossWorkerCollectivesPass")

    def __init__(self, collective_attrs: dict[str, Any] | None = None) -> None:
        self.collective_attrs = dict(collective_attrs or {"algorithm": "ring"})
        self._algorithm = check_algorithm(self.collective_attrs.get("algorithm", "ring"), "local",
                                          "LowerCollectivesPass (the strategy's cross-device ops)")

    def __repr__(self) -> str:
        return f"{self.name}({self.collective_attrs})"

    def _attrs_for(self, ctx: PassContext) -> dict[str, Any]:
        attrs: dict[str, Any] = {"algorithm": self._algorithm.name}
        if self._algorithm.uses_root:
            device = self.collective_attrs.get("reduce_to_device")
            attrs["root"] = ctx.devices.index(device) if device in ctx.devices else 0
        return attrs

    @staticmethod
    def _check_groups(nodes: list[Node]) -> None:
        groups: dict[str, list[Node]] = {}
        for node in nodes:
            groups.setdefault(node.attrs.get("group_key", node.name), []).append(node)
        for key, members in groups.items():
            types = {(m.inputs[0].dtype.name, m.inputs[0].shape) for m in members}
            if len(types) > 1 and members[0].op_type == "AllReduce":
                listing = ", ".join(f"replica {'?' if m.replica is None else m.replica}: {m.inputs[0].type_str()}"
                                    for m in members)
                raise GraphError(
                    f"all-reduce {key} gets values of different shapes or dtypes ({listing}); per-replica values "
                    "reduced together must match (pad or slice them to one shape first)"
                )

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        modified = False
        wanted = self._attrs_for(ctx)
        self._check_groups(_collectives(graph))
        alone = []  # groups of one: the identity
        for node in _collectives(graph):
            if int(node.attrs.get("group_size", 1)) == 1:
                alone.append(node)
                modified = True
                continue
            if node.op_type == "AllReduce" and any(node.attrs.get(k) != v for k, v in wanted.items()):
                node.attrs.update(wanted)
                modified = True
        graph.replace_all_uses_with_many([(node.outputs[0], node.inputs[0]) for node in alone])
        graph.remove_nodes(alone)
        return PassResult(graph, modified)
