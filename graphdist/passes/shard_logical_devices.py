"""ShardLogicalDevicesPass: run ``experimental_split_to_logical_devices`` values tile by tile.

Invariant established: no ``graphdist.SplitToLogicalDevices`` node remains. A
split value of replica ``r`` with ``partition_dimensions`` ``P`` (``prod(P)``
tiles, tile ``t`` in row-major order on logical device ``t``) is cut into
tiles by ``Slice`` nodes on the replica's first logical device; every reader
that can compute tile by tile gets one copy per tile, placed on the tile's
logical device, and its result is split the same way (propagation continues
through its readers). Every other reader, and a graph output, reads the value
reassembled by ``Concat`` on the first logical device. The result equals the
unsplit computation exactly (same ops on the same elements).

Readers computed tile by tile:
* unary elementwise ops (``Relu``, ``Exp``, ``Neg``, ``Cast``...);
* n-ary elementwise ops (``Add``, ``Mul``, ``Where``...) whose output has the
  split value's shape: other operands split the same way are used tile by
  tile, unsplit operands are sliced along the split axes where they span
  them and used whole where they broadcast (size 1);
* ``MatMul`` of a split left operand (rank >= 2) whose contracted axis is
  not split, with an unsplit rank-2 right operand: row tiles;
* ``MatMul`` of an unsplit left operand with a right operand (rank 2) split
  only along its columns: column tiles.

Cases:
* ``P`` all ones (one tile): the annotation is removed, nothing is split;
* a split value whose shape is not static or not divisible by ``P``:
  ``ValueError`` naming the value (the strategy checks this when the
  annotation is made);
* no annotations: unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.placement_ops import SPLIT_TO_LOGICAL_DEVICES
from graphdist.passes.base import PassBase, PassContext, PassResult
from graphdist.passes.place_logical_devices import logical_device

__all__ = ["ShardLogicalDevicesPass", "ELEMENTWISE_OPS"]

#: Ops computed element by element (output element i depends on input elements i, with broadcasting).
ELEMENTWISE_OPS = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitwiseAnd", "BitwiseNot",
    "BitwiseOr", "BitwiseXor", "Cast", "Ceil", "Clip", "Cos", "Cosh", "Div", "Equal", "Erf", "Exp", "Floor",
    "Greater", "GreaterOrEqual", "Identity", "IsInf", "IsNaN", "Less", "LessOrEqual", "Log", "Max", "Min",
    "Mod", "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal", "Relu", "Round", "Sigmoid", "Sign", "Sin", "Sinh",
    "Softplus", "Sqrt", "Sub", "Tan", "Tanh", "Where", "Xor",
})


@dataclass
class _Split:
    """A value computed as tiles: ``parts[a]`` tiles along axis ``a``, ``tiles`` in row-major order."""

    parts: tuple[int, ...]
    tiles: list[Value]


class ShardLogicalDevicesPass(PassBase):
    """Splits annotated values over their replica's logical devices.

    Args:
        cores: ``cores[replica][logical_device]`` -> device string.
    """

    def __init__(self, cores: Sequence[Sequence[str]]) -> None:
        self.cores = [list(c) for c in cores]

    def __repr__(self) -> str:
        return f"{self.name}(cores={self.cores})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        annotations = graph.find_nodes(SPLIT_TO_LOGICAL_DEVICES, GRAPHDIST_DOMAIN)
        for node in annotations:
            _Sharder(graph, self.cores, node).run()
        if annotations:
            graph.topological_sort()
        return PassResult(graph, modified=bool(annotations))


class _Sharder:
    """Splits one annotated value and propagates the split through its readers."""

    def __init__(self, graph: Graph, cores: list[list[str]], annotation: Node) -> None:
        self.graph = graph
        self.annotation = annotation
        self.replica = annotation.replica
        parts = tuple(int(p) for p in annotation.attrs.get("partition_dimensions", ()))
        self.devices = [logical_device(cores, annotation, t) for t in range(int(np.prod(parts or (1,))))]
        self.home = self.devices[0]
        self.parts = parts
        self.split: dict[Value, _Split] = {}  # values are hashed by identity

    # ------------------------------------------------------------------ driver
    def run(self) -> None:
        value = self.annotation.inputs[0]
        self.graph.replace_all_uses_with(self.annotation.outputs[0], value)
        self.graph.remove_node(self.annotation)
        if len(self.devices) == 1:
            return
        _check_divisible(value, self.parts)
        self.split[value] = _Split(self.parts, self._slice_tiles(value, self.parts))
        pending = [value]
        while pending:
            current = pending.pop()
            for reader, _ in list(current.uses):
                if reader.graph is None or any(out in self.split for out in reader.outputs):
                    continue
                made = self._tile_reader(reader)
                if made is not None:
                    pending.append(reader.outputs[0])
        tile_makers = {id(tile.producer) for split in self.split.values() for tile in split.tiles}
        for value in list(self.split):
            self._gather_for_remaining_readers(value, tile_makers)

    # ------------------------------------------------------------- new nodes
    def _node(self, op_type: str, inputs: list[Value | None], attrs: dict | None, device: str,
              name: str) -> Value:
        node = self.graph.add_node(op_type, inputs, attrs, name=name)
        node.device, node.replica = device, self.replica
        return node.outputs[0]

    def _int64s(self, values: Sequence[int]) -> Value:
        return self.graph.add_initializer("shard_axes", np.asarray(list(values), np.int64))

    def _slice_tiles(self, value: Value, parts: Sequence[int], device: str | None = None) -> list[Value]:
        """Tiles of ``value`` (row-major over ``parts``), cut on ``device`` (default: the home device)."""
        tiles = []
        for index in itertools.product(*(range(p) for p in parts)):
            axes = [a for a, p in enumerate(parts) if p > 1]
            starts = [index[a] * (value.shape[a] // parts[a]) for a in axes]
            ends = [(index[a] + 1) * (value.shape[a] // parts[a]) for a in axes]
            tiles.append(self._node("Slice", [value, self._int64s(starts), self._int64s(ends), self._int64s(axes)],
                                    None, device or self.home, f"{value.name}_tile"))
        return tiles

    # ----------------------------------------------------------- propagation
    def _tile_reader(self, reader: Node) -> list[Value] | None:
        """Creates ``reader``'s per-tile copies when it can run tile by tile; returns their outputs."""
        if reader.domain or len(reader.outputs) != 1:
            return None
        if reader.op_type in ELEMENTWISE_OPS:
            operands = self._elementwise_operands(reader)
        elif reader.op_type == "MatMul":
            operands = self._matmul_operands(reader)
        else:
            return None
        if operands is None:
            return None
        out = reader.outputs[0]
        parts = self._output_parts(reader)
        tiles = [self._node(reader.op_type, [ops[t] for ops in operands], reader.attrs, device, reader.name)
                 for t, device in enumerate(self.devices)]
        self.split[out] = _Split(parts, tiles)
        return tiles

    def _output_parts(self, reader: Node) -> tuple[int, ...]:
        if reader.op_type != "MatMul":
            return next(self.split[v].parts for v in reader.inputs if v in self.split)
        a, b = reader.inputs
        if a in self.split:
            return (*self.split[a].parts[:-1], 1)
        return (*(1,) * (reader.outputs[0].rank - 1), self.split[b].parts[-1])

    def _elementwise_operands(self, reader: Node) -> list[list[Value | None]] | None:
        out = reader.outputs[0]
        source = next(v for v in reader.inputs if v in self.split)
        first = self.split[source]
        if tuple(out.shape) != tuple(source.shape):
            return None
        operands = []
        for value in reader.inputs:
            if value is None:
                operands.append([None] * len(self.devices))
            elif value in self.split:
                if self.split[value].parts != first.parts:
                    return None
                operands.append(self.split[value].tiles)
            else:
                per_tile = self._broadcast_operand(value, out.rank, first.parts)
                if per_tile is None:
                    return None
                operands.append(per_tile)
        return operands

    def _broadcast_operand(self, value: Value, rank: int, parts: tuple[int, ...]) -> list[Value] | None:
        """An unsplit operand per tile: whole where it broadcasts, sliced where it spans a split axis."""
        if not value.is_static:
            return None
        offset = rank - value.rank
        own_parts = []
        for axis, size in enumerate(value.shape):
            p = parts[axis + offset]
            if p > 1 and size != 1:
                if size % p:
                    return None
                own_parts.append(p)
            else:
                own_parts.append(1)
        if all(p == 1 for p in own_parts):
            return [value] * len(self.devices)
        tiles_of_value = self._slice_tiles(value, own_parts)
        # Map each output tile (row-major over ``parts``) to the operand tile it reads.
        mapping = []
        for index in itertools.product(*(range(p) for p in parts)):
            own_index = [index[a + offset] if own_parts[a] > 1 else 0 for a in range(value.rank)]
            mapping.append(tiles_of_value[int(np.ravel_multi_index(own_index, own_parts))] if own_parts else value)
        return mapping

    def _matmul_operands(self, reader: Node) -> list[list[Value]] | None:
        a, b = reader.inputs
        a_split, b_split = self.split.get(a), self.split.get(b)
        if a_split is not None and b_split is None and a.rank >= 2 and b.rank == 2 and a_split.parts[-1] == 1:
            return [a_split.tiles, [b] * len(self.devices)]
        if b_split is not None and a_split is None and b.rank == 2 and a.rank >= 2 and b_split.parts[0] == 1:
            return [[a] * len(self.devices), b_split.tiles]
        return None

    # ---------------------------------------------------------------- gather
    def _gather_for_remaining_readers(self, value: Value, tile_makers: set[int]) -> None:
        """Readers that did not run tile by tile (and graph outputs) read the reassembled value.

        ``tile_makers``: ids of the nodes that compute tiles (slices and per-tile copies).
        """
        readers = [(n, i) for n, i in value.uses if id(n) not in tile_makers and not self._has_tiles(n)]
        is_output = value in self.graph.outputs
        if not readers and not is_output:
            return
        whole = self._concat(value, self.split[value])
        for node, index in readers:
            node.replace_input(index, whole)
        for position, out in enumerate(self.graph.outputs):
            if out is value:
                self.graph.outputs[position] = whole

    def _has_tiles(self, node: Node) -> bool:
        return bool(node.outputs) and all(out in self.split for out in node.outputs)

    def _concat(self, value: Value, split: _Split) -> Value:
        """Concatenates the tiles back, innermost split axis first, on the home device."""
        pieces = list(split.tiles)
        shape = list(split.parts)
        for axis in reversed(range(len(shape))):
            if shape[axis] == 1:
                continue
            groups = len(pieces) // shape[axis]
            pieces = [self._node("Concat", pieces[g * shape[axis]:(g + 1) * shape[axis]], {"axis": axis},
                                 self.home, f"{value.name}_gather") for g in range(groups)]
            shape[axis] = 1
        return pieces[0]


def _check_divisible(value: Value, parts: tuple[int, ...]) -> None:
    if len(parts) != value.rank:
        raise ValueError(f"partition_dimensions {list(parts)} has {len(parts)} entries but %{value.name} has rank "
                         f"{value.rank}; give one entry per dimension")
    if not value.is_static or any(size % p for size, p in zip(value.shape, parts)):
        raise ValueError(f"%{value.name} ({value.type_str()}) cannot be split into {list(parts)} equal tiles; "
                         "each dimension must be static and divisible by its partition count")
