"""Training throughput: MultiWorkerMirroredStrategy on 2 worker processes vs 1 worker.

The MLP 784-512-512-10 training step (SGD, global batch 256, synthetic
data) as ``strategy.reduce("SUM", strategy.run(step))`` in one
``gd.function``, under three set-ups on this host:

* **1 worker**: ``MultiWorkerMirroredStrategy`` in one process, one device,
  all cores (no cluster: single-worker mode);
* **2 workers**: ``graphdist launch --workers 2``: two processes, one device
  and an equal share of the cores each (launch's binding), each computing
  half of every global batch; gradients all-reduced through MPI;
* **2 workers, bucketed + overlap**: the same two processes with
  ``communication_options=gd.experimental.CommunicationOptions(bytes_per_pack=BYTES_PER_PACK)``
  and ``GRAPHDIST_OVERLAP=1``: the gradients cross the workers in packs (one
  MPI all-reduce each, the last layer's first) and each worker's backward
  pass is cut at the packs, so a pack's MPI all-reduce runs while the first
  layer's backward pass computes;
* **Mirrored, 1 process**: ``MirroredStrategy(["cpu:0", "cpu:1"])`` for
  reference (the same split between two logical devices of one process).

Each run times ``steps`` steps after a warm-up, in ``blocks`` blocks (median
block); the set-ups alternate for ``repeats`` runs, and the table gives the
best run of each (the least disturbed by other work on a shared machine;
every run is listed too). **speed-up = 1-worker step time / set-up step
time** (same global batch, so it is the throughput ratio).

Waiting for communication per step, on worker 0: "MPI waits" is the time
inside the MPI communicator's waits during the timed steps (fingerprints
and payloads, including waiting for the other worker); then ``wait_steps``
more steps are recorded with :func:`graphdist.runtime.timeline.record` (the
``GRAPHDIST_TRACE`` timeline), giving per step the *exposed communication*
(a collective ran and no device computed) and the timeline's MPI waits
(medians over the recorded steps).

    python -m benchmarks.bench_multi_worker [--repeats N] [--quick] [--bytes-per-pack B] [--write]
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
_PACKED = "2 workers, bucketed + overlap"
SETUPS = ("1 worker", "2 workers", _PACKED, "Mirrored, 1 process")
#: Pack size of the bucketed set-up: the MLP's gradients (last layer first: 40 B, 20 KB, 2 KB, 1 MB, 2 KB,
#: 1.6 MB, and the 4-byte loss sum) make two packs, [loss, b3, W3, b2, W2] (1.07 MB) and [b1, W1] (1.6 MB).
BYTES_PER_PACK = 2 << 20
_REPO = Path(__file__).resolve().parents[1]


def _worker(kind: str, steps: int, blocks: int, out: str, bytes_per_pack: int = BYTES_PER_PACK,
            wait_steps: int = 10) -> None:
    """Trains and times; the chief writes ``{"ms": [per-step ms per block], "mpi_ms": [...], "timeline": {...}}``."""
    import graphdist as gd
    from graphdist.models.mlp import MLP

    if kind == "mirrored":
        strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    elif kind == "multi_worker_bucketed":
        options = gd.experimental.CommunicationOptions(bytes_per_pack=bytes_per_pack)
        strategy = gd.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        strategy = gd.MultiWorkerMirroredStrategy()
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
    recorded = _timeline_waits(lambda: step(*batch), wait_steps)
    if getattr(strategy.extended, "should_checkpoint", True):  # the chief reports
        Path(out).write_text(json.dumps({"ms": ms, "mpi_ms": mpi_ms, "timeline": recorded}))


def _timeline_waits(run_step: Any, steps: int) -> dict[str, float]:
    """Runs ``steps`` recorded steps; medians per step (ms) of the exposed communication and the MPI waits."""
    from graphdist.runtime import timeline

    with timeline.record() as recorded:
        for _ in range(steps):
            run_step()

    def total(events: list[Any], name: str) -> float:
        return sum(e.duration for e in events if e.cat == "wait" and e.name == name) * 1e3

    return {"exposed_ms": median([total(events, "waiting for communication") for events in recorded]),
            "mpi_wait_ms": median([total(events, "MPI wait") for events in recorded]),
            "collective_ms": median([sum(e.duration for e in events if e.cat == "collective") * 1e3
                                     for events in recorded])}


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


def _run_once(setup: str, steps: int, blocks: int, bytes_per_pack: int = BYTES_PER_PACK,
              wait_steps: int = 10) -> tuple[float, float, dict[str, float]]:
    """One run of a set-up: (median ms per step, MPI wait ms per step, timeline waits per step)."""
    env = dict(os.environ, PYTHONPATH=str(_REPO), GRAPHDIST_OVERLAP="1" if setup == _PACKED else "0")
    env.pop("TF_CONFIG", None)
    env.pop("GRAPHDIST_CONFIG", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        worker = [sys.executable, "-m", "benchmarks.bench_multi_worker", "--worker", "--steps", str(steps),
                  "--blocks", str(blocks), "--out", str(out), "--bytes-per-pack", str(bytes_per_pack),
                  "--wait-steps", str(wait_steps)]
        if setup in ("2 workers", _PACKED):
            kind = "multi_worker_bucketed" if setup == _PACKED else "multi_worker"
            command = [sys.executable, "-m", "graphdist.cli.main", "launch", "--workers", "2", "--timeout", "120",
                       "--", *worker, "--kind", kind]
        else:
            command = [*worker, "--kind", "mirrored" if setup.startswith("Mirrored") else "multi_worker"]
        subprocess.run(command, check=True, timeout=900, env=env, cwd=_REPO)
        result = json.loads(out.read_text())
        return median(result["ms"]), median(result["mpi_ms"]), result["timeline"]


def run(repeats: int | None = None, quick: bool = False, wait_s: float | None = None,
        bytes_per_pack: int = BYTES_PER_PACK) -> dict[str, Any]:
    """Alternates the set-ups ``repeats`` times (waiting up to ``wait_s`` for a quiet machine before each run).

    Returns:
        ``{"name", "machine", "repeats", "steps", "bytes_per_pack", "ms" (set-up -> best run's ms per
        step), "mpi_ms" (its MPI waits per step), "timeline" (its exposed communication, MPI waits and
        collectives per step from the timeline), "median_ms", "runs" (set-up -> every run's ms),
        "speedup" (set-up -> 1-worker ms / its ms, best runs), "loadavg"}``. The best run is the one
        least disturbed by other work on a shared machine.
    """
    info = machine_info()
    repeats = repeats or (1 if quick else 5)
    steps, blocks = (10, 2) if quick else (60, 6)
    wait_steps = 3 if quick else 20
    runs: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    mpi: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    waits: dict[str, list[dict[str, float]]] = {setup: [] for setup in SETUPS}
    meter = CpuMeter()
    load_before = loadavg(2)
    for index in range(repeats):
        order = SETUPS if index % 2 == 0 else SETUPS[::-1]
        for setup in order:
            wait_quiet(meter, timeout=wait_s if wait_s is not None else (30 if quick else 120))
            step_ms, mpi_ms, recorded = _run_once(setup, steps, blocks, bytes_per_pack, wait_steps)
            runs[setup].append(step_ms)
            mpi[setup].append(mpi_ms)
            waits[setup].append(recorded)
            logger.info("%s: %.2f ms/step", setup, runs[setup][-1])
    best = {setup: int(np.argmin(values)) for setup, values in runs.items()}
    ms = {setup: runs[setup][best[setup]] for setup in SETUPS}
    mpi_ms = {setup: mpi[setup][best[setup]] for setup in SETUPS}
    recorded = {setup: waits[setup][best[setup]] for setup in SETUPS}
    speedup = {setup: ms["1 worker"] / value for setup, value in ms.items()}
    return {"name": NAME, "machine": info, "repeats": repeats, "steps": steps, "bytes_per_pack": bytes_per_pack,
            "ms": ms, "runs": runs, "mpi_ms": mpi_ms, "timeline": recorded,
            "median_ms": {setup: median(values) for setup, values in runs.items()}, "speedup": speedup,
            "wait_steps": wait_steps, "loadavg": [load_before, loadavg(2)]}


def table(results: dict[str, Any]) -> str:
    """A plain-text table of :func:`run`'s results."""
    lines = [f"{'set-up':31} {'ms/step':>9} {'examples/s':>11} {'speed-up':>9} {'MPI waits':>10} "
             f"{'exposed comm (timeline)':>24} {'MPI waits (timeline)':>21}"]
    for setup in SETUPS:
        ms, recorded = results["ms"][setup], results["timeline"][setup]
        lines.append(f"{setup:31} {ms:>9.2f} {GLOBAL_BATCH / ms * 1e3:>11.0f} {results['speedup'][setup]:>9.2f} "
                     f"{results['mpi_ms'][setup]:>10.2f} {recorded['exposed_ms']:>24.2f} "
                     f"{recorded['mpi_wait_ms']:>21.2f}")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    rows = ["| set-up | ms / step | of which in MPI waits | exposed communication / step (timeline) | "
            "MPI waits / step (timeline) | examples / s | speed-up vs 1 worker | every run (ms) |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for setup in SETUPS:
        ms, recorded = results["ms"][setup], results["timeline"][setup]
        runs = ", ".join(f"{v:.2f}" for v in results["runs"][setup])
        workers = setup in ("2 workers", _PACKED)
        waits = f"{results['mpi_ms'][setup]:.2f}" if workers else "-"
        timeline_mpi = f"{recorded['mpi_wait_ms']:.2f}" if workers else "-"
        rows.append(f"| {setup} | {ms:.2f} | {waits} | {recorded['exposed_ms']:.2f} | {timeline_mpi} | "
                    f"{GLOBAL_BATCH / ms * 1e3:,.0f} | {results['speedup'][setup]:.2f}x | {runs} |")
    return f"""## Multi-worker training throughput: 2 worker processes vs 1

MLP 784-512-512-10 training step (SGD, global batch {GLOBAL_BATCH}, synthetic data) under
`MultiWorkerMirroredStrategy`: one worker process (single-worker mode, all cores) vs two worker
processes started by `graphdist launch --workers 2` (one device and one equal share of the cores
each; every step all-reduces the gradients, 2.7 MB, through MPI), the same two processes with the
gradients packed into buckets of at most {results['bytes_per_pack']:,} bytes
(`communication_options=gd.experimental.CommunicationOptions(bytes_per_pack=...)`, one MPI all-reduce
per pack) and the backward pass cut at the packs (`GRAPHDIST_OVERLAP=1`), and `MirroredStrategy` on two
logical devices of one process for reference. Best of {results['repeats']} alternating runs of
{results['steps']} timed steps each (median block; the best run is the least disturbed by other work
on this shared machine, every run is listed); speed-up = 1-worker step time / step time.
Measured {results['machine']['date']}; load average before/after: {results['loadavg'][0]} /
{results['loadavg'][1]}.

{chr(10).join(rows)}

On a 2-core host both set-ups use both cores, so this measures the cost of splitting the step
across processes, not added hardware. "MPI waits" is worker 0's time inside the communicator per
step (fingerprints and all-reduces, including waiting for the other worker); the timeline columns
come from {results.get('wait_steps', 20)} more steps recorded with `graphdist.runtime.timeline`
(medians per step): "exposed communication" is the time a collective ran while no device of the
worker computed (what overlap hides), "MPI waits" the time in MPI requests. The rest of the
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
    parser.add_argument("--bytes-per-pack", type=int, default=BYTES_PER_PACK,
                        help=f"pack size of the bucketed set-up (default {BYTES_PER_PACK})")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--wait-steps", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.kind, args.steps, args.blocks, args.out, args.bytes_per_pack, args.wait_steps)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    results = run(args.repeats, args.quick, bytes_per_pack=args.bytes_per_pack)
    print(table(results))
    if args.write:
        write_section(NAME, markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
