"""Layouts of values over a device mesh: data the layout passes read and write (tensor parallelism).

A :class:`Layout` says, for each dimension of a value, the mesh axis it is
split over (or ``None``: whole on every device), and over which mesh axes
the value is a *partial sum* (each device holds a summand; the value is their
sum, pending a reduction). :class:`MeshSpec` is the mesh as plain data: axis
names and sizes, and the devices of each replica (the batch axis makes the
replicas; the other axes split a replica's computation over its devices).

Where the layouts live on a graph (written by
:class:`graphdist.passes.propagate_layouts.PropagateLayoutsPass`, read by
:class:`graphdist.passes.lower_layouts.LowerLayoutsPass`):

* ``value.meta[LAYOUT_KEY]``: the value's :class:`Layout`;
* ``node.meta[INPUT_LAYOUTS_KEY]``: the layout each input must have where the
  node reads it (``None`` for an absent input); where it differs from the
  input's own layout, a reshard is needed (``node.meta[RESHARDS_KEY]`` lists
  those input positions, for summaries and tests);
* ``graph.meta.mesh``: the :class:`MeshSpec`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphdist.errors import GraphError

__all__ = ["INPUT_LAYOUTS_KEY", "LAYOUT_KEY", "RESHARDS_KEY", "Layout", "MeshSpec", "all_indices",
           "local_slices"]

LAYOUT_KEY = "layout"
INPUT_LAYOUTS_KEY = "input_layouts"
RESHARDS_KEY = "reshards"


@dataclass(frozen=True)
class Layout:
    """A value's layout: the mesh axis of each dimension, and the axes it is a partial sum over.

    Attributes:
        dims: One entry per dimension: a mesh axis name, or ``None`` (not split).
        partial: Mesh axes over which each device holds a summand of the value.
    """

    dims: tuple[str | None, ...]
    partial: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def replicated(cls, rank: int) -> Layout:
        """Whole on every device."""
        return cls((None,) * rank)

    @property
    def is_replicated(self) -> bool:
        """No dimension split and no pending sum."""
        return not self.partial and all(d is None for d in self.dims)

    def axes(self) -> set[str]:
        """The mesh axes the dimensions are split over."""
        return {d for d in self.dims if d is not None}

    def without_partial(self) -> Layout:
        """The same split, reduced."""
        return Layout(self.dims)

    def to_attr(self) -> list[str]:
        """The form of an op attribute (``""`` for a dimension not split)."""
        return [d or "" for d in self.dims]

    @classmethod
    def from_attr(cls, attr: Sequence[Any]) -> Layout:
        """Inverse of :meth:`to_attr`."""
        return cls(tuple((a.decode() if isinstance(a, bytes) else str(a)) or None for a in attr))

    def __str__(self) -> str:
        dims = ", ".join(d or "-" for d in self.dims)
        partial = f" partial({', '.join(sorted(self.partial))})" if self.partial else ""
        return f"[{dims}]{partial}"


@dataclass(frozen=True)
class MeshSpec:
    """The mesh as the passes see it.

    Attributes:
        axis_names: Every mesh axis, in order.
        shape: The mesh's size along each axis.
        batch_axis: The axis the replicas are made of (``None``: one replica).
        devices: ``devices[replica][index]``: a replica's devices, ``index`` running row-major over the
            non-batch axes (:attr:`model_axes`).
    """

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    batch_axis: str | None
    devices: tuple[tuple[str, ...], ...]

    @property
    def model_axes(self) -> tuple[str, ...]:
        """The axes that split a replica's computation (every axis but the batch axis)."""
        return tuple(a for a in self.axis_names if a != self.batch_axis)

    @property
    def model_shape(self) -> tuple[int, ...]:
        """Sizes of :attr:`model_axes`."""
        return tuple(self.size(a) for a in self.model_axes)

    @property
    def devices_per_replica(self) -> int:
        """Devices each replica's computation is split over."""
        return int(np.prod(self.model_shape, dtype=np.int64))

    def size(self, axis: str) -> int:
        """The mesh's size along ``axis``."""
        if axis not in self.axis_names:
            raise GraphError(f"layout names mesh axis {axis!r}; the mesh's axes are {', '.join(self.axis_names)}")
        return self.shape[self.axis_names.index(axis)]

    def coordinates(self, index: int) -> dict[str, int]:
        """The model-axis coordinates of a replica's device ``index``."""
        coords = np.unravel_index(index, self.model_shape) if self.model_shape else ()
        return {axis: int(c) for axis, c in zip(self.model_axes, coords)}

    def group(self, index: int, axis: str) -> list[int]:
        """The devices of a replica (indices) that differ from device ``index`` only along ``axis``, in
        coordinate order: the participants of a collective over ``axis``.
        """
        coords = self.coordinates(index)
        members = []
        for position in range(self.size(axis)):
            moved = {**coords, axis: position}
            members.append(int(np.ravel_multi_index([moved[a] for a in self.model_axes], self.model_shape)))
        return members

    def group_name(self, index: int, axis: str) -> str:
        """A name for the group of :meth:`group` (the other axes' coordinates)."""
        coords = self.coordinates(index)
        others = [f"{a}{c}" for a, c in coords.items() if a != axis]
        return f"{axis}" + (f"@{'.'.join(others)}" if others else "")

    def local_shape(self, shape: Sequence[Any], layout: Layout) -> tuple[Any, ...]:
        """The shape each device holds of a value of ``shape`` laid out as ``layout``."""
        out = []
        for dim, axis in zip(shape, layout.dims):
            out.append(dim if axis is None else dim // self.size(axis))
        return tuple(out)

    def normalised(self, layout: Layout) -> Layout:
        """``layout`` with the axes of size one (and the batch axis) dropped: they split nothing in a replica."""
        def keep(axis: str | None) -> bool:
            return axis is not None and axis != self.batch_axis and self.size(axis) > 1

        return Layout(tuple(a if keep(a) else None for a in layout.dims),
                      frozenset(a for a in layout.partial if keep(a)))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"axis_names": list(self.axis_names), "shape": list(self.shape), "batch_axis": self.batch_axis,
                "devices": [list(d) for d in self.devices]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MeshSpec:
        """Inverse of :meth:`to_json`."""
        return cls(tuple(data["axis_names"]), tuple(int(s) for s in data["shape"]), data.get("batch_axis"),
                   tuple(tuple(d) for d in data["devices"]))

    @classmethod
    def build(cls, axis_names: Iterable[str], shape: Iterable[int], devices: Sequence[str],
              batch_axis: str | None) -> MeshSpec:
        """The spec of a mesh whose ``devices`` are listed row-major over ``shape``."""
        names, sizes = tuple(axis_names), tuple(int(s) for s in shape)
        grid = np.asarray(list(devices), dtype=object).reshape(sizes)
        if batch_axis is not None and batch_axis in names:
            grid = np.moveaxis(grid, names.index(batch_axis), 0)
            replicas = grid.shape[0]
        else:
            grid = grid.reshape((1, *sizes))
            replicas = 1
        # np.asarray(grid[r]): on a one-axis mesh the batch axis leaves a 0-d cell, one device, not an array.
        per_replica = tuple(tuple(str(d) for d in np.asarray(grid[r], dtype=object).reshape(-1))
                            for r in range(replicas))
        return cls(names, sizes, batch_axis, per_replica)


def local_slices(mesh: MeshSpec, shape: Sequence[int], layout: Layout, index: int) -> list[tuple[int, int, int]]:
    """``(axis, start, stop)`` of device ``index``'s block of a value of ``shape`` laid out as ``layout``."""
    coords = mesh.coordinates(index)
    out = []
    for dim_index, (dim, axis) in enumerate(zip(shape, layout.dims)):
        if axis is None:
            continue
        block = int(dim) // mesh.size(axis)
        out.append((dim_index, coords[axis] * block, (coords[axis] + 1) * block))
    return out


def all_indices(mesh: MeshSpec) -> range:
    """Device indices of a replica."""
    return range(mesh.devices_per_replica)

