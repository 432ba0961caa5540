"""Keras ``fit`` throughput: ``gd.keras`` under MirroredStrategy(2) vs TensorFlow Keras under MirroredStrategy(2).

The same model, data, initial weights and settings on both sides:

* model: ``Sequential`` of ``Dense(256, relu)``, ``Dense(256, relu)``,
  ``Dense(10)`` on 784 inputs (He-initialised arrays made here, set into
  both models); ``SGD(0.01)``; ``SparseCategoricalCrossentropy(from_logits=True)``;
  ``metrics=["accuracy"]``; all created in the strategy's scope;
* data: :data:`SAMPLES` float32 rows of 784 standard-normal features with
  random labels in ``[0, 10)`` (the throughput does not depend on the values),
  numpy arrays given to ``fit(x, y, batch_size=256, shuffle=True, verbose=0)``,
  i.e. every global batch of 256 split 128 + 128 between the replicas by the
  library itself;
* **graphdist**: ``gd.MirroredStrategy(["cpu:0", "cpu:1"])`` (two logical CPU
  devices, in-process ring all-reduce), ``gd.keras`` in this process;
* **TensorFlow 2.21 / Keras 3** (``benchmarks/tf_keras_fit.py`` in
  ``.bench-venvs/tf``, made by ``python -m benchmarks.bench_train_step --setup-tf``):
  the physical CPU split into two logical devices, ``tf.distribute.MirroredStrategy``
  with the cross-device ops and thread pools that were fastest for TensorFlow
  in ``bench_mirrored_train``'s scan (``ReductionToOneDevice``; intra-op 1,
  inter-op 2), in a process of its own, driven over a pipe.

Check before timing: one epoch without shuffling from the same initial
weights on both sides gives the same weights (rtol 1e-3; TensorFlow uses
oneDNN kernels) and the same epoch loss and accuracy.

Timing: each timed block is one ``model.fit(..., epochs=EPOCHS)`` call
(after a warm-up fit, so tracing and compiling are excluded; per-call setup
such as shuffling and per-epoch iterator creation is included, as a user
sees it). Each library also fits a quarter of the samples, which splits
the time into a per-step and a per-call part. Blocks of the two libraries alternate in rounds (order reversed
every other round) with :func:`benchmarks.quiet.quiet_rounds`: a round in
which other processes used more than 10% of the machine's CPU time is marked
disturbed and repeated (within a time budget). Throughput = samples x epochs
/ wall time; the headline is the median over quiet rounds of the ratio
within a round.

    python -m benchmarks.bench_keras_fit [--quick] [--no-tf] [--write]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import BENCHMARKS_MD, machine_info, update_section
from benchmarks.quiet import QUIET, CpuMeter, quiet_rounds
from benchmarks.tf_serve import ServeProcess

__all__ = ["NAME", "SIZES", "SAMPLES", "BATCH", "run", "table", "markdown", "main"]

logger = logging.getLogger(__name__)

NAME = "keras_fit"
SIZES: tuple[int, ...] = (784, 256, 256, 10)
SAMPLES = 16384
BATCH = 256
LEARNING_RATE = 0.01
EPOCHS = 1
TF_VENV = Path(__file__).resolve().parent.parent / ".bench-venvs" / "tf"
TF_SCRIPT = Path(__file__).resolve().parent / "tf_keras_fit.py"
_GD = "graphdist gd.keras, Mirrored(2)"
_TF = "TensorFlow Keras, Mirrored(2)"
#: Second, smaller epoch (a quarter of the samples): two sizes separate the per-step time from the per-fit cost.
_SMALL = ", quarter epoch"


def make_data(samples: int = SAMPLES, seed: int = 0) -> dict[str, np.ndarray]:
    """Features, labels, sizes, batch, learning rate and He-initialised weights ``w0, b0, ...``."""
    rng = np.random.default_rng(seed)
    data = {"x": rng.standard_normal((samples, SIZES[0])).astype(np.float32),
            "y": rng.integers(0, SIZES[-1], samples).astype(np.int64),
            "sizes": np.array(SIZES), "batch": np.int64(BATCH), "lr": np.float32(LEARNING_RATE)}
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        data[f"w{i}"] = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        data[f"b{i}"] = np.zeros(fan_out, np.float32)
    return data


def build_graphdist(data: dict[str, np.ndarray]) -> Any:
    """The gd.keras model under MirroredStrategy(2), compiled, with the benchmark's weights."""
    import graphdist as gd

    keras = gd.keras
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        layers = [keras.layers.Dense(SIZES[1], activation="relu", input_shape=(SIZES[0],))]
        layers += [keras.layers.Dense(w, activation="relu") for w in SIZES[2:-1]]
        layers.append(keras.layers.Dense(SIZES[-1]))
        model = keras.Sequential(layers)
        model.compile(optimizer=gd.optimizers.SGD(LEARNING_RATE), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.set_weights([data[f"{kind}{i}"] for i in range(len(SIZES) - 1) for kind in ("w", "b")])
    return model


class TFProcess(ServeProcess):
    """``tf_keras_fit.py --serve`` as a subprocess timing ``fit`` calls on request."""

    def __init__(self, data_path: Path, timeout: float = 300.0) -> None:
        super().__init__([TF_VENV / "bin" / "python", TF_SCRIPT, "--data", data_path, "--serve"], timeout)

    def fit(self, epochs: int, rows: int) -> float:
        """Microseconds per epoch of one ``fit(epochs=epochs)`` call on the first ``rows`` samples."""
        return self.us_per_call(f"fit {epochs} {rows}")


def _check(data: dict[str, np.ndarray], data_path: Path, tf: bool) -> dict[str, Any]:
    """One unshuffled epoch on each side from the same weights: the weights and logs must agree."""
    model = build_graphdist(data)
    history = model.fit(data["x"], data["y"], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    result: dict[str, Any] = {"gd_loss": history.history["loss"][0], "gd_accuracy": history.history["accuracy"][0]}
    if not tf:
        return result
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "check.npz"
        done = subprocess.run([str(TF_VENV / "bin" / "python"), str(TF_SCRIPT), "--data", str(data_path), "--check",
                               str(out)], capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if done.returncode != 0:
            raise RuntimeError(f"tf_keras_fit.py --check failed: {done.stderr.strip().splitlines()[-3:]}")
        with np.load(out) as npz:
            reference = {key: npz[key] for key in npz.files}
    worst = 0.0
    for i, weight in enumerate(model.get_weights()):
        want = reference[f"{'wb'[i % 2]}{i // 2}"]
        np.testing.assert_allclose(weight, want, rtol=1e-3, atol=1e-4, err_msg=f"weight {i}")
        worst = max(worst, float(np.max(np.abs(weight - want))))
    np.testing.assert_allclose(result["gd_loss"], float(reference["loss"]), rtol=1e-4)
    np.testing.assert_allclose(result["gd_accuracy"], float(reference["accuracy"]), atol=1e-6)
    result.update(tf_loss=float(reference["loss"]), tf_accuracy=float(reference["accuracy"]), max_weight_diff=worst)
    return result


def run(quick: bool = False, rounds: int | None = None, tf: bool = True, budget_s: float = 240.0) -> dict[str, Any]:
    """Checks, then times both libraries' ``fit`` in interleaved rounds."""
    tf = tf and (TF_VENV / "bin" / "python").exists()
    rounds = rounds or (3 if quick else 7)
    samples = 4096 if quick else SAMPLES
    data = make_data(samples)
    results: dict[str, Any] = {"samples": samples, "batch": BATCH, "sizes": SIZES, "epochs_per_block": EPOCHS,
                               "tf": tf}
    with tempfile.TemporaryDirectory() as tmp:
        data_path = Path(tmp) / "data.npz"
        np.savez(data_path, **data)
        results["check"] = _check(data, data_path, tf)
        model = build_graphdist(data)
        model.fit(data["x"], data["y"], batch_size=BATCH, epochs=1, verbose=0)   # trace and compile

        def gd_block(rows: int) -> Any:
            def block(epochs: int) -> float:
                import time

                start = time.perf_counter_ns()
                model.fit(data["x"][:rows], data["y"][:rows], batch_size=BATCH, epochs=epochs, shuffle=True,
                          verbose=0)
                return (time.perf_counter_ns() - start) / epochs / 1e3

            return block

        small = samples // 4
        variants = {_GD: gd_block(samples), _GD + _SMALL: gd_block(small)}
        process = TFProcess(data_path) if tf else None
        meter = CpuMeter()
        if process is not None:
            variants[_TF] = lambda epochs: process.fit(epochs, samples)
            variants[_TF + _SMALL] = lambda epochs: process.fit(epochs, small)
            meter.pids.append(process.pid)
            results["tf_info"] = process.info
        foreign: list[float] = []
        try:
            timing = quiet_rounds(variants, list(variants), meter, calls=EPOCHS, rounds=rounds,
                                  max_rounds=rounds * 3, budget_s=budget_s, wait_s=10.0, patience=5.0, settle=0.2,
                                  foreign=foreign)
        finally:
            if process is not None:
                process.close()
    quiet = [i for i, share in enumerate(foreign) if share <= QUIET]
    use = quiet if len(quiet) >= 3 else list(range(len(foreign)))
    times = timing["times"]
    results["rounds"] = len(foreign)
    results["quiet_rounds"] = len(quiet)
    results["foreign"] = foreign
    results["samples_per_s"] = {name: statistics.median(samples * 1e6 / times[name][i] for i in use)
                                for name in variants if not name.endswith(_SMALL)}
    results["ms_per_epoch"] = {name: statistics.median(times[name][i] / 1e3 for i in use) for name in variants}
    steps, small_steps = -(-samples // BATCH), -(-small // BATCH)
    results["steps"] = (steps, small_steps)
    results["split"] = {}
    for name in (n for n in variants if not n.endswith(_SMALL)):
        per_step = [(times[name][i] - times[name + _SMALL][i]) / 1e3 / (steps - small_steps) for i in use]
        fixed = [times[name][i] / 1e3 - p * steps for i, p in zip(use, per_step)]
        results["split"][name] = (statistics.median(per_step), statistics.median(fixed))
    if tf:
        ratios = [times[_TF][i] / times[_GD][i] for i in use]
        results["ratio"] = statistics.median(ratios)
        results["ratio_range"] = (min(ratios), max(ratios))
        results["goal_met"] = results["ratio"] > 1.0
    else:
        results["goal_met"] = None
    return results


def table(results: dict[str, Any]) -> str:
    """A plain-text summary."""
    lines = [f"Keras fit, MLP {'-'.join(map(str, results['sizes']))}, {results['samples']} samples, batch "
             f"{results['batch']} ({results['quiet_rounds']}/{results['rounds']} quiet rounds)"]
    for name, rate in results["samples_per_s"].items():
        per_step, fixed = results["split"][name]
        lines.append(f"  {name:34s} {rate:>10,.0f} samples/s  {results['ms_per_epoch'][name]:8.1f} ms/epoch  "
                     f"({per_step:.2f} ms/step + {fixed:.0f} ms per fit call)")
    if results.get("ratio") is not None:
        lines.append(f"  graphdist / TensorFlow throughput: {results['ratio']:.2f}x")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    check = results["check"]
    lines = [
        "## Keras fit throughput: gd.keras vs TensorFlow Keras, both MirroredStrategy on 2 logical CPUs",
        "",
        "The same model, data, initial weights and settings on both sides: graphdist's `gd.keras` under "
        "`gd.MirroredStrategy([\"cpu:0\", \"cpu:1\"])` in this process, TensorFlow 2.21's Keras under "
        "`tf.distribute.MirroredStrategy` on the CPU split into two logical devices, in its own process "
        "(the cross-device ops and thread pools that were fastest for TensorFlow in the Mirrored training "
        "benchmark's scan).",
        "",
        "Setup: `Sequential` Dense 784-256(relu)-256(relu)-10, SGD(0.01), sparse categorical cross-entropy from "
        f"logits, `metrics=[\"accuracy\"]`; {results['samples']:,} samples (numpy arrays), "
        f"`fit(x, y, batch_size={results['batch']}, shuffle=True, verbose=0)`, each timed block one "
        f"`fit(epochs={results['epochs_per_block']})` call after a warm-up fit. Both sides split each global "
        "batch 128 + 128 between the two replicas. Source: `benchmarks/bench_keras_fit.py`, "
        "`benchmarks/tf_keras_fit.py`.",
        "",
        "**Goal:** graphdist's `fit` ahead of TensorFlow Keras' `fit` (throughput ratio > 1).",
        "",
    ]
    if results["tf"]:
        info = results.get("tf_info", {})
        lines += [
            f"Check (one unshuffled epoch from the same weights): largest weight difference "
            f"{check['max_weight_diff']:.1e}; epoch loss graphdist {check['gd_loss']:.6f}, TensorFlow "
            f"{check['tf_loss']:.6f}; accuracy {check['gd_accuracy']:.4f} / {check['tf_accuracy']:.4f}. "
            f"TensorFlow {info.get('tensorflow')}, Keras {info.get('keras')}, cross-device ops "
            f"{info.get('cross_device_ops')}, intra-op {info.get('intra_op')}, inter-op {info.get('inter_op')}.",
            "",
        ]
    lines += [f"{results['quiet_rounds']} of {results['rounds']} rounds were quiet (other processes under "
              f"{QUIET:.0%} of the CPU time); medians over "
              f"{'the quiet rounds' if results['quiet_rounds'] >= 3 else 'all rounds'}.", "",
              "| variant | samples/s | ms per epoch | ms per step | ms per fit call (fixed) |",
              "|---|---:|---:|---:|---:|"]
    for name, rate in results["samples_per_s"].items():
        per_step, fixed = results["split"][name]
        lines.append(f"| {name} | {rate:,.0f} | {results['ms_per_epoch'][name]:.1f} | {per_step:.2f} | {fixed:.0f} |")
    if results.get("ratio") is not None:
        low, high = results["ratio_range"]
        verdict = "goal met" if results["goal_met"] else "goal missed"
        lines += ["", f"**graphdist / TensorFlow throughput: {results['ratio']:.2f}x** (per-round ratios "
                      f"{low:.2f}-{high:.2f}x; {verdict})."]
        steps, small_steps = results["steps"]
        gd_step, gd_fixed = results["split"][_GD]
        tf_step, tf_fixed = results["split"][_TF]
        lines += ["", f"Where the time goes: every round also times a fit on a quarter of the samples ({small_steps} "
                      f"instead of {steps} steps); the difference gives the time per step and the rest the fixed "
                      f"cost of a `fit` call (shuffling, setting up the epoch's input, callbacks). Per step: "
                      f"graphdist {gd_step:.2f} ms, TensorFlow {tf_step:.2f} ms ({tf_step / gd_step:.1f}x); per fit "
                      f"call: graphdist {gd_fixed:.0f} ms, TensorFlow {tf_fixed:.0f} ms. TensorFlow's step is a "
                      "`tf.function` with `strategy.run` whose all-reduce and per-replica ops go through its "
                      "executor on the two logical devices; graphdist's step is one compiled plan of ONNX Runtime "
                      "segments."]
    else:
        lines += ["", "TensorFlow's environment was not found (`.bench-venvs/tf`): only graphdist was timed."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: runs the benchmark, prints the table, optionally writes BENCHMARKS.md."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_keras_fit", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and rounds (noisy)")
    parser.add_argument("--rounds", type=int, help="quiet rounds wanted (default 7)")
    parser.add_argument("--no-tf", action="store_true", help="time graphdist only")
    parser.add_argument("--write", action="store_true", help=f"update this section of {BENCHMARKS_MD.name}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    info = machine_info()
    results = run(quick=args.quick, rounds=args.rounds, tf=not args.no_tf)
    print(table(results))
    if args.write:
        print(f"wrote {update_section(NAME, markdown(results), info=info)}")
    return 0 if results["goal_met"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
