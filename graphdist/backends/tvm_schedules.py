"""Hand-written TIR schedules for the tvm backend's CPU (llvm) target.

TVM's legalized operators compile to plain loop nests; without a schedule
they run serially and unvectorized (the 784-512-512-10 MLP forward takes
~400 ms, ONNX Runtime 2.2 ms). ``dlight`` ships schedule rules for GPUs but,
in TVM 0.27, only GEMV and reduction rules for CPUs. This module adds the
rules the model zoo needs, in dlight's :class:`ScheduleRule` form, applied by
``dlight.ApplyDefaultSchedule`` in the order of :func:`cpu_rules`:

* :class:`CPUMatmul`: any function whose one reduction block is a
  (batched) matrix multiply, in any operand layout (``MatMul``, transposed
  operands written as ``Einsum`` by the backend), with fused elementwise
  producers and consumers (bias add, ReLU mask, the SGD update). The block
  is normalised to ``C[s, i, j] += A[s, i, k] * B[s, j, k]`` (dlight's
  reindexing), padded to the register tile, and tiled as a BLIS-style
  micro-kernel: an ``MR x NR`` accumulator tile kept in registers (``NR``
  vector lanes wide, unrolled), the reduction axis innermost but one, the
  column-panel loop parallel. ``B`` is packed into contiguous ``K x NR``
  panels when its rows are not already contiguous along ``j`` (a transposed
  weight in the backward pass); otherwise it is read in place.
* :class:`CPUElementwise`: spatial-only functions (elementwise chains,
  transposes, broadcasts): single-consumer producers inlined, loops fused,
  split into a parallel outer and a vectorized inner loop (blocks of booleans
  stay scalar: LLVM rejects TVM's vectorized ``i1`` logic).
* dlight's CPU ``Reduction`` and ``GEMV`` rules for the rest (softmax sums,
  bias gradients). Every rule is wrapped by :class:`SafeRule`, so a rule
  that rejects a function by raising (dlight's GEMV asserts on some shapes)
  leaves it to the next rule instead of failing the compile.

A function no rule accepts keeps TVM's default (serial) code: correct, slow.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["CPUElementwise", "CPUMatmul", "CPUOuterReduction", "SafeRule", "cpu_rules", "vector_lanes"]

logger = logging.getLogger(__name__)

# Imported lazily: importing tvm takes ~1 s and most processes never use this backend.
_tvm: dict[str, Any] = {}


def _mods() -> dict[str, Any]:
    if not _tvm:
        from tvm import s_tir, tirx
        from tvm.s_tir import dlight
        from tvm.s_tir.dlight.analysis import get_root_block
        from tvm.s_tir.dlight.gpu.matmul import (
            auto_inline_consumer_chain,
            auto_inline_producers,
            get_index_map,
            get_reduction_blocks,
        )

        _tvm.update(
            s_tir=s_tir, tirx=tirx, dlight=dlight, get_root_block=get_root_block,
            auto_inline_consumer_chain=auto_inline_consumer_chain,
            auto_inline_producers=auto_inline_producers,
            get_index_map=get_index_map, get_reduction_blocks=get_reduction_blocks,
        )
    return _tvm


def vector_lanes(target: Any) -> int:
    """Float32 lanes of the target's widest vector unit (16 with AVX-512, 8 with AVX2, else 4)."""
    attrs = target.attrs
    features = " ".join(str(f) for f in attrs.get("mattr", []) or [])
    mcpu = str(attrs.get("mcpu", ""))
    if "avx512f" in features or any(tag in mcpu for tag in ("avx512", "skylake-avx512", "icelake", "znver4",
                                                             "sapphirerapids", "cascadelake", "cooperlake")):
        return 16
    if "avx2" in features or any(tag in mcpu for tag in ("haswell", "broadwell", "skylake", "znver", "alderlake")):
        return 8
    return 4


class _LLVMRule:
    """A schedule rule for PrimFuncs compiled for ``llvm``: subclasses implement :meth:`schedule`."""

    def apply(self, func: Any, target: Any, _tunable: bool) -> Any:
        m = _mods()
        if not isinstance(func, m["tirx"].PrimFunc) or target.kind.name != "llvm":
            return None
        sch = m["s_tir"].Schedule(func)
        return self.schedule(sch, sch.get_child_blocks(m["get_root_block"](sch)), target)

    def schedule(self, sch: Any, blocks: list[Any], target: Any) -> Any:
        """Schedules ``sch`` (top-level ``blocks``); returns it, or ``None`` when the rule does not apply."""
        raise NotImplementedError


def _extent(sch: Any, loop: Any) -> int | None:
    return _static_extent(sch.get(loop).extent)


def _static_extent(value: Any) -> int | None:
    """``value`` as an int when it is a constant (a loop extent, a buffer dimension), else ``None``."""
    return int(value) if isinstance(value, _mods()["tirx"].IntImm) else None


def _base_rule() -> type:
    return _mods()["dlight"].ScheduleRule


class SafeRule:
    """Wraps a dlight rule so that an exception means "not applicable" (logged at debug level)."""

    def __init__(self, rule: Any) -> None:
        self.rule = rule

    def apply(self, func: Any, target: Any, tunable: bool) -> Any:
        try:
            return self.rule.apply(func, target, tunable)
        except Exception as err:  # noqa: BLE001 - any failure means the rule does not apply
            logger.debug("schedule rule %s skipped a function: %s", type(self.rule).__name__,
                         str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__)
            return None


class CPUMatmul(_LLVMRule):
    """Register-tiled, parallel, vectorized matrix multiply (see the module docstring).

    Args:
        rows: ``MR``, rows of the accumulator tile.
        vectors: Vectors per accumulator row (``NR = vectors * lanes``).
        k_unroll: Unroll factor of the reduction loop.
        pack_computed_a: Pack A into ``MR``-row panels when it is computed (not a plain input).
        pack_a_min_depth: Shortest reduction for which such an A is packed.
        max_rows: Most rows of a narrow tile (one with fewer than ``vectors`` vectors per row gets
            more rows, as many accumulators in registers).
    """

    def __init__(self, rows: int = 4, vectors: int = 4, k_unroll: int = 4, pack_computed_a: bool = True,
                 pack_a_min_depth: int = 32, max_rows: int = 8) -> None:
        self.rows = rows
        self.max_rows = max_rows
        self.vectors = vectors
        self.k_unroll = k_unroll
        self.pack_computed_a = pack_computed_a
        self.pack_a_min_depth = pack_a_min_depth

    def schedule(self, sch: Any, blocks: list[Any], target: Any) -> Any:
        m = _mods()
        reductions = m["get_reduction_blocks"](sch, blocks)
        if reductions is None or not m["get_index_map"](sch.get(reductions[0])):
            return None
        main = reductions[0]
        b_contiguous = self._b_rows_contiguous(sch.get(main))
        packs, rows, vectors, lanes = self._normalize(sch, main, vector_lanes(target), b_contiguous)
        batch, i, j, k = sch.get_loops(main)
        i_outer, i_inner = sch.split(i, [None, rows])
        j_outer, j_vectors, j_lanes = sch.split(j, [None, vectors, lanes])
        k_outer, k_inner = sch.split(k, [None, self.k_unroll]) if _divides(self.k_unroll, _extent(sch, k)) \
            else (k, None)
        order = [batch, j_outer, i_outer, k_outer] + ([k_inner] if k_inner is not None else [])
        sch.reorder(*order, i_inner, j_vectors, j_lanes)
        # Parallel before caching: the check for a compact dataflow needs the plain reduction block.
        panels = _extent(sch, batch) and _extent(sch, j_outer) and _extent(sch, batch) * _extent(sch, j_outer)
        if panels is not None and panels < _cores(target):
            # Fewer column panels than cores (a convolution with 8 output channels): row tiles in
            # parallel too, or all but one core would idle.
            i_outer = sch.fuse(batch, j_outer, i_outer)  # the row-tile loop is now the parallel one
            sch.parallel(i_outer)
        else:
            sch.parallel(sch.fuse(batch, j_outer))
        for loop in (k_inner, i_inner, j_vectors):
            if loop is not None:
                sch.unroll(loop)
        sch.vectorize(j_lanes)
        accumulator = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(accumulator, i_outer, preserve_unit_loops=True)
        _inline_producers(sch, main, keep=packs)
        m["auto_inline_consumer_chain"](sch, accumulator)
        _vectorize_innermost(sch, accumulator, lanes)
        init = sch.decompose_reduction(main, k_outer)
        _vectorize_innermost(sch, init, lanes)
        return sch

    @staticmethod
    def _b_rows_contiguous(block: Any) -> bool:
        """True when B's last index is an output column (``j``) iterator: rows are read in place."""
        if len(block.reads) < 2 or not block.writes:
            return False
        b_region = block.reads[-1].region
        return bool(b_region) and any(b_region[-1].min.same_as(r.min) for r in block.writes[0].region)

    def _normalize(self, sch: Any, main: Any, lanes: int, b_contiguous: bool) -> tuple[list[Any], int, int, int]:
        """Reindexes the block to ``C[s, i, j] += A[s, i, k] * B[s, j, k]`` and pads it to the tile.

        Narrow outputs (``j`` of 8 in a convolution's gradients) get a narrow tile: fewer vectors
        per row and, below the widest vector, narrower vectors (8 columns as one 8-lane vector, not
        half of a padded 16-lane one: padding would compute twice the work through masked loads).

        Returns:
            The packing blocks (of A and B, those packed), the rows of the tile, its vectors per row
            and the lanes per vector.
        """
        m = _mods()
        b_last_extent = _static_extent(sch.get(main).reads[-1].source.shape[-1])
        reindex_a = sch.reindex(main, ("read", 0))
        a_computed = self.pack_computed_a and bool(sch.get_producers(reindex_a))
        reindex_b = sch.reindex(main, ("read", 1))
        reindex_c = sch.reindex(main, ("write", 0))
        block_map, a_map, b_map, c_map = m["get_index_map"](sch.get(main))
        sch.transform_layout(reindex_a, ("write", 0), a_map)
        sch.transform_layout(reindex_b, ("write", 0), b_map)
        sch.transform_layout(reindex_c, ("read", 0), c_map)
        sch.transform_block_layout(main, block_map)
        columns = _extent(sch, sch.get_loops(main)[2])
        if columns:
            while lanes > 4 and columns <= lanes // 2:
                lanes //= 2
        vectors = self._vectors_for(columns, lanes)
        nr = vectors * lanes
        rows = min(self.max_rows, self.rows * self.vectors // vectors)  # narrow tiles: more rows
        sch.pad_einsum(main, [1, rows, nr, 1])
        if b_contiguous and columns != b_last_extent:
            b_contiguous = False  # j spans more than B's last axis (a broadcast batch folded into j)
        packs = []
        depth = _extent(sch, sch.get_loops(main)[3])
        if a_computed and depth is not None and depth >= self.pack_a_min_depth:
            # A computed on the fly (a convolution's im2col through its padding): every A element of a
            # tile would cost index arithmetic and a bounds test per multiply-add; computed once into
            # MR-row panels instead. Not for short reductions (a 3x3 convolution of one channel: the
            # copy costs more than the arithmetic it saves).
            packs.append(self._pack(sch, main, 0, reindex_a, lambda s, i, k: (s, i // rows, k, i % rows)))
        if not b_contiguous:
            packs.append(self._pack(sch, main, 1, reindex_b, lambda s, j, k: (s, j // nr, k, j % nr)))
        return packs, rows, vectors, lanes

    def _pack(self, sch: Any, main: Any, operand: int, reindex: Any, layout: Any) -> Any:
        """Makes ``main``'s operand ``operand`` a packed copy in ``layout``; returns the packing block.

        After padding, the kernel reads the operand through the padding block (when it was padded):
        that block is the one kept as the packed copy.
        """
        buffer = sch.get(main).reads[operand].source
        writers = [b for b in sch.get_producers(main)
                   if any(region.source.same_as(buffer) for region in sch.get(b).writes)]
        sch.transform_layout(main, ("read", operand), layout)
        return self._schedule_pack(sch, writers[0] if writers else reindex)

    def _vectors_for(self, columns: int | None, lanes: int) -> int:
        """Vectors per tile row: the most (up to ``self.vectors``) among those padding ``columns`` least
        (72 columns: one vector, 80 computed, not four, 128 computed).
        """
        if not columns:
            return self.vectors
        candidates = range(min(self.vectors, -(-columns // lanes)), 0, -1)
        return min(candidates, key=lambda v: -(-columns // (v * lanes)) * v * lanes)

    @staticmethod
    def _schedule_pack(sch: Any, pack: Any) -> Any:
        """Keeps B's packing copy (its reindex block) as its own parallel loop nest: inlining it into
        the kernel would undo the packing.
        """
        _inline_producers(sch, pack)
        loops = sch.get_loops(pack)
        sch.parallel(sch.fuse(*loops[:2]) if len(loops) > 2 else loops[0])
        return pack


def _inline_producers(sch: Any, block: Any, keep: Sequence[Any] = ()) -> None:
    """Inlines every producer of ``block`` (transitively) that can be inlined, except those in ``keep``."""
    # Compared by name: block statements are replaced (new objects) as the schedule changes.
    keep_names = {sch.get(kept).name_hint for kept in keep}
    changed = True
    while changed:
        changed = False
        for producer in sch.get_producers(block):
            if sch.get(producer).name_hint in keep_names:
                continue
            try:
                sch.compute_inline(producer)
                changed = True
            except Exception:  # noqa: BLE001 - producers that cannot be inlined stay loop nests
                continue


def _cores(target: Any) -> int:
    """The cores the target's code runs on (its ``num-cores``; 1 when unknown)."""
    cores = target.attrs.get("num-cores")
    return int(cores) if cores is not None else 1


def _divides(factor: int, extent: int | None) -> bool:
    return extent is not None and extent % factor == 0 and extent > factor


def _vectorize_innermost(sch: Any, block: Any, lanes: int) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    extent = _extent(sch, loops[-1])
    if extent is None:
        return
    if extent == lanes:
        sch.vectorize(loops[-1])
    elif extent % lanes == 0:
        _, inner = sch.split(loops[-1], [None, lanes])
        sch.vectorize(inner)


class CPUElementwise(_LLVMRule):
    """Parallel, vectorized schedule of functions whose blocks are all spatial (see the module docstring).

    Args:
        parallel_min: Fewest elements worth a parallel loop (thread start-up costs ~ microseconds).
        max_inline_blocks: Functions with more blocks are not inlined (compile time).
    """

    def __init__(self, parallel_min: int = 16384, max_inline_blocks: int = 64) -> None:
        self.parallel_min = parallel_min
        self.max_inline_blocks = max_inline_blocks

    def schedule(self, sch: Any, blocks: list[Any], target: Any) -> Any:
        m = _mods()
        spatial = m["tirx"].IterVar.DataPar
        if not blocks or any(iv.iter_type != spatial for b in blocks for iv in sch.get(b).iter_vars):
            return None
        # Big fused functions (the unrolled taps of a pooling gradient: 70+ blocks) are left as loop nests:
        # each compute_inline re-analyses the whole function, and compiling them took ~3x longer.
        for block in blocks[:-1] if len(blocks) <= self.max_inline_blocks else []:
            # Only single-consumer blocks: inlining a value used k times copies its expression k times,
            # and chains of such copies grow exponentially (a max-pool gradient took 54 s to compile).
            if len(sch.get_consumers(block)) != 1:
                continue
            try:
                sch.compute_inline(block)
            except Exception:  # noqa: BLE001 - blocks that cannot be inlined get their own loops
                continue
        lanes = vector_lanes(target)
        for block in sch.get_child_blocks(m["get_root_block"](sch)):
            self._schedule_block(sch, block, lanes)
        return sch

    def _schedule_block(self, sch: Any, block: Any, lanes: int) -> None:
        loops = sch.get_loops(block)
        if not loops:
            return
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = _extent(sch, fused)
        if extent is None or extent < lanes:
            return
        if extent % lanes:
            if extent >= self.parallel_min:
                sch.parallel(sch.split(fused, [None, lanes])[0])
            return
        outer, inner = sch.split(fused, [None, lanes])
        if extent >= self.parallel_min:
            sch.parallel(outer)
        if not _touches_bool(sch.get(block)):
            # LLVM rejects TVM's vectorized i1 logic (`and <16 x i8>, <16 x i1>`): bool blocks stay scalar.
            sch.vectorize(inner)


class CPUOuterReduction(_LLVMRule):
    """Reductions over an outer axis (``out[j] = sum_k x[k, j]``, the bias gradient): the output's
    contiguous axis becomes the vector lane, the reduction loops run inside the parallel loop.
    """

    def schedule(self, sch: Any, blocks: list[Any], target: Any) -> Any:
        m = _mods()
        reductions = m["get_reduction_blocks"](sch, blocks)
        if reductions is None:
            return None
        block = reductions[0]
        _inline_producers(sch, block)
        stmt = sch.get(block)
        kinds = [iv.iter_type == m["tirx"].IterVar.DataPar for iv in stmt.iter_vars]
        loops = sch.get_loops(block)
        if len(loops) != len(kinds) or not kinds[-1] and not any(kinds):
            return None
        spatial = [loop for loop, is_spatial in zip(loops, kinds) if is_spatial]
        reduce = [loop for loop, is_spatial in zip(loops, kinds) if not is_spatial]
        last_var = stmt.iter_vars[max(i for i, k in enumerate(kinds) if k)].var
        if not stmt.writes or not stmt.writes[0].region[-1].min.same_as(last_var):
            return None
        lanes = vector_lanes(target)
        extent = _extent(sch, spatial[-1])
        if extent is None or extent % lanes:
            return None
        j_outer, j_lanes = sch.split(spatial[-1], [None, lanes])
        sch.reorder(*spatial[:-1], j_outer, *reduce, j_lanes)
        parallel = sch.fuse(*spatial[:-1], j_outer) if spatial[:-1] else j_outer
        sch.parallel(parallel)
        sch.vectorize(j_lanes)
        init = sch.decompose_reduction(block, reduce[0])
        _vectorize_innermost(sch, init, lanes)
        return sch


def _touches_bool(block: Any) -> bool:
    return any(str(region.source.dtype) == "bool" for region in [*block.reads, *block.writes])


def cpu_rules() -> list[Any]:
    """The llvm target's schedule rules, in the order dlight tries them."""
    dlight = _mods()["dlight"]
    rules = [CPUMatmul(), CPUElementwise(), dlight.cpu.Reduction(), CPUOuterReduction(), dlight.cpu.GEMV()]
    return [SafeRule(rule) for rule in rules]
