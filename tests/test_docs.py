"""``make docs`` (docs/build_api.py): pdoc's warnings, an import failure first, fail the API reference build."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("pdoc", reason="pdoc is in the [test] extra")


def _builder():
    spec = importlib.util.spec_from_file_location("build_api", REPO / "docs" / "build_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(root: Path, name: str, submodule: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(f'"""Package {name}."""\n__all__ = ["lazy", "part"]\n'
                                             "def __getattr__(attr):\n"
                                             "    if attr == 'lazy':\n"
                                             "        return 42\n"
                                             "    raise AttributeError(attr)\n")
    (root / name / "part.py").write_text(textwrap.dedent(submodule))


def test_broken_module_fails_the_build_and_a_clean_one_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    build_api = _builder()
    monkeypatch.syspath_prepend(str(tmp_path))
    _package(tmp_path, "docs_ok_pkg", '''
        """A documented module."""

        def f(x: int) -> int:
            """Doubles.

            Args:
                x: A number.
            """
            return 2 * x
        ''')
    _package(tmp_path, "docs_broken_pkg", '''
        """Imports something that does not exist."""
        import no_such_module_anywhere
        ''')
    assert build_api.build(tmp_path / "ok", ("docs_ok_pkg",)) == []
    page = (tmp_path / "ok" / "docs_ok_pkg" / "part.html").read_text()
    assert "Doubles." in page and "A number." in page
    assert "lazy" in (tmp_path / "ok" / "docs_ok_pkg.html").read_text()  # the lazy export is documented
    problems = build_api.build(tmp_path / "broken", ("docs_broken_pkg",))
    assert any("docs_broken_pkg.part" in p and "no_such_module_anywhere" in p for p in problems), problems


def test_package_that_does_not_import_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_api = _builder()
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "docs_import_fails").mkdir()
    (tmp_path / "docs_import_fails" / "__init__.py").write_text('"""Broken."""\nraise RuntimeError("boom")\n')
    assert build_api.build(tmp_path / "out", ("docs_import_fails",)) == [
        "cannot import docs_import_fails: RuntimeError: boom"]
    assert not (tmp_path / "out").exists()
