"""Compile time against graph size: load + first call of an ONNX model of 1k, 10k and 100k nodes vs ONNX Runtime.

The path users take: ``model = gd.onnx.load(path)`` (outside any scope: the default strategy, its float
initializers become variables) and the first call of ``gd.function(lambda x: model(x))``, which traces the
model, runs the pass pipeline, partitions, lowers the segment to ONNX and compiles it with ONNX Runtime (through
the disk cache: an EXTENDED-optimized model is written, then the session that runs is created from it, see
:mod:`graphdist.backends.ort`). Against it, in the same process and on the same file: creating an
``onnxruntime.InferenceSession`` (``CPUExecutionProvider``, default options), the baseline; and a session of the
same model with its initializers turned into graph inputs (what a graphdist segment is: the weights are
variables, fed on every step).

The model is synthetic (:func:`ladder_model`): a ladder of two rails of ``[4, 8]`` float tensors, four nodes per
rung (``a' = Tanh(a + b)``, ``b' = b * w_k - (a' or x)``): one weight per rung (25,000 variables at 100k nodes)
and the model input ``x`` read by every other rung (a value with 12,500 readers at 100k nodes), the shapes
that made verification quadratic. The outputs of graphdist and ONNX Runtime are compared.

One measurement is one FRESH process (``--one NODES``) with an empty ``GRAPHDIST_CACHE_DIR`` (cold: every
segment is compiled); a second process on the same directory measures the run of a later process (warm:
ONNX Runtime loads the optimized model from the disk cache). Before timing, each process loads and calls a
64-node model through both, so one-time initialisation (imports, ONNX Runtime's environment) is not counted.
Stages are timed by wrapping the private stage boundaries, as :mod:`benchmarks.bench_first_step` does. Each
process also measures the share of the machine's CPU time other processes took meanwhile
(:class:`benchmarks.quiet.CpuMeter`): the host is shared, and timings are only compared within a process.

Goal: at 100k nodes, cold load + first call within 2x ONNX Runtime's session creation, and the time per node
growing no faster than the baseline's from 10k to 100k nodes.

    python -m benchmarks.bench_compile_time [--sizes 1000 10000 100000] [--repeats 1] [--write]
    python -m benchmarks.bench_compile_time --one 10000 --json     # one measurement (what run() spawns)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import git_commit, json_child, machine_info, median, replace_section, report

__all__ = ["NAME", "GOAL", "SIZES", "ladder_model", "measure_one", "run", "table", "markdown", "main"]

NAME = "compile_time"
#: At the largest size: graphdist's cold load + first call / ONNX Runtime's session creation.
GOAL = 2.0
SIZES = (1000, 10000, 100000)
ROOT = Path(__file__).resolve().parent.parent
WIDTH = 8
BATCH = 4
_STAGES = ("load_s", "trace_s", "passes_s", "compile_s", "first_call_s", "total_s")


def ladder_model(nodes: int, seed: int = 0) -> Any:
    """A model of exactly ``nodes`` nodes (at least 6): a ladder of two rails with one weight per rung.

    ``x: float32[4, 8]``; ``b0 = -x``; rung ``k``: ``s = a + b``, ``t = Tanh(s)``, ``m = b * w_k``,
    ``b' = m - (x if k is odd else t)``, ``a' = t``; identities pad to ``nodes``; ``y = a + b``.
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    if nodes < 6:
        raise ValueError(f"a ladder needs at least 6 nodes, got {nodes}")
    rng = np.random.default_rng(seed)
    graph_nodes = [helper.make_node("Neg", ["x"], ["b_start"], name="start")]
    weights = []
    a, b, k = "x", "b_start", 0
    while len(graph_nodes) + 5 <= nodes:
        weights.append(numpy_helper.from_array(rng.uniform(0.9, 1.0, WIDTH).astype(np.float32), f"w{k}"))
        graph_nodes += [
            helper.make_node("Add", [a, b], [f"s{k}"], name=f"add{k}"),
            helper.make_node("Tanh", [f"s{k}"], [f"t{k}"], name=f"tanh{k}"),
            helper.make_node("Mul", [b, f"w{k}"], [f"m{k}"], name=f"mul{k}"),
            helper.make_node("Sub", [f"m{k}", "x" if k % 2 else f"t{k}"], [f"b{k}"], name=f"sub{k}"),
        ]
        a, b, k = f"t{k}", f"b{k}", k + 1
    while len(graph_nodes) < nodes - 1:
        graph_nodes.append(helper.make_node("Identity", [a], [f"pad{len(graph_nodes)}"], name=f"pad{len(graph_nodes)}"))
        a = graph_nodes[-1].output[0]
    graph_nodes.append(helper.make_node("Add", [a, b], ["y"], name="end"))
    graph = helper.make_graph(graph_nodes, f"ladder{nodes}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, WIDTH])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench")
    model.ir_version = 10
    return model


def _weights_as_inputs(model: Any) -> Any:
    import onnx
    from onnx import helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    weights = list(copy.graph.initializer)
    del copy.graph.initializer[:]
    copy.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in weights)
    return copy


def _ort_session_s(path: str) -> tuple[float, Any]:
    import onnxruntime as ort

    start = time.perf_counter()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start, session


def measure_one(nodes: int, ort_first: bool = True) -> dict[str, Any]:
    """One measurement at ``nodes`` in this process (which must be fresh; its cache directory decides cold/warm).

    Returns:
        Seconds per stage and for the baselines, the outputs' largest difference, CPU share of other processes.
    """
    start = time.perf_counter()
    import numpy as np
    import onnx

    import graphdist as gd
    from benchmarks.bench_first_step import _install_hooks
    from benchmarks.quiet import CpuMeter

    import_s = time.perf_counter() - start
    x = np.random.default_rng(1).standard_normal((BATCH, WIDTH)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="bench-compile-time-") as tmp:
        paths = {}
        for name, model in (("warmup", ladder_model(64, seed=1)), ("model", ladder_model(nodes)),
                            ("inputs", _weights_as_inputs(ladder_model(nodes)))):
            paths[name] = os.path.join(tmp, f"{name}.onnx")
            onnx.save(model, paths[name])
        _ort_session_s(paths["warmup"])  # one-time initialisation of both, not timed
        warm = gd.onnx.load(paths["warmup"])
        gd.function(lambda v: warm(v))(x)

        meter = CpuMeter()
        mark = meter.start()
        result: dict[str, Any] = {"nodes": nodes, "graphdist_file": gd.__file__, "import_s": import_s}

        def baselines() -> Any:
            result["ort_s"], session = _ort_session_s(paths["model"])
            result["ort_inputs_s"], _ = _ort_session_s(paths["inputs"])
            return session

        session = baselines() if ort_first else None
        function_class = type(gd.function(lambda v: v))
        timings = _install_hooks(gd, function_class)
        begin = time.perf_counter()
        model = gd.onnx.load(paths["model"])
        loaded = time.perf_counter()
        step = gd.function(lambda v: model(v))
        y = step(x)
        end = time.perf_counter()
        if session is None:
            session = baselines()
        result["foreign_cpu"] = meter.foreign(mark)
        expected = session.run(None, {"x": x})[0]

    def stage(*keys: str) -> float | None:
        return sum(sum(timings[k]) for k in keys) if timings[keys[0]] else None

    result.update({
        "load_s": loaded - begin, "trace_s": stage("trace"), "passes_s": stage("passes", "plan"),
        "compile_s": stage("compile"), "first_call_s": end - loaded, "total_s": end - begin,
        "max_abs_diff": float(np.max(np.abs(np.asarray(y) - expected))),
        "variables": len(model.variables), "ort_first": ort_first,
    })
    snapshot = getattr(getattr(gd, "stats", None), "snapshot", None)
    counts = snapshot() if callable(snapshot) else {}
    result["compiles"], result["disk_cache_hits"] = counts.get("compiles"), counts.get("disk_cache_hits")
    return result


def _spawn(nodes: int, cache: str, ort_first: bool, timeout: float) -> dict[str, Any]:
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p)
    env = {**os.environ, "GRAPHDIST_CACHE_DIR": cache, "PYTHONPATH": path}
    command = [sys.executable, "-m", "benchmarks.bench_compile_time", "--one", str(nodes), "--json",
               "--order", "ort-first" if ort_first else "graphdist-first"]
    return json_child(command, env, timeout, {"nodes": nodes})


def run(quick: bool = False, sizes: Sequence[int] = SIZES, repeats: int = 1, warm: bool = True,
        timeout: float = 1800.0) -> dict[str, Any]:
    """Measures every size ``repeats`` times (cold, then warm from the same cache), each in a fresh process.

    ``quick``: 300 and 3,000 nodes, once (a smoke run). Rounds interleave the sizes and alternate which of
    ONNX Runtime and graphdist goes first in a process.

    Returns:
        Machine, commit, and per size the runs and the medians; ``goal_met`` at the largest size.
    """
    if quick:
        sizes, repeats = (300, 3000), 1
    info, date = machine_info(), datetime.datetime.now().isoformat(timespec="seconds")
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {n: {"cold": [], "warm": []} for n in sizes}
    for round_index in range(repeats):
        for nodes in sizes:
            with tempfile.TemporaryDirectory(prefix="bench-compile-time-cache-") as cache:
                ort_first = round_index % 2 == 0
                runs[nodes]["cold"].append(_spawn(nodes, cache, ort_first, timeout))
                if warm:
                    runs[nodes]["warm"].append(_spawn(nodes, cache, ort_first, timeout))
    keys = (*_STAGES, "ort_s", "ort_inputs_s", "import_s", "foreign_cpu", "max_abs_diff")
    summary = []
    for nodes in sizes:
        entry: dict[str, Any] = {"nodes": nodes, "runs": runs[nodes]}
        for kind in ("cold", "warm"):
            ok = [r for r in runs[nodes][kind] if "error" not in r]
            entry[f"{kind}_errors"] = [r["error"] for r in runs[nodes][kind] if "error" in r]
            if ok:
                entry[kind] = {k: None if any(r.get(k) is None for r in ok) else median([r[k] for r in ok])
                               for k in keys}
                entry[kind]["vs_ort"] = median([r["total_s"] / r["ort_s"] for r in ok])  # within each process
                entry[kind]["us_per_node"] = entry[kind]["total_s"] / nodes * 1e6
                entry[kind]["ort_us_per_node"] = entry[kind]["ort_s"] / nodes * 1e6
                entry.update({k: ok[0].get(k) for k in ("variables", "graphdist_file")})
                entry[f"{kind}_compiles"] = (ok[0].get("compiles"), ok[0].get("disk_cache_hits"))
        summary.append(entry)
    largest = next((e for e in reversed(summary) if "cold" in e), None)
    commit, dirty = git_commit()
    return {"name": NAME, "commit": commit, "dirty": dirty, "date": date, "machine": info, "repeats": repeats,
            "sizes": summary, "goal": GOAL,
            "goal_met": bool(largest and largest["nodes"] == max(sizes) and largest["cold"]["vs_ort"] <= GOAL)}


def _s(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _growth(results: dict[str, Any], kind: str, key: str) -> str:
    """Time per node at the largest size / at the one before (1.0: linear)."""
    rows = [e for e in results["sizes"] if kind in e]
    if len(rows) < 2:
        return "n/a"
    return _s(rows[-1][kind][key] / rows[-2][kind][key])


def _own_growth(results: dict[str, Any]) -> str:
    """Time per node of graphdist's own stages (load, trace, passes) at the largest size / the one before."""
    rows = [e for e in results["sizes"] if "cold" in e and None not in (e["cold"]["trace_s"], e["cold"]["passes_s"])]
    if len(rows) < 2:
        return "n/a"
    per_node = [(e["cold"]["load_s"] + e["cold"]["trace_s"] + e["cold"]["passes_s"]) / e["nodes"] for e in rows[-2:]]
    return _s(per_node[1] / per_node[0])


def table(results: dict[str, Any]) -> str:
    """Plain-text table of :func:`run`'s results (medians, seconds)."""
    lines = [f"load + first call vs ONNX Runtime session creation, medians of {results['repeats']} process(es) (s); "
             f"commit {(results.get('commit') or 'unknown')[:12]}{' + changes' if results.get('dirty') else ''}",
             f"{'nodes':>8}{'ort':>8}{'ort-in':>8}{'load':>8}{'trace':>8}{'passes':>8}{'compile':>9}{'total':>8}"
             f"{'x ort':>7}{'us/node':>9}{'warm':>8}{'x ort':>7}{'other':>7}"]
    for e in results["sizes"]:
        if "cold" not in e:
            lines.append(f"{e['nodes']:>8} FAILED: {(e['cold_errors'] or ['?'])[-1].strip().splitlines()[-1:]}")
            continue
        c, w = e["cold"], e.get("warm", {})
        lines.append(f"{e['nodes']:>8}{_s(c['ort_s']):>8}{_s(c['ort_inputs_s']):>8}{_s(c['load_s']):>8}"
                     f"{_s(c['trace_s']):>8}{_s(c['passes_s']):>8}{_s(c['compile_s']):>9}{_s(c['total_s']):>8}"
                     f"{_s(c['vs_ort']):>7}{_s(c['us_per_node'], 0):>9}{_s(w.get('total_s')):>8}"
                     f"{_s(w.get('vs_ort')):>7}{_s(c['foreign_cpu']):>7}")
    lines.append(f"time per node, largest size / the one before: graphdist {_growth(results, 'cold', 'us_per_node')}, "
                 f"ONNX Runtime {_growth(results, 'cold', 'ort_us_per_node')}; goal (x ort <= {GOAL} at the "
                 f"largest size) {'met' if results['goal_met'] else 'missed'}")
    return "\n".join(lines)


def markdown(results: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The "Compile time against graph size" section; with ``before`` a before/after table too."""
    info = results["machine"]
    before = before or results.get("before")
    out = ["## Compile time against graph size: load + first call vs ONNX Runtime", "",
           "`model = gd.onnx.load(path)` and the first call of `gd.function(lambda x: model(x))` (trace, passes,",
           "partition, ONNX lowering, ONNX Runtime compile through the disk cache) on a synthetic ladder model",
           "(`benchmarks.bench_compile_time.ladder_model`: 4 nodes and 1 weight per rung, the input read by every",
           "other rung), against creating an `onnxruntime.InferenceSession` on the same file in the same process",
           "(ort), and on the same model with its weights as graph inputs (ort-in: what a graphdist segment is, its",
           "weights being variables). Cold: a fresh process with an empty compile cache; warm: a second process on",
           "that cache (ONNX Runtime loads the optimized model; a segment of more than 20,000 nodes has no disk entry,",
           "`graphdist.backends.ort.OFFLINE_MAX_NODES`, so at 100k the warm process compiles as the cold one does).",
           "Seconds, medians of "
           f"{results['repeats']} process(es); x ort is the ratio",
           "within each process. other CPU: the share of the machine's CPU time other processes took during the",
           "measurement (the host was shared with other work: compare ratios, not seconds, across rows).",
           f"Machine: {info['cpu']}, {info['nproc']} usable cores; load average {info.get('loadavg')} at the start. "
           f"Commit `{(results.get('commit') or 'unknown')[:12]}`"
           f"{' + uncommitted changes' if results.get('dirty') else ''}, {results.get('date', '')}.", "",
           "| nodes (variables) | ort s | ort-in s | load s | trace s | passes s | compile s | cold total s | "
           "cold x ort | µs per node | warm total s | warm x ort | other CPU |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in results["sizes"]:
        if "cold" not in e:
            out.append(f"| {e['nodes']:,} | failed | | | | | | | | | | | |")
            continue
        c, w = e["cold"], e.get("warm", {})
        out.append(f"| {e['nodes']:,} ({e.get('variables', 0):,}) | {_s(c['ort_s'])} | {_s(c['ort_inputs_s'])} | "
                   f"{_s(c['load_s'])} | {_s(c['trace_s'])} | {_s(c['passes_s'])} | {_s(c['compile_s'])} | "
                   f"{_s(c['total_s'])} | **{_s(c['vs_ort'])}x** | {_s(c['us_per_node'], 0)} | "
                   f"{_s(w.get('total_s'))} | {_s(w.get('vs_ort')) + 'x' if w else 'n/a'} | "
                   f"{_s(100 * (c['foreign_cpu'] or 0), 0)}% |")
    out += ["", f"Time per node from the second largest to the largest size: graphdist x"
            f"{_growth(results, 'cold', 'us_per_node')} (1.00: linear; it includes ONNX Runtime's session on the "
            f"segment), graphdist's own stages (load, trace, passes) x{_own_growth(results)}, ONNX Runtime x"
            f"{_growth(results, 'cold', 'ort_us_per_node')}. Goal: cold x ort <= {GOAL} at the largest size: "
            f"{'met' if results['goal_met'] else 'missed'}. Outputs equal ONNX Runtime's (largest difference "
            f"{max((e['cold']['max_abs_diff'] for e in results['sizes'] if 'cold' in e), default=0):.1e})."]
    if before:
        old = {e["nodes"]: e for e in before["sizes"]}
        commit = (before.get("commit") or "unknown")[:12]
        out += ["", f"Before (`{commit}`, {before.get('date', '')}: the same benchmark run on that commit's tree, "
                "a separate run) → after (this run), cold, seconds:", "",
                "| nodes | ort s | load s | trace s | passes s | compile s | total s | x ort |",
                "|---|---|---|---|---|---|---|---|"]
        for e in results["sizes"]:
            b = old.get(e["nodes"], {}).get("cold")
            a = e.get("cold")
            if not b or not a:
                continue
            cells = [f"{_s(b[k])} → {_s(a[k])}" for k in ("ort_s", "load_s", "trace_s", "passes_s", "compile_s",
                                                          "total_s")]
            out.append(f"| {e['nodes']:,} | {' | '.join(cells)} | {_s(b['vs_ort'])}x → **{_s(a['vs_ort'])}x** |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark (or, with ``--one``, a single measurement); ``--write`` updates BENCHMARKS.md."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_compile_time",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--one", type=int, metavar="NODES", help="measure one size in this process")
    parser.add_argument("--json", action="store_true", help="with --one: print the measurement as one JSON line")
    parser.add_argument("--order", choices=("ort-first", "graphdist-first"), default="ort-first",
                        help="with --one: which of the two is measured first")
    parser.add_argument("--quick", action="store_true", help="300 and 3,000 nodes, once (a smoke run)")
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per size (median reported)")
    parser.add_argument("--no-warm", action="store_true", help="skip the second (warm cache) process")
    parser.add_argument("--output", type=Path, help="save the results as JSON here")
    parser.add_argument("--before", type=Path, help="a saved JSON (--output) to compare against")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.one:
        result = measure_one(args.one, ort_first=args.order == "ort-first")
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return 0
    results = run(quick=args.quick, sizes=args.sizes, repeats=args.repeats, warm=not args.no_warm)
    report(args, results, table, markdown, lambda text: replace_section(NAME, text))
    failed = [e["nodes"] for e in results["sizes"] if "cold" not in e]
    return 1 if failed or not results["goal_met"] else 0


if __name__ == "__main__":
    sys.exit(main())
