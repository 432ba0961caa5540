"""In-process all-reduce (``graphdist.runtime.comm.local``) vs the physical bound.

Reducing N buffers of S bytes needs (N - 1) elementwise combines of S
bytes. The **bound** is the one-thread time of exactly that work with no
collective around it: (N - 1) ``np.add`` calls with ``out=`` on S-byte
float32 arrays (``np.add(b0, b1, out=acc)``, then ``np.add(acc, bi,
out=acc)``), into a preallocated accumulator, on the same input buffers, in
the same process. **ratio = bound time / all-reduce time**: 1.0 means the
all-reduce costs what its additions cost; the goal is at least
:data:`GOAL` for large buffers (:data:`LARGE_BYTES` and up).

The all-reduce is timed as the scheduler calls it: ``local.all_reduce(buffers,
"SUM", algorithm)``, one result per call, dropped before the next call. A
ratio above 1 is possible: the communicator combines all N inputs block by
block while a block is in cache, which moves less memory than (N - 1) full
passes.

Method: for every size and replica count, each round runs every variant
(bound, each algorithm, and for large buffers two diagnostic variants: ring
with 2 threads, ring without output reuse) ``calls`` times in a row, the
order reversed every other round. The ratio of a variant is the median over
rounds of (bound time / variant time) within the round, which cancels slow
drifts of a shared machine; the table also gives the median bound time.

    python -m benchmarks.bench_allreduce [--rounds N] [--quick] [--write]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import machine_info, median, time_interleaved, update_section

__all__ = ["NAME", "GOAL", "SIZES", "REPLICAS", "LARGE_BYTES", "run", "table", "markdown", "main"]

logger = logging.getLogger(__name__)

NAME = "allreduce"
#: Target: bound time / all-reduce time, for buffers of LARGE_BYTES and up.
GOAL = 0.8
#: Buffer sizes in bytes (float32).
SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
#: Replica (logical device) counts.
REPLICAS = (2, 4)
#: "Large buffers", where the goal applies: well past a core's 1 MB L2 cache, where the time is
#: memory traffic (L3 cache up to 32 MB, DRAM beyond) rather than per-call overhead.
LARGE_BYTES = 4 << 20
#: Diagnostic variants are measured from this size up.
DIAGNOSTIC_BYTES = 4 << 20
#: Each variant runs about this long per round (calls are chosen to match).
BLOCK_S = 0.02

_BOUND = "bound"
_THREADS2 = "ring, 2 threads"
_NO_REUSE = "ring, no output reuse"


def _label(size: int) -> str:
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _with_settings(fn: Callable[[], Any], **settings: int) -> Callable[[], Any]:
    from graphdist.runtime.comm import local

    def call() -> Any:
        previous = local.configure(**settings)
        try:
            return fn()
        finally:
            local.configure(**previous)

    return call


def _measure(size: int, replicas: int, rounds: int, algorithms: Sequence[str], diagnostics: bool,
             block_s: float) -> dict[str, Any]:
    from graphdist.runtime.comm import local

    count = size // 4
    rng = np.random.default_rng(size + replicas)
    buffers = [rng.standard_normal(count, dtype=np.float32) for _ in range(replicas)]
    acc = np.empty(count, np.float32)

    def bound() -> None:
        np.add(buffers[0], buffers[1], out=acc)
        for other in buffers[2:]:
            np.add(acc, other, out=acc)

    variants: dict[str, Callable[[], Any]] = {_BOUND: bound}
    for algorithm in algorithms:
        variants[algorithm] = lambda a=algorithm: local.all_reduce(buffers, "SUM", a)
    if diagnostics:
        # The settings switch is part of the timed call; it costs about a microsecond.
        variants[_THREADS2] = _with_settings(lambda: local.all_reduce(buffers, "SUM", "ring"), threads=2)
        variants[_NO_REUSE] = _with_settings(lambda: local.all_reduce(buffers, "SUM", "ring"), pool_bytes=0)

    bound()
    for name, fn in variants.items():
        if name != _BOUND:
            np.testing.assert_allclose(fn()[0], acc, rtol=1e-5, atol=1e-5, err_msg=f"{_label(size)} {name}")
    start = time.perf_counter()
    for _ in range(3):
        bound()
    per_call = (time.perf_counter() - start) / 3
    calls = max(2, min(20000, int(block_s / max(per_call, 1e-7))))
    load_before = _loadavg()
    times = time_interleaved(variants, rounds=rounds, calls=calls, warmup=2)
    ratios = {name: median([b / t for b, t in zip(times[_BOUND], values)])
              for name, values in times.items() if name != _BOUND}
    bound_us = median(times[_BOUND])
    quartiles = statistics.quantiles(times[_BOUND], n=4) if rounds >= 2 else [bound_us] * 3
    moved = 3 * size * (replicas - 1)  # (N - 1) adds, each reads two S-byte operands and writes one
    return {
        "size": size,
        "replicas": replicas,
        "rounds": rounds,
        "calls": calls,
        "bound_us": bound_us,
        "bound_gbs": moved / bound_us / 1e3,
        "us": {name: median(values) for name, values in times.items()},
        "ratio": ratios,
        "spread": (quartiles[2] - quartiles[0]) / bound_us,
        "loadavg": [load_before, _loadavg()],
    }


def run(rounds: int | None = None, quick: bool = False, sizes: Sequence[int] = SIZES,
        replicas: Sequence[int] = REPLICAS) -> dict[str, Any]:
    """Measures every size x replica count.

    Args:
        rounds: Rounds per case (default 31; 3 with ``quick``).
        quick: Few rounds and short blocks (a smoke run; noisy).
        sizes: Buffer sizes in bytes.
        replicas: Replica counts.

    Returns:
        ``{"name", "goal", "goal_met", "worst", "machine", "settings", "cases"}``.
        ``goal_met``: every algorithm's ratio is at least :data:`GOAL` for
        every size of at least :data:`LARGE_BYTES`. ``worst``: (ratio, case
        label, algorithm) of the lowest such ratio. Each case has
        ``bound_us``, ``bound_gbs`` (bytes the bound moves per second),
        ``us`` (median per-call time per variant) and ``ratio`` (per
        variant, the median over rounds of bound / variant time).
    """
    from graphdist.runtime.comm import local

    info = machine_info()  # before measuring: the load average says how busy the machine was
    rounds = rounds or (3 if quick else 31)
    block_s = BLOCK_S / 10 if quick else BLOCK_S
    cases = []
    for size in sizes:
        for count in replicas:
            logger.info("measuring %s x %d replicas: %d rounds (load %.2f)", _label(size), count, rounds, _loadavg())
            cases.append(_measure(size, count, rounds, local.ALGORITHMS,
                                  diagnostics=size >= DIAGNOSTIC_BYTES and not quick, block_s=block_s))
    large = [(ratio, f"{_label(c['size'])} x {c['replicas']}", name) for c in cases if c["size"] >= LARGE_BYTES
             for name, ratio in c["ratio"].items() if name in local.ALGORITHMS]
    worst = min(large) if large else None
    return {"name": NAME, "goal": GOAL, "goal_met": worst is None or worst[0] >= GOAL, "worst": worst,
            "machine": info, "settings": local.settings(), "algorithms": list(local.ALGORITHMS), "cases": cases}


def _columns(results: dict[str, Any]) -> list[str]:
    names = list(results["algorithms"])
    if any(_THREADS2 in c["ratio"] for c in results["cases"]):
        names += [_THREADS2, _NO_REUSE]
    return names


def table(results: dict[str, Any]) -> str:
    """A plain-text table of :func:`run`'s results."""
    names = _columns(results)
    lines = [f"{'size':>7} {'N':>2} {'bound us':>10} {'GB/s':>6} " + " ".join(f"{n:>22}" for n in names)
             + "  load"]
    for case in results["cases"]:
        cells = [f"{case['ratio'][n]:>22.2f}" if n in case["ratio"] else f"{'':>22}" for n in names]
        lines.append(f"{_label(case['size']):>7} {case['replicas']:>2} {case['bound_us']:>10.1f} "
                     f"{case['bound_gbs']:>6.1f} " + " ".join(cells)
                     + f"  {case['loadavg'][0]:.1f}-{case['loadavg'][1]:.1f}")
    worst = results["worst"]
    if worst:
        verdict = "met" if results["goal_met"] else "NOT met"
        lines.append(f"goal (ratio >= {results['goal']} from {_label(LARGE_BYTES)}): {verdict}; "
                     f"lowest {worst[0]:.2f} ({worst[1]}, {worst[2]})")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    names = _columns(results)
    cases = results["cases"]
    settings = results["settings"]
    out = [
        "## All-reduce vs the physical bound",
        "",
        "`graphdist.runtime.comm.local.all_reduce(buffers, \"SUM\", algorithm)` on N float32 buffers of S",
        "bytes (N logical devices in one process) against the **physical bound**: reducing N buffers of",
        "S bytes needs (N - 1) elementwise adds of S bytes, so the bound is the one-thread time of (N - 1)",
        "`np.add` calls with `out=` on the same S-byte arrays into a preallocated accumulator",
        "(`np.add(b0, b1, out=acc)`, then `np.add(acc, bi, out=acc)`), measured in the same process.",
        "**ratio = bound time / all-reduce time**; above 1 means faster than the bound (possible: the",
        "communicator combines all N inputs block by block while the block is in cache, which moves",
        "less memory than N - 1 full passes).",
        "",
        "Method: each round runs the bound and every variant `calls` times in a row (about 20 ms per",
        "block), the order reversed every other round; a ratio is the median over rounds of the ratio",
        "within a round, which cancels slow drifts of the shared machine. Each call returns a fresh result",
        "that the benchmark drops before the next call, as the scheduler does between steps. Communicator",
        f"settings: threads={settings['threads']}, output reuse pool {settings['pool_bytes'] >> 20} MiB. Measured "
        f"on {results['machine']['date']} (numpy {results['machine']['numpy']}); the machine is shared, the *load*",
        "column is the 1-minute load average when the row started.",
        "Diagnostic columns (4 MB and up): *ring, 2 threads* splits each call between two threads;",
        "*ring, no output reuse* allocates a fresh output every call. "
        "Source: `benchmarks/bench_allreduce.py`.",
        "",
        f"**Goal:** ratio >= **{results['goal']}** for large buffers ({_label(LARGE_BYTES)} and up), N = 2 and 4,",
        "every algorithm.",
        "",
    ]
    for count in sorted({c["replicas"] for c in cases}):
        rows = [c for c in cases if c["replicas"] == count]
        out.append(f"### {count} replicas")
        out.append("")
        out.append("| size | bound us | bound GB/s | " + " | ".join(names) + " | rounds x calls | load |")
        out.append("|---|---:|---:|" + "---:|" * len(names) + "---:|---:|")
        for case in rows:
            cells = [f"{case['ratio'][n]:.2f}" if n in case["ratio"] else "" for n in names]
            out.append(f"| {_label(case['size'])} | {case['bound_us']:.1f} | {case['bound_gbs']:.1f} | "
                       + " | ".join(cells) + f" | {case['rounds']} x {case['calls']} | "
                       f"{case['loadavg'][0]:.1f} |")
        out.append("")
    worst = results["worst"]
    if worst:
        verdict = "**met**" if results["goal_met"] else "**not met**"
        out.append(f"Goal {verdict} for large buffers: the lowest ratio from {_label(LARGE_BYTES)} up is "
                   f"{worst[0]:.2f} ({worst[1]} replicas, {worst[2]}).")
        out.append("")
    out += _analysis(results)
    return "\n".join(out).rstrip()


def _case(results: dict[str, Any], size: int, replicas: int) -> dict[str, Any] | None:
    return next((c for c in results["cases"] if c["size"] == size and c["replicas"] == replicas), None)


def _analysis(results: dict[str, Any]) -> list[str]:
    """Explanations backed by the measured numbers (only for the cases that were measured)."""
    algorithms = results["algorithms"]
    lines = []
    small = [c for c in results["cases"] if c["size"] < LARGE_BYTES]
    if small:
        tiny = min(small, key=lambda c: (c["size"], -c["replicas"]))
        below = [c for c in small if min(c["ratio"][a] for a in algorithms) < results["goal"]]
        per_call = ", ".join(f"{a} {tiny['us'][a]:.1f} us" for a in algorithms)
        text = (f"*Below {_label(LARGE_BYTES)}* the ratio measures fixed per-call costs, not memory: at "
                f"{_label(tiny['size'])} x {tiny['replicas']} replicas the bound takes {tiny['bound_us']:.1f} us and "
                f"one all-reduce {per_call}. Every call checks shapes and dtypes, takes an output buffer and "
                "marks it read-only (about 3 us on a quiet machine), and each numpy call costs about 0.5-1 us; "
                "the bound makes N - 1 calls, reduce_to_one the same N - 1, hierarchical_copy N - 1 plus a "
                "scratch block, and ring N x (N - 1) on 1/N-size chunks (12 for N = 4), because each chunk "
                "is summed in its own order.")
        if below:
            largest = max(below, key=lambda c: c["size"])
            low = min(algorithms, key=lambda a: largest["ratio"][a])
            text += (f" The largest size below the goal is {_label(largest['size'])} (x {largest['replicas']}: "
                     f"{low} {largest['ratio'][low]:.2f}, bound {largest['bound_us']:.0f} us).")
        lines += [text, ""]
    def lowest(c: dict[str, Any]) -> str:
        name = min(algorithms, key=lambda a: c["ratio"][a])
        return f"{_label(c['size'])} x {c['replicas']}: {c['ratio'][name]:.2f} ({name})"

    cached = [c for c in results["cases"] if LARGE_BYTES <= c["size"] < 16 << 20]
    if cached:
        lines += [
            f"*At {', '.join(sorted({_label(c['size']) for c in cached}))}* all buffers fit in the 32 MB L3 cache "
            f"(the bound moves {min(c['bound_gbs'] for c in cached):.0f}-{max(c['bound_gbs'] for c in cached):.0f} "
            "GB/s), so there is little memory traffic to save, and what the communicator adds shows: ring's "
            "chunks and the 1 MB blocks mean more, smaller numpy calls, and hierarchical_copy's tree needs a "
            "scratch block per level, one more operand stream than a chain of adds. Lowest ratios: "
            + "; ".join(lowest(c) for c in cached) + ".",
            "",
        ]
    dram = [c for c in results["cases"] if c["size"] >= 16 << 20]
    if dram:
        text = ("*From 16 MB* the buffers no longer fit in the cache and the bound runs at memory bandwidth "
                f"({min(c['bound_gbs'] for c in dram):.0f}-{max(c['bound_gbs'] for c in dram):.0f} GB/s moved by "
                "one thread). With 2 replicas the all-reduce does exactly the bound's work (one add straight into "
                "the output): " + "; ".join(lowest(c) for c in dram if c["replicas"] == 2) + ".")
        many = [c for c in dram if c["replicas"] >= 3]
        beats = [c for c in many if max(c["ratio"][a] for a in algorithms) >= 1.05]
        ties = [c for c in many if c not in beats]
        if beats:
            text += (" With more replicas it beats the bound ("
                     + ", ".join(f"{_label(c['size'])} x {c['replicas']}: up to "
                                 f"{max(c['ratio'][a] for a in algorithms):.2f}" for c in beats)
                     + "): all N inputs are combined block by block (1 MB blocks) while the block is in cache, so "
                     "memory traffic is about N reads and one write of S bytes instead of the bound's (N - 1) "
                     "passes of 3 S.")
        if ties:
            text += (" At " + ", ".join(f"{_label(c['size'])} x {c['replicas']}" for c in ties)
                     + " the two tie (lowest " + ", ".join(
                         f"{min(c['ratio'][a] for a in algorithms):.2f}" for c in ties) + ")")
            if all(c["size"] < 32 << 20 for c in ties):
                text += ": the bound's S-byte accumulator stays in the 32 MB L3 cache, so the bound too reads "
                text += "little more than the inputs from memory"
            text += "."
        lines += [text, ""]
    big = max(results["cases"], key=lambda c: (c["size"], -c["replicas"]))
    if _NO_REUSE in big["ratio"]:
        lines += [
            f"*Output reuse* matters most at {_label(big['size'])}: with a fresh output every call the ring "
            f"reaches only {big['ratio'][_NO_REUSE]:.2f} (x {big['replicas']}) instead of {big['ratio']['ring']:.2f}. "
            "A fresh large array is mapped from the kernel and every page is zeroed on first touch, which "
            "costs about as much as the addition itself; numpy/glibc recycle smaller blocks but not these. "
            "The communicator therefore reuses an earlier output once nothing refers to it any more (a result "
            "that is still referenced is never written).",
            "",
        ]
    threaded = [c for c in results["cases"] if _THREADS2 in c["ratio"]]
    if threaded:
        loads = [c["loadavg"][0] for c in threaded]
        one = ", ".join(f"{c['ratio']['ring']:.2f}" for c in threaded)
        gain = statistics.median(c["ratio"][_THREADS2] / c["ratio"]["ring"] for c in threaded)
        text = ("*Two threads* (ring split between the caller and a helper thread): "
                + ", ".join(f"{_label(c['size'])} x {c['replicas']} {c['ratio'][_THREADS2]:.2f}" for c in threaded)
                + f" against one thread's ring ({one}); median gain {gain:.2f}x. The machine has 2 cores and "
                f"other work was running (load average {min(loads):.1f}-{max(loads):.1f}), so a second thread "
                "competes with it for a core and for the memory bus; during a training step the devices' own "
                "threads are busy too. ")
        if results["settings"]["threads"] > 1:
            text += f"This run used {results['settings']['threads']} threads by default."
        else:
            text += ("The default stays one thread; `local.configure(threads=2)` (or `GRAPHDIST_COMM_THREADS=2`) "
                     "turns the split on.")
        lines += [text, ""]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints a table, optionally updates BENCHMARKS.md.

    Returns:
        0, or 1 when a large buffer misses the goal.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_allreduce", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds per case (default: 31)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of short blocks: a smoke run")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    parser.add_argument("-v", "--verbose", action="store_true", help="log per-round times")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")

    results = run(rounds=args.rounds, quick=args.quick)
    print(table(results))
    if args.write:
        path = update_section(NAME, markdown(results), info=results["machine"])
        print(f"updated {path}")
    return 0 if results["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
