"""How a step's arguments and results map to its traced graph, and through replication to a plan.

A step is traced once, as one replica. A per-replica argument is one traced
input per *variant* (replicas whose components had the same shape), a
per-replica result one traced output per variant. :class:`StepInterface`
records that mapping at trace time; :meth:`StepInterface.resolve` reads the
``replication`` record ``ReplicatePass`` leaves on a rewritten graph and
gives the plan's input names in call order and its outputs in result order.
A plan directory stores the interface as JSON (:meth:`to_json`), so a
re-planned step is called and answers exactly like the original.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphdist.errors import PlanError
from graphdist.ir.graph import Graph

__all__ = ["result_value", "ArgumentFeed", "ResultLeaf", "StepInterface", "Resolved", "rebuild_results"]


@dataclass(frozen=True)
class ArgumentFeed:
    """What one argument leaf feeds.

    Attributes:
        kind: ``"tensor"`` (one array), ``"per_replica"`` (one component per
            replica) or ``"none"`` (a Python value, a variable: no input).
        inputs: Traced input names: one for a tensor; per replica, the input
            of its variant (``None`` for a component that is not an array).
    """

    kind: str
    inputs: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class ResultLeaf:
    """Where one result leaf comes from.

    Attributes:
        kind: ``"plain"`` (one value), ``"per_replica"`` (a ``PerReplica`` of
            every replica's copy of a replica value) or ``"components"`` (a
            ``PerReplica`` whose components are separate values).
        outputs: Traced output positions: one for plain; per replica, the
            output of its variant; per component for components.
    """

    kind: str
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class Resolved:
    """An interface resolved against a rewritten graph.

    Attributes:
        input_names: Plan inputs fed by the call's arrays, in call order.
        output_order: Rewritten output positions of the results, in result order.
        counts: Per result leaf, ``None`` (plain) or its number of components.
    """

    input_names: list[str]
    output_order: list[int]
    counts: list[int | None]


@dataclass
class StepInterface:
    """Argument feeds and result leaves of a traced step (see the module docstring)."""

    arguments: list[ArgumentFeed]
    results: list[ResultLeaf]

    def resolve(self, graph: Graph) -> Resolved:
        """Plan input names and result outputs of ``graph``, rewritten from the traced one.

        Raises:
            PlanError: The graph lacks an input or output the interface names.
        """
        replication = graph.meta.replication
        input_map = replication.input_map if replication is not None else {}
        output_map = replication.output_map if replication is not None else None
        replica_outputs = replication.replica_outputs if replication is not None else {}
        names: list[str] = []
        for feed in self.arguments:
            if feed.kind == "tensor":
                names.append(_plain_input(feed.inputs[0], input_map))
            elif feed.kind == "per_replica":
                names += [_replica_input(name, replica, input_map) for replica, name in enumerate(feed.inputs)
                          if name is not None]
        order: list[int] = []
        counts: list[int | None] = []
        for leaf in self.results:
            if leaf.kind == "per_replica":
                order += [_replica_output(t, r, replica_outputs, output_map) for r, t in enumerate(leaf.outputs)]
                counts.append(len(leaf.outputs))
            else:
                order += [_plain_output(t, output_map) for t in leaf.outputs]
                counts.append(None if leaf.kind == "plain" else len(leaf.outputs))
        return Resolved(names, order, counts)

    def for_replicas(self, count: int) -> StepInterface:
        """The interface of the same traced step distributed over ``count`` replicas: each per-replica
        argument and result has ``count`` components, all of the step's one variant.

        Raises:
            PlanError: A per-replica argument or result had components of different shapes (the step
                was traced once per shape, for its replica count only).
        """
        def widen(items: tuple[Any, ...], what: str) -> tuple[Any, ...]:
            if len(items) == count:
                return items  # the replica count it was traced for: variants and all
            present = {item for item in items if item is not None}
            if len(present) > 1:
                raise PlanError(f"a per-replica {what} of this step had components of different shapes (traced "
                                "once per shape); it can only run on the replica count it was traced for")
            return (present.pop() if present else None,) * count

        arguments = [ArgumentFeed(f.kind, widen(f.inputs, "argument")) if f.kind == "per_replica" else f
                     for f in self.arguments]
        results = [ResultLeaf(r.kind, widen(r.outputs, "result")) if r.kind == "per_replica" else r
                   for r in self.results]
        return StepInterface(arguments, results)

    # ----------------------------------------------------------------- json
    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"arguments": [{"kind": f.kind, "inputs": list(f.inputs)} for f in self.arguments],
                "results": [{"kind": r.kind, "outputs": list(r.outputs)} for r in self.results]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepInterface:
        """Inverse of :meth:`to_json`.

        Raises:
            PlanError: A malformed entry.
        """
        try:
            arguments = [ArgumentFeed(str(a["kind"]), tuple(None if n is None else str(n) for n in a["inputs"]))
                         for a in data["arguments"]]
            results = [ResultLeaf(str(r["kind"]), tuple(int(t) for t in r["outputs"])) for r in data["results"]]
        except (KeyError, TypeError, ValueError) as err:
            raise PlanError(f"the step interface in plan.json is malformed ({type(err).__name__}: {err})") from None
        return cls(arguments, results)


def result_value(output: np.ndarray) -> Any:
    """A step's output as it is returned: a 0-d numeric array as a numpy scalar (as numpy's reductions give
    one); a 0-d string or object array stays an array (its element would be a bare Python object).
    """
    return output[()] if output.ndim == 0 and output.dtype != object else output


def rebuild_results(outputs: Sequence[Any], counts: Sequence[int | None], treedef: Any) -> Any:
    """The step's result from its outputs in result order: a ``PerReplica`` of ``count`` outputs where
    a leaf has a count, the output itself otherwise.
    """
    from graphdist import nest
    from graphdist.trace.values import PerReplica

    leaves, position = [], 0
    for count in counts:
        if count is None:
            leaves.append(outputs[position])
            position += 1
        else:
            leaves.append(PerReplica(outputs[position: position + count]))
            position += count
    return nest.unflatten(treedef, leaves)


def _plain_input(name: str | None, input_map: Mapping[str, Any]) -> str:
    if name is None:
        raise PlanError("a tensor argument feeds no input")
    if name in input_map:  # a per-replica input fed by one array: replica 0's copy
        return input_map[name][min(input_map[name])]
    return name


def _replica_input(name: str, replica: int, input_map: Mapping[str, Any]) -> str:
    twins = input_map.get(name)
    if twins is None:
        return name
    if replica not in twins:
        raise PlanError(f"input {name!r} has no copy for replica {replica} (copies: {sorted(twins)})")
    return twins[replica]


def _plain_output(position: int, output_map: Sequence[int] | Mapping[int, int] | None) -> int:
    if output_map is None:
        return position
    return output_map[position]


def _replica_output(position: int, replica: int, replica_outputs: Mapping[int, Mapping[int, int]],
                    output_map: Mapping[int, int] | None) -> int:
    twins = replica_outputs.get(position)
    if twins is None:
        return _plain_output(position, output_map)
    if replica not in twins:
        raise PlanError(f"output {position} has no copy for replica {replica} (copies: {sorted(twins)})")
    return twins[replica]
