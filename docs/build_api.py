"""Builds the API reference (HTML) from graphdist's docstrings with pdoc: ``make docs`` runs it.

pdoc reads the Google-style docstrings as they are (no configuration files) and reports every problem
(a module that fails to import, a name in ``__all__`` that does not resolve, an annotation it cannot
evaluate) as a Python warning and goes on. This script turns each of those warnings into a failure, so
the build and CI fail on them.

Usage: ``python docs/build_api.py [--output docs/api]`` (exit status 1 on any pdoc warning).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from pathlib import Path

__all__ = ["build", "main"]

#: The documented modules: the public API (``graphdist`` and the modules its ``__all__`` names), the internal
#: layers a contributor works in, and the passes. pdoc follows each package's ``__all__`` to its submodules.
PACKAGES = ("graphdist", "graphdist.distribute", "graphdist.compile", "graphdist.ir", "graphdist.backends",
            "graphdist.runtime", "graphdist.onnx.model", "graphdist.onnx.backend", "graphdist.cli", "graphdist.passes")

REPO = Path(__file__).resolve().parents[1]


def _resolve_lazy_exports(package: str) -> None:
    """Puts names that a module exports through ``__getattr__`` (imported on first use, e.g.
    ``graphdist.onnx.load``) into the module, so pdoc documents them like eager exports.
    """
    for name, module in list(sys.modules.items()):
        if not (name == package or name.startswith(f"{package}.")) or module is None:
            continue
        if "__getattr__" not in vars(module):
            continue
        for export in getattr(module, "__all__", ()):
            if export in vars(module):
                continue
            try:
                setattr(module, export, getattr(module, export))
            except AttributeError:
                continue  # a submodule not imported yet (pdoc imports it) or a broken export (pdoc reports it)


def build(output: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Writes the HTML reference of ``packages`` into ``output``; returns pdoc's warnings (empty when clean)."""
    import pdoc
    import pdoc.render

    sys.path.insert(0, str(REPO))
    pdoc.render.configure(docformat="google", show_source=False, footer_text="graphdist")
    problems = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for package in packages:
            try:
                importlib.import_module(package)
            except Exception as err:  # noqa: BLE001 - reported as a build failure, with its cause
                problems.append(f"cannot import {package}: {type(err).__name__}: {err}")
                continue
            _resolve_lazy_exports(package)
        if problems:
            return problems
        try:
            pdoc.pdoc(*packages, output_directory=output)
        except Exception as err:  # noqa: BLE001 - pdoc raises for a module named in __all__ that fails to import
            cause = f" ({type(err.__cause__).__name__}: {err.__cause__})" if err.__cause__ else ""
            return [f"pdoc failed: {type(err).__name__}: {err}{cause}"]
    return [f"{Path(w.filename).name}:{w.lineno}: {w.message}" for w in caught if _counts(w)]


def _counts(warning: warnings.WarningMessage) -> bool:
    """True for the warnings of pdoc itself and of the documented code (third-party deprecations aside)."""
    path = Path(warning.filename).resolve()
    return "pdoc" in path.parts or REPO in path.parents


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--output DIR``; prints the warnings and returns 1 when there are any."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "api", help="HTML directory (docs/api)")
    args = parser.parse_args(argv)
    problems = build(args.output)
    for problem in problems:
        print(f"docs: warning: {problem}", file=sys.stderr)
    if problems:
        print(f"docs: {len(problems)} pdoc warning(s): fix the docstrings or imports named above", file=sys.stderr)
        return 1
    print(f"docs: API reference written to {args.output}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
