"""Imports inside :mod:`graphdist.ir` form no circle, and ``ir/graph.py`` is pure data.

Every import of an IR module counts, at module level or inside a function: a late import that
closes a circle only hides it (the import order still matters, and half-initialized modules are
one refactor away). ``graph.py`` holds the data types (``Value``, ``Node``, ``Graph``) and imports
only its metadata record (``graph_meta``) and the op registry (``op_registry``, for the types of
the nodes it adds); the views of a graph (text, Graphviz, ONNX, networkx) are free functions in
their own modules, which import ``graph``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

IR = Path(__file__).resolve().parents[2] / "graphdist" / "ir"
#: What graph.py may import: its metadata record and the op registry (which imports no IR module).
GRAPH_IMPORTS = {"graph_meta", "op_registry"}


def _ir_imports(tree: ast.AST, package: set[str]) -> set[str]:
    """The graphdist.ir modules named by every import under ``tree`` (in functions too); ``package``
    names the modules of the folder, so ``from graphdist.ir import x`` counts only when ``x`` is one.
    """
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[:2] != ["graphdist", "ir"]:
                continue
            found.update([parts[2]] if len(parts) > 2 else [a.name for a in node.names if a.name in package])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names
                         if a.name.startswith("graphdist.ir.") and len(a.name.split(".")) > 2)
    return found


def _import_graph(root: Path = IR) -> nx.DiGraph:
    modules = {path.stem for path in root.glob("*.py")} - {"__init__"}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module in modules:  # __init__ is the package: it imports every module and none imports it
        for target in _ir_imports(ast.parse((root / f"{module}.py").read_text()), modules) - {module}:
            graph.add_edge(module, target)
    return graph


def test_no_import_cycle_inside_ir() -> None:
    graph = _import_graph()
    assert graph.number_of_nodes() > 20 and graph.has_edge("render", "graph")  # the scan sees the package
    assert graph.has_edge("graph", "op_registry")
    cycles = sorted(map(sorted, nx.simple_cycles(graph)))
    assert not cycles, f"import cycles inside graphdist/ir (imports in functions included): {cycles}"


def test_graph_module_is_pure_data() -> None:
    imports = _ir_imports(ast.parse((IR / "graph.py").read_text()), {p.stem for p in IR.glob("*.py")})
    assert imports <= GRAPH_IMPORTS, f"graph.py imports {sorted(imports - GRAPH_IMPORTS)}"
    registry = _ir_imports(ast.parse((IR / "op_registry.py").read_text()), {p.stem for p in IR.glob("*.py")})
    assert registry == set(), f"op_registry.py imports {sorted(registry)}"


def test_the_scan_finds_a_cycle_through_a_late_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from graphdist.ir.b import x\n")
    (tmp_path / "b.py").write_text("import numpy\n\n\ndef f():\n    from graphdist.ir import a, numpy_like\n")
    (tmp_path / "c.py").write_text("import graphdist.ir.a\n")
    assert sorted(map(sorted, nx.simple_cycles(_import_graph(tmp_path)))) == [["a", "b"]]
    assert set(_import_graph(tmp_path).edges) == {("a", "b"), ("b", "a"), ("c", "a")}
