"""Real exported ONNX models shipped inside PyPI wheels, fetched for the tests (pinned by hash).

Nobody here wrote these files: they are what real exporters wrote and real packages ship.

* ``rapidocr_onnxruntime`` 1.4.4 (Apache-2.0, https://github.com/RapidAI/RapidOCR): PaddleOCR's
  detector (DBNet, with ``Resize``), recogniser (CRNN/SVTR, computed ``Reshape`` shapes, dynamic
  batch) and text-direction classifier, exported by Paddle2ONNX; their weights are ``Constant`` nodes.
* ``silero_vad`` 6.2.3 (MIT, https://github.com/snakers4/silero-vad): a voice-activity detector
  exported by torch.onnx, with ``If`` subgraphs choosing the 16 kHz or 8 kHz branch.

The wheels' dependencies (onnxruntime CPU, torch, opencv) are not installed: ``pip download --no-deps
--require-hashes`` fetches the pinned wheel alone, and only its ``.onnx`` members are extracted, into
``.test-models/`` at the repository root (git-ignored, private to the user running the tests; ``make
test`` fills it first). A test that needs a model skips, saying why, when the wheel cannot be fetched.
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

__all__ = ["WHEELS", "MODELS", "model_path", "fetch_all"]

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".test-models"

#: package -> (version, sha256 of its py3-none-any wheel)
WHEELS = {
    "rapidocr_onnxruntime": ("1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    "silero_vad": ("6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
}

#: short name -> (package, member path inside its wheel)
MODELS = {
    "ppocr_det": ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ppocr_rec": ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "ppocr_cls": ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "silero_vad": ("silero_vad", "silero_vad/data/silero_vad.onnx"),
    "silero_vad_16k_op15": ("silero_vad", "silero_vad/data/silero_vad_16k_op15.onnx"),
}


def _private_dir(path: Path) -> Path:
    """``path``, created 0700 if missing; refused if another user owns it or may write to it."""
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeError(f"{path} is owned by uid {info.st_uid} or writable by others (mode "
                           f"{stat.filemode(info.st_mode)}); remove it so the tests can fetch their models again")
    return path


def _fetch_wheel(package: str, into: Path) -> None:
    version, sha256 = WHEELS[package]
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{package}=={version} --hash=sha256:{sha256}\n")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--require-hashes", "-r", str(requirements), "-d", tmp],
            capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not fetch {package}=={version}: {done.stderr.strip()[-400:]}")
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for member, (owner, inside) in ((m, MODELS[m]) for m in MODELS):
                if owner == package:
                    target = into / f"{member}.onnx"
                    partial = target.with_suffix(".partial")
                    partial.write_bytes(archive.read(inside))
                    partial.replace(target)


def model_path(name: str) -> Path:
    """The path of model ``name`` (a key of :data:`MODELS`), fetching its wheel on first use.

    Skips the calling test when the wheel cannot be fetched (no network to PyPI).
    """
    package, _ = MODELS[name]
    cache = _private_dir(CACHE)
    target = cache / f"{name}.onnx"
    if target.exists():
        return target
    with open(cache / ".lock", "w") as lock:  # pytest-xdist workers may ask at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            try:
                _fetch_wheel(package, cache)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
                pytest.skip(f"model {name} ({package} from PyPI) is not available: {err}")
    return target


def fetch_all() -> None:
    """Fetches every model (``make test`` runs this before the tests)."""
    cache = _private_dir(CACHE)
    for package in WHEELS:
        if not all((cache / f"{m}.onnx").exists() for m, (p, _) in MODELS.items() if p == package):
            _fetch_wheel(package, cache)
    print(f"{len(MODELS)} real models in {cache}")


if __name__ == "__main__":
    fetch_all()
