"""LowerStopGradientsPass: remove ``graphdist.StopGradient`` markers after autodiff.

Invariant established: no ``StopGradient`` node remains; readers of each
marker read its input (the marker is the identity in the forward pass).

Cases:
* marker with readers or used as a graph output: rewired, node removed;
* no markers: unchanged.
"""

from __future__ import annotations

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["LowerStopGradientsPass"]


class LowerStopGradientsPass(PassBase):
    """Replaces stop-gradient markers by their inputs."""

    runs_after = ("AutodiffPass",)

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        markers = graph.find_nodes("StopGradient", GRAPHDIST_DOMAIN)
        graph.replace_all_uses_with_many([(node.outputs[0], node.inputs[0]) for node in markers])
        graph.remove_nodes(markers)
        return PassResult(graph, modified=bool(markers))
