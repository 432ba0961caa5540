"""Helpers shared by the TensorFlow-side benchmark scripts (``tf_*.py``).

Those scripts run in TensorFlow's own venv, so this module imports only numpy
and the standard library; they import it as a sibling file (their directory is
first on ``sys.path`` when run as scripts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["default_mlp_data", "load_data", "time_calls"]


def default_mlp_data(sizes: tuple[int, ...] = (784, 512, 512, 10), batch: int = 256, seed: int = 0) -> dict[str, Any]:
    """The benchmarks' MLP: He-initialised weights ``w0, b0, ...``, one batch ``x``/``labels``, ``lr``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    data = {"lr": np.float32(0.01), "global_batch": np.int64(batch)}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        data[f"w{i}"] = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        data[f"b{i}"] = np.zeros(fan_out, np.float32)
    data["x"] = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    data["labels"] = rng.integers(0, sizes[-1], batch).astype(np.int64)
    return data


def load_data(path: str | None) -> dict[str, Any]:
    """The arrays of the ``.npz`` at ``path``; :func:`default_mlp_data` when ``path`` is ``None``."""
    import numpy as np

    if path is None:
        return default_mlp_data()
    with np.load(path) as npz:
        return {key: npz[key] for key in npz.files}


def time_calls(step: Callable[[], Any], calls: int) -> float:
    """Microseconds per call of ``calls`` back-to-back calls of ``step``."""
    start = time.perf_counter_ns()
    for _ in range(calls):
        step()
    return (time.perf_counter_ns() - start) / calls / 1e3
