"""Overlap of gradient all-reduces with the backward pass: Mirrored(2) vs OneDevice, overlap off vs on.

For each model (the 784-512-512-10 MLP with SGD at global batch 256, the
default ConvNet and transformer block of ``graphdist/models/`` with Adam at global
batch 256), one process builds four variants of the same training step from
the same initial weights:

* **OneDevice**: ``gd.OneDeviceStrategy("cpu:0")``, the whole batch;
* **Mirrored, default**: ``gd.MirroredStrategy(["cpu:0", "cpu:1"])``: each
  gradient summed inside the segment of the replica that updates it
  (``LowerSingleReaderAllReducesPass``), no all-reduce;
* **Mirrored, packs, overlap off**: ``gd.MirroredStrategy(["cpu:0", "cpu:1"],
  gd.NcclAllReduce(num_packs=4))`` traced with ``GRAPHDIST_OVERLAP=0`` (the default): one
  forward+backward segment per device, the all-reduces after it;
* **Mirrored, packs, overlap on**: the same with the overlap cut (``GRAPHDIST_OVERLAP=1``): the
  backward pass cut at the 4 gradient buckets, bucket ``k``'s all-reduce
  running while the earlier layers' backward computes.

Each timed step is ``strategy.reduce("SUM", strategy.run(step, args=batch))``
inside one ``gd.function`` with the per-replica halves fixed. Timing follows
the house method (:mod:`benchmarks.quiet`): interleaved rounds, order reversed
every other round, rounds repeated until quiet; throughput ratios are medians
over rounds of the ratio within a round. The communication wait per step
comes from the timeline (:func:`graphdist.runtime.timeline.record`, a
separate pass of ``wait_steps`` steps): the time in which an all-reduce ran
and no device computed, and the all-reduce time in all. Before timing, one
step of overlap on and off from the same weights must give bitwise equal
weights.

    python -m benchmarks.bench_overlap [--quick] [--rounds N] [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import graphdist as gd
from benchmarks.quiet import CpuMeter, loadavg, quiet_rounds, timed
from graphdist.runtime import timeline

__all__ = ["run", "markdown", "write_section", "NAME", "MODELS"]

logger = logging.getLogger(__name__)

NAME = "overlap"
MODELS = ("mlp", "convnet", "transformer")
_ONE, _AUTO = "OneDevice", "Mirrored(2) default (sums at the readers)"
_OFF, _ON = "Mirrored(2) packs, overlap off", "Mirrored(2) packs, overlap on"
_MIRRORED = (_AUTO, _OFF, _ON)
_DEVICES = ["cpu:0", "cpu:1"]
NUM_PACKS = 4


@contextlib.contextmanager
def _overlap(enabled: bool) -> Iterator[None]:
    previous = os.environ.get("GRAPHDIST_OVERLAP")
    os.environ["GRAPHDIST_OVERLAP"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("GRAPHDIST_OVERLAP", None)
        else:
            os.environ["GRAPHDIST_OVERLAP"] = previous


def _model(kind: str, batch: int, sizes: tuple[int, ...]) -> tuple[Callable[[], Any], Any, np.ndarray, np.ndarray]:
    """``(make model + optimizer in the current scope, -, x, labels)`` for one model kind."""
    if kind == "mlp":
        from graphdist.models.mlp import MLP

        def build() -> Any:
            return MLP(sizes, seed=0, trainable=True), gd.optimizers.SGD(0.01)

        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        return build, None, x, rng.integers(0, sizes[-1], batch)
    if kind == "convnet":
        from graphdist.models.convnet import ConvNet as Model
    elif kind == "transformer":
        from graphdist.models.transformer import TransformerBlock as Model
    else:
        raise ValueError(f"unknown model {kind!r}; pick one of {', '.join(MODELS)}")

    def build_classifier() -> Any:
        return Model(seed=0), gd.optimizers.Adam(0.01)

    x, labels = Model.example_data(n=batch, seed=0)
    return build_classifier, None, x, labels


def _variant(kind: str, strategy: gd.Strategy, overlap: bool, batch: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    build, _, x, labels = _model(kind, batch, sizes)
    with strategy.scope():
        model, optimizer = build()
    replica_step = model.make_train_step(optimizer, batch)

    @gd.function
    def train(x: Any, labels: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    data = strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))
    args = next(iter(data))
    with _overlap(overlap):
        plan = train.get_concrete_function(*args).plan
    return {"step": lambda: train(*args), "model": model, "plan": plan}


def _weights(model: Any) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def _wait_per_step(variant: dict[str, Any], steps: int) -> dict[str, float]:
    with timeline.record() as recorded:
        for _ in range(steps):
            variant["step"]()
    waits = [sum(e.duration for e in events if e.cat == "wait") * 1e6 for events in recorded]
    comm = [sum(e.duration for e in events if e.cat == "collective") * 1e6 for events in recorded]
    return {"wait_us": statistics.median(waits), "collective_us": statistics.median(comm)}


def _bench_model(kind: str, *, batch: int, sizes: tuple[int, ...], calls: int, rounds: int, wait_steps: int,
                 wait_s: float, budget_s: float) -> dict[str, Any]:
    variants = {_ONE: _variant(kind, gd.OneDeviceStrategy("cpu:0"), False, batch, sizes),
                _AUTO: _variant(kind, gd.MirroredStrategy(_DEVICES), False, batch, sizes)}
    for name, overlap in ((_OFF, False), (_ON, True)):
        strategy = gd.MirroredStrategy(_DEVICES, cross_device_ops=gd.NcclAllReduce(num_packs=NUM_PACKS))
        variants[name] = _variant(kind, strategy, overlap, batch, sizes)
    variants[_OFF]["step"]()
    variants[_ON]["step"]()
    variants[_AUTO]["step"]()
    auto_diff = max(float(np.max(np.abs(a - b))) if a.size else 0.0
                    for a, b in zip(_weights(variants[_OFF]["model"]), _weights(variants[_AUTO]["model"])))
    pairs = list(zip(_weights(variants[_OFF]["model"]), _weights(variants[_ON]["model"])))
    equal = all(np.array_equal(a, b) for a, b in pairs)
    largest = max(float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in pairs)
    for a, b in pairs:  # ONNX Runtime optimises each segment alone: conv layouts may round differently
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=f"{kind}: overlap on vs off")
    names = [_ONE, *_MIRRORED]
    foreign: list[float] = []
    timing = quiet_rounds({n: timed(variants[n]["step"]) for n in names}, names, CpuMeter(), calls=calls,
                          rounds=rounds, max_rounds=rounds * 3, budget_s=budget_s, wait_s=wait_s,
                          patience=min(wait_s, 5.0), settle=0.02, foreign=foreign)
    times = timing["times"]
    ratio = {n: statistics.median(times[_ONE][i] / times[n][i] for i in range(len(times[n]))) for n in _MIRRORED}
    return {
        "model": kind, "batch": batch, "weights_bitwise_equal": equal, "weights_max_abs_diff": largest,
        "default_vs_all_reduce_max_abs_diff": auto_diff,
        "segments": {n: len(variants[n]["plan"].segments) for n in names},
        "all_reduces": len([c for c in variants[_ON]["plan"].comms if c.op == "AllReduce"]),
        "us": {n: statistics.median(times[n]) for n in names},
        "vs_one_device": ratio,
        "wait": {n: _wait_per_step(variants[n], wait_steps) for n in _MIRRORED},
        "rounds": len(foreign), "quiet_rounds": sum(share <= 0.10 for share in foreign),
    }


def run(*, models: tuple[str, ...] = MODELS, quick: bool = False, rounds: int = 15, calls: int = 10,
        batch: int = 256, sizes: tuple[int, ...] = (784, 512, 512, 10), wait_steps: int = 20,
        wait_s: float = 10.0, budget_s: float = 120.0) -> dict[str, Any]:
    """Runs the benchmark; returns the results (see :func:`markdown`)."""
    if quick:
        rounds, calls, wait_steps, budget_s = min(rounds, 3), min(calls, 3), min(wait_steps, 3), 10.0
    results = [_bench_model(kind, batch=batch, sizes=sizes, calls=calls, rounds=rounds, wait_steps=wait_steps,
                            wait_s=wait_s, budget_s=budget_s) for kind in models]
    return {"models": results, "load": loadavg(2), "num_packs": NUM_PACKS}


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    lines = ["## Overlap of gradient all-reduces with the backward pass (Mirrored(2) vs OneDevice)", "",
             "`benchmarks/bench_overlap.py`: per model, OneDevice and Mirrored on 2 logical CPU devices: the default "
             "`MirroredStrategy` (each gradient summed inside the segment of the replica that updates it, no "
             f"all-reduce), and `NcclAllReduce(num_packs={results['num_packs']})` all-reduces with overlap off "
             "(`GRAPHDIST_OVERLAP=0`: one backward segment per device) and on (the backward cut at the buckets), "
             "interleaved in one process. "
             "Throughput ratio = OneDevice step time / Mirrored step time (median over rounds of the ratio within "
             "a round). Communication wait = time per step in which an all-reduce ran and no device computed, "
             f"from the timeline. Load average at the end: {results['load']}.", "",
             "| model | variant | segments | us/step | throughput vs OneDevice | all-reduce us/step | "
             "waiting for communication us/step |", "|---|---|---:|---:|---:|---:|---:|"]
    for entry in results["models"]:
        for name in (_ONE, *_MIRRORED):
            ratio = entry["vs_one_device"].get(name)
            wait = entry["wait"].get(name)
            ratio_text = "1.000x" if ratio is None else f"{ratio:.3f}x"
            comm_text = "-" if wait is None else f"{wait['collective_us']:.0f}"
            wait_text = "-" if wait is None else f"{wait['wait_us']:.0f}"
            lines.append(f"| {entry['model']} (batch {entry['batch']}) | {name} | {entry['segments'][name]} | "
                         f"{entry['us'][name]:.0f} | {ratio_text} | {comm_text} | {wait_text} |")
    best = {e["model"]: max(e["vs_one_device"].values()) for e in results["models"]}
    goal = all(ratio >= 0.97 for ratio in best.values())
    lines += ["", "Goal Mirrored(2)/OneDevice >= 0.97 (best Mirrored variant per model: "
              + ", ".join(f"{m} {r:.3f}x" for m, r in best.items()) + f"): {'met' if goal else 'not met'} "
              "on this run. Weights after one step with overlap on vs off: "
              + "; ".join(f"{e['model']} {_equality(e)}" for e in results["models"]) + "; default vs packed "
              "all-reduces, largest difference: "
              + "; ".join(f"{e['model']} {e['default_vs_all_reduce_max_abs_diff']:.2g}" for e in results["models"])
              + "."]
    return "\n".join(lines) + "\n"


def _equality(entry: dict[str, Any]) -> str:
    if entry["weights_bitwise_equal"]:
        return "bitwise equal"
    return f"max abs diff {entry['weights_max_abs_diff']:.2g}"


def write_section(text: str, path: Path = Path("BENCHMARKS.md")) -> None:
    """Replaces (or appends) this benchmark's marked section of ``path``."""
    begin, end = f"<!-- begin {NAME} -->", f"<!-- end {NAME} -->"
    block = f"{begin}\n{text}{end}\n"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        new = old.rstrip("\n") + "\n\n" + block
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: mlp, convnet, transformer")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    parser.add_argument("--json", help="also write the raw results to this file")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    results = run(models=tuple(m for m in options.models.split(",") if m), quick=options.quick,
                  rounds=options.rounds)
    text = markdown(results)
    print(text)
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=2))
    if options.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
