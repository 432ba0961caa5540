"""Every pass has a test file of its own: ``graphdist/passes/<module>.py`` defining a ``*Pass`` class has
``tests/passes/test_<module>.py``, which imports that class from ``graphdist.passes.<module>`` (see
tests/passes/pass_checks.py for what such a file checks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PASSES = REPO / "graphdist" / "passes"
TESTS = REPO / "tests" / "passes"


def _pass_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Pass")
            and node.name != "PassBase"]


def _imported(path: Path, module: str) -> set[str]:
    """Names ``path`` imports from ``graphdist.passes.<module>``."""
    tree = ast.parse(path.read_text())
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == f"graphdist.passes.{module}" for alias in node.names}


PASS_MODULES = sorted(p.stem for p in PASSES.glob("*.py") if _pass_classes(p))


def test_the_passes_are_found() -> None:
    assert {"replicate", "partition", "lower_index_checks", "place_logical_devices"} <= set(PASS_MODULES)
    assert "base" not in PASS_MODULES


@pytest.mark.parametrize("module", PASS_MODULES)
def test_pass_has_a_test_file_that_imports_it(module: str) -> None:
    test_file = TESTS / f"test_{module}.py"
    assert test_file.is_file(), (f"graphdist/passes/{module}.py has no tests/passes/test_{module}.py "
                                 "(see pass_checks.py)")
    missing = set(_pass_classes(PASSES / f"{module}.py")) - _imported(test_file, module)
    assert not missing, f"{test_file.name} does not import {', '.join(sorted(missing))} from graphdist.passes.{module}"
