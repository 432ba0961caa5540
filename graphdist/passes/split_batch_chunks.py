"""SplitBatchChunksPass: every replica computes its batch as fixed chunks of the global batch, summed in a tree.

With ``gd.config.experimental.enable_op_determinism()`` the global batch is
cut into ``chunks`` equal chunks (default 8) whatever the number of replicas:
replica ``r`` of ``N`` holds chunks ``[r * C/N, (r + 1) * C/N)``, and runs the
step's forward and backward computation once per chunk, on chunk-sized
shapes. A chunk's partial results (its gradient, its share of the loss) are
then the same bits on any replica of any strategy, since the same kernels
run on the same rows at the same shapes. What crosses chunks is summed in
one fixed pairwise tree over the ``C`` chunks, ``((c0 + c1) + (c2 + c3)) +
...``: the chunks of one replica form a subtree of it, and
``LowerDeterministicReductionsPass`` sums the replicas' subtrees with the
rest of the same tree. So the sums, and the weights updated from them, are
the same bits for one device, 2, 4 or 8 replicas, one or several processes,
and gradient accumulation.

Compiled steps use :class:`~graphdist.passes.chunk_batch_reductions.ChunkBatchReductionsPass`
instead (after differentiation; only what mixes examples per chunk, faster, and its sums are not this
pass's bits); this pass is the per-chunk form, for a ``PipelineConfig`` without ``deterministic_whole_rows``.

The rewrite is :class:`~graphdist.passes.accumulate_gradients.AccumulateGradientsPass`'s
(``C / N`` micro-batches per replica; the micro-batches count as replicas,
so ``compute_average_loss`` divides by the global batch), with the
micro-batches' sums combined in the pairwise tree instead of a running total.

Requires: ``chunks`` a power of two and ``replicas`` (the replicas in sync) a
power of two dividing it; the graph not yet cut into micro-batches.

Invariant established (ensures): each per-replica batch input is read only
through ``chunks / replicas`` ``Slice`` nodes of ``global_batch / chunks``
rows; every sum over micro-batches is an ``Add`` tree whose leaves are in
micro-batch order; ``graph.meta.deterministic_chunks = chunks`` and
``graph.meta.accumulate_steps = chunks / replicas``. The graph's inputs,
outputs and their shapes are unchanged.

Cases:

* ``chunks == replicas`` (one chunk per replica): nothing to cut; only the
  meta is set (``modified`` is then True only if it was absent);
* a graph without batch inputs (nothing is computed per example): unchanged;
* already cut (a second run, or ``accumulate_steps`` cut it): unchanged;
* ``MAX`` / ``MIN`` combinations, gathers and concatenations: as in
  ``AccumulateGradientsPass`` (they are exact in any order);
* a per-replica batch not divisible by ``chunks / replicas``, uneven
  per-replica batches: ``GraphError`` naming the global batch and the chunks;
* what ``AccumulateGradientsPass`` refuses (moving statistics assigned from
  the batch, synchronized batch normalization): ``NotImplementedError``.
"""

from __future__ import annotations

from graphdist.errors import GraphError, PostconditionError, PreconditionError
from graphdist.ir.graph import Graph
from graphdist.passes.accumulate_gradients import MicroBatchRewriter
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["BatchChunking", "SplitBatchChunksPass", "chunks_per_replica"]


def chunks_per_replica(chunks: int, replicas: int) -> int:
    """The chunks each of ``replicas`` replicas computes, checking the rule that makes the sums one tree.

    Raises:
        GraphError: ``chunks`` is not a power of two, or ``replicas`` is not a power of two dividing it.
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1 or chunks & (chunks - 1):
        raise GraphError(f"op determinism: chunks must be a power of two (the global batch is cut into that many "
                         f"equal chunks, summed in a pairwise tree), got {chunks!r}")
    if replicas < 1 or replicas & (replicas - 1) or chunks % replicas:
        raise GraphError(f"op determinism: {replicas} replicas in sync cannot each hold whole subtrees of the "
                         f"{chunks} chunks of the global batch; use a power-of-two replica count up to {chunks}, or "
                         f"gd.config.experimental.enable_op_determinism(chunks=N) with N a power of two that is a "
                         f"multiple of {replicas} if {replicas} is one")
    return chunks // replicas




class BatchChunking(PassBase):
    """What the passes that cut the global batch into op determinism's fixed chunks share: their arguments,
    and the precondition that the batch cuts evenly.

    Args:
        chunks: Chunks of the global batch (a power of two).
        replicas: Replicas in sync over all workers (a power of two dividing ``chunks``).
    """

    def __init__(self, chunks: int, replicas: int) -> None:
        self.per_replica = chunks_per_replica(chunks, replicas)
        self.chunks, self.replicas = int(chunks), int(replicas)

    def __repr__(self) -> str:
        return f"{self.name}(chunks={self.chunks}, replicas={self.replicas})"

    def requires(self, graph: Graph, ctx: PassContext | None = None) -> None:
        """The global batch divides into ``chunks`` equal chunks.

        Raises:
            PreconditionError: It does not (naming the batch and the chunks).
        """
        batch = graph.meta.batch
        if graph.meta.replica_variants:
            raise PreconditionError(f"it has per-replica batches of different sizes (a partial last batch); op "
                                    f"determinism cuts the global batch into {self.chunks} equal chunks: batch the "
                                    "dataset with drop_remainder=True")
        if batch is not None and int(batch) % self.per_replica:
            raise PreconditionError(f"a global batch of {int(batch) * self.replicas} rows does not cut into "
                                    f"{self.chunks} equal chunks (op determinism); use a global batch divisible by "
                                    f"{self.chunks}, or enable_op_determinism(chunks=N) with a power of two N that "
                                    "divides it")


class SplitBatchChunksPass(BatchChunking):
    """Cuts each replica's batch into its fixed chunks of the global batch (see the module docstring).

    Args:
        chunks: Chunks of the global batch (a power of two).
        replicas: Replicas in sync over all workers (a power of two dividing ``chunks``).
    """

    def ensures(self, graph: Graph, ctx: PassContext | None = None) -> None:
        """A graph this pass cut says so (one without batch inputs, or already cut into micro-batches by
        ``AccumulateGradientsPass``, is left as it was).

        Raises:
            PostconditionError: It does not.
        """
        untouched = graph.meta.batch is None or (
            graph.meta.accumulate_steps is not None and graph.meta.deterministic_chunks is None)
        if not untouched and graph.meta.deterministic_chunks != self.chunks:
            raise PostconditionError(f"graph {graph.name!r} lost graph.meta.deterministic_chunks")

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        if graph.meta.batch is None or graph.meta.accumulate_steps is not None:
            return PassResult(graph, modified=False)
        modified = graph.meta.deterministic_chunks != self.chunks
        graph.meta.deterministic_chunks = self.chunks
        if self.per_replica > 1:
            MicroBatchRewriter(graph, self.per_replica, tree=True,
                               label=f"op determinism ({self.chunks} chunks, per replica)").run()
            graph.meta.accumulate_steps = self.per_replica
            modified = True
        return PassResult(graph, modified=modified)
