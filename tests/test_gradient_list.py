"""The ONNX guide's list of ops with gradient rules (docs/onnx.md) is the registry's.

docs/build_gradient_list.py writes it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from graphdist.ir.gradients import ops_with_gradients

REPO = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("build_gradient_list", REPO / "docs" / "build_gradient_list.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_lists_exactly_the_ops_with_gradient_rules() -> None:
    builder = _builder()
    text = (REPO / "docs" / "onnx.md").read_text()  # the ONNX guide page (moved from the README)
    block = text[text.index(builder.BEGIN) + len(builder.BEGIN): text.index(builder.END)]
    listed = re.findall(r"`([A-Za-z0-9.]+)`", block)
    assert listed == ops_with_gradients(), "run python docs/build_gradient_list.py"
    assert {"Resize", "ConvTranspose", "Einsum", "HardSwish", "InstanceNormalization"} <= set(listed)
    assert builder.updated_readme(text) == text


def test_stale_list_is_rewritten_and_check_fails(tmp_path: Path) -> None:
    builder = _builder()
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{builder.BEGIN}\nOps with gradient rules (1): `Add`.\n{builder.END}\nafter\n")
    assert builder.main(["--check", "--readme", str(readme)]) == 1
    assert builder.main(["--readme", str(readme)]) == 0
    assert builder.main(["--check", "--readme", str(readme)]) == 0
    assert "`Resize`" in readme.read_text() and readme.read_text().endswith(f"{builder.END}\nafter\n")
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="no .* block"):
        builder.main(["--readme", str(readme)])
