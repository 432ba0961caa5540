"""Gradient accumulation (``gd.function(step, accumulate_steps=k)``): peak memory and step time.

An MLP (default 784-2048-2048-10, 5.8 M parameters) trains with SGD on one
device (``OneDeviceStrategy("cpu:0")``) on a batch of ``batch`` rows, three
ways, each in its own child process so that its peak RSS (``ru_maxrss``) is
its own:

* **whole batch**: one pass over the ``batch`` rows per step;
* **accumulated**: ``accumulate_steps=k``, ``k`` micro-batches of
  ``batch / k`` rows per step, one update (the same update: the weights after
  the steps are compared);
* **micro-batch alone**: a step on ``batch / k`` rows, the floor an
  accumulated step could reach (its activations are one micro-batch's).

Reported per variant: peak RSS, median step time over ``steps`` timed steps
after one warm-up step, and the largest weight difference to the whole
batch.

    python -m benchmarks.bench_accumulate [--quick] [--steps N] [--write]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from benchmarks import median_ms, peak_rss_bytes, run_child, update_section

__all__ = ["NAME", "SIZES", "run", "child", "markdown", "main"]

NAME = "accumulate"
#: Layer sizes of the default model.
SIZES = (784, 2048, 2048, 10)
BATCH = 8192
STEPS = 8


def child(accumulate: int, rows: int, sizes: tuple[int, ...], steps: int) -> dict[str, Any]:
    """Trains in this process on ``rows`` rows per step with ``accumulate`` micro-batches; its measurements."""
    import graphdist as gd
    from graphdist.models.mlp import MLP

    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = MLP(sizes, seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.01)
    replica_step = model.make_train_step(optimizer)

    @gd.function(accumulate_steps=accumulate)
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], rows)
    train(x, labels)  # compiles, and the first step
    return {"accumulate": accumulate, "rows": rows, "step_ms": median_ms(lambda: train(x, labels), steps),
            "peak_rss_bytes": peak_rss_bytes(),
            "weights": [v.numpy().ravel()[:: max(1, v.numpy().size // 64)].tolist() for v in model.trainable_variables]}


def _in_child(accumulate: int, rows: int, sizes: tuple[int, ...], steps: int, timeout: float) -> dict[str, Any]:
    return run_child("benchmarks.bench_accumulate", ["--child", str(accumulate), "--rows", str(rows), "--sizes",
                                                     ",".join(map(str, sizes)), "--steps", str(steps)], timeout)


def run(sizes: tuple[int, ...] = SIZES, batch: int = BATCH, k: int = STEPS, steps: int = 3,
        timeout: float = 900.0) -> dict[str, Any]:
    """The three variants, each in a child process; ratios to the whole batch."""
    whole = _in_child(1, batch, sizes, steps, timeout)
    accumulated = _in_child(k, batch, sizes, steps, timeout)
    alone = _in_child(1, batch // k, sizes, steps, timeout)
    difference = max(float(np.abs(np.subtract(a, b)).max())
                     for a, b in zip(accumulated.pop("weights"), whole.pop("weights")))
    alone.pop("weights")
    return {"sizes": list(sizes), "batch": batch, "k": k, "steps": steps, "whole": whole,
            "accumulated": accumulated, "alone": alone, "weight_difference": difference,
            "rss_ratio": accumulated["peak_rss_bytes"] / whole["peak_rss_bytes"],
            "step_ratio": accumulated["step_ms"] / whole["step_ms"]}


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    batch, k = results["batch"], results["k"]
    rows = []
    for label, key in ((f"whole batch ({batch} rows)", "whole"),
                       (f"accumulate_steps={k} ({k} x {batch // k} rows)", "accumulated"),
                       (f"micro-batch alone ({batch // k} rows, for reference)", "alone")):
        r = results[key]
        rows.append(f"| {label} | {r['peak_rss_bytes'] / 2**20:,.0f} MiB | {r['step_ms']:,.1f} ms |")
    return "\n".join([
        "## Gradient accumulation: memory and step time", "",
        f"MLP {'-'.join(map(str, results['sizes']))}, SGD, `OneDeviceStrategy(\"cpu:0\")`, ONNX Runtime; median "
        f"of {results['steps']} steps after a warm-up; each variant in its own process "
        "(`python -m benchmarks.bench_accumulate`).", "",
        "| variant | peak RSS | step |", "|---|---|---|", *rows, "",
        f"Accumulated / whole batch: peak RSS {results['rss_ratio']:.3f}, step time {results['step_ratio']:.3f}; "
        f"largest weight difference after the steps {results['weight_difference']:.1e}.",
        "The micro-batches run in one ONNX Runtime session per device, one after the other in the graph's order, "
        "with ONNX Runtime's memory pattern off for that session (it would allocate one block holding every "
        "micro-batch's tensors); the gradients' running sums and the batch itself stay in memory throughout, "
        "so the peak stays above one micro-batch's alone.", ""])


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model and batch")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else ((32, 16, 4) if args.quick else SIZES)
    if args.child:
        print(json.dumps(child(args.child, args.rows, sizes, args.steps)))
        return
    results = run(sizes, 64 if args.quick else BATCH, 4 if args.quick else STEPS, args.steps)
    text = markdown(results)
    print(text)
    if args.write:
        update_section(NAME, text)


if __name__ == "__main__":
    main()
