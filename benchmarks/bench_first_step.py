"""Time to first step: trace, pass pipeline, partition, compile and first call of a distributed training step.

For the MLP and the transformer block of ``graphdist/models/`` (their ``make_step(strategy, batch, seed)``: model and
optimizer built in the strategy's scope, one ``gd.function`` running ``strategy.run`` + ``strategy.reduce``)
and each strategy -- ``OneDeviceStrategy("cpu:0")`` (the baseline), ``MirroredStrategy`` on 2 and on 8
logical CPUs, ``TPUStrategy`` on 8 simulated cores (``local[8]``; compiled by its backend, tvm: ONNX Runtime
cannot run ``tpu`` devices) -- one measurement is one FRESH process (``--one CASE``) with a fresh, empty
``GRAPHDIST_CACHE_DIR``: nothing is in the memory or disk compile cache, so compile time is a real build.
Every case of a model uses the same global batch (64); each replica gets ``64 / replicas`` rows.

Per process: ``total`` = ``step.get_concrete_function(*args)`` + one call of the concrete function (public
API). The stages are timed from the outside by wrapping, for the duration of the process, ``Function._trace``
(trace), ``PassManager.run`` and ``Plan.from_graph`` (pass pipeline + partition), and ``Plan.compile``
(compile: lowering to ONNX and the backend's build); a name that is missing (or never called) gives ``None``
for its stage and only the total is reported. Each case runs ``--repeats`` times (rounds interleave the
cases); the medians are reported, each metric separately.

    python -m benchmarks.bench_first_step [--repeats 3] [--output FILE.json] [--before FILE.json] [--write]
    python -m benchmarks.bench_first_step --one mlp/tpu_8 --json     # one measurement (what run() spawns)
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import inspect
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import git_commit, json_child, machine_info, median, report, update_section

__all__ = ["NAME", "CASES", "MODELS", "measure_one", "run", "table", "markdown", "main"]

NAME = "first_step"
ROOT = Path(__file__).resolve().parent.parent
#: Model module (``models.<name>``) -> global batch, the same for every strategy.
MODELS: dict[str, int] = {"mlp": 64, "transformer": 64}
#: Case -> (label, strategy factory taking the ``graphdist`` module).
CASES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "one_device": ("OneDevice cpu:0", lambda gd: gd.OneDeviceStrategy("cpu:0")),
    "mirrored_2": ("Mirrored cpu:0-1", lambda gd: gd.MirroredStrategy(["cpu:0", "cpu:1"])),
    "mirrored_8": ("Mirrored cpu:0-7", lambda gd: gd.MirroredStrategy([f"cpu:{i}" for i in range(8)])),
    "tpu_8": ("TPU local[8]", lambda gd: gd.TPUStrategy(gd.cluster_resolver.TPUClusterResolver(tpu="local[8]"))),
}
BASELINE = "one_device"
STAGES = ("trace_s", "passes_s", "compile_s", "first_call_s", "total_s")
_NODES = ("traced_nodes", "rewritten_nodes", "partitioned_nodes", "segments")


def _wrap_timed(owner: Any, attr: str, sink: list[float]) -> bool:
    """Replaces ``owner.attr`` by a wrapper appending the duration of each outermost call to ``sink``."""
    try:
        static = inspect.getattr_static(owner, attr)
    except AttributeError:
        return False
    is_classmethod = isinstance(static, classmethod)
    original = static.__func__ if is_classmethod else static
    if not callable(original):
        return False
    depth = [0]

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                sink.append(time.perf_counter() - start)

    setattr(owner, attr, classmethod(timed) if is_classmethod else timed)
    return True


def _install_hooks(gd: Any, function_class: type) -> dict[str, list[float]]:
    """Wraps the private stage boundaries that exist; returns stage -> call durations."""
    timings: dict[str, list[float]] = {"trace": [], "passes": [], "plan": [], "compile": []}
    _wrap_timed(function_class, "_trace", timings["trace"])
    try:
        from graphdist.passes.base import PassManager

        _wrap_timed(PassManager, "run", timings["passes"])
    except ImportError:
        pass
    plan_class = getattr(gd, "Plan", None)
    if plan_class is not None:
        _wrap_timed(plan_class, "from_graph", timings["plan"])
        _wrap_timed(plan_class, "compile", timings["compile"])
    return timings


def measure_one(case_id: str) -> dict[str, Any]:
    """One measurement of ``case_id`` (``"<model>/<case>"``) in this process (which must be fresh).

    Returns:
        Stage seconds (``None`` where a stage could not be timed), graph sizes, backend and loss.
    """
    model_name, case = case_id.split("/")
    start = time.perf_counter()
    import numpy as np

    import graphdist as gd

    import_s = time.perf_counter() - start
    module = importlib.import_module(f"graphdist.models.{model_name}")
    strategy = CASES[case][1](gd)
    step, args = module.make_step(strategy, batch=MODELS[model_name], seed=0)
    timings = _install_hooks(gd, type(step))
    start = time.perf_counter()
    concrete = step.get_concrete_function(*args)
    built = time.perf_counter()
    loss = concrete(*args)
    end = time.perf_counter()

    def stage(*keys: str) -> float | None:
        return sum(sum(timings[k]) for k in keys) if timings[keys[0]] else None

    result: dict[str, Any] = {
        "case": case_id, "graphdist_file": gd.__file__, "import_s": import_s,
        "trace_s": stage("trace"), "passes_s": stage("passes", "plan"), "compile_s": stage("compile"),
        "build_s": built - start, "first_call_s": end - built, "total_s": end - start,
        "pass_manager_runs": len(timings["passes"]), "replicas": strategy.num_replicas_in_sync,
        "backend": getattr(concrete.plan, "backend_name", None), "loss": float(np.sum(np.asarray(loss))),
        "traced_nodes": len(concrete.graph("traced").nodes), "rewritten_nodes": len(concrete.graph("rewritten").nodes),
        "partitioned_nodes": len(concrete.graph("partitioned").nodes), "segments": len(concrete.plan.segments),
    }
    snapshot = getattr(getattr(gd, "stats", None), "snapshot", None)  # backend compiles (not cache hits)
    result["compiles"] = snapshot().get("compiles") if callable(snapshot) else None
    known = [result[k] for k in ("trace_s", "passes_s", "compile_s")]
    result["other_build_s"] = None if None in known else result["build_s"] - sum(known)
    return result


def _spawn(case_id: str, timeout: float) -> dict[str, Any]:
    """Runs :func:`measure_one` in a fresh interpreter with an empty compile cache directory."""
    with tempfile.TemporaryDirectory(prefix="bench-first-step-cache-") as cache:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "GRAPHDIST_CACHE_DIR": cache, "PYTHONPATH": path}
        command = [sys.executable, "-m", "benchmarks.bench_first_step", "--one", case_id, "--json"]
        return json_child(command, env, timeout, {"case": case_id})


def run(quick: bool = False, repeats: int = 3, models: Sequence[str] = tuple(MODELS),
        cases: Sequence[str] = tuple(CASES), timeout: float = 900.0) -> dict[str, Any]:
    """Measures every model x case ``repeats`` times, each in a fresh process (``quick``: MLP, no TPU, once).

    Returns:
        Machine, commit, and per case the runs, the medians and ``vs_one_device`` (total / baseline total).
    """
    if quick:
        repeats, models, cases = 1, ("mlp",), tuple(c for c in cases if c != "tpu_8")
    info, date = machine_info(), datetime.datetime.now().isoformat(timespec="seconds")
    ids = [f"{m}/{c}" for m in models for c in cases]
    runs: dict[str, list[dict[str, Any]]] = {case_id: [] for case_id in ids}
    for _ in range(repeats):  # rounds interleave the cases: drift in the machine's load spreads over all of them
        for case_id in ids:
            runs[case_id].append(_spawn(case_id, timeout))
    summary = []
    for case_id in ids:
        ok = [r for r in runs[case_id] if "error" not in r]
        model, case = case_id.split("/")
        entry: dict[str, Any] = {"id": case_id, "model": model, "case": case, "label": CASES[case][0],
                                 "global_batch": MODELS[model], "runs": runs[case_id],
                                 "errors": [r["error"] for r in runs[case_id] if "error" in r]}
        if ok:
            entry.update({k: ok[0].get(k) for k in (*_NODES, "compiles", "replicas", "backend", "graphdist_file")})
            if not str(entry["graphdist_file"]).startswith(str(ROOT)):
                print(f"warning: {case_id} imported {entry['graphdist_file']}, not {ROOT}'s", file=sys.stderr)
            entry["median"] = {k: None if any(r.get(k) is None for r in ok) else median([r[k] for r in ok])
                               for k in (*STAGES, "import_s", "build_s", "other_build_s")}
        summary.append(entry)
    by_id = {e["id"]: e for e in summary}
    for entry in summary:
        base = by_id.get(f"{entry['model']}/{BASELINE}", {}).get("median")
        entry["vs_one_device"] = entry["median"]["total_s"] / base["total_s"] if base and "median" in entry else None
    commit, dirty = git_commit()
    return {"name": NAME, "commit": commit, "dirty": dirty, "tree": str(ROOT), "date": date, "machine": info,
            "repeats": repeats, "cases": summary}


def _commit(results: dict[str, Any]) -> str:
    return (results.get("commit") or "unknown")[:12] + (" + uncommitted changes" if results.get("dirty") else "")


def _s(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def table(results: dict[str, Any]) -> str:
    """Plain-text table of :func:`run`'s results (medians; ``other``: the rest of the build, e.g. lazy imports)."""
    columns = ("import_s", "trace_s", "passes_s", "compile_s", "other_build_s", "first_call_s", "total_s")
    lines = [f"time to first step, medians of {results['repeats']} fresh processes (s); commit {_commit(results)}",
             f"{'case':<24}{'traced':>7}{'rewr.':>7}{'segs':>5}{'builds':>7}"
             + "".join(f"{c.split('_')[0]:>9}" for c in columns) + f"{'x base':>8}"]
    for e in results["cases"]:
        if "median" not in e:
            lines.append(f"{e['id']:<24} FAILED: {e['errors'][-1].strip().splitlines()[-1:]}")
            continue
        lines.append(f"{e['id']:<24}{e['traced_nodes']:>7}{e['rewritten_nodes']:>7}{e['segments']:>5}"
                     f"{e.get('compiles') or '?':>7}"
                     + "".join(f"{_s(e['median'][c]):>9}" for c in columns) + f"{_s(e['vs_one_device'], 2):>8}")
    return "\n".join(lines)


def _pair(before: dict[str, Any] | None, after: dict[str, Any], key: str) -> str:
    """``before -> after`` of a median (or a graph size) of one case."""
    def get(entry: dict[str, Any] | None) -> Any:
        if not entry or "median" not in entry:
            return None
        return entry[key] if key in entry else entry["median"].get(key)

    b, a = get(before), get(after)
    fmt = (lambda v: str(v) if v is not None else "n/a") if key in _NODES else _s
    return fmt(a) if b == a and key in _NODES else f"{fmt(b)} → {fmt(a)}"


def markdown(results: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The "Time to first step" section; with ``before`` (or ``results["before"]``) a before/after table too."""
    before = before or results.get("before")
    out = ["## Time to first step", "",
           "A whole training step (`models.<model>.make_step`: `strategy.run` + `strategy.reduce` in one",
           "`gd.function`), built and called once in a fresh process with an empty compile cache",
           f"(`GRAPHDIST_CACHE_DIR`); medians of {results['repeats']} processes per case, seconds. Same global batch",
           "for every strategy of a model. trace: `Function._trace`; passes: the strategy's pass pipeline +",
           "partition (`PassManager.run`, `Plan.from_graph`); compile: `Plan.compile` (ONNX lowering + backend",
           "build); total: `get_concrete_function` + first call. TPU compiles with tvm (ORT cannot run TPU cores).",
           f"Commit `{_commit(results)}`, {results.get('date', '')}.", "",
           "| model (global batch) | strategy | backend | traced / rewritten nodes | segments | trace s | passes s "
           "| compile s | first call s | total s | vs one device |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in results["cases"]:
        if "median" not in e:
            out.append(f"| {e['model']} ({e['global_batch']}) | {e['label']} | failed | | | | | | | | |")
            continue
        m = e["median"]
        out.append(f"| {e['model']} ({e['global_batch']}) | {e['label']} | {e['backend']} | {e['traced_nodes']} / "
                   f"{e['rewritten_nodes']} | {e['segments']} | {_s(m['trace_s'])} | {_s(m['passes_s'])} | "
                   f"{_s(m['compile_s'])} | {_s(m['first_call_s'])} | {_s(m['total_s'])} | "
                   f"{_s(e['vs_one_device'], 2)}x |")
    if before:
        old = {e["id"]: e for e in before["cases"]}
        out += ["", f"Before (`{_commit(before)}`, {before.get('date', '')}) → after "
                "(this run), medians in seconds:", "",
                "| model | strategy | traced nodes | rewritten nodes | segments | trace s | passes s | compile s | "
                "total s | after / before |", "|---|---|---|---|---|---|---|---|---|---|"]
        for e in results["cases"]:
            b = old.get(e["id"])
            ratio = (e["median"]["total_s"] / b["median"]["total_s"]) if b and "median" in b and "median" in e \
                else None
            cells = [_pair(b, e, k) for k in (*_NODES[:2], "segments", "trace_s", "passes_s", "compile_s", "total_s")]
            out.append(f"| {e['model']} | {e['label']} | {' | '.join(cells)} | **{_s(ratio, 2)}x** |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark (or, with ``--one``, a single measurement); ``--write`` updates BENCHMARKS.md."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_first_step", description=__doc__.splitlines()[0])
    parser.add_argument("--one", metavar="MODEL/CASE", help="measure one case in this process (run() spawns these)")
    parser.add_argument("--json", action="store_true", help="with --one: print the measurement as one JSON line")
    parser.add_argument("--quick", action="store_true", help="MLP only, no TPU, one repeat (a smoke run)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per case (median reported)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--output", type=Path, help="save the results as JSON here")
    parser.add_argument("--before", type=Path, help="a saved JSON (--output) to compare against: before/after table")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.one:
        result = measure_one(args.one)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return 0
    results = run(quick=args.quick, repeats=args.repeats, models=args.models, cases=args.cases)
    report(args, results, table, markdown, lambda text: update_section(NAME, text, info=results["machine"]))
    failed = [e["id"] for e in results["cases"] if "median" not in e]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
