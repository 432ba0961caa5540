"""The IR owns its edits: no code outside :mod:`graphdist.ir` edits the IR's pointers by hand.

Nodes join and leave a graph through the :class:`~graphdist.ir.Graph` edit
methods (``add_node``, ``insert_before``/``insert_after``, the
``inserting_before`` cursor, ``remove``, ``replace_node``, ``set_nodes``), and a
value changes producer through ``Node.add_output``. This test reads the source
of every other package and flags an assignment to ``.graph`` (other than a
class's own ``self.graph``), to ``.producer``, to ``<graph>.nodes`` (or a slice
of it), and calls that edit a graph's node list in place (``graph.nodes.insert``).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = [REPO / "graphdist"]  # graphdist/passes and graphdist/models included
IR = REPO / "graphdist" / "ir"
LIST_EDITS = {"append", "insert", "remove", "extend", "pop", "clear", "sort", "reverse"}


def _sources() -> list[Path]:
    files = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root)
            if relative.parts[0] == "ir":
                continue  # ir/ owns the pointers
            files.append(path)
    return files


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _is_graph(node: ast.expr) -> bool:
    """A receiver named as a graph (``graph``, ``self.graph``, ``g``): other objects may have ``nodes`` lists."""
    text = ast.unparse(node)
    return text == "g" or text.endswith("graph")


def _targets(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            found.extend(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            found.append(node.target)
        elif isinstance(node, ast.Delete):
            found.extend(node.targets)  # del graph.nodes[i:]
    flat: list[ast.expr] = []
    while found:
        target = found.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            found.extend(target.elts)
        else:
            flat.append(target)
    return flat


def _hand_edits(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    edits = []
    for target in _targets(tree):
        if isinstance(target, ast.Subscript):
            target = target.value  # graph.nodes[:] = ...
            if not (isinstance(target, ast.Attribute) and target.attr == "nodes"):
                continue
        if not isinstance(target, ast.Attribute):
            continue
        if (target.attr == "producer" or (target.attr == "graph" and not _is_self(target.value))
                or (target.attr == "nodes" and _is_graph(target.value))):
            edits.append(f"{path.relative_to(REPO)}:{target.lineno}: assigns {ast.unparse(target)}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LIST_EDITS
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "nodes"
                and _is_graph(node.func.value.value)):
            edits.append(f"{path.relative_to(REPO)}:{node.lineno}: edits {ast.unparse(node.func)}(...) in place")
    return edits


def _replica_in_meta(path: Path) -> list[str]:
    """Uses of ``meta["replica"]`` (a node's replica has one home: ``node.replica``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        keyed = (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "meta"
                 and isinstance(node.slice, ast.Constant) and node.slice.value == "replica")
        called = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "meta"
                  and (any(isinstance(a, ast.Constant) and a.value == "replica" for a in node.args[:1])
                       or any(k.arg == "replica" for k in node.keywords)))
        if keyed or called:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_a_node_replica_lives_in_its_field_only() -> None:
    uses = [use for path in _sources() for use in _replica_in_meta(path)]
    assert not uses, "use node.replica:\n" + "\n".join(uses)


def test_the_replica_check_flags_meta_replica(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text("def f(node):\n    node.meta['replica'] = 1\n    node.meta.get('replica')\n"
                      "    node.meta.update(replica=2)\n    node.meta.get('context')\n")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        assert len(_replica_in_meta(source)) == 3
    finally:
        REPO = saved


def test_no_code_outside_ir_edits_the_ir_pointers_by_hand() -> None:
    files = _sources()
    assert any(p.parent.name == "passes" for p in files) and len(files) > 50  # the scan reads the packages
    edits = [edit for path in files for edit in _hand_edits(path)]
    assert not edits, "use the Graph edit methods instead:\n" + "\n".join(edits)


def test_the_check_flags_a_hand_edit(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text("def f(graph, node, value, twin):\n    graph.nodes = []\n    node.graph = graph\n"
                      "    value.producer, value.index = twin, 0\n    graph.nodes[:0] = [node]\n"
                      "    graph.nodes.insert(0, node)\n    self.graph = graph\n    del self.graph.nodes[3:]\n")
    found = [line.split(": ", 1)[1] for line in _hand_edits_at(source)]
    assert found == ["assigns graph.nodes", "assigns node.graph", "assigns value.producer",
                     "assigns graph.nodes", "edits graph.nodes.insert(...) in place", "assigns self.graph.nodes"]


def _hand_edits_at(path: Path) -> list[str]:
    global REPO
    saved, REPO = REPO, path.parent
    try:
        return sorted(_hand_edits(path), key=lambda e: int(e.split(":")[1]))
    finally:
        REPO = saved
