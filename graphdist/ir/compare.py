"""Structural comparison of graphs (like TVM's ``assert_structural_equal``).

Two graphs are structurally equal when they compute the same thing the same
way, whatever their value and node names: the same inputs (dtype, shape, in
order), the same nodes in order (op, domain, attributes, which earlier value
each input reads, output types, and optionally device and replica), the same
initializer values where they are read, and the same outputs. Collective
group keys and variable uids are names too: they must correspond one to one,
not be equal.

:func:`structural_diff` returns the first difference as text (``None`` when
equal); :func:`assert_structural_equal` raises with it. Pass tests compare a
pass's result with a hand-built expected graph this way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.graph import Graph, Node, Value

__all__ = ["structural_diff", "assert_structural_equal", "same_attr"]

#: Attributes that name things (groups, variables) rather than say what is computed.
_NAME_ATTRS = frozenset({"group_key", "name", "variable"})


class _Matcher:
    def __init__(self, a: Graph, b: Graph, placement: bool, meta_keys: tuple[str, ...]) -> None:
        self.a, self.b = a, b
        self.placement = placement
        self.meta_keys = meta_keys
        self.values: dict[int, Value] = {}  # id(value of a) -> value of b
        self.keys: dict[Any, Any] = {}
        self.reverse_keys: dict[Any, Any] = {}

    def run(self) -> str | None:
        return (self._inputs() or self._nodes() or self._outputs())

    def _inputs(self) -> str | None:
        if len(self.a.inputs) != len(self.b.inputs):
            return f"{len(self.a.inputs)} inputs vs {len(self.b.inputs)}"
        for index, (x, y) in enumerate(zip(self.a.inputs, self.b.inputs)):
            if x.dtype != y.dtype or tuple(x.shape) != tuple(y.shape):
                return f"input {index}: %{x.name} {x.type_str()} vs %{y.name} {y.type_str()}"
            self.values[id(x)] = y
        return None

    def _nodes(self) -> str | None:
        if len(self.a.nodes) != len(self.b.nodes):
            listing = _ops_difference(self.a, self.b)
            return f"{len(self.a.nodes)} nodes vs {len(self.b.nodes)}{listing}"
        for index, (x, y) in enumerate(zip(self.a.nodes, self.b.nodes)):
            problem = self._node(x, y)
            if problem:
                return f"node {index} ({x.name} vs {y.name}): {problem}"
        return None

    def _node(self, x: Node, y: Node) -> str | None:
        if (x.domain, x.op_type) != (y.domain, y.op_type):
            return f"{x.qualified_op} vs {y.qualified_op}"
        problem = self._attrs(x, y)
        if problem:
            return problem
        if len(x.inputs) != len(y.inputs):
            return f"{len(x.inputs)} inputs vs {len(y.inputs)}"
        for index, (u, v) in enumerate(zip(x.inputs, y.inputs)):
            problem = self._same_value(u, v)
            if problem:
                return f"input {index}: {problem}"
        if len(x.outputs) != len(y.outputs):
            return f"{len(x.outputs)} outputs vs {len(y.outputs)}"
        for u, v in zip(x.outputs, y.outputs):
            if u.dtype != v.dtype or tuple(u.shape) != tuple(v.shape):
                return f"output {u.type_str()} vs {v.type_str()}"
            self.values[id(u)] = v
        if self.placement and (x.device, x.replica) != (y.device, y.replica):
            return f"placed on {x.device} (replica {x.replica}) vs {y.device} (replica {y.replica})"
        for key in self.meta_keys:
            if key == "replica":  # the node's replica field (its one home; formerly also a meta entry)
                if x.replica != y.replica:
                    return f"replica {x.replica!r} vs {y.replica!r}"
                continue
            if x.meta.get(key) != y.meta.get(key):
                return f"meta[{key!r}] {x.meta.get(key)!r} vs {y.meta.get(key)!r}"
        return None

    def _attrs(self, x: Node, y: Node) -> str | None:
        if set(x.attrs) != set(y.attrs):
            return f"attributes {sorted(x.attrs)} vs {sorted(y.attrs)}"
        for name, value in x.attrs.items():
            other = y.attrs[name]
            if name in _NAME_ATTRS:
                if self.keys.setdefault(value, other) != other or self.reverse_keys.setdefault(other, value) != value:
                    return f"{name} {value!r} vs {other!r} do not correspond one to one"
            elif not same_attr(value, other):
                return f"attribute {name}: {value!r} vs {other!r}"
        return None

    def _same_value(self, u: Value | None, v: Value | None) -> str | None:
        if u is None or v is None:
            return None if u is v else f"{u!r} vs {v!r}"
        if u.const_value is not None or v.const_value is not None:
            if u.const_value is None or v.const_value is None:
                return f"%{u.name} vs %{v.name} (one is a constant)"
            x, y = np.asarray(u.const_value), np.asarray(v.const_value)
            if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                return f"constant %{u.name} {_short(x)} vs %{v.name} {_short(y)}"
            return None
        mapped = self.values.get(id(u))
        if mapped is not v:
            return f"reads %{u.name} vs %{v.name}, which do not correspond"
        return None

    def _outputs(self) -> str | None:
        if len(self.a.outputs) != len(self.b.outputs):
            return f"{len(self.a.outputs)} outputs vs {len(self.b.outputs)}"
        for index, (u, v) in enumerate(zip(self.a.outputs, self.b.outputs)):
            problem = self._same_value(u, v)
            if problem:
                return f"graph output {index}: {problem}"
        return None


def same_attr(a: Any, b: Any) -> bool:
    """Whether two node attribute values are equal (arrays by value, lists element by element)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_attr(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _short(array: np.ndarray) -> str:
    text = np.array2string(array, threshold=6)
    return f"{array.dtype.name}{list(array.shape)} {text if len(text) < 60 else text[:57] + '...'}"


def _ops_difference(a: Graph, b: Graph) -> str:
    from collections import Counter

    ca, cb = Counter(n.qualified_op for n in a.nodes), Counter(n.qualified_op for n in b.nodes)
    more = [f"+{op} x{count}" for op, count in (ca - cb).items()]
    fewer = [f"-{op} x{count}" for op, count in (cb - ca).items()]
    return f" ({', '.join(more + fewer)})" if more or fewer else ""


def structural_diff(actual: Graph, expected: Graph, *, placement: bool = False,
                    meta_keys: tuple[str, ...] = ()) -> str | None:
    """The first structural difference between two graphs, or ``None`` when they are equal.

    Args:
        actual: A graph.
        expected: The graph it should equal.
        placement: Also compare every node's device and replica.
        meta_keys: Node ``meta`` entries that must also be equal; ``"replica"`` compares
            the node's ``replica`` field (without its device, as ``placement`` would).
    """
    return _Matcher(actual, expected, placement, meta_keys).run()


def assert_structural_equal(actual: Graph, expected: Graph, *, placement: bool = False,
                            meta_keys: tuple[str, ...] = ()) -> None:
    """Raises :class:`~graphdist.errors.GraphError` naming the first difference (see :func:`structural_diff`)."""
    problem = structural_diff(actual, expected, placement=placement, meta_keys=meta_keys)
    if problem:
        raise GraphError(f"graph {actual.name!r} differs from {expected.name!r}: {problem}")
