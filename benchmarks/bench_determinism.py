"""Op determinism (``gd.config.experimental.enable_op_determinism()``): step time with it and without.

The MLP (784-512-512-10), the ConvNet and the transformer block (their default sizes) train with Adam on a
global batch of ``batch`` rows under ``OneDeviceStrategy("cpu:0")`` and ``MirroredStrategy`` on two logical
CPU devices. For each case one process builds two steps, the default one and one compiled with determinism
on (``chunks`` chunks of the global batch, summed in a fixed tree: 8, the default, which serves up to 8
replicas, and 2, which serves up to 2), and times them interleaved (rounds of
``calls`` calls each, after a warm-up), so both see the same machine load. Reported: the median step of
each and their ratio; the goal is a ratio within 1.2.

    python -m benchmarks.bench_determinism [--quick] [--repeat N] [--output F] [--before F] [--write]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import machine_info, median, report, time_interleaved, update_section

__all__ = ["NAME", "GOAL", "run", "table", "markdown", "main"]

NAME = "determinism"
#: Largest accepted ratio of a deterministic step to the default one.
GOAL = 1.2
BATCH = 256
MODELS = ("mlp", "convnet", "transformer")
STRATEGIES = ("one_device", "mirrored2")
#: ``enable_op_determinism(chunks)`` values measured: the default, and the fewest that serve 2 replicas.
CHUNKS = (8, 2)


def _strategy(label: str) -> Any:
    import graphdist as gd

    return gd.OneDeviceStrategy("cpu:0") if label == "one_device" else gd.MirroredStrategy(["cpu:0", "cpu:1"])


def _step(model_name: str, strategy: Any, batch: int) -> Any:
    """A compiled training step of ``model_name`` and a call of it on one global batch."""
    import graphdist as gd
    from graphdist.models.convnet import ConvNet
    from graphdist.models.mlp import MLP
    from graphdist.models.transformer import TransformerBlock

    with strategy.scope():
        model = {"mlp": lambda: MLP(seed=0, trainable=True), "convnet": lambda: ConvNet(seed=0),
                 "transformer": lambda: TransformerBlock(seed=0)}[model_name]()
        optimizer = gd.optimizers.Adam(1e-3)
    replica_step = model.make_train_step(optimizer, batch)

    @gd.function
    def step(x: Any, labels: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    if model_name == "mlp":
        rng = np.random.default_rng(0)
        x, labels = rng.standard_normal((batch, 784)).astype(np.float32), rng.integers(0, 10, batch)
    else:
        x, labels = {"convnet": ConvNet.example_data, "transformer": TransformerBlock.example_data}[model_name](batch)
    distributed = next(iter(strategy.experimental_distribute_dataset(
        gd.data.Dataset.from_tensors((x, labels)))))
    step(*distributed)  # compiles with the switch as it is now
    return lambda: step(*distributed)


def measure(model_name: str, strategy_label: str, batch: int, rounds: int, calls: int,
            chunks: int = 8) -> dict[str, Any]:
    """One case: the default and the deterministic step, timed interleaved."""
    import graphdist as gd

    default = _step(model_name, _strategy(strategy_label), batch)
    gd.config.experimental.enable_op_determinism(chunks)
    try:
        deterministic = _step(model_name, _strategy(strategy_label), batch)
    finally:
        gd.config.experimental.disable_op_determinism()
    times = time_interleaved({"default": default, "deterministic": deterministic}, rounds, calls, warmup=2)
    default_ms, deterministic_ms = median(times["default"]) / 1e3, median(times["deterministic"]) / 1e3
    return {"model": model_name, "strategy": strategy_label, "batch": batch, "chunks": chunks, "default_ms": default_ms,
            "deterministic_ms": deterministic_ms, "ratio": deterministic_ms / default_ms}


def _median_case(model: str, strategy: str, batch: int, rounds: int, calls: int, chunks: int,
                 repeat: int) -> dict[str, Any]:
    """The case measured ``repeat`` times (each in its own pair of steps): the measurement with the median ratio,
    and every ratio (on a shared host one measurement can land on a burst of other work)."""
    runs = sorted((measure(model, strategy, batch, rounds, calls, chunks) for _ in range(repeat)),
                  key=lambda case: case["ratio"])
    return {**runs[len(runs) // 2], "ratios": [round(case["ratio"], 3) for case in runs]}


def run(quick: bool = False, batch: int = BATCH, repeat: int = 1) -> dict[str, Any]:
    """Every case (``quick``: fewer rounds and calls; ``repeat``: measurements per case, the median kept)."""
    rounds, calls = (3, 3) if quick else (5, 10)
    info = machine_info()
    cases = [_median_case(m, s, batch, rounds, calls, c, repeat) for c in CHUNKS for m in MODELS for s in STRATEGIES]
    return {"machine": info, "batch": batch, "rounds": rounds, "calls": calls, "repeat": repeat, "cases": cases,
            "goal_met": all(c["ratio"] <= GOAL for c in cases if c["chunks"] == CHUNKS[0])}


def table(results: dict[str, Any]) -> str:
    """The results as a markdown table."""
    rows = [f"| {c['model']} | {c['strategy']} | {c.get('chunks', 8)} | {c['default_ms']:.2f} ms | "
            f"{c['deterministic_ms']:.2f} ms | {c['ratio']:.2f}x | "
            f"{', '.join(f'{r:.2f}' for r in c.get('ratios', [c['ratio']]))} |" for c in results["cases"]]
    return "\n".join(["| model | strategy | chunks | default step | deterministic step | ratio | every ratio |",
                      "|---|---|---|---|---|---|---|", *rows])


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    worst = max(c["ratio"] for c in results["cases"] if c.get("chunks", 8) == CHUNKS[0])
    return "\n".join([
        "## Op determinism: step time with and without", "",
        f"Adam training steps on a global batch of {results['batch']} rows, ONNX Runtime; both steps built in one "
        f"process and timed interleaved ({results['rounds']} rounds of {results['calls']} calls, median per "
        f"call), each case measured {results.get('repeat', 1)} time(s) in fresh steps, the median ratio shown "
        "(`python -m benchmarks.bench_determinism --repeat N`). Deterministic: "
        "`gd.config.experimental.enable_op_determinism(chunks)`: the global batch in `chunks` chunks; row-wise "
        "ops on each replica's whole batch, the sums over examples per chunk, the chunks summed in one fixed tree "
        "(8 serves up to 8 replicas, 2 up to 2).", "",
        table(results), "",
        f"Worst ratio with the default 8 chunks {worst:.2f}x (goal: within {GOAL}x: "
        f"{'met' if results['goal_met'] else 'missed'}).", ""])


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_determinism",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds and calls (noisy)")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--repeat", type=int, default=1, help="measurements per case, the median ratio kept")
    parser.add_argument("--output", type=Path, help="save the results as JSON here")
    parser.add_argument("--before", type=Path, help="a saved JSON (--output) to show next to this run")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    results = run(quick=args.quick, batch=args.batch, repeat=args.repeat)
    report(args, results, table, markdown, lambda text: update_section(NAME, text, info=results["machine"]))
    return 0 if results["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
