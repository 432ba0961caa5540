"""ZeRO-1 vs unsharded, in one process (Mirrored(2)) and across 2 MPI worker processes: memory and step time.

An MLP of >= 50 M parameters (default 4096-4096-4096-4096-10, 50.4 M) trains
with Adam under ``MirroredStrategy(["cpu:0", "cpu:1"])`` (``cross_device_ops=
gd.NcclAllReduce(shard_optimizer_state=...)``) and under
``MultiWorkerMirroredStrategy(shard_optimizer_state=...)`` in 2 processes
started by ``graphdist launch --workers 2``, each once unsharded and once
sharded. Each variant runs in its own child process(es), so its peak RSS
(``ru_maxrss``) is its own. Reported per variant:

* per-replica optimizer-state bytes, from the plan
  (:func:`graphdist.passes.shard_optimizer_state.state_bytes_per_replica`);
* peak RSS of the process (all replicas of one process: in-process replicas
  share host memory, so this measures the step's transient buffers, not
  N copies of the slots);
* median step time over ``steps`` timed steps after one warm-up step;
* the weights' checksum after the steps (both variants must agree);
* across workers, per worker process: the optimizer-state bytes the process
  stores (its variables' arrays) and its peak RSS, where sharding shows.

Goal: step time of ZeRO-1 within 1.1x of unsharded.

    python -m benchmarks.bench_zero1 [--quick] [--steps N] [--no-workers] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import median_ms, mlp_training, peak_rss_bytes, run_child, update_section, weights_checksum

__all__ = ["NAME", "GOAL", "SIZES", "run", "child", "markdown", "main"]

NAME = "zero1"
#: Target: ZeRO-1 step time / unsharded step time.
GOAL = 1.1
#: Layer sizes of the default model (50.4 M parameters).
SIZES = (4096, 4096, 4096, 4096, 10)
BATCH = 32


def child(zero: bool, sizes: tuple[int, ...], batch: int, steps: int, workers: bool = False) -> dict[str, Any]:
    """Trains in this process and returns its measurements (run in a fresh process for a clean RSS).

    ``workers``: under ``MultiWorkerMirroredStrategy`` (this process is one worker of ``graphdist launch``).
    """
    import graphdist as gd
    from graphdist.passes.shard_optimizer_state import state_bytes_per_replica

    if workers:
        strategy = gd.MultiWorkerMirroredStrategy(shard_optimizer_state=zero)
    else:
        strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"],
                                       cross_device_ops=gd.NcclAllReduce(shard_optimizer_state=zero))
    model, optimizer, train, args = mlp_training(strategy, sizes, batch)
    step_ms = median_ms(lambda: train(*args), steps)
    plan = train.get_concrete_function(*args).plan
    return {"zero": zero, "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "state_bytes_per_replica": state_bytes_per_replica(plan.graph),
            "stored_state_bytes": int(sum(v._stored_nbytes for v in optimizer.variables())),
            "peak_rss_bytes": peak_rss_bytes(),
            "step_ms": step_ms,
            "checksum": weights_checksum(model)}


def _across_workers(zero: bool, sizes: tuple[int, ...], batch: int, steps: int, timeout: float) -> dict[str, Any]:
    """Both workers' measurements (``graphdist launch --workers 2``); the step time is the slower worker's."""
    with tempfile.TemporaryDirectory() as tmp:
        worker = [sys.executable, "-m", "benchmarks.bench_zero1", "--child", "zero" if zero else "plain",
                  "--workers", "--out", tmp, "--sizes", ",".join(map(str, sizes)), "--batch", str(batch),
                  "--steps", str(steps)]
        command = [sys.executable, "-m", "graphdist.cli.main", "launch", "--workers", "2", "--timeout",
                   str(int(timeout)), "--", *worker]
        env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "GRAPHDIST_CONFIG")}
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 60, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"benchmark job {' '.join(command)} failed:\n{done.stderr[-3000:]}")
        ranks = [json.loads((Path(tmp) / f"worker{r}.json").read_text()) for r in range(2)]
    return {**ranks[0], "step_ms": max(r["step_ms"] for r in ranks),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks),
            "stored_state_bytes": max(r["stored_state_bytes"] for r in ranks), "workers": ranks}


def _in_child(zero: bool, sizes: tuple[int, ...], batch: int, steps: int, timeout: float) -> dict[str, Any]:
    return run_child("benchmarks.bench_zero1", ["--child", "zero" if zero else "plain", "--sizes",
                                                 ",".join(map(str, sizes)), "--batch", str(batch), "--steps",
                                                 str(steps)], timeout)


def _compare(plain: dict[str, Any], zero: dict[str, Any]) -> dict[str, Any]:
    return {"plain": plain, "zero": zero,
            "state_ratio": zero["state_bytes_per_replica"] / plain["state_bytes_per_replica"],
            "stored_ratio": zero["stored_state_bytes"] / plain["stored_state_bytes"],
            "rss_ratio": zero["peak_rss_bytes"] / plain["peak_rss_bytes"],
            "step_ratio": zero["step_ms"] / plain["step_ms"],
            "same_weights": bool(np.isclose(zero["checksum"], plain["checksum"], rtol=1e-5)),
            "goal_met": zero["step_ms"] / plain["step_ms"] <= GOAL}


def run(sizes: tuple[int, ...] = SIZES, batch: int = BATCH, steps: int = 5, timeout: float = 900.0,
        workers: bool = True) -> dict[str, Any]:
    """Every variant in child processes; the ratios and the goal check (``workers``: also across 2 workers)."""
    plain, zero = (_in_child(sharded, sizes, batch, steps, timeout) for sharded in (False, True))
    results = {"sizes": list(sizes), "batch": batch, "steps": steps, **_compare(plain, zero)}
    if workers:
        results["workers"] = _compare(_across_workers(False, sizes, batch, steps, timeout),
                                      _across_workers(True, sizes, batch, steps, timeout))
    return results


def _row(label: str, r: dict[str, Any]) -> str:
    return (f"| {label} | {r['state_bytes_per_replica'] / 2**20:,.1f} MiB | {r['stored_state_bytes'] / 2**20:,.1f} MiB"
            f" | {r['peak_rss_bytes'] / 2**20:,.0f} MiB | {r['step_ms']:,.1f} ms |")


def _ratios(r: dict[str, Any]) -> str:
    return (f"state per replica {r['state_ratio']:.3f}, state stored per process {r['stored_ratio']:.3f}, peak RSS "
            f"{r['rss_ratio']:.3f}, step time {r['step_ratio']:.3f} (goal <= {GOAL}: "
            f"{'met' if r['goal_met'] else 'not met'}); same weights after the steps: {r['same_weights']}")


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    rows = [_row("Mirrored(2)", results["plain"]), _row("Mirrored(2), shard_optimizer_state=True", results["zero"])]
    across = results.get("workers")
    if across:
        rows += [_row("MultiWorkerMirrored, 2 workers", across["plain"]),
                 _row("MultiWorkerMirrored, 2 workers, shard_optimizer_state=True", across["zero"])]
    params = results["plain"]["params"]
    lines = [
        "## ZeRO-1: sharded optimizer state", "",
        f"MLP {'-'.join(map(str, results['sizes']))} ({params / 1e6:.1f} M parameters), Adam, global batch "
        f"{results['batch']}; Mirrored on 2 logical CPU devices in one process, and MultiWorkerMirrored in 2 "
        f"processes (`graphdist launch --workers 2`, one device each); median of {results['steps']} steps; each "
        "variant in its own process(es) (`python -m benchmarks.bench_zero1`). Across workers, RSS, stored state and "
        "step time are the larger of the two workers'.", "",
        "| variant | optimizer state per replica (plan) | optimizer state stored per process | peak RSS per process "
        "| step |", "|---|---|---|---|---|", *rows, "",
        f"Ratios in one process (ZeRO-1 / unsharded): {_ratios(results)}.",
        "In one process the replicas share host memory: each slot is stored as one part per replica (each "
        "replica's update reads and writes back its own part), the parts together the whole slot, so the "
        "process stores the slots once and peak RSS shows the step's transient buffers, not N copies of the slots."]
    if across:
        lines += ["", f"Ratios across 2 workers (ZeRO-1 / unsharded): {_ratios(across)}.",
                  "Each worker process stores only its chunk of every Adam slot; the gradient is reduce-scattered "
                  "and the weights all-gathered through MPI."]
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model (not the >= 50 M one)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--sizes", default=None, help="layer sizes, comma-separated")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--no-workers", action="store_true", help="skip the 2-worker (MPI) variants")
    parser.add_argument("--child", choices=("zero", "plain"), help=argparse.SUPPRESS)
    parser.add_argument("--workers", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else ((64, 64, 10) if args.quick else SIZES)
    if args.child and args.workers:
        result = child(args.child == "zero", sizes, args.batch, args.steps, workers=True)
        rank = int(os.environ.get("PMI_RANK", "0"))
        (Path(args.out) / f"worker{rank}.json").write_text(json.dumps(result))
        return
    if args.child:
        print(json.dumps(child(args.child == "zero", sizes, args.batch, args.steps)))
        return
    results = run(sizes, args.batch, args.steps, workers=not args.no_workers)
    text = markdown(results)
    print(text)
    if args.write:
        update_section(NAME, text)


if __name__ == "__main__":
    main()
