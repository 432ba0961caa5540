"""One CPU arena for all of graphdist's ONNX Runtime sessions (graphdist/backends/ort_memory.py).

Eight sessions each need 64 MiB of intermediates (two 32 MiB tensors); run one after another in a fresh
process, they keep about 64 MiB with the shared arena (measured 66) and about 8 x 64 MiB with one arena
each (ONNX Runtime's default, ``GRAPHDIST_ORT_SHARED_ARENA=0``; measured 528), counted as the
process's resident memory after the runs. The results are the same
either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphdist.backends.ort_memory import SHARED_ARENA_ENV, shared_arena_enabled
from graphdist.errors import InvalidArgumentError

_SCRIPT = r"""
import json, os
import numpy as np
import onnx
from onnx import TensorProto, helper
from graphdist.backends import get_backend

def model(k):
    # x (1, 1024) -> Expand to (8192, 1024) float32 (32 MiB) -> * k -> ReduceSum over rows -> (1024,)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [8192, 1024])
    scale = helper.make_tensor("k", TensorProto.FLOAT, [], [float(k)])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    nodes = [helper.make_node("Expand", ["x", "shape"], ["big"]), helper.make_node("Mul", ["big", "k"], ["scaled"]),
             helper.make_node("ReduceSum", ["scaled", "axes"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, f"segment{k}", [x], [y], [shape, scale, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

backend = get_backend("ort")
executables = [backend.compile(model(k), "cpu:0", threads=1) for k in range(1, 9)]
x = np.ones((1, 1024), np.float32)
def resident():  # bytes in memory now (the arenas keep what they allocated)
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

before = resident()
sums = [float(exe.run({"x": x})[0].sum()) for exe in executables]
print(json.dumps({"grown_mib": (resident() - before) / 2**20, "sums": sums}))
"""


def _run(shared: bool, cache: Path) -> dict:
    # A fresh compile cache: a cached optimized model could hold fewer intermediates than a first compile.
    env = {**os.environ, SHARED_ARENA_ENV: "1" if shared else "0", "GRAPHDIST_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sessions_run_one_after_another_keep_one_intermediate_not_eight(tmp_path: Path) -> None:
    shared, separate = _run(True, tmp_path / "shared"), _run(False, tmp_path / "separate")
    assert shared["sums"] == separate["sums"] == [8192.0 * 1024 * k for k in range(1, 9)]
    assert separate["grown_mib"] > 6 * 64  # every session kept its 64 MiB
    assert shared["grown_mib"] < 2 * 64  # one arena reused: one session's intermediates


@pytest.mark.parametrize(("text", "enabled"), [("", True), ("1", True), ("on", True), ("0", False), ("no", False)])
def test_the_switch(monkeypatch: pytest.MonkeyPatch, text: str, enabled: bool) -> None:
    monkeypatch.setenv(SHARED_ARENA_ENV, text)
    assert shared_arena_enabled() is enabled


def test_a_bad_switch_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARED_ARENA_ENV, "maybe")
    with pytest.raises(InvalidArgumentError, match=SHARED_ARENA_ENV):
        shared_arena_enabled()
