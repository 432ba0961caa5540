"""Every ```python block of the README and of the guide (docs/*.md) runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(page, index, code) for page in PAGES
          for index, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))]


@pytest.mark.parametrize("page, index, code", BLOCKS,
                         ids=[f"{page.stem}-block{index}" for page, index, _ in BLOCKS])
def test_readme_block_runs(page: Path, index: int, code: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{page.name}, python block {index}:\n{result.stderr[-3000:]}"
