"""Training throughput: MultiWorkerMirroredStrategy on 2 worker processes vs 1 worker.

The MLP 784-512-512-10 training step (SGD, global batch 256, synthetic
data) as ``strategy.reduce("SUM", strategy.run(step))`` in one
``gd.function``, under three set-ups on this host:

* **1 worker**: ``MultiWorkerMirroredStrategy`` in one process, one device,
  all cores (no cluster: single-worker mode);
* **2 workers**: ``graphdist launch --workers 2``: two processes, one device
  and an equal share of the cores each (launch's binding), each computing
  half of every global batch; gradients all-reduced through MPI;
* **Mirrored, 1 process**: ``MirroredStrategy(["cpu:0", "cpu:1"])`` for
  reference (the same split between two logical devices of one process).

Each run times ``steps`` steps after a warm-up, in ``blocks`` blocks (median
block); the set-ups alternate for ``repeats`` runs, and the table gives the
best run of each (the least disturbed by other work on a shared machine;
every run is listed too). **speed-up = 1-worker step time / set-up step
time** (same global batch, so it is the throughput ratio).

    python -m benchmarks.bench_multi_worker [--repeats N] [--quick] [--write]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import machine_info, median
from benchmarks.bench_mpi_allreduce import write_section
from benchmarks.quiet import CpuMeter, loadavg, wait_quiet

__all__ = ["NAME", "SETUPS", "run", "table", "markdown", "main"]

logger = logging.getLogger(__name__)

NAME = "multi_worker"
SIZES = (784, 512, 512, 10)
GLOBAL_BATCH = 256
SETUPS = ("1 worker", "2 workers", "Mirrored, 1 process")
_REPO = Path(__file__).resolve().parents[1]


def _worker(kind: str, steps: int, blocks: int, out: str) -> None:
    """Trains and times; the chief writes ``{"ms": [per-step ms per block]}``."""
    import graphdist as gd
    from graphdist.models.mlp import MLP

    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"]) if kind == "mirrored" else gd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = MLP(SIZES, seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.01)
    train_step = model.make_train_step(optimizer, global_batch_size=GLOBAL_BATCH)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(train_step, args=(x, labels)), axis=None)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((GLOBAL_BATCH, SIZES[0]), dtype=np.float32)
    labels = rng.integers(0, SIZES[-1], GLOBAL_BATCH).astype(np.int64)
    (batch,) = list(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels))))
    waited = _meter_mpi_waits(getattr(strategy, "communicator", None))
    for _ in range(5):
        step(*batch)
    per_block = max(1, steps // blocks)
    ms, mpi_ms = [], []
    for _ in range(blocks):
        waited[0] = 0.0
        start = time.perf_counter()
        for _ in range(per_block):
            loss = step(*batch)
        ms.append((time.perf_counter() - start) / per_block * 1e3)
        mpi_ms.append(waited[0] / per_block * 1e3)
    if not np.isfinite(loss):
        raise SystemExit("the loss is not finite")
    if getattr(strategy.extended, "should_checkpoint", True):  # the chief reports
        Path(out).write_text(json.dumps({"ms": ms, "mpi_ms": mpi_ms}))


def _meter_mpi_waits(communicator: Any) -> list[float]:
    """Wraps the communicator's waits to add their seconds to the returned one-element list."""
    total = [0.0]
    if communicator is None:
        return total
    wait = communicator._wait

    def timed_wait(*args: Any) -> None:
        start = time.perf_counter()
        try:
            wait(*args)
        finally:
            total[0] += time.perf_counter() - start

    communicator._wait = timed_wait
    return total


def _run_once(setup: str, steps: int, blocks: int) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=str(_REPO))
    env.pop("TF_CONFIG", None)
    env.pop("GRAPHDIST_CONFIG", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        worker = [sys.executable, "-m", "benchmarks.bench_multi_worker", "--worker", "--steps", str(steps),
                  "--blocks", str(blocks), "--out", str(out)]
        if setup == "2 workers":
            command = [sys.executable, "-m", "graphdist.cli.main", "launch", "--workers", "2", "--timeout", "120",
                       "--", *worker, "--kind", "multi_worker"]
        else:
            command = [*worker, "--kind", "mirrored" if setup.startswith("Mirrored") else "multi_worker"]
        subprocess.run(command, check=True, timeout=900, env=env, cwd=_REPO)
        result = json.loads(out.read_text())
        return median(result["ms"]), median(result["mpi_ms"])


def run(repeats: int | None = None, quick: bool = False, wait_s: float | None = None) -> dict[str, Any]:
    """Alternates the set-ups ``repeats`` times (waiting up to ``wait_s`` for a quiet machine before each run).

    Returns:
        ``{"name", "machine", "repeats", "steps", "ms" (set-up -> best run's ms per step),
        "median_ms", "runs" (set-up -> every run's ms), "speedup" (set-up -> 1-worker ms / its ms,
        best runs), "loadavg"}``. The best run is the one least disturbed by other work on a
        shared machine.
    """
    info = machine_info()
    repeats = repeats or (1 if quick else 5)
    steps, blocks = (10, 2) if quick else (60, 6)
    runs: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    mpi: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    meter = CpuMeter()
    load_before = loadavg(2)
    for index in range(repeats):
        order = SETUPS if index % 2 == 0 else SETUPS[::-1]
        for setup in order:
            wait_quiet(meter, timeout=wait_s if wait_s is not None else (30 if quick else 120))
            step_ms, mpi_ms = _run_once(setup, steps, blocks)
            runs[setup].append(step_ms)
            mpi[setup].append(mpi_ms)
            logger.info("%s: %.2f ms/step", setup, runs[setup][-1])
    best = {setup: int(np.argmin(values)) for setup, values in runs.items()}
    ms = {setup: runs[setup][best[setup]] for setup in SETUPS}
    mpi_ms = {setup: mpi[setup][best[setup]] for setup in SETUPS}
    speedup = {setup: ms["1 worker"] / value for setup, value in ms.items()}
    return {"name": NAME, "machine": info, "repeats": repeats, "steps": steps, "ms": ms, "runs": runs, "mpi_ms": mpi_ms,
            "median_ms": {setup: median(values) for setup, values in runs.items()}, "speedup": speedup,
            "loadavg": [load_before, loadavg(2)]}


def table(results: dict[str, Any]) -> str:
    """A plain-text table of :func:`run`'s results."""
    lines = [f"{'set-up':22} {'ms/step':>9} {'examples/s':>11} {'speed-up':>9}"]
    for setup in SETUPS:
        ms = results["ms"][setup]
        lines.append(f"{setup:22} {ms:>9.2f} {GLOBAL_BATCH / ms * 1e3:>11.0f} {results['speedup'][setup]:>9.2f}")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    rows = ["| set-up | ms / step | of which in MPI waits | examples / s | speed-up vs 1 worker | every run (ms) |",
            "|---|---:|---:|---:|---:|---|"]
    for setup in SETUPS:
        ms = results["ms"][setup]
        runs = ", ".join(f"{v:.2f}" for v in results["runs"][setup])
        waits = f"{results['mpi_ms'][setup]:.2f}" if setup == "2 workers" else "-"
        rows.append(f"| {setup} | {ms:.2f} | {waits} | {GLOBAL_BATCH / ms * 1e3:,.0f} | "
                    f"{results['speedup'][setup]:.2f}x | {runs} |")
    return f"""## Multi-worker training throughput: 2 worker processes vs 1

MLP 784-512-512-10 training step (SGD, global batch {GLOBAL_BATCH}, synthetic data) under
`MultiWorkerMirroredStrategy`: one worker process (single-worker mode, all cores) vs two worker
processes started by `graphdist launch --workers 2` (one device and one equal share of the cores
each; every step all-reduces the gradients, 2.7 MB, through MPI), and `MirroredStrategy` on two
logical devices of one process for reference. Best of {results['repeats']} alternating runs of
{results['steps']} timed steps each (median block; the best run is the least disturbed by other work
on this shared machine, every run is listed); speed-up = 1-worker step time / step time.
Measured {results['machine']['date']}; load average before/after: {results['loadavg'][0]} /
{results['loadavg'][1]}.

{chr(10).join(rows)}

On a 2-core host both set-ups use both cores, so this measures the cost of splitting the step
across processes, not added hardware. "MPI waits" is worker 0's time inside the communicator per
step (fingerprints and all-reduces, including waiting for the other worker); the rest of the
2-worker step is each worker's half batch on one core, which ONNX Runtime computes less
efficiently than the whole batch on two cores. Reproduce:
`python -m benchmarks.bench_multi_worker --write`.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: measure, print, optionally update BENCHMARKS.md (``--worker``: one process)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_multi_worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="multi_worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=60, help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, default=6, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.kind, args.steps, args.blocks, args.out)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    results = run(args.repeats, args.quick)
    print(table(results))
    if args.write:
        write_section(NAME, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
