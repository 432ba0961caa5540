"""ResNet50 inference: an imported ONNX model under Mirrored(2) against one ONNX Runtime session.

The model is the onnx wheel's ResNet-50 zoo architecture with seeded random
weights (:mod:`graphdist.models.onnx_zoo`). Every variant computes the same global
batch of 8 images, in one process, timed in interleaved rounds
(:func:`benchmarks.quiet.quiet_rounds`: the order reversed every other
round; rounds in which other processes took more than 10% of the CPU time
are repeated, within a budget):

* ``ONNX Runtime``: one ``InferenceSession`` (``CPUExecutionProvider``,
  intra-op threads = usable cores) on the whole batch: the baseline;
* ``graphdist Mirrored(2), weights constant``: ``gd.onnx.load(model,
  trainable=False)`` in ``gd.MirroredStrategy(["cpu:0", "cpu:1"])``'s scope,
  a ``gd.function`` running ``strategy.run(model, ...)`` on the two halves
  (4 images per replica, as a distributed dataset hands them over) and
  gathering the outputs;
* ``graphdist Mirrored(2), weights variables``: the same with ``gd.onnx.load(model)``:
  the weights are ``MirroredVariable`` s, fed to the compiled segments on
  every call (what a model being trained runs);
* ``ONNX Runtime, weights as inputs``: one session of the model with its
  initializers turned into graph inputs (fed on every call): the cost of
  feeding weights in ONNX Runtime alone, without graphdist.

Outputs are checked against the baseline before timing (rtol 1e-3). The
headline is the throughput ratio graphdist / ONNX Runtime (median over
rounds of the ratio within a round) for constant weights; goal >= 0.95.
The number of nodes ONNX Runtime keeps after its graph optimizations is
counted per variant (it fuses BatchNormalization into the convolutions only
when their parameters are constants).

    python -m benchmarks.bench_onnx_resnet [--quick] [--write]
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import machine_info, replace_section
from benchmarks.quiet import QUIET, CpuMeter, quiet_rounds

__all__ = ["NAME", "GOAL", "run", "table", "markdown", "main"]

logger = logging.getLogger(__name__)

NAME = "onnx_resnet"
GOAL = 0.95
_ORT = "ONNX Runtime (1 session, batch 8)"
_CONST = "graphdist Mirrored(2), weights constant"
_VARS = "graphdist Mirrored(2), weights variables"
_ORT_INPUTS = "ONNX Runtime, weights as inputs"


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _session(model: Any, threads: int, optimized_path: str | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _optimized_ops(model: Any, threads: int) -> collections.Counter:
    """Node counts by op type of the model ONNX Runtime runs after its graph optimizations."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="bench-onnx-resnet-") as directory:
        path = os.path.join(directory, "optimized.onnx")
        _session(model, threads, path)
        return collections.Counter(n.op_type for n in onnx.load(path).graph.node)


def _weights_as_inputs(model: Any) -> Any:
    from graphdist.onnx.prepare import variable_initializers, with_variables_as_inputs

    return with_variables_as_inputs(model, variable_initializers(model))


def _variants(model_name: str, batch: int, replicas: int) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    """The callables to time and facts about them (compile seconds, output check, optimized node counts)."""
    from onnx import numpy_helper

    import graphdist as gd
    from graphdist.models.onnx_zoo import input_name, zoo_model

    proto = zoo_model(model_name)
    threads = _threads()
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    name = input_name(proto)
    session = _session(proto, threads)
    inputs_model = _weights_as_inputs(proto)
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer
               if t.name in {vi.name for vi in inputs_model.graph.input}}
    inputs_session = _session(inputs_model, threads)
    inputs_feeds = {name: x, **weights}
    strategy = gd.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])
    share = batch // replicas
    halves = gd.PerReplica([x[r * share:(r + 1) * share] for r in range(replicas)])
    steps, compile_s = {}, {}
    for label, trainable in ((_CONST, False), (_VARS, True)):
        with strategy.scope():
            model = gd.onnx.load(proto, trainable=trainable)

        def step(x: Any, model: Any = model) -> Any:
            return strategy.gather(strategy.run(model, args=(x,)), axis=0)

        steps[label] = gd.function(step, name=f"{model_name}_inference")
        start = time.perf_counter()
        steps[label](halves)
        compile_s[label] = time.perf_counter() - start
    expected = session.run(None, {name: x})[0]
    check = {label: float(np.abs(np.asarray(fn(halves)) - expected).max()) for label, fn in steps.items()}
    check[_ORT_INPUTS] = float(np.abs(inputs_session.run(None, inputs_feeds)[0] - expected).max())
    for label, error in check.items():
        if error > 1e-3 * max(float(np.abs(expected).max()), 1e-6):
            raise AssertionError(f"{label} differs from ONNX Runtime by {error}")
    variants = {
        _ORT: lambda: session.run(None, {name: x}),
        _CONST: lambda: steps[_CONST](halves),
        _VARS: lambda: steps[_VARS](halves),
        _ORT_INPUTS: lambda: inputs_session.run(None, inputs_feeds),
    }
    facts = {"compile_s": compile_s, "max_abs_diff": check, "threads": threads,
             "optimized_ops": {_ORT: dict(_optimized_ops(proto, threads)),
                               _ORT_INPUTS: dict(_optimized_ops(inputs_model, threads))},
             "model_ops": dict(collections.Counter(n.op_type for n in proto.graph.node))}
    return variants, facts


def _block(fn: Callable[[], Any]) -> Callable[[int], float]:
    def block(calls: int) -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - start) / calls / 1e3

    return block


def run(quick: bool = False, rounds: int | None = None, calls: int | None = None, model: str = "resnet50",
        batch: int = 8, replicas: int = 2, budget_s: float | None = None, wait_s: float | None = None
        ) -> dict[str, Any]:
    """Measures every variant; returns times (us per call), throughputs and ratios."""
    info = machine_info()
    rounds = rounds or (3 if quick else 15)
    calls = calls or (1 if quick else 2)
    budget_s = budget_s if budget_s is not None else (30.0 if quick else 240.0)
    wait_s = wait_s if wait_s is not None else (0.0 if quick else 20.0)
    with tempfile.TemporaryDirectory(prefix="bench-onnx-resnet-cache-") as cache:
        old = os.environ.get("GRAPHDIST_CACHE_DIR")
        os.environ["GRAPHDIST_CACHE_DIR"] = cache  # compile seconds are real builds
        try:
            variants, facts = _variants(model, batch, replicas)
        finally:
            if old is None:
                os.environ.pop("GRAPHDIST_CACHE_DIR", None)
            else:
                os.environ["GRAPHDIST_CACHE_DIR"] = old
        names = list(variants)
        foreign: list[float] = []
        timing = quiet_rounds({n: _block(f) for n, f in variants.items()}, names, CpuMeter(), calls=calls,
                              rounds=rounds, max_rounds=rounds * 3, budget_s=budget_s, wait_s=wait_s,
                              patience=0.0 if quick else 5.0, settle=0.05, foreign=foreign)
    times = timing["times"]
    quiet = [i for i, share in enumerate(foreign) if share <= QUIET]
    use = quiet if len(quiet) >= 3 else list(range(len(foreign)))
    ms = {n: statistics.median(times[n][i] for i in use) / 1e3 for n in names}
    ratios = {n: statistics.median(times[_ORT][i] / times[n][i] for i in use) for n in names}
    headline = ratios[_CONST]
    return {"name": NAME, "goal": GOAL, "goal_met": headline >= GOAL, "ratio": headline, "model": model,
            "batch": batch, "replicas": replicas, "rounds": len(foreign), "quiet_rounds": len(quiet),
            "calls": calls, "ms": ms, "images_per_s": {n: batch * 1e3 / ms[n] for n in names},
            "ratios": ratios, "ratio_range": (min(times[_ORT][i] / times[_CONST][i] for i in use),
                                              max(times[_ORT][i] / times[_CONST][i] for i in use)),
            "load": (timing["load_start"], timing["load_end"]), "machine": info, **facts}


def table(results: dict[str, Any]) -> str:
    """Plain-text summary of :func:`run`'s results."""
    lines = [f"{results['model']} inference, global batch {results['batch']} ({results['quiet_rounds']}/"
             f"{results['rounds']} quiet rounds x {results['calls']} calls)"]
    for name, ms in results["ms"].items():
        lines.append(f"  {name:44s} {ms:9.1f} ms  {results['images_per_s'][name]:7.1f} images/s  "
                     f"{results['ratios'][name]:.3f}x ORT")
    verdict = "met" if results["goal_met"] else "missed"
    lines.append(f"graphdist Mirrored(2) (constant weights) / ORT throughput {results['ratio']:.3f}: goal >= "
                 f"{results['goal']} {verdict}")
    return "\n".join(lines)


def _op_summary(counts: dict[str, int]) -> str:
    keep = ("Conv", "FusedConv", "BatchNormalization", "Relu", "Sum", "Add")
    return ", ".join(f"{op} {counts[op]}" for op in keep if counts.get(op))


def markdown(results: dict[str, Any]) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    info = results["machine"]
    load_start, load_end = results["load"]
    lines = [
        "## ResNet50 inference: Mirrored(2) vs ONNX Runtime",
        "",
        "The onnx wheel's ResNet-50 zoo architecture (opset 9, 53 Conv + BatchNormalization, 16 residual `Sum`s) "
        "with seeded random weights (`graphdist/models/onnx_zoo.py`), imported by `gd.onnx.load` at its own opset. "
        "Every "
        f"variant computes the same global batch of {results['batch']} images (3x224x224) in this process: "
        f"graphdist under `gd.MirroredStrategy([\"cpu:0\", \"cpu:1\"])` ({results['batch'] // results['replicas']} "
        "images per replica, given as the two halves a distributed dataset hands over; a `gd.function` runs "
        "`strategy.run(model, ...)` and gathers the outputs), the baseline one `onnxruntime.InferenceSession` "
        f"(`CPUExecutionProvider`, {results['threads']} intra-op threads, the usable cores) on the whole batch. "
        "Outputs checked against the baseline before timing (largest difference "
        + ", ".join(f"{n}: {d:.1e}" for n, d in results["max_abs_diff"].items()) + ").",
        "",
        "Method: interleaved rounds (`benchmarks/quiet.py`), each variant "
        f"{results['calls']} calls per round after a 50 ms pause, the order reversed every other round; "
        f"{results['quiet_rounds']} of {results['rounds']} rounds were quiet (other processes under {QUIET:.0%} "
        f"of the CPU time), medians over {'those' if results['quiet_rounds'] >= 3 else 'all rounds'}. Ratios: "
        "median over rounds of the ratio to ONNX Runtime within the round. Source: "
        "`benchmarks/bench_onnx_resnet.py`.",
        "",
        f"Machine: {info['cpu']}, {info['nproc']} usable cores; Python {info['python']}, onnxruntime "
        f"{info['onnxruntime']}; measured on {info['date']}, load average {load_start} at the start, {load_end} at "
        "the end (the machine is shared).",
        "",
        f"**Goal:** graphdist Mirrored(2) / ONNX Runtime throughput >= **{results['goal']}**.",
        "",
        "| variant | ms per batch | images/s | throughput vs ORT | first call s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, ms in results["ms"].items():
        first = results["compile_s"].get(name)
        lines.append(f"| {name} | {ms:.1f} | {results['images_per_s'][name]:.1f} | {results['ratios'][name]:.3f}x "
                     f"| {'' if first is None else f'{first:.1f}'} |")
    low, high = results["ratio_range"]
    verdict = "goal met" if results["goal_met"] else "goal missed"
    lines += [
        "",
        f"**graphdist Mirrored(2) / ONNX Runtime = {results['ratio']:.3f}x** with the weights as constants "
        f"(`gd.onnx.load(model, trainable=False)`; per-round ratios {low:.3f}-{high:.3f}): {verdict}.",
        "",
        "Where the time goes with the weights as variables (`gd.onnx.load(model)`, what a model being trained "
        f"runs: {results['ratios'][_VARS]:.3f}x): the compiled segments take the weights as inputs, fed on every "
        "call, so ONNX Runtime cannot fold BatchNormalization into the convolutions or pre-pack the "
        "convolution weights, which it does only for constants. The optimized graphs it runs: with constant "
        f"weights {_op_summary(results['optimized_ops'][_ORT])}; with weights as inputs "
        f"{_op_summary(results['optimized_ops'][_ORT_INPUTS])}. A plain ONNX Runtime session of the model with "
        f"its weights as inputs is as slow ({results['ratios'][_ORT_INPUTS]:.3f}x of the baseline): the gap "
        "is ONNX Runtime's, not graphdist's; for inference load the model with `trainable=False`.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark; ``--write`` updates BENCHMARKS.md."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_onnx_resnet",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 1 call (a smoke run, noisy)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--budget", type=float, default=None, metavar="S",
                        help="seconds to keep repeating rounds until enough were quiet (default 240)")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    results = run(quick=args.quick, rounds=args.rounds, budget_s=args.budget)
    print(table(results))
    if args.write:
        replace_section(NAME, markdown(results))  # the section states its own machine
    return 0 if results["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
