"""What every pass test checks, in the style of TVM's pass tests (``tests/passes/test_<pass module>.py``).

:func:`check_pass` runs a pass once and asserts: ``modified`` is what the test says (a pass that changes
nothing must say so), the result verifies, it is structurally equal to a hand-built expected graph (when
one is given), the numerics are unchanged (the graph before and after run through the reference
backend on the same feeds), and a second run changes nothing.
"""

from __future__ import annotations

import numpy as np

from graphdist.backends import default_cache, get_backend
from graphdist.ir import Graph, Value, assert_structural_equal, to_onnx, verify
from graphdist.passes.base import PassBase, PassContext
from graphdist.runtime.devices import parse_device

__all__ = ["run_reference", "random_feeds", "check_pass", "replica_op"]


def run_reference(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``graph``'s outputs on ``feeds`` with the reference backend (graphdist ops as one participant)."""
    exe = default_cache().get_or_compile(get_backend("reference"), to_onnx(graph), parse_device("cpu:0"))
    return exe.run({v.name: feeds[v.name] for v in graph.inputs})


def replica_op(graph: Graph, op_type: str, inputs: list, attrs: dict | None = None, *, replica: int = 0,
               domain: str = "", **meta) -> Value:
    """Adds a node of replica ``replica`` (``meta["context"] = "replica"`` and ``meta``), as the replicated step
    holds them; returns its first output."""
    node = graph.add_node(op_type, inputs, attrs, domain=domain)
    node.replica = replica
    node.meta.update(context="replica", **meta)
    return node.outputs[0]


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """One array per graph input, random (integers in ``[0, 4)``)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.inputs:
        shape = tuple(int(d) for d in value.shape)
        if np.issubdtype(value.dtype, np.integer):
            feeds[value.name] = rng.integers(0, 4, shape).astype(value.dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(value.dtype)
    return feeds


def check_pass(pass_: PassBase, graph: Graph, *, modified: bool, expected: Graph | None = None,
               ctx: PassContext | None = None, feeds: dict[str, np.ndarray] | None = None,
               numerics: bool = True, placement: bool = False, meta_keys: tuple[str, ...] = (),
               new_outputs: int = 0) -> Graph:
    """Runs ``pass_`` on ``graph`` and checks it (see the module docstring); returns the result.

    Args:
        pass_: The pass.
        graph: The graph before (the pass may edit it in place).
        modified: What the pass must report.
        expected: The hand-built graph the result must equal structurally (``None``: not compared).
        ctx: The pass context (default: ``PassContext()``).
        feeds: Inputs for the numerics check (default: :func:`random_feeds`).
        numerics: Compare the outputs before and after (off where the reference backend cannot run the
            graph, e.g. several participants of one collective).
        placement: Compare devices and replicas too.
        meta_keys: Node meta keys compared too.
        new_outputs: Outputs the pass appends (variable updates): the ones before must keep their values,
            the test checks the new ones.
    """
    ctx = ctx or PassContext()
    feeds = feeds if feeds is not None else random_feeds(graph)
    before = run_reference(graph, feeds) if numerics else None
    result = pass_(graph, ctx)
    assert result.modified is modified, f"{pass_.name} reported modified={result.modified}, expected {modified}"
    verify(result.graph)
    if expected is not None:
        assert_structural_equal(result.graph, expected, placement=placement, meta_keys=meta_keys)
    if before is not None:
        after = run_reference(result.graph, feeds)
        assert len(after) == len(before) + new_outputs
        for got, want in zip(after, before):
            np.testing.assert_array_equal(got, want)
    snapshot = result.graph.copy()
    again = pass_(result.graph, ctx)
    assert not again.modified, f"{pass_.name} changed its own result"
    assert_structural_equal(again.graph, snapshot, placement=True, meta_keys=meta_keys)
    return result.graph
