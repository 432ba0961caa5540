"""The files on disk are laid out as they are imported: one module object per file, no symbolic links."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_symbolic_link_in_the_package_tree() -> None:
    links = [str(p.relative_to(REPO)) for p in (REPO / "graphdist").rglob("*") if p.is_symlink()]
    assert links == []


def test_one_module_object_per_file_with_the_repository_root_on_sys_path() -> None:
    """``import passes.base`` (the repository root on ``sys.path``, as pytest's ``pythonpath``) must not load
    a second copy of ``graphdist.passes.base``: the top-level name does not exist.
    """
    code = ("import importlib.util, sys\n"
            "import graphdist.passes.base as base\n"
            "print(importlib.util.find_spec('passes'), importlib.util.find_spec('models'))\n"
            "print(sum(1 for m in list(sys.modules.values()) if getattr(m, '__file__', None) == base.__file__))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None", "1"]
