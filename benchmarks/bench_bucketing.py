"""Gradient bucketing on vs off: MirroredStrategy training steps with many small gradients.

Every variant trains its own copy of the same MLP (same initial weights, same
batch) under ``gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops)``:

* **off**: ``gd.NcclAllReduce()``: one all-reduce per gradient;
* **one pack**: ``gd.NcclAllReduce(num_packs=1)``: every gradient in one pack;
* **4 packs**: ``gd.NcclAllReduce(num_packs=4)``;
* **16 KiB packs**: ``gd.NcclAllReduce(bytes_per_pack=16384)``.

Before timing, each variant runs a few steps from the same weights and the
benchmark checks that the weights equal the unbucketed run's (bitwise with two
replicas, where a sum of two buffers does not depend on the order).

Timing: the step ``strategy.run(step, args=(x, y))`` (traced and compiled
before timing), ``rounds`` rounds of ``calls`` calls per variant, interleaved
and the order reversed every other round (:func:`benchmarks.time_interleaved`);
the table reports medians over rounds, the ratio to **off** within each round
(median over rounds), the number of all-reduce tasks in the plan and the time
spent in the local communicator's ``all_reduce`` per step (timed in a
separate pass of the same rounds).

Cases: an MLP of 20 narrow layers (many small gradients: the case bucketing
is for) and the 784-512-512-10 MLP (6 large gradients: a control).

    python -m benchmarks.bench_bucketing [--rounds N] [--quick] [--write]
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import BENCHMARKS_MD, machine_info, machine_markdown, median, replace_section, time_interleaved

__all__ = ["NAME", "CASES", "VARIANTS", "run", "table", "markdown", "write_section", "main"]

logger = logging.getLogger(__name__)

NAME = "bucketing"

#: (label, layer sizes, global batch, rounds, calls per round).
CASES: tuple[tuple[str, tuple[int, ...], int, int, int], ...] = (
    ("MLP 32 x 20 layers (40 gradients of 40 B..4 KiB)", (32,) * 20 + (10,), 64, 31, 40),
    ("MLP 784-512-512-10 (6 gradients, 40 B..1.6 MB)", (784, 512, 512, 10), 256, 21, 10),
)

_OFF = "off (one all-reduce per gradient)"
#: Variant name -> cross_device_ops factory arguments.
VARIANTS: dict[str, dict[str, int]] = {
    _OFF: {},
    "one pack (num_packs=1)": {"num_packs": 1},
    "4 packs (num_packs=4)": {"num_packs": 4},
    "16 KiB packs (bytes_per_pack=16384)": {"bytes_per_pack": 16384},
}

#: Pause before each timed block so ONNX Runtime's spinning worker threads go idle.
SETTLE = 0.02


def _setup(sizes: tuple[int, ...], batch: int, options: dict[str, int]) -> dict[str, Any]:
    """A strategy, model, step and fixed per-replica batch for one variant."""
    import graphdist as gd
    from graphdist.models.mlp import MLP

    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"], gd.NcclAllReduce(**options))
    with strategy.scope():
        model = MLP(sizes, seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.01)
    step = model.make_train_step(optimizer, batch)
    rng = np.random.default_rng(0)
    half = batch // 2
    x = gd.PerReplica(tuple(rng.standard_normal((half, sizes[0])).astype(np.float32) for _ in range(2)))
    y = gd.PerReplica(tuple(rng.integers(0, sizes[-1], half) for _ in range(2)))
    plan = strategy._function_for(step).get_concrete_function(x, y).plan
    tasks = [c for c in plan.comms if c.op == "AllReduce"]
    return {"strategy": strategy, "model": model, "step": step, "x": x, "y": y,
            "call": lambda: strategy.run(step, args=(x, y)), "all_reduce_tasks": len(tasks),
            "largest_task_bytes": max(plan.graph_value(t.inputs[0]).nbytes for t in tasks)}


def _check_equal(setups: dict[str, dict[str, Any]], steps: int = 3) -> bool:
    """Runs ``steps`` steps per variant from the same weights; True when all weights match **off** bitwise."""
    for setup in setups.values():
        for _ in range(steps):
            setup["call"]()
    reference = [v.numpy() for v in setups[_OFF]["model"].trainable_variables]
    same = True
    for name, setup in setups.items():
        weights = [v.numpy() for v in setup["model"].trainable_variables]
        if not all(np.array_equal(a, b) for a, b in zip(weights, reference)):
            logger.error("%s: weights differ from the unbucketed run", name)
            same = False
    return same


def _comm_time(variants: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    """Median time per step inside the local communicator's all_reduce, per variant."""
    from graphdist.runtime.comm import local

    raw = local.all_reduce
    clock = time.perf_counter_ns
    inside = 0

    def timed(*args: Any, **kwargs: Any) -> Any:
        nonlocal inside
        start = clock()
        try:
            return raw(*args, **kwargs)
        finally:
            inside += clock() - start

    local.all_reduce = timed
    try:
        per_round: dict[str, list[float]] = {name: [] for name in variants}
        for index in range(rounds):
            for name in (list(variants) if index % 2 == 0 else list(variants)[::-1]):
                inside = 0
                for _ in range(calls):
                    variants[name]()
                per_round[name].append(inside / calls / 1e3)
    finally:
        local.all_reduce = raw
    return {name: median(values) for name, values in per_round.items()}


def _measure_case(label: str, sizes: tuple[int, ...], batch: int, rounds: int, calls: int) -> dict[str, Any]:
    setups = {name: _setup(sizes, batch, options) for name, options in VARIANTS.items()}
    equal = _check_equal(setups)
    variants = {name: setup["call"] for name, setup in setups.items()}
    times = time_interleaved(variants, rounds=rounds, calls=calls, warmup=max(calls // 4, 3), settle=SETTLE)
    comm = _comm_time(variants, rounds=max(rounds // 3, 1), calls=calls)
    us = {name: median(values) for name, values in times.items()}
    ratios = {name: median([a / b for a, b in zip(values, times[_OFF])]) for name, values in times.items()}
    num_gradients = 2 * (len(sizes) - 1)
    return {
        "label": label, "sizes": list(sizes), "batch": batch, "rounds": rounds, "calls": calls,
        "gradients": num_gradients, "equal_to_off": equal, "us": us,
        "us_min": {name: min(values) for name, values in times.items()}, "ratio_to_off": ratios,
        "comm_us": comm, "tasks": {name: s["all_reduce_tasks"] for name, s in setups.items()},
        "largest_task_bytes": {name: s["largest_task_bytes"] for name, s in setups.items()},
    }


def run(rounds: int | None = None, quick: bool = False, cases: Sequence[tuple] | None = None) -> dict[str, Any]:
    """Measures every case (default :data:`CASES`).

    Args:
        rounds: Rounds per case (medians are taken over rounds).
        quick: 3 rounds and a quarter of the calls (a smoke run; noisy).
        cases: Cases to run instead of :data:`CASES`.

    Returns:
        ``{"name", "machine", "cases", "goal_met"}``; each case has ``us``
        (median per-step microseconds per variant), ``ratio_to_off`` (median
        over rounds of the variant / off within the round), ``us_min``,
        ``comm_us`` (median time per step in the communicator), ``tasks``
        (all-reduce tasks per step), ``largest_task_bytes`` and
        ``equal_to_off`` (bitwise equal weights after 3 steps).
        ``goal_met``: every variant of every case trained to the same weights.
    """
    info = machine_info()  # before measuring: the load average says how busy the machine was
    results = []
    for label, sizes, batch, case_rounds, calls in cases or CASES:
        case_rounds = rounds or case_rounds
        if quick:
            case_rounds, calls = min(case_rounds, 3), max(calls // 4, 2)
        logger.info("measuring %s: %d rounds x %d calls", label, case_rounds, calls)
        results.append(_measure_case(label, tuple(sizes), batch, case_rounds, calls))
    return {"name": NAME, "machine": info, "cases": results, "goal_met": all(c["equal_to_off"] for c in results)}


def table(results: dict[str, Any]) -> str:
    """A plain-text table of :func:`run`'s results."""
    lines = []
    for case in results["cases"]:
        lines.append(f"{case['label']}, global batch {case['batch']}  ({case['rounds']} rounds x {case['calls']} "
                     f"calls; weights equal to off: {case['equal_to_off']})")
        lines.append(f"  {'variant':<38}{'tasks':>6}{'median us':>11}{'vs off':>8}{'comm us':>9}{'min us':>9}")
        for name in VARIANTS:
            lines.append(f"  {name:<38}{case['tasks'][name]:>6}{case['us'][name]:>11.1f}"
                         f"{case['ratio_to_off'][name]:>7.3f}x{case['comm_us'][name]:>9.1f}{case['us_min'][name]:>9.1f}")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """This benchmark's section of BENCHMARKS.md (with its own machine line)."""
    info = results["machine"]
    parts = [
        "## Gradient bucketing: all-reduce packs on vs off",
        "",
        "Per-step time of a MirroredStrategy training step on two logical CPU devices "
        "(`gd.MirroredStrategy([\"cpu:0\", \"cpu:1\"], cross_device_ops)`, SGD, ONNX Runtime segments, "
        "the in-process ring all-reduce) with the gradients' all-reduces fused into packs by "
        "`BucketCollectivesPass` (`num_packs` / `bytes_per_pack` of `gd.NcclAllReduce`) or not. "
        "Every variant trains its own copy of the same model from the same weights on the same "
        "batch; after 3 steps its weights are checked to be bitwise equal to the unbucketed run's.",
        "",
        "Method: `strategy.run(step, args=(x, y))` after tracing and compiling; each round runs every "
        "variant `calls` times in a row after a 20 ms pause, the order reversed every other round. The "
        "table shows the median per-step time over rounds (and the minimum), the median over rounds of "
        "the ratio to *off* within the round, the number of all-reduce tasks per step in the plan, and "
        "the median time per step inside the local communicator's `all_reduce` (a separate, "
        "instrumented pass). Source: `benchmarks/bench_bucketing.py`.",
        "",
        "Machine for these numbers: " + machine_markdown(info).split("\n", 2)[2].replace("\n- ", "; ")
        .removeprefix("- ") + ".",
    ]
    for case in results["cases"]:
        parts += ["", f"### {case['label']}, global batch {case['batch']}", "",
                  f"{case['rounds']} rounds x {case['calls']} steps; {case['gradients']} gradients; weights "
                  f"after 3 steps bitwise equal to *off*: {'yes' if case['equal_to_off'] else '**no**'}.", "",
                  "| variant | all-reduce tasks | largest pack | median us/step | vs off | in all_reduce us/step "
                  "| min us/step |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name in VARIANTS:
            parts.append(f"| {name} | {case['tasks'][name]} | {case['largest_task_bytes'][name]:,} B | "
                         f"{case['us'][name]:.1f} | {case['ratio_to_off'][name]:.3f}x | "
                         f"{case['comm_us'][name]:.1f} | {case['us_min'][name]:.1f} |")
        best = min((n for n in VARIANTS if n != _OFF), key=lambda n: case["ratio_to_off"][n])
        parts += ["", f"Fastest with bucketing: {best}, **{case['ratio_to_off'][best]:.3f}x** the unbucketed step "
                  f"time ({case['us'][best] - case['us'][_OFF]:+.1f} us/step, difference of medians); time in "
                  f"`all_reduce` {case['comm_us'][_OFF]:.1f} -> {case['comm_us'][best]:.1f} us/step."]
    parts += ["", "Reading: with many small gradients each all-reduce costs a fixed amount of Python work (a "
              "communicator call, a scheduler task, one more output of each backward segment and input of the "
              "update segment), so fusing them into few packs saves more than the communicator time alone. With "
              "few large gradients the step is dominated by the GEMMs; the packs save a few calls but add "
              "Concat/Split copies of the packed megabytes, and the difference stays within the noise. "
              "Under PartitionPass's (device, phase) segments a device's whole backward pass is one segment, so "
              "packs do not yet overlap the backward pass; they are ordered for it (the last layer's gradients "
              "first)."]
    return "\n".join(textwrap.fill(part, width=100, break_on_hyphens=False, break_long_words=False)
                     if part and part[0] not in "#|" else part for part in parts)


def write_section(text: str, path: Any = BENCHMARKS_MD) -> Any:
    """Replaces this benchmark's section of BENCHMARKS.md, or appends it; leaves every other section alone
    (the machine section too: this section states its own machine)."""
    return replace_section(NAME, text, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: runs the benchmark, prints the table, optionally writes BENCHMARKS.md."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_bucketing", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds per case (default: 31 and 21)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, few calls: a smoke run")
    parser.add_argument("--write", action="store_true", help="replace or append this section of BENCHMARKS.md")
    parser.add_argument("-v", "--verbose", action="store_true", help="log per-round times")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")
    results = run(rounds=args.rounds, quick=args.quick)
    print(table(results))
    if args.write:
        print(f"wrote {write_section(markdown(results))}")
    return 0 if results["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
