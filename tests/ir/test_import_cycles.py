"""Imports inside :mod:`graphdist.ir` form no circle, and ``ir/graph.py`` is pure data.

The IR's modules import one another only downwards at import time (a cycle
would make the import order matter and half-initialized modules possible).
``graph.py`` holds the data types (``Value``, ``Node``, ``Graph``) and imports
no other IR module at import time but its metadata record (``graph_meta``). Its only late imports are the op registry
(``add_node`` infers output types) and the views that its thin convenience
methods (``summary``, ``to_onnx``, ``to_dot``, ``render``, ``to_networkx``)
delegate to; those views are free functions in their own modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

IR = Path(__file__).resolve().parents[2] / "graphdist" / "ir"
# The late imports graph.py may make: type inference, and the views its thin wrappers delegate to.
GRAPH_LATE_IMPORTS = {"ops", "printer", "render", "onnx_io", "networkx_view"}


def _ir_imports(statements: list[ast.stmt] | ast.AST) -> set[str]:
    """The graphdist.ir modules named by the import statements among ``statements`` (or under an AST)."""
    nodes = ast.walk(statements) if isinstance(statements, ast.AST) else statements
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("graphdist.ir"):
            parts = node.module.split(".")
            found.update([parts[2]] if len(parts) > 2 else [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("graphdist.ir."))
    return found


def _module_level_graph(root: Path = IR) -> nx.DiGraph:
    graph = nx.DiGraph()
    for path in root.glob("*.py"):
        graph.add_node(path.stem)
        if path.stem == "__init__":
            continue  # the package re-exports its modules; it is imported first, by every one of them
        for target in _ir_imports(ast.parse(path.read_text()).body) - {path.stem}:
            graph.add_edge(path.stem, target)
    return graph


def test_no_import_cycle_inside_ir() -> None:
    graph = _module_level_graph()
    assert graph.number_of_nodes() > 20 and graph.has_edge("render", "graph")  # the scan sees the package
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles inside graphdist/ir: {cycles}"


def test_graph_module_is_pure_data() -> None:
    tree = ast.parse((IR / "graph.py").read_text())
    # its one import-time IR import is its own metadata record (graph_meta, which imports only placement's specs)
    assert _ir_imports(tree.body) <= {"graph_meta", "op_registry"}, "graph.py imports another IR module at import time"
    late = _ir_imports(tree) - {"graph_meta", "op_registry"}
    assert late <= GRAPH_LATE_IMPORTS, f"graph.py imports {sorted(late - GRAPH_LATE_IMPORTS)}"
    assert "printer" not in late  # summary goes through render.graph_summary


def test_the_scan_finds_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from graphdist.ir.b import x\n")
    (tmp_path / "b.py").write_text("import numpy\n\nfrom graphdist.ir import a\n")
    (tmp_path / "c.py").write_text("def f():\n    from graphdist.ir.a import y\n")  # late: not at import time
    assert sorted(map(sorted, nx.simple_cycles(_module_level_graph(tmp_path)))) == [["a", "b"]]
