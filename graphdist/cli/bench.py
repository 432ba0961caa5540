"""``graphdist bench``: time a compiled step, on one backend or several side by side.

::

    graphdist bench graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1
    graphdist bench graphdist.models.convnet:forward --compare ort,tvm --rounds 9
    graphdist bench model.onnx --batch 64 --format json -o timings.json

TARGET is compiled as ``graphdist inspect``/``export`` compile it, once per
backend (``--backend``, or every backend of ``--compare``; the first is the
baseline). The first call is timed as the compile time (tracing, passes,
backend build or cache load). Then the backends run interleaved: every round
calls each backend's step ``--steps`` times in a row, the order reversed
every other round, so drifts of the machine hit every backend alike; the
report gives each backend's median and 90th percentile time per call over the
rounds, its throughput (examples of the global batch per second) and, with
several backends, each one's time relative to the baseline (median of the
per-round ratios). Steps that train update their own variables on every call
(each backend has its own copy).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_bench_parser", "cmd_bench", "measure"]

logger = logging.getLogger(__name__)

_EPILOG = """\
examples:
  graphdist bench graphdist.models.mlp:forward
  graphdist bench graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 --steps 20
  graphdist bench graphdist.models.convnet:forward --compare ort,tvm --rounds 9
  graphdist bench model.onnx --batch 64 --format json -o timings.json

Times are wall-clock per call of the whole compiled step (scheduler, transfers and
collectives included), measured in this process; a busy machine makes them noisy:
compare backends with --compare (interleaved) rather than across separate runs.
"""


def measure(calls: Mapping[str, Callable[[], Any]], rounds: int, steps: int, warmup: int,
            settle: float = 0.0) -> dict[str, list[float]]:
    """Seconds per call of each callable, one value per round, rounds interleaved to cancel drift.

    Every round calls each callable ``steps`` times in a row; the order is
    reversed every other round, so slow drifts of the machine (frequency,
    other load) hit every callable alike. ``benchmarks.time_interleaved``
    is this timer too.

    Args:
        calls: Name -> zero-argument callable.
        rounds: Rounds to time.
        steps: Calls per callable per round.
        warmup: Untimed calls of each callable first.
        settle: Seconds to sleep before each timed block, so that worker
            threads the previous callable left spinning (ONNX Runtime's
            thread pools spin for a while after a run) go idle first.
    """
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            call = calls[name]
            if settle:
                time.sleep(settle)
            start = time.perf_counter_ns()
            for _ in range(steps):
                call()
            times[name].append((time.perf_counter_ns() - start) / steps / 1e9)
    for name in names:
        logger.debug("%s: %s us", name, ", ".join(f"{t * 1e6:.1f}" for t in times[name]))
    return times


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _backends(args: argparse.Namespace) -> list[str]:
    from graphdist.cli.main import UsageError, backend_choices

    choices = backend_choices()

    if args.compare:
        if args.backend is not None:
            raise UsageError("give --backend or --compare, not both (--compare ort,tvm times both)")
        names = [name.strip() for name in args.compare.split(",") if name.strip()]
        unknown = [name for name in names if name not in choices]
        if unknown or not names:
            raise UsageError(f"--compare: unknown backend(s) {unknown or [args.compare]}; choose among "
                             f"{', '.join(choices)}, comma-separated, the baseline first")
        if len(set(names)) != len(names):
            raise UsageError(f"--compare: {args.compare!r} names a backend twice")
        return names
    return [args.backend] if args.backend else [""]


def _check_counts(args: argparse.Namespace) -> None:
    from graphdist.cli.main import UsageError

    for option, value, least in (("--steps", args.steps, 1), ("--rounds", args.rounds, 1),
                                 ("--warmup", args.warmup, 0)):
        if value < least:
            raise UsageError(f"{option} must be at least {least}, got {value}")


def cmd_bench(args: argparse.Namespace) -> int:
    """Compiles TARGET per backend and times it; prints a table or writes JSON."""
    from graphdist.cli.main import EXIT_OK, _build_target, _global_arrays, _write

    _check_counts(args)
    backends = _backends(args)
    built, compile_s = {}, {}
    for backend in backends:
        start = time.perf_counter()
        target = _build_target(argparse.Namespace(**{**vars(args), "backend": backend or None}))
        target.concrete(*target.example_args)  # the first call: builds (or loads) every segment
        compile_s[backend] = time.perf_counter() - start
        built[backend] = target
    arrays = _global_arrays(next(iter(built.values())).example_args)
    batch = next((int(a.shape[0]) for a in arrays.values() if a.ndim), None)
    calls = {backend: (lambda b=built[backend]: b.concrete(*b.example_args)) for backend in backends}
    times = measure(calls, args.rounds, args.steps, args.warmup)
    report = _report(args.target, built, backends, compile_s, times, batch, args)
    if args.format == "json":
        text = json.dumps(report, indent=1)
    else:
        text = _text(report)
    if args.output:
        _write(args.output, lambda path: Path(path).write_text(text + "\n"))
        print(f"wrote {args.format} results to {args.output}")
    else:
        print(text)
    return EXIT_OK


def _report(target: str, built: dict[str, Any], backends: list[str], compile_s: dict[str, float],
            times: dict[str, list[float]], batch: int | None, args: argparse.Namespace) -> dict[str, Any]:
    from graphdist.runtime.devices import host_cores

    baseline = backends[0]
    rows = []
    for backend in backends:
        plan = built[backend].concrete.plan
        per_call = times[backend]
        median = statistics.median(per_call)
        row = {"backend": plan.backend_name, "compile_s": compile_s[backend], "median_ms": median * 1e3,
               "p90_ms": _percentile(per_call, 0.9) * 1e3, "rounds_ms": [t * 1e3 for t in per_call],
               "segments": len(plan.segments), "devices": list(plan.devices)}
        if batch:
            row["examples_per_s"] = batch / median
        if len(backends) > 1:
            row["vs_baseline"] = statistics.median([t / b for t, b in zip(per_call, times[baseline])])
        rows.append(row)
    return {"target": target, "what": built[baseline].what, "global_batch": batch, "steps_per_round": args.steps,
            "rounds": args.rounds, "warmup": args.warmup, "host_cores": host_cores(), "results": rows}


def _text(report: dict[str, Any]) -> str:
    rows = report["results"]
    lines = [f"{report['what']}: {report['rounds']} rounds x {report['steps_per_round']} calls per backend "
             f"(interleaved), global batch {report['global_batch'] or '-'}, {report['host_cores']} host core(s)"]
    header = f"  {'backend':<10}{'compile s':>10}{'median ms':>11}{'p90 ms':>9}{'examples/s':>12}"
    if len(rows) > 1:
        header += f"{'vs ' + rows[0]['backend']:>12}"
    lines.append(header)
    for row in rows:
        line = (f"  {row['backend']:<10}{row['compile_s']:>10.2f}{row['median_ms']:>11.3f}{row['p90_ms']:>9.3f}"
                f"{row.get('examples_per_s', float('nan')):>12,.0f}")
        if "vs_baseline" in row:
            line += f"{row['vs_baseline']:>11.2f}x"
        lines.append(line)
    return "\n".join(lines)


def add_bench_parser(commands: Any, formatter: type) -> None:
    """Adds ``bench`` to the ``graphdist`` subcommands."""
    from graphdist.cli.main import _add_target_options

    bench = commands.add_parser(
        "bench", help="time a compiled step (per call, per example), on one backend or several side by side",
        description="Compile TARGET (as 'graphdist export' does) and time its calls: median and 90th percentile "
                    "per call, examples per second, compile time; with --compare, several backends "
                    "interleaved in this process and each one's time relative to the first.",
        epilog=_EPILOG, formatter_class=formatter)
    _add_target_options(bench)
    bench.add_argument("--compare", metavar="LIST", default=None,
                       help="backends to time side by side, comma-separated, the baseline first (e.g. ort,tvm)")
    bench.add_argument("--steps", type=int, default=10, metavar="N", help="calls per backend per round (default 10)")
    bench.add_argument("--rounds", type=int, default=5, metavar="N", help="timed rounds (default 5)")
    bench.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed calls first (default 3)")
    bench.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    bench.add_argument("-o", "--output", metavar="PATH", help="write the results to PATH instead of stdout")
    bench.set_defaults(handler=cmd_bench)
