"""ZeRO-1 (``gd.NcclAllReduce(shard_optimizer_state=True)``) vs unsharded Mirrored(2): memory and step time.

An MLP of >= 50 M parameters (default 4096-4096-4096-4096-10, 50.4 M) trains
with Adam under ``MirroredStrategy(["cpu:0", "cpu:1"])``, once unsharded and
once with the optimizer state sharded. Each variant runs in its own child
process, so its peak RSS (``ru_maxrss``) is its own. Reported per variant:

* per-replica optimizer-state bytes, from the plan
  (:func:`graphdist.passes.shard_optimizer_state.state_bytes_per_replica`);
* peak RSS of the process (all replicas of one process: in-process replicas
  share host memory, so this measures the step's transient buffers, not
  N copies of the slots);
* median step time over ``steps`` timed steps after one warm-up step;
* the weights' checksum after the steps (both variants must agree).

Goal: step time of ZeRO-1 within 1.1x of unsharded.

    python -m benchmarks.bench_zero1 [--quick] [--steps N] [--write]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from benchmarks import median_ms, peak_rss_bytes, run_child, update_section

__all__ = ["NAME", "GOAL", "SIZES", "run", "child", "markdown", "main"]

NAME = "zero1"
#: Target: ZeRO-1 step time / unsharded step time.
GOAL = 1.1
#: Layer sizes of the default model (50.4 M parameters).
SIZES = (4096, 4096, 4096, 4096, 10)
BATCH = 32


def child(zero: bool, sizes: tuple[int, ...], batch: int, steps: int) -> dict[str, Any]:
    """Trains in this process and returns its measurements (run in a fresh process for a clean RSS)."""
    import graphdist as gd
    from graphdist.models.mlp import MLP
    from graphdist.passes.shard_optimizer_state import state_bytes_per_replica

    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"],
                                   cross_device_ops=gd.NcclAllReduce(shard_optimizer_state=zero))
    with strategy.scope():
        model = MLP(sizes, seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(1e-4)
    replica_step = model.make_train_step(optimizer, batch)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    dataset = gd.data.Dataset.from_tensors((x, labels))
    args = next(iter(strategy.experimental_distribute_dataset(dataset)))
    train(*args)  # compiles, and the first step
    step_ms = median_ms(lambda: train(*args), steps)
    plan = train.get_concrete_function(*args).plan
    return {"zero": zero, "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "state_bytes_per_replica": state_bytes_per_replica(plan.graph),
            "peak_rss_bytes": peak_rss_bytes(),
            "step_ms": step_ms,
            "checksum": float(sum(np.abs(v.numpy()).sum(dtype=np.float64) for v in model.trainable_variables))}


def _in_child(zero: bool, sizes: tuple[int, ...], batch: int, steps: int, timeout: float) -> dict[str, Any]:
    return run_child("benchmarks.bench_zero1", ["--child", "zero" if zero else "plain", "--sizes",
                                                 ",".join(map(str, sizes)), "--batch", str(batch), "--steps",
                                                 str(steps)], timeout)


def run(sizes: tuple[int, ...] = SIZES, batch: int = BATCH, steps: int = 5, timeout: float = 900.0) -> dict[str, Any]:
    """Both variants, each in a child process; the ratios and the goal check."""
    plain = _in_child(False, sizes, batch, steps, timeout)
    zero = _in_child(True, sizes, batch, steps, timeout)
    return {"sizes": list(sizes), "batch": batch, "steps": steps, "plain": plain, "zero": zero,
            "state_ratio": zero["state_bytes_per_replica"] / plain["state_bytes_per_replica"],
            "rss_ratio": zero["peak_rss_bytes"] / plain["peak_rss_bytes"],
            "step_ratio": zero["step_ms"] / plain["step_ms"],
            "same_weights": bool(np.isclose(zero["checksum"], plain["checksum"], rtol=1e-5)),
            "goal_met": zero["step_ms"] / plain["step_ms"] <= GOAL}


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    rows = []
    for label, key in (("Mirrored(2)", "plain"), ("Mirrored(2), shard_optimizer_state=True", "zero")):
        r = results[key]
        rows.append(f"| {label} | {r['state_bytes_per_replica'] / 2**20:,.1f} MiB | "
                    f"{r['peak_rss_bytes'] / 2**20:,.0f} MiB | {r['step_ms']:,.1f} ms |")
    params = results["plain"]["params"]
    return "\n".join([
        "## ZeRO-1: sharded optimizer state", "",
        f"MLP {'-'.join(map(str, results['sizes']))} ({params / 1e6:.1f} M parameters), Adam, global batch "
        f"{results['batch']}, 2 logical CPU devices; median of {results['steps']} steps; each variant in its own "
        "process (`python -m benchmarks.bench_zero1`).", "",
        "| variant | optimizer state per replica (plan) | peak RSS | step |", "|---|---|---|---|", *rows, "",
        f"Ratios (ZeRO-1 / unsharded): state per replica {results['state_ratio']:.3f}, peak RSS "
        f"{results['rss_ratio']:.3f}, step time {results['step_ratio']:.3f} (goal <= {GOAL}: "
        f"{'met' if results['goal_met'] else 'not met'}); same weights after the steps: {results['same_weights']}.",
        "In one process the replicas share host memory and each variable is one host array, so peak RSS shows "
        "the step's transient buffers, not N copies of the slots.", ""])


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model (not the >= 50 M one)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--sizes", default=None, help="layer sizes, comma-separated")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--child", choices=("zero", "plain"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else ((64, 64, 10) if args.quick else SIZES)
    if args.child:
        print(json.dumps(child(args.child == "zero", sizes, args.batch, args.steps)))
        return
    results = run(sizes, args.batch, args.steps)
    text = markdown(results)
    print(text)
    if args.write:
        update_section(NAME, text)


if __name__ == "__main__":
    main()
