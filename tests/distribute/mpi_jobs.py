"""Helpers of the multi-process tests: run ``mpiexec`` / ``graphdist launch`` with a hard timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HARD_TIMEOUT = 120  # seconds: nothing a test starts may hang the suite


def env(**extra: str) -> dict[str, str]:
    """The test process's environment with the repository importable and ``extra`` set."""
    out = dict(os.environ)
    out.pop("TF_CONFIG", None)
    out.pop("GRAPHDIST_CONFIG", None)
    out["PYTHONPATH"] = os.pathsep.join([str(REPO), out.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out.update(extra)
    return out


def launch(*args: str, timeout: float = HARD_TIMEOUT, **extra: str) -> subprocess.CompletedProcess:
    """Runs ``graphdist launch ARGS`` and returns the completed process (text output)."""
    command = [sys.executable, "-m", "graphdist.cli.main", "launch", *args]
    return subprocess.run(command, cwd=REPO, env=env(**extra), capture_output=True, text=True, timeout=timeout,
                          check=False)


def mpiexec(ranks: int, *args: str, timeout: float = HARD_TIMEOUT, **extra: str) -> subprocess.CompletedProcess:
    """Runs ``mpiexec -n RANKS python ARGS``."""
    command = [str(BIN / "mpiexec"), "-n", str(ranks), sys.executable, *args]
    return subprocess.run(command, cwd=REPO, env=env(**extra), capture_output=True, text=True, timeout=timeout,
                          check=False)
