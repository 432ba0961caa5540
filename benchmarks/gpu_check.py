"""``make gpu-check``: does graphdist run on an NVIDIA GPU, and agree with the CPU there?

On a machine whose CUDA driver reports a GPU, in under 5 minutes, each check
against the same computation on the host (``cpu:0``, ONNX Runtime):

1. ONNX Runtime's CUDA provider, ``OneDeviceStrategy("cuda:0")``: the MLP's
   forward pass (784-512-512-10, batch 256);
2. ONNX Runtime, ``MirroredStrategy(["cuda:0", "cpu:0"])``: one training step
   with one replica on the GPU and one on the host (an all-reduce between
   them), against ``MirroredStrategy(["cpu:0", "cpu:1"])`` on the same global
   batch;
3. the tvm backend's CUDA module, ``OneDeviceStrategy("cuda:0")``: the forward
   pass, compiled by TVM for the GPU (dlight's default schedules);
4. one training step (SGD) on ``cuda:0`` against the same step on ``cpu:0``:
   the loss and every updated weight.

Soft device placement is turned off, so a strategy naming ``cuda:0`` fails
instead of running on the host, and ONNX Runtime's backend refuses to start
without its CUDA provider: a check that passes ran on the GPU. It prints a
Markdown table for the README (check, devices, backend, largest difference
from the host, tolerance, compile and step times, result) and exits 1 when a
check fails.

Without a GPU it prints one line saying it skipped, and exits 0.
``--stand-in cpu:1`` runs the same checks with ``cpu:1`` in the GPU's place
(the tvm check then builds for the host): it exercises this script on a
machine without a GPU, and its table says so; it proves nothing about GPUs.

    python -m benchmarks.gpu_check [--output FILE.json] [--stand-in cpu:1] [--sizes 784,512,512,10]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SKIP_LINE", "BUDGET_S", "run", "markdown", "main"]

#: Printed (alone) where the CUDA driver reports no GPU.
SKIP_LINE = ("gpu-check: skipped: no NVIDIA GPU on this machine (the CUDA driver reports none); run "
             "`make gpu-check` where one is present")
#: The checks stop starting new work after this many seconds (the whole run stays under 5 minutes).
BUDGET_S = 240.0
SIZES = (784, 512, 512, 10)
BATCH = 256
RTOL, ATOL = 2e-3, 2e-4  # GPU float32 (TF32 matmuls on recent GPUs) against the host's float32


def _max_diff(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _close(pairs: Sequence[tuple[Any, Any]]) -> tuple[bool, float]:
    import numpy as np

    ok = all(np.allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL) for a, b in pairs)
    return ok, max((_max_diff(a, b) for a, b in pairs), default=0.0)


def _timed(call: Callable[[], Any], repeats: int = 5) -> tuple[Any, float, float]:
    """``(first result, first call s, median of the next calls in ms)``."""
    start = time.perf_counter()
    first = call()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return first, compile_s, statistics.median(times) * 1e3


def _forward(gd: Any, strategy: Any, sizes: Sequence[int], backend: str | None) -> tuple[Any, float, float]:
    from graphdist.models.mlp import MLP

    model = MLP(sizes, seed=0)
    (x,) = model.example_inputs(batch=BATCH, seed=1)

    @gd.function(backend=backend)
    def forward(x: Any) -> Any:
        return strategy.run(model.forward, args=(x,))

    with strategy.scope():
        return _timed(lambda: strategy.experimental_local_results(forward(x))[0])


def _train(gd: Any, strategy: Any, sizes: Sequence[int]) -> tuple[tuple[Any, list[Any]], float, float]:
    """One SGD step of the MLP under ``strategy`` (fresh weights): the loss, the updated weights, and times
    (the step runs again for the step time, on copies of the weights that are then thrown away).
    """
    from graphdist.models.common import distributed_step
    from graphdist.models.mlp import MLP

    with strategy.scope():
        model = MLP(sizes, seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    (x,) = model.example_inputs(batch=BATCH, seed=1)
    import numpy as np

    labels = np.random.default_rng(1).integers(0, sizes[-1], BATCH)
    step, args = distributed_step(strategy, model.make_train_step(optimizer), x, labels, "gpu_check_step")
    start = time.perf_counter()
    loss = float(np.asarray(step(*args)))
    compile_s = time.perf_counter() - start
    weights = [np.array(v.numpy()) for v in model.trainable_variables]
    times = []
    for _ in range(3):
        begin = time.perf_counter()
        step(*args)
        times.append(time.perf_counter() - begin)
    return (loss, weights), compile_s, statistics.median(times) * 1e3


def run(device: str = "cuda:0", sizes: Sequence[int] = SIZES, budget_s: float = BUDGET_S) -> dict[str, Any]:
    """Runs the four checks with ``device`` as the GPU (``cpu:1``: a stand-in, see the module docstring).

    Returns:
        ``{"device", "stand_in", "rows": [...], "passed"}``; a row: check, devices, backend, max_diff,
        compile_s, step_ms, status (``pass``, ``FAIL``, ``error: ...`` or ``skipped: ...``).
    """
    import graphdist as gd

    soft = gd.config.get_soft_device_placement()
    gd.config.set_soft_device_placement(False)  # a missing GPU is an error, never a silent CPU run
    try:
        return _run_checks(gd, device, sizes, budget_s)
    finally:
        gd.config.set_soft_device_placement(soft)


def _run_checks(gd: Any, device: str, sizes: Sequence[int], budget_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    host = "cpu:0"
    stand_in = not device.startswith("cuda")
    rows: list[dict[str, Any]] = []

    def check(name: str, devices: str, backend: str, body: Callable[[], tuple[bool, float, float, float]]) -> None:
        row: dict[str, Any] = {"check": name, "devices": devices, "backend": backend, "max_diff": None,
                               "compile_s": None, "step_ms": None}
        if time.perf_counter() - started > budget_s:
            row["status"] = f"skipped: the {budget_s:.0f} s budget was spent"
        else:
            try:
                ok, diff, compile_s, step_ms = body()
                row.update(max_diff=diff, compile_s=compile_s, step_ms=step_ms, status="pass" if ok else "FAIL")
            except Exception as err:  # noqa: BLE001 - a failing check is a row of the report, not a crash
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                row["status"] = f"error: {type(err).__name__}: {first[:300]}"
        rows.append(row)
        print(f"gpu-check: {name} on {devices} ({backend}): {row['status']}", flush=True)

    reference_forward, _, _ = _forward(gd, gd.OneDeviceStrategy(host), sizes, "ort")

    def ort_one_device() -> tuple[bool, float, float, float]:
        out, compile_s, step_ms = _forward(gd, gd.OneDeviceStrategy(device), sizes, "ort")
        return (*_close([(out, reference_forward)]), compile_s, step_ms)

    def ort_mirrored() -> tuple[bool, float, float, float]:
        (loss, weights), compile_s, step_ms = _train(gd, gd.MirroredStrategy([device, host]), sizes)
        (ref_loss, ref_weights), _, _ = _train(gd, gd.MirroredStrategy([host, "cpu:1"]), sizes)
        return (*_close([(loss, ref_loss), *zip(weights, ref_weights)]), compile_s, step_ms)

    def tvm_module() -> tuple[bool, float, float, float]:
        out, compile_s, step_ms = _forward(gd, gd.OneDeviceStrategy(device), sizes, "tvm")
        return (*_close([(out, reference_forward)]), compile_s, step_ms)

    def train_step() -> tuple[bool, float, float, float]:
        (loss, weights), compile_s, step_ms = _train(gd, gd.OneDeviceStrategy(device), sizes)
        (ref_loss, ref_weights), _, _ = _train(gd, gd.OneDeviceStrategy(host), sizes)
        return (*_close([(loss, ref_loss), *zip(weights, ref_weights)]), compile_s, step_ms)

    check("forward, ORT CUDA provider, OneDevice", device, "ort", ort_one_device)
    check("training step, Mirrored (GPU + host)", f"{device} + {host}", "ort", ort_mirrored)
    check("forward, tvm CUDA module, OneDevice", device, "tvm", tvm_module)
    check("training step vs the host", device, "ort", train_step)
    return {"device": device, "stand_in": stand_in, "sizes": list(sizes), "batch": BATCH, "rows": rows,
            "seconds": time.perf_counter() - started, "passed": all(r["status"] == "pass" for r in rows),
            "host": platform.node(), "gpu": _gpu_name() if not stand_in else None}


def _gpu_name() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def markdown(results: dict[str, Any]) -> str:
    """The table for the README."""
    def fmt(value: Any, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    where = (f"stand-in: {results['device']} in the GPU's place (no GPU here; proves nothing about GPUs)"
             if results["stand_in"] else f"GPU: {results.get('gpu') or results['device']}")
    lines = [f"`make gpu-check`, {where}; MLP {'-'.join(map(str, results['sizes']))}, batch {results['batch']}; "
             f"against cpu:0 (ONNX Runtime), tolerance rtol {RTOL} / atol {ATOL}; {results['seconds']:.0f} s in all.",
             "", "| check | devices | backend | max abs diff vs host | first call s | step ms | result |",
             "|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        lines.append(f"| {row['check']} | {row['devices']} | {row['backend']} | {fmt(row['max_diff'], '.2e')} | "
                     f"{fmt(row['compile_s'], '.2f')} | {fmt(row['step_ms'], '.2f')} | {row['status']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the checks (or prints :data:`SKIP_LINE` without a GPU); 0 when every check passed or skipped."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--stand-in", metavar="DEVICE", help="without a GPU: run the checks on this CPU device "
                        "(e.g. cpu:1) to exercise the script")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="MLP layer sizes (default %(default)s)")
    parser.add_argument("--output", type=Path, help="save the results as JSON here")
    args = parser.parse_args(argv)
    from graphdist.runtime.devices import num_gpus

    gpus = num_gpus()
    if gpus == 0 and not args.stand_in:
        print(SKIP_LINE)
        return 0
    device = "cuda:0" if gpus else args.stand_in
    results = run(device, tuple(int(s) for s in args.sizes.split(",")))
    text = markdown(results)
    print()
    print(text)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
