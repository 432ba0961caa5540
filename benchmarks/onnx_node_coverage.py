"""ONNX node tests: how many of ONNX's own node test cases graphdist runs, next to plain ONNX Runtime.

Every node test case of the installed ``onnx`` (``onnx.backend.test.loader.load_model_tests(kind="node")``:
the cases ONNX's backend test suite runs, generated in memory by ONNX's own generators, deterministic:
each generator seeds numpy with 0) runs, in this process and on the same inputs,

* through a plain ``onnxruntime.InferenceSession`` (``CPUExecutionProvider``, the model as generated), and
* through :mod:`graphdist.onnx.backend` (``prepare(model, backend=...).run(inputs)``) on each graphdist
  backend asked for (``ort``, ``tvm``; ``tvm`` runs what graphdist's tvm backend runs, including any
  op it hands elsewhere).

A run passes when every data set's outputs match the expected outputs ONNX generated, by ONNX's own
comparison (``onnx.backend.test.runner.Runner.assert_similar_outputs``: shapes, dtypes, and values within
the case's rtol/atol). The numbers: cases, ORT passes, graphdist passes, graphdist passes among ORT's passes
(the goal: at least 97% on ort, 90% on tvm), and the failures grouped by reason.

Compiles use a temporary, empty ``GRAPHDIST_CACHE_DIR`` (removed after), so the times are cold compiles
and the user's cache is left alone.

    python -m benchmarks.onnx_node_coverage [--backends ort tvm] [--only SUBSTRING ...] [--output FILE.json]
                                            [--no-save] [--write]
    python -m benchmarks.onnx_node_coverage --from-json benchmarks/onnx_node_coverage.json --write

The results are saved to ``benchmarks/onnx_node_coverage.json`` (``--output``); ``--write`` updates the
"ONNX node tests" section of BENCHMARKS.md. Not part of ``make bench`` (``run_all`` runs ``bench_*``
modules): it measures coverage, not speed, and takes minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import BENCHMARKS_MD, machine_info, machine_markdown, replace_section

__all__ = ["NAME", "GOALS", "JSON_PATH", "FUNCTION_PATH", "node_cases", "reason_of", "run_case", "run", "table",
           "markdown", "label", "write_section", "main"]

logger = logging.getLogger(__name__)

NAME = "onnx_node_tests"
#: Minimum share of ORT's passes that graphdist must pass, per backend.
GOALS = {"ort": 0.97, "tvm": 0.90, "function:ort": 0.97, "function:tvm": 0.90}
#: Prefix of a backend name measured through ``gd.function(gd.onnx.load(...))`` (the path that distributes a
#: model) instead of ``graphdist.onnx.backend``: ``function:ort``, ``function:tvm``.
FUNCTION_PATH = "function:"
JSON_PATH = Path(__file__).resolve().parent / "onnx_node_coverage.json"
_ORT = "onnxruntime"


def node_cases(only: Sequence[str] | None = None) -> list[Any]:
    """ONNX's node test cases (``onnx.backend.test.case.test_case.TestCase``), sorted by name.

    Args:
        only: Keep the cases whose name contains one of these substrings (default: all).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        from onnx.backend.test.loader import load_model_tests

        cases = load_model_tests(kind="node")
    cases = sorted(cases, key=lambda c: c.name)
    if only:
        cases = [c for c in cases if any(s in c.name for s in only)]
    return cases


def _data_sets(case: Any) -> list[tuple[list[Any], list[Any]]]:
    """The case's data sets with TensorProtos as arrays (as ``BackendTest`` normalizes them)."""
    from onnx.backend.test.runner import _normalize_tensor

    return [([_normalize_tensor(x) for x in inputs], [_normalize_tensor(y) for y in outputs])
            for inputs, outputs in case.data_sets]


_QUOTED = re.compile(r"'[^'\s]*'|\"[^\"\s]*\"")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def reason_of(err: BaseException) -> str:
    """A failure's reason with case-specific names taken out, so that equal failures group together."""
    if isinstance(err, AssertionError):
        text = " ".join(str(err).split())
        if "incorrect shape" in text:
            return "wrong output shape"
        if "dtype(" in text:
            return "wrong output dtype"
        if "Items are not equal" in text:
            return "wrong number of outputs"
        return "wrong values (outside the case's rtol/atol)"
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    first = _ADDRESS.sub("0x…", _QUOTED.sub("'…'", first))
    first = re.sub(r"/onnxruntime_src/\S+", "", first)
    first = re.split(r"\.? (?:Feeds given|Inputs expected):", first)[0]
    first = re.sub(r"\d+", "N", first)
    return f"{type(err).__name__}: {first[:140]}"


def _check(case: Any, data: list[tuple[list[Any], list[Any]]], run_one: Any) -> tuple[bool, str]:
    """Runs every data set and compares with ONNX's comparison: ``(passed, reason)``."""
    from onnx.backend.test.runner import Runner

    try:
        for inputs, expected in data:
            outputs = run_one(inputs)
            Runner.assert_similar_outputs(expected, list(outputs), rtol=case.rtol, atol=case.atol,
                                          model_dir=case.name)
    except Exception as err:  # noqa: BLE001 - every failure is a counted result
        return False, reason_of(err)
    return True, "pass"


def run_case(case: Any, backend: str) -> tuple[bool, str]:
    """Runs one case on ``backend`` (``"onnxruntime"``: a plain session; else graphdist's ONNX backend).

    Returns:
        ``(passed, reason)``; the reason is ``"pass"`` or the failure, grouped (:func:`reason_of`).
    """
    data = _data_sets(case)
    if backend == _ORT:
        import onnxruntime

        session: Any = None

        def run_ort(inputs: list[Any]) -> list[Any]:
            nonlocal session
            if session is None:
                options = onnxruntime.SessionOptions()
                options.log_severity_level = 4
                session = onnxruntime.InferenceSession(case.model.SerializeToString(), options,
                                                       providers=["CPUExecutionProvider"])
            # numpy scalars (some cases' inputs) as 0-d arrays, which ORT's Python API takes; sequences as lists.
            feeds = {i.name: np.asarray(x) if isinstance(x, (np.generic, bool, int, float)) else x
                     for i, x in zip(session.get_inputs(), inputs)}
            return session.run(None, feeds)

        return _check(case, data, run_ort)
    if backend.startswith(FUNCTION_PATH):
        return _check(case, data, _function_runner(case.model, backend.removeprefix(FUNCTION_PATH)))
    from graphdist.onnx.backend import prepare

    rep: Any = None

    def run_graphdist(inputs: list[Any]) -> Any:
        nonlocal rep
        if rep is None:
            rep = prepare(case.model, "CPU", backend=backend)
        return rep.run(inputs)

    return _check(case, data, run_graphdist)


def _function_runner(model: Any, backend: str) -> Any:
    """Runs ``model`` the way a model is distributed: ``gd.function(gd.onnx.load(model, trainable=False))``."""
    import graphdist as gd

    step: Any = None

    def run_function(inputs: list[Any]) -> list[Any]:
        nonlocal step
        if step is None:
            step = gd.function(gd.onnx.load(model, trainable=False), backend=backend)
        outputs = step(*inputs)
        return list(outputs) if isinstance(outputs, tuple) else [outputs]

    return run_function


@contextlib.contextmanager
def _fresh_cache() -> Iterator[str]:
    """A temporary, empty ``GRAPHDIST_CACHE_DIR`` for the block (the old value restored after)."""
    old = os.environ.get("GRAPHDIST_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="graphdist-node-tests-") as path:
        os.environ["GRAPHDIST_CACHE_DIR"] = path
        try:
            yield path
        finally:
            if old is None:
                os.environ.pop("GRAPHDIST_CACHE_DIR", None)
            else:
                os.environ["GRAPHDIST_CACHE_DIR"] = old


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """ORT's and TVM's own log lines would drown the progress lines; the loggers' levels are put back
    after (the smoke test runs this inside the test process, whose later tests read graphdist's warnings).
    """
    with contextlib.suppress(ImportError):
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)
    loggers = [logging.getLogger(name) for name in ("graphdist", "tvm")]
    levels = [logger.level for logger in loggers]
    for quiet in loggers:
        quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for quiet, level in zip(loggers, levels):
            quiet.setLevel(level)


def run(backends: Sequence[str] = ("ort", "tvm"), only: Sequence[str] | None = None, quick: bool = False,
        progress: bool = False) -> dict[str, Any]:
    """Runs the node cases through plain ORT and graphdist's ONNX backend on ``backends``.

    Args:
        backends: graphdist backends (``"ort"``, ``"tvm"``, ``"reference"``).
        only: Only the cases whose name contains one of these substrings.
        quick: Only the first 40 cases (a smoke run).
        progress: Log a line every 200 cases.

    Returns:
        ``machine``, ``onnx``/``onnxruntime`` versions, ``cases``, ``ort`` (plain ORT: ``passes``,
        ``seconds``, ``failures`` grouped, ``failed``: name -> reason), and per graphdist backend under
        ``backends`` the same and ``passes_among_ort``, ``share_of_ort`` (passes among ORT's / ORT's
        passes), ``goal``, ``goal_met``, ``only_graphdist`` (passes ORT fails), ``failing_ort_passes``
        (name -> reason: the cases ORT passes and graphdist fails); ``goal_met`` (every backend's).
    """
    import onnx
    import onnxruntime

    info = machine_info()
    cases = node_cases(only)
    if quick:
        cases = cases[:40]
    results: dict[str, Any] = {"machine": info, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                               "cases": len(cases), "backends": {}}
    outcome: dict[str, dict[str, tuple[bool, str]]] = defaultdict(dict)
    with _fresh_cache(), warnings.catch_warnings(), _quiet_logs():
        warnings.simplefilter("ignore")
        for backend in (_ORT, *backends):
            start = time.perf_counter()
            for index, case in enumerate(cases):
                outcome[backend][case.name] = run_case(case, backend)
                if progress and (index + 1) % 200 == 0:
                    logger.info("%s: %d/%d cases", backend, index + 1, len(cases))
            seconds = time.perf_counter() - start
            passed = {name for name, (ok, _) in outcome[backend].items() if ok}
            failures = Counter(reason for ok, reason in outcome[backend].values() if not ok)
            entry = {"passes": len(passed), "seconds": round(seconds, 1),
                     "failures": dict(failures.most_common()),
                     "failed": {name: reason for name, (ok, reason) in sorted(outcome[backend].items()) if not ok}}
            if backend == _ORT:
                results["ort"] = entry
                continue
            ort_passed = {name for name, (ok, _) in outcome[_ORT].items() if ok}
            among = passed & ort_passed
            share = len(among) / len(ort_passed) if ort_passed else None
            goal = GOALS.get(backend)
            entry.update({
                "passes_among_ort": len(among),
                "share_of_ort": None if share is None else round(share, 4),
                "goal": goal,
                "goal_met": None if goal is None or share is None else share >= goal,
                "only_graphdist": sorted(passed - ort_passed),
                "failing_ort_passes": {name: outcome[backend][name][1] for name in sorted(ort_passed - passed)},
            })
            results["backends"][backend] = entry
    met = [e["goal_met"] for e in results["backends"].values() if e["goal_met"] is not None]
    results["goal_met"] = all(met) if met else None
    return results


def label(backend: str) -> str:
    """How a result row names the path it measures and its backend."""
    if backend.startswith(FUNCTION_PATH):
        return f"`gd.function(gd.onnx.load(m))` on `{backend.removeprefix(FUNCTION_PATH)}`"
    return f"`graphdist.onnx.backend` on `{backend}`"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def table(results: dict[str, Any]) -> str:
    """A plain-text summary."""
    ort = results["ort"]
    lines = [f"ONNX node tests (onnx {results['onnx']}): {results['cases']} cases; plain ORT "
             f"{results['onnxruntime']} passes {ort['passes']} ({ort['seconds']} s)"]
    for backend, e in results["backends"].items():
        goal = "" if e["goal"] is None else f", goal {_pct(e['goal'])}: {'met' if e['goal_met'] else 'MISSED'}"
        lines.append(f"{label(backend)}: passes {e['passes']}; {e['passes_among_ort']} of ORT's {ort['passes']} "
                     f"({_pct(e['share_of_ort'])}{goal}); {len(e['only_graphdist'])} that ORT fails "
                     f"({e['seconds']} s)")
        for reason, count in list(e["failures"].items())[:12]:
            lines.append(f"    {count:5d}  {reason}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: dict[str, Any]) -> str:
    """The "ONNX node tests" section of BENCHMARKS.md."""
    ort = results["ort"]
    out = ["## ONNX node tests", "",
           f"Every node test case of onnx {results['onnx']}",
           "(`onnx.backend.test.loader.load_model_tests(kind=\"node\")`, generated by ONNX's own generators: the",
           "node cases of `onnx.backend.test.BackendTest`), run in one process on",
           f"the same inputs through a plain ONNX Runtime {results['onnxruntime']} session (`CPUExecutionProvider`)",
           "and through graphdist by two paths: `graphdist.onnx.backend` (`prepare(model, backend=...)`, ONNX's",
           "backend API) and `gd.function(gd.onnx.load(model, trainable=False), backend=...)` (the path that",
           "distributes a model: every input a traced argument), compared with ONNX's own",
           "comparison (`Runner.assert_similar_outputs`: shape, dtype, values within the case's rtol/atol).",
           "Cold compiles (empty `GRAPHDIST_CACHE_DIR`); the seconds are the whole pass over the cases (import,",
           "compile, run, compare). Source: `benchmarks/onnx_node_coverage.py`",
           "(`python -m benchmarks.onnx_node_coverage --write`; per-case results in",
           "`benchmarks/onnx_node_coverage.json`).",
           "",
           "Machine for these numbers: " + machine_markdown(results["machine"]).split("\n", 2)[2].removeprefix("- ")
           .replace("\n- ", "; ") + ".",
           "",
           "**Goal:** graphdist passes at least 97% (ort) / 90% (tvm) of the cases plain ORT passes, by each path.",
           "",
           "| runs on | passes | of ORT's passes | share of ORT's | passes ORT fails | goal | seconds |",
           "|---|---:|---:|---:|---:|---|---:|",
           f"| plain ONNX Runtime | {ort['passes']} / {results['cases']} | {ort['passes']} | 100% | | | "
           f"{ort['seconds']} |"]
    for backend, e in results["backends"].items():
        goal = "" if e["goal"] is None else f"{_pct(e['goal'])}: {'met' if e['goal_met'] else '**missed**'}"
        out.append(f"| {label(backend)} | {e['passes']} / {results['cases']} | {e['passes_among_ort']} / "
                   f"{ort['passes']} | **{_pct(e['share_of_ort'])}** | {len(e['only_graphdist'])} | {goal} | "
                   f"{e['seconds']} |")
    for backend, e in results["backends"].items():
        if e["only_graphdist"]:
            out += ["", f"{label(backend)} passes {len(e['only_graphdist'])} that plain ORT fails: "
                    + ", ".join(f"`{n}`" for n in e["only_graphdist"]) + "."]
    for backend, e in results["backends"].items():
        failing = e["failing_ort_passes"]
        out += ["", f"### {label(backend)}: failures among ORT's passes ({len(failing)})", ""]
        if not failing:
            out.append("None.")
            continue
        grouped: dict[str, list[str]] = defaultdict(list)
        for name, reason in failing.items():
            grouped[reason].append(name)
        out += ["| cases | reason | examples |", "|---:|---|---|"]
        for reason, names in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            examples = ", ".join(f"`{n}`" for n in names[:4]) + (", ..." if len(names) > 4 else "")
            out.append(f"| {len(names)} | {_cell(reason)} | {examples} |")
    out += ["", "### All failures by reason (including the cases ORT fails too)", "",
            "| reason | " + " | ".join(["ORT", *(label(b) for b in results["backends"])]) + " |",
            "|---|" + "---:|" * (1 + len(results["backends"]))]
    columns = [ort["failures"], *(e["failures"] for e in results["backends"].values())]
    reasons = sorted({r for c in columns for r in c}, key=lambda r: -sum(c.get(r, 0) for c in columns))
    for reason in reasons[:15]:
        out.append(f"| {_cell(reason)} | " + " | ".join(str(c.get(reason, "")) for c in columns) + " |")
    if len(reasons) > 15:
        out.append(f"| ({len(reasons) - 15} more reasons: see the JSON) |" + " |" * len(columns))
    return "\n".join(out)


def write_section(text: str, path: Path = BENCHMARKS_MD) -> Path:
    """Replaces this benchmark's section of BENCHMARKS.md, or appends it; leaves every other section alone
    (the machine section too: this section states its own machine)."""
    return replace_section(NAME, text, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the coverage; saves the JSON, prints the summary; ``--write`` updates BENCHMARKS.md.

    Returns:
        0 when every backend with a goal met it, 1 otherwise.
    """
    import json

    parser = argparse.ArgumentParser(prog="python -m benchmarks.onnx_node_coverage",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["ort", "tvm", "function:ort", "function:tvm"],
                        choices=["ort", "tvm", "reference", "function:ort", "function:tvm"])
    parser.add_argument("--only", nargs="+", metavar="SUBSTRING", help="only the cases whose name contains one")
    parser.add_argument("--quick", action="store_true", help="the first 40 cases only (a smoke run)")
    parser.add_argument("--output", type=Path, default=JSON_PATH, help="JSON results (default: %(default)s)")
    parser.add_argument("--no-save", action="store_true", help="do not write the JSON")
    parser.add_argument("--write", action="store_true", help="update the section of BENCHMARKS.md")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="no run: the markdown (and --write) of results saved earlier")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        print(markdown(results))
        if args.write:
            print(f"updated {write_section(markdown(results))}")
        return 0
    results = run(backends=args.backends, only=args.only, quick=args.quick, progress=True)
    if not args.no_save:
        args.output.write_text(json.dumps(results, indent=1) + "\n")
        print(f"saved {args.output}")
    print(table(results))
    if args.write:
        print(f"updated {write_section(markdown(results))}")
    return 0 if results["goal_met"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
