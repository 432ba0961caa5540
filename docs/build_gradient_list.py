"""Writes the ONNX guide's list of ops with gradient rules (docs/onnx.md) from the registry (``make docs``).

The list sits between the markers ``<!-- gradient-ops:begin -->`` and ``<!-- gradient-ops:end -->`` in
docs/onnx.md; ``tests/test_gradient_list.py`` fails when it differs from the registry
(:func:`graphdist.ir.gradients.ops_with_gradients`).

Usage: ``python docs/build_gradient_list.py [--check]`` (``--check``: exit status 1 when the list is stale).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["BEGIN", "END", "gradient_list", "updated_readme", "main"]

REPO = Path(__file__).resolve().parents[1]
BEGIN = "<!-- gradient-ops:begin (written by docs/build_gradient_list.py) -->"
END = "<!-- gradient-ops:end -->"


def gradient_list() -> str:
    """The markdown the markers enclose: the count and the ops, in backticks, alphabetically."""
    from graphdist.ir.gradients import ops_with_gradients

    ops = ops_with_gradients()
    return f"Ops with gradient rules ({len(ops)}): " + ", ".join(f"`{op}`" for op in ops) + "."


def updated_readme(text: str) -> str:
    """``text`` (docs/onnx.md) with the list between the markers replaced by the registry's."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN!r} ... {END!r} block")
    indent = text[text.rfind("\n", 0, start) + 1: start]  # the block sits inside a list item
    return text[: start + len(BEGIN)] + f"\n{indent}{gradient_list()}\n{indent}" + text[end:]


def main(argv: list[str] | None = None) -> int:
    """Rewrites (or, with ``--check``, checks) the guide's list; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the list is up to date")
    parser.add_argument("--readme", type=Path, default=REPO / "docs" / "onnx.md")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    new = updated_readme(text)
    if args.check:
        if new != text:
            print(f"{args.readme}: the list of ops with gradients is stale; run python docs/build_gradient_list.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
