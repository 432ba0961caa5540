"""Flattening and rebuilding of nested Python structures (like ``tf.nest``).

Containers are tuples, lists, dicts (sorted by key), namedtuples and ``None``
(a container with no leaves); everything else is a leaf. The tree definition
is hashable so it can be part of a cache key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["flatten", "unflatten", "map_structure", "TreeDef"]

# A TreeDef is a nested tuple: ("leaf",) | ("none",) | (kind, type, keys, children).
TreeDef = tuple


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def flatten(structure: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], TreeDef]:
    """Returns the leaves of ``structure`` (depth first) and its tree definition."""
    leaves: list[Any] = []
    treedef = _flatten_into(structure, leaves, is_leaf)
    return leaves, treedef


def _flatten_into(value: Any, leaves: list[Any], is_leaf: Callable[[Any], bool] | None) -> TreeDef:
    if is_leaf is not None and is_leaf(value):
        leaves.append(value)
        return ("leaf",)
    if value is None:
        return ("none",)
    if _is_namedtuple(value):
        children = tuple(_flatten_into(v, leaves, is_leaf) for v in value)
        return ("namedtuple", type(value), None, children)
    if isinstance(value, (tuple, list)):
        children = tuple(_flatten_into(v, leaves, is_leaf) for v in value)
        return (type(value).__name__, type(value), None, children)
    if isinstance(value, dict):
        keys = tuple(sorted(value, key=repr))
        children = tuple(_flatten_into(value[k], leaves, is_leaf) for k in keys)
        return ("dict", type(value), keys, children)
    leaves.append(value)
    return ("leaf",)


def unflatten(treedef: TreeDef, leaves: list[Any] | tuple[Any, ...]) -> Any:
    """Rebuilds a structure from :func:`flatten`'s tree definition and leaves."""
    iterator = iter(leaves)
    result = _build(treedef, iterator)
    if next(iterator, _SENTINEL) is not _SENTINEL:
        raise ValueError("unflatten: more leaves than the structure holds")
    return result


_SENTINEL = object()


def _build(treedef: TreeDef, leaves: Any) -> Any:
    kind = treedef[0]
    if kind == "leaf":
        return next(leaves)
    if kind == "none":
        return None
    _, cls, keys, children = treedef
    values = [_build(child, leaves) for child in children]
    if kind == "namedtuple":
        return cls(*values)
    if kind == "dict":
        out = dict(zip(keys, values))
        return out if cls is dict else cls(out)
    return cls(values)


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """Applies ``fn`` leaf-wise over structures of the same shape."""
    flat = [flatten(s) for s in structures]
    first_def = flat[0][1]
    for _, other_def in flat[1:]:
        if _strip_types(other_def) != _strip_types(first_def):
            raise ValueError("map_structure: the structures differ")
    return unflatten(first_def, [fn(*leaves) for leaves in zip(*(f[0] for f in flat))])


def _strip_types(treedef: TreeDef) -> Any:
    if treedef[0] in ("leaf", "none"):
        return treedef[0]
    return (treedef[0], treedef[2], tuple(_strip_types(c) for c in treedef[3]))
