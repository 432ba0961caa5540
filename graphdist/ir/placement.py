"""Variable placement as data on the graph: what a strategy decides, passes read.

A traced graph lists the variables it reads in ``graph.meta.variables`` as
``(input name, VariableSpec)`` pairs: plain data (name, dtype, shape,
trainability), never the Python variable objects. Before its pipeline runs,
the strategy's decision is written into ``graph.meta.placement`` as a
:class:`PlacementSpec` (``graphdist.compile.build.compile_traced``; a loaded
plan's comes from its ``plan.json``): for each variable, where its value
lives. Passes read that spec (``PlaceVariablesPass`` for a central copy,
``PlacePSVariablesPass`` for parameter-server shards), the renderer and the
plan exporter show it, and a plan directory stores it as JSON, so a
re-planned step gets a new spec without any Python object.

Kinds of placement:

* ``"local"``: one copy on ``devices[0]`` (one device, or the default strategy);
* ``"mirrored"``: a copy on every replica's device, kept equal by identical updates;
* ``"central"``: one copy on ``devices[0]``, the parameter device; replicas read it there;
* ``"ps"``: rows ``start:stop`` of the variable on parameter-server task ``ps`` under
  ``key``, one :class:`Shard` per part (``devices`` names the ps tasks);
* ``"sharded"``: an optimizer slot split evenly over the replicas' devices
  (ZeRO-1, ``graphdist.passes.shard_optimizer_state``): each replica reads and updates
  only its slice of the flattened value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphdist.errors import GraphError

__all__ = ["KINDS", "Shard", "VariableSpec", "VariablePlacement", "PlacementSpec", "variable_specs", "placement_of"]

KINDS = ("local", "mirrored", "central", "ps", "sharded")


@dataclass(frozen=True)
class Shard:
    """Rows ``start:stop`` (axis 0) of a variable, stored on ps task ``ps`` under ``key``."""

    ps: int
    key: str
    start: int
    stop: int


@dataclass(frozen=True)
class VariableSpec:
    """A variable as the graph knows it.

    Attributes:
        uid: Unique id (``AssignVariable``'s ``variable`` attribute names it).
        name: The variable's name (``dense/kernel``).
        dtype: numpy dtype string (``"<f4"``).
        shape: Static shape.
        trainable: Whether optimizers and ``trainable_variables`` see it.
        kind: Class name of the variable (``"MirroredVariable"``), for display.
    """

    uid: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    trainable: bool = True
    kind: str = "Variable"

    @classmethod
    def of(cls, variable: Any) -> VariableSpec:
        """The spec of a ``gd.Variable``."""
        return cls(variable.uid, variable._name, np.dtype(variable.dtype).str, tuple(int(d) for d in variable.shape),
                   bool(variable.trainable), type(variable).__name__)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"uid": self.uid, "name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "trainable": self.trainable, "kind": self.kind}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VariableSpec:
        """Inverse of :meth:`to_json`."""
        return cls(str(data["uid"]), str(data["name"]), str(data["dtype"]), tuple(int(d) for d in data["shape"]),
                   bool(data.get("trainable", True)), str(data.get("kind", "Variable")))


@dataclass(frozen=True)
class VariablePlacement:
    """Where one variable's value lives (see the module docstring for the kinds)."""

    kind: str
    devices: tuple[str, ...] = ()
    shards: tuple[Shard, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GraphError(f"unknown variable placement {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind == "ps" and not self.shards:
            raise GraphError("a 'ps' placement needs at least one shard")

    def describe(self) -> str:
        """``mirrored on cpu:0, cpu:1`` style text."""
        if self.kind == "ps":
            parts = ", ".join(f"ps {s.ps}" + (f" rows {s.start}:{s.stop}" if len(self.shards) > 1 else "")
                              for s in self.shards)
            return f"on {parts}"
        if self.kind == "mirrored":
            return "mirrored on " + ", ".join(self.devices)
        if self.kind == "sharded":
            return f"sharded 1/{len(self.devices)} on each of " + ", ".join(self.devices)
        return f"{'central on' if self.kind == 'central' else 'on'} {self.devices[0]}" if self.devices else "-"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {"kind": self.kind, "devices": list(self.devices)}
        if self.shards:
            out["shards"] = [[s.ps, s.key, s.start, s.stop] for s in self.shards]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VariablePlacement:
        """Inverse of :meth:`to_json`."""
        shards = tuple(Shard(int(p), str(k), int(a), int(b)) for p, k, a, b in data.get("shards", []))
        return cls(str(data["kind"]), tuple(str(d) for d in data.get("devices", [])), shards)


@dataclass
class PlacementSpec:
    """Placement of every variable of a step, keyed by the variable's uid."""

    variables: dict[str, VariablePlacement] = field(default_factory=dict)

    def __getitem__(self, uid: str) -> VariablePlacement:
        return self.variables[uid]

    def get(self, uid: str) -> VariablePlacement | None:
        """The placement of ``uid``, or ``None``."""
        return self.variables.get(uid)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {uid: p.to_json() for uid, p in self.variables.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlacementSpec:
        """Inverse of :meth:`to_json`."""
        return cls({str(uid): VariablePlacement.from_json(p) for uid, p in data.items()})


def variable_specs(graph: Any) -> list[tuple[str, VariableSpec]]:
    """``(input name, spec)`` of every variable the graph reads."""
    return list(graph.meta.variables)


def placement_of(graph: Any, specs: Iterable[tuple[str, VariableSpec]] | None = None) -> dict[str, VariablePlacement]:
    """``input name -> placement`` for the graph's variables that the spec places."""
    spec: PlacementSpec | None = graph.meta.placement
    if spec is None:
        return {}
    out = {}
    for name, variable in (specs if specs is not None else variable_specs(graph)):
        placement = spec.get(variable.uid)
        if placement is not None:
            out[name] = placement
    return out
