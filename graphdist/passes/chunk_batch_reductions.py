"""ChunkBatchReductionsPass: a replica's batch computed whole where rows stay apart, in fixed chunks where they meet.

With ``gd.config.experimental.enable_op_determinism()`` the global batch is
cut into ``chunks`` equal chunks (default 8) whatever the number of replicas,
and what sums over examples sums each chunk at its own shape, then the
chunks in one fixed pairwise tree (the contract of ``SplitBatchChunksPass``,
which computes *everything* per chunk). This pass gets the same bits for
less time: the ops whose rows of example ``e`` depend only on example
``e``'s rows (:mod:`graphdist.passes.row_layout`: elementwise ops,
``MatMul`` over rows, ``Conv`` per image, ``Softmax`` over features...) run
once on the replica's whole batch, since ONNX Runtime's kernels compute a
row by the same arithmetic whatever the number of rows (checked by
``tests/backends/test_kernel_determinism.py`` and the determinism tests); only
the rest, the *chunk region*, runs once per chunk on the Slices of its
inputs: every op that mixes examples (the weight gradients ``MatMul(X^T,
dY)``, ``ReduceSum`` over the batch, a convolution's filter gradient) and
every op after one, up to the cross-replica ops, which read the chunks
combined in the pairwise tree as in ``SplitBatchChunksPass``.

It runs after ``AutodiffPass`` (the backward ops are classified like the
forward ones), on the graph of one replica.

Requires: ``chunks`` a power of two and ``replicas`` a power of two dividing
it; the graph differentiated and not yet cut into micro-batches.

Invariant established (ensures): the same as ``SplitBatchChunksPass``'s for the
chunk region (each chunk copy reads rows ``[c * rows / k, (c + 1) * rows / k)``
of the whole values along their batch axis; sums over chunks are ``Add``
trees in chunk order, a tree's ``Add`` of a chunk's 2-D ``MatMul`` over at most
:data:`FUSED_ROWS` rows being ``Gemm(a, b, left)``; a sum over the leading
axes of a whole value being ``MatMul(ones, X.reshape(k, n, rest))`` sliced
per chunk); numbers computed from the batch size that are not
shapes read the chunk's size (the chunks count as replicas, so
``NumReplicas`` reads ``replicas * chunks / replicas``);
``graph.meta.deterministic_chunks = chunks``, ``graph.meta.accumulate_steps
= chunks / replicas``. Inputs, outputs and their shapes are unchanged.

Cases:

* one chunk per replica: nothing to cut; only the meta is set;
* no batch inputs, or already cut: unchanged;
* an op that is not known to be row-wise: in the chunk region (correct, only slower);
* what ``AccumulateGradientsPass`` refuses (moving statistics, synchronized batch
  normalization): ``NotImplementedError``; uneven batches: ``PreconditionError``.
"""

from __future__ import annotations

import numpy as np

from graphdist.errors import PostconditionError
from graphdist.ir.batch import BatchDim, elements
from graphdist.ir.graph import Graph, Node, Value
from graphdist.passes.accumulate_gradients import MicroBatchRewriter, _is_boundary
from graphdist.passes.base import PassContext, PassResult
from graphdist.passes.row_layout import ELEMENTWISE, row_layouts
from graphdist.passes.split_batch_chunks import BatchChunking

__all__ = ["ChunkBatchReductionsPass", "FUSED_ROWS"]

#: Largest contraction (rows of a chunk) whose product is fused with the tree's addition (ONNX Runtime's
#: GEMM sums up to 256 rows in one block before adding ``C``; half of that for margin).
FUSED_ROWS = 128

#: (op, input index) operands that are shapes: a batch-size constant there keeps the whole batch's size.
_SHAPE_OPERANDS = frozenset({("Reshape", 1), ("Expand", 1), ("Tile", 1), ("ConstantOfShape", 0), ("Slice", 1),
                             ("Slice", 2), ("Pad", 1), ("Split", 1), ("Range", 0), ("Range", 1)})


class ChunkBatchReductionsPass(BatchChunking):
    """Cuts into the fixed chunks only what mixes the examples of a replica's batch (see the module docstring).

    Args:
        chunks: Chunks of the global batch (a power of two).
        replicas: Replicas in sync over all workers (a power of two dividing ``chunks``).
    """

    runs_after = ("AutodiffPass", "LowerStopGradientsPass")

    def ensures(self, graph: Graph, ctx: PassContext | None = None) -> None:
        """The meta says how the batch was cut.

        Raises:
            PostconditionError: It does not.
        """
        if graph.meta.batch is not None and graph.meta.deterministic_chunks != self.chunks:
            raise PostconditionError(f"graph {graph.name!r} lost graph.meta.deterministic_chunks")

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        if graph.meta.batch is None or graph.meta.accumulate_steps is not None:
            return PassResult(graph, modified=False)
        graph.meta.deterministic_chunks = self.chunks
        # one chunk per replica too: its sums over the batch take the chunked form, the same bits as on k chunks
        ReductionChunker(graph, self.per_replica, label=f"op determinism ({self.chunks} chunks, per replica)").run()
        graph.meta.accumulate_steps = self.per_replica
        return PassResult(graph, modified=True)


class ReductionChunker(MicroBatchRewriter):
    """:class:`MicroBatchRewriter` whose micro region is only the chunk region (see the module docstring)."""

    def __init__(self, graph: Graph, steps: int, label: str) -> None:
        self.layout: dict[int, int] = {}  # id(value) -> the axis its examples lie along (whole values)
        self.whole: list[Node] = []  # the nodes kept on the whole batch that read a batch value
        super().__init__(graph, steps, tree=True, label=label)

    def _micro_region(self) -> set[int]:
        sized = {id(v) for v in self.graph.initializers.values() if elements(v.meta.get("batch"))}
        self.layout = {id(v): 0 for v in self.batch_inputs}
        for value in self.graph.initializers.values():  # constants as long as the batch (autodiff's ones, zeros)
            axis = _batch_axis(value.meta.get("batch_fill"))
            if axis is not None:
                self.layout[id(value)] = axis
        chunked: set[int] = set()
        region: set[int] = set()
        for node in self.graph.nodes:
            reads = {id(v) for v in node.inputs if v is not None}
            if _is_boundary(node) or not reads & (chunked | set(self.layout) | sized):
                continue
            layouts = None if reads & chunked else self._whole_layouts(node, sized)
            if layouts is None:
                region.add(id(node))
                chunked.update(id(out) for out in node.outputs)
                continue
            self.whole.append(node)
            self.layout.update((id(out), axis) for out, axis in zip(node.outputs, layouts) if axis is not None)
        return region

    def _whole_layouts(self, node: Node, sized: set[int]) -> list[int | None] | None:
        """The layouts of ``node``'s outputs if it runs on the whole batch, else ``None``."""
        if not any(v is not None and id(v) in self.layout for v in node.inputs):
            # only batch-size numbers: a shape operand made whole-batch (Expand of a gradient seed) or a number
            if node.op_type in ELEMENTWISE and all(not out.shape for out in node.outputs):
                return [None] * len(node.outputs)  # a number (the loss's divisor)
            if node.op_type not in ("Expand", "ConstantOfShape"):
                return None  # Range(batch)...: per chunk, from the chunk's size
            axis = self._sized_axis(node)
            return None if axis is None else [axis]
        return row_layouts(node, self.layout, self.batch)

    def _sized_axis(self, node: Node) -> int | None:
        """The axis an ``Expand`` / ``ConstantOfShape`` to a shape holding the batch size puts it on."""
        shape = node.inputs[1 if node.op_type == "Expand" else 0]
        return _batch_axis(shape.meta.get("batch"))

    def run(self) -> None:
        for node in self.whole:
            for index, value in enumerate(list(node.inputs)):
                if value is not None and value.const_value is not None and elements(value.meta.get("batch")) \
                        and (node.op_type, index) not in _SHAPE_OPERANDS and _numeric(node, value):
                    node.replace_input(index, self._once(value, "micro", lambda v=value: self._micro_constant(v)))
        super().run()
        for node in list(self.graph.nodes):
            self._fuse_leaf_product(node)

    def _fuse_leaf_product(self, node: Node) -> None:
        """``Add(left, MatMul(a, b))`` of the chunks' tree as ``Gemm(a, b, left)``: one pass over the weight-sized
        sum instead of two. ONNX Runtime's GEMM adds ``C`` to each finished dot product (for contractions of
        up to 256 rows, one block: here at most :data:`FUSED_ROWS`), so it is the same bits as the ``Add``,
        which the summing of the same chunks by another replica count does.
        """
        if node.op_type != "Add" or node.domain or not node.name.startswith("micro_add") or len(node.inputs) != 2:
            return
        left, right = node.inputs
        product = right.producer if right is not None else None
        if product is None or product.op_type != "MatMul" or product.domain or "micro" not in product.meta:
            return
        a, b = product.inputs
        if len(right.uses) != 1 or right in self.graph.outputs or len(a.shape) != 2 or len(b.shape) != 2 \
                or a.dtype != np.float32 or int(a.shape[1]) > FUSED_ROWS or tuple(left.shape) != tuple(right.shape):
            return
        node.detach_inputs()
        node.op_type, node.attrs = "Gemm", {}
        for value in (a, b, left):
            node._append_input(value)
        self.graph.remove(product)  # its one reader is now the Gemm: nothing reads it

    def _copy(self, node: Node, m: int) -> Node:
        summed = self._chunk_sums(node)
        if summed is None:
            return super()._copy(node, m)
        part = self._once(summed, ("chunk", m), lambda: self._add(
            "Slice", [summed, self._constant("micro_start", _ints(m)), self._constant("micro_stop", _ints(m + 1)),
                      self._constant("micro_axis", _ints(0))], node.meta))
        shape = self._constant("chunk_sum_shape", np.array([int(d) for d in node.outputs[0].shape], np.int64))
        return self._twin(node, m, "Reshape", [part, shape], {})

    def _chunk_sums(self, node: Node) -> Value | None:
        """For a ``ReduceSum`` over the leading axes of a whole value (the batch's first), every chunk's sum at
        once: ``MatMul(ones(1, n), X.reshape(k, n, rest))``, shape ``(k, 1, rest)``: each chunk's product is the
        GEMM of one ``(1, n) @ (n, rest)`` matrix pair whatever ``k`` is; ``None`` for another node.
        """
        x = node.inputs[0] if node.op_type == "ReduceSum" and node.domain == "" and node.inputs else None
        if x is None or self.layout.get(id(x)) != 0 or x.dtype.kind != "f" or len(node.inputs) < 2:
            return None
        axes = node.inputs[1].const_value if node.inputs[1] is not None else None
        if axes is None or node.attrs.get("noop_with_empty_axes", 0):
            return None
        axes = sorted(int(a) % len(x.shape) for a in np.atleast_1d(axes))
        if axes != list(range(len(axes))):
            return None

        def make() -> Value:
            dims = [int(d) for d in x.shape]
            rows = int(np.prod(dims[:len(axes)], dtype=np.int64)) // self.k
            rest = int(np.prod(dims[len(axes):], dtype=np.int64))
            stacked = self._add("Reshape", [x, self._constant("chunk_rows", np.array([self.k, rows, rest], np.int64))],
                                node.meta)
            ones = self._constant("chunk_ones", np.ones((1, rows), x.dtype))
            return self._add("MatMul", [ones, stacked], node.meta)
        return self._once(x, ("chunk_sums", tuple(axes)), make)

    def _micro_input(self, value: Value | None, m: int) -> Value | None:
        if value is not None and id(value) not in self.copies and id(value) in self.layout:
            return self._slice(value, m)
        return super()._micro_input(value, m)

    def _slice(self, value: Value, m: int) -> Value:
        axis = self.layout.get(id(value), 0)

        if self.k == 1:
            return value

        def make() -> Value:
            size = int(value.shape[axis]) // self.k
            rows = self._add("Slice", [value, self._constant("micro_start", _ints(m * size)),
                                       self._constant("micro_stop", _ints((m + 1) * size)),
                                       self._constant("micro_axis", _ints(axis))],
                             {"context": "replica"} if self._read_in_replicas(value) else {})
            if axis == 0 and isinstance(value.shape[0], BatchDim):
                rows.shape = (BatchDim(size), *rows.shape[1:])
            return rows
        return self._once(value, ("slice", m), make)


def _numeric(node: Node, constant: Value) -> bool:
    """A batch-size constant read as a number, not as a shape: it is a float, or ``node`` makes floats."""
    return constant.dtype.kind == "f" or any(out.dtype.kind == "f" for out in node.outputs)


def _batch_axis(provenance: list | None) -> int | None:
    """The one position of a shape that is a whole multiple of the batch size, else ``None``."""
    axes = [i for i, tag in enumerate(elements(provenance) or []) if tag and tag[1] == 0 and tag[0] >= 1]
    return axes[0] if len(axes) == 1 else None


def _ints(number: int) -> np.ndarray:
    return np.array([number], np.int64)
