"""MLP training throughput: graphdist Mirrored on 2 logical CPU devices vs OneDevice vs TensorFlow's MirroredStrategy.

The step: the 784-512-512-10 MLP (ReLU, He init from ``graphdist.models.mlp.MLP``,
seed 0), global batch 256, softmax cross-entropy averaged over the global
batch, plain SGD (learning rate 0.01), float32. Variants:

* **graphdist Mirrored** (headline): ``gd.MirroredStrategy(["cpu:0", "cpu:1"])``
  (default cross-device ops: the in-process ring all-reduce), model and
  ``gd.optimizers.SGD(0.01)`` built in its scope, ``step =
  model.make_train_step(opt, 256)``. Input:
  ``strategy.experimental_distribute_dataset(Dataset.from_tensors((x, labels)).repeat())``
  (each element one global batch, split into two halves by the distributed
  dataset, which prefetches in a background thread of its own, so no
  ``.prefetch`` is added: a second prefetch thread only competes for the
  GIL); each timed step is
  ``strategy.reduce("SUM", strategy.run(step, args=next(iterator)), axis=None)``
  and the loss converted to a Python float: the same input path and per-step
  work as TensorFlow's variant.
* **graphdist Mirrored, PerReplica halves** (diagnostic): the same strategy
  and step; each timed step splits the fixed global batch itself
  (``gd.PerReplica((x[:128], x[128:]))``, views) instead of a dataset.
* **graphdist OneDevice**: ``gd.OneDeviceStrategy("cpu:0")``, each timed step
  ``strategy.run(step, args=(x, labels))`` on the whole batch (two intra-op
  threads in its one ONNX Runtime session; the Mirrored devices get one each).
* **TensorFlow Mirrored** (``benchmarks/tf_mirrored_train.py`` in
  ``.bench-venvs/tf``, made by ``python -m benchmarks.bench_train_step --setup-tf``):
  the physical CPU split into two logical devices,
  ``tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops)``,
  a ``tf.function`` step with ``strategy.run`` + ``strategy.reduce``, inputs
  from ``experimental_distribute_dataset`` of the same repeated, prefetched
  dataset. The cross-device ops and thread pools are options
  (:data:`TF_CROSS_DEVICE_OPS`, :data:`TF_THREADS`: the fastest setting of an
  interleaved scan on the reference machine, ``--tf-scan`` repeats it).
* **TensorFlow, default strategy** (reference): the same script and input
  path under ``tf.distribute.get_strategy()`` in the same process.

Checks before timing: one step of graphdist Mirrored and of graphdist
OneDevice from the same initial weights give the same weights
(``assert_allclose``, rtol 1e-5, atol 1e-6), and one step of each variant
(graphdist and TensorFlow) matches an independent float64 numpy step
(rtol 1e-4, atol 1e-6); TensorFlow's replicas hold identical copies.

Timing: rounds; every round times each variant for ``calls`` steps in a row
after a pause of :data:`SETTLE` (worker threads that the previous variant left
spinning go idle), the order reversed every other round. The machine may be
shared: for every block the benchmark reads ``/proc/stat`` and the CPU time of
its own processes, and marks the round *disturbed* when other processes used
more than :data:`QUIET` of the machine's CPU time. Disturbed rounds are
repeated (within ``budget_s``) until ``rounds`` are quiet; medians are over
the quiet rounds when there are at least :data:`MIN_QUIET`, otherwise over all
rounds. Throughput = global batch / step time; the headline ratios are
medians over rounds of the ratio within the round.

Where graphdist Mirrored's time goes: a separate, instrumented pass wraps
every segment executable's ``run`` and the local communicator's
``all_reduce`` with timers (in this process, without editing the library)
and splits each step's wall time into ONNX Runtime time per device, the
all-reduces, the input iterator and the time in which nothing computes
(Python: ``strategy.run``'s dispatch, the scheduler's task hand-offs to the
device threads, ``strategy.reduce``). The forward/backward segments are
also timed alone (one at a time) to show how much running side by side
slows each down.

    python -m benchmarks.bench_mirrored_train [--rounds N] [--quick] [--no-tf] [--write]
    python -m benchmarks.bench_mirrored_train --tf-scan     # TF cross-device ops x threads, interleaved
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import BENCHMARKS_MD, machine_info, machine_markdown, median, replace_section
from benchmarks.bench_train_step import NumpyTrainStep
from benchmarks.quiet import QUIET, CpuMeter, loadavg, quiet_rounds, timed, wait_quiet
from benchmarks.tf_serve import ServeProcess
from graphdist.passes.lower_single_reader_all_reduces import SUMMED_GROUP

__all__ = [
    "NAME", "SIZES", "BATCH", "LEARNING_RATE", "TF_VENV", "TF_SCRIPT", "TF_CROSS_DEVICE_OPS", "TF_THREADS",
    "TF_DEFAULT_THREADS",
    "reference_step", "TFMirroredProcess", "run", "tf_scan", "table", "markdown", "write_section", "main",
]

logger = logging.getLogger(__name__)

NAME = "mirrored_train"
SIZES: tuple[int, ...] = (784, 512, 512, 10)
BATCH = 256
LEARNING_RATE = 0.01
DEVICES = ("cpu:0", "cpu:1")
ROUNDS = 21
CALLS = 20
#: Pause before each timed block: ONNX Runtime's and TensorFlow's pool threads spin for a while after a run.
SETTLE = 0.1
#: A round is disturbed when other processes used more than this share of the machine's CPU time.
MIN_QUIET = 5
#: After a disturbed round, seconds to wait at most for the machine to become quiet again.
PATIENCE = 5.0
#: TensorFlow's environment (made by ``python -m benchmarks.bench_train_step --setup-tf``) and script.
TF_VENV = Path(__file__).resolve().parent.parent / ".bench-venvs" / "tf"
TF_SCRIPT = Path(__file__).resolve().parent / "tf_mirrored_train.py"
#: TensorFlow Mirrored's all-reduce and (intra-op, inter-op) threads: the fastest of ``--tf-scan`` on the
#: reference machine (see BENCHMARKS.md); inter-op 2 lets the two replicas' ops run side by side.
TF_CROSS_DEVICE_OPS = "reduction_to_one"
TF_THREADS = (1, 2)
#: TensorFlow's default strategy runs in a process of its own with the threads of ``bench_train_step``.
TF_DEFAULT_THREADS = (2, 1)

_MIR = "graphdist Mirrored, 2 devices"
_MIR_PR = "graphdist Mirrored, PerReplica halves"
_ONE = "graphdist OneDevice"
_TFM = "TensorFlow Mirrored, 2 devices"
_TFD = "TensorFlow, default strategy"
ORDER = (_MIR, _TFM, _ONE, _TFD, _MIR_PR)
DIAGNOSTIC = (_MIR_PR,)
_PARAM_NAMES = ("w", "b")


# ------------------------------------------------------------------------------ reference
def reference_step(params: Sequence[np.ndarray], x: np.ndarray, labels: np.ndarray, lr: float,
                   global_batch: int) -> tuple[float, list[np.ndarray]]:
    """One SGD step of the MLP in float64 numpy (``bench_train_step``'s numpy step); returns ``(loss, updated
    params)``.
    """
    step = NumpyTrainStep(params, lr, global_batch, dtype=np.float64)
    loss = step(np.asarray(x, np.float64), np.asarray(labels))
    return float(loss), step.params


def _compare(label: str, got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float) -> float:
    """assert_allclose on every parameter; returns the largest relative difference."""
    worst = 0.0
    for index, (a, b) in enumerate(zip(got, want)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{label}: parameter {index}")
        worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6))))
    return worst


# ------------------------------------------------------------------------ CPU accounting
class TFMirroredProcess(ServeProcess):
    """``tf_mirrored_train.py --serve`` as a subprocess that times blocks of steps on request.

    Args:
        python: The TensorFlow environment's interpreter.
        data: The ``.npz`` with the initial weights and the batch.
        cross_device_ops: ``default``, ``reduction_to_one`` or ``hierarchical_copy``.
        threads: ``(intra_op, inter_op)``.
        variants: Which of ``mirrored``, ``default`` to build.
        timeout: Seconds to wait for the process to start (import, trace, warm-up).
        wait: Wait for the process to be ready now; otherwise call :meth:`ready` later (start several at once).
    """

    def __init__(self, python: Path, data: Path, cross_device_ops: str, threads: tuple[int, int],
                 variants: Sequence[str] = ("mirrored", "default"), timeout: float = 300.0,
                 wait: bool = True) -> None:
        super().__init__([python, TF_SCRIPT, "--data", data, "--cross-device-ops", cross_device_ops,
                          "--intra-op", threads[0], "--inter-op", threads[1], "--variants", ",".join(variants),
                          "--serve"], timeout, wait)

    def blocker(self, variant: str) -> Callable[[int], float]:
        """``block(calls)``: runs ``calls`` steps of ``variant``; returns microseconds per step."""
        return lambda calls: self.us_per_call(f"run {variant} {calls}")


def _tf_check(python: Path, data: Path, cross_device_ops: str, threads: tuple[int, int], out: Path
              ) -> dict[str, np.ndarray]:
    done = subprocess.run([str(python), str(TF_SCRIPT), "--data", str(data), "--cross-device-ops", cross_device_ops,
                           "--intra-op", str(threads[0]), "--inter-op", str(threads[1]), "--check", str(out)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"tf_mirrored_train.py --check failed: {tail}")
    with np.load(out) as npz:
        return {key: npz[key] for key in npz.files}


# ------------------------------------------------------------------------------ helpers


def _param_key(index: int) -> str:
    return f"{_PARAM_NAMES[index % 2]}{index // 2}"


def _build(sizes: tuple[int, ...], batch: int) -> dict[str, Any]:
    """graphdist's strategies, models, steps and inputs (same initial weights and batch for all)."""
    import graphdist as gd
    from graphdist.models.mlp import MLP

    mirrored = gd.MirroredStrategy(list(DEVICES))
    with mirrored.scope():
        mir_model = MLP(sizes, seed=0, trainable=True)
        mir_opt = gd.optimizers.SGD(LEARNING_RATE)
    mir_step = mir_model.make_train_step(mir_opt, batch)
    one = gd.OneDeviceStrategy("cpu:0")
    with one.scope():
        one_model = MLP(sizes, seed=0, trainable=True)
        one_opt = gd.optimizers.SGD(LEARNING_RATE)
    one_step = one_model.make_train_step(one_opt, batch)
    (x,) = one_model.example_inputs(batch=batch, seed=0)
    labels = np.random.default_rng(1).integers(0, sizes[-1], batch).astype(np.int64)
    dataset = gd.data.Dataset.from_tensors((x, labels)).repeat()  # the distributed dataset prefetches itself
    iterator = iter(mirrored.experimental_distribute_dataset(dataset))
    half = (batch + 1) // 2

    def mirrored_dataset_step() -> float:
        xs, ys = next(iterator)
        return float(mirrored.reduce("SUM", mirrored.run(mir_step, args=(xs, ys)), axis=None))

    def mirrored_halves_step() -> float:
        xs = gd.PerReplica((x[:half], x[half:]))
        ys = gd.PerReplica((labels[:half], labels[half:]))
        return float(mirrored.reduce("SUM", mirrored.run(mir_step, args=(xs, ys)), axis=None))

    def one_device_step() -> Any:
        return one.run(one_step, args=(x, labels))

    return {"gd": gd, "mirrored": mirrored, "one": one, "mir_model": mir_model, "one_model": one_model,
            "mir_step": mir_step, "one_step": one_step, "x": x, "labels": labels, "iterator": iterator,
            "calls": {_MIR: mirrored_dataset_step, _MIR_PR: mirrored_halves_step, _ONE: one_device_step}}


def _params(model: Any) -> list[np.ndarray]:
    return [np.array(np.asarray(v), copy=True) for v in model.trainable_variables]


def _mirrored_concrete(setup: dict[str, Any]) -> Any:
    gd = setup["gd"]
    x, labels, half = setup["x"], setup["labels"], (len(setup["x"]) + 1) // 2
    xs = gd.PerReplica((x[:half], x[half:]))
    ys = gd.PerReplica((labels[:half], labels[half:]))
    return setup["mirrored"]._function_for(setup["mir_step"]).get_concrete_function(xs, ys)


# ----------------------------------------------------------------------- instrumentation
def _breakdown(setup: dict[str, Any], steps: int, rounds: int) -> dict[str, Any]:
    """Where graphdist Mirrored's step time goes (timers around segments, all-reduces, iterator, run, reduce).

    Each executable's ``run`` is replaced by a timing wrapper on the instance (the scheduler calls
    ``executable.run``) and the local communicator's ``all_reduce`` by one on the module; both are
    restored afterwards.
    """
    from graphdist.runtime.comm import local

    gd, mirrored = setup["gd"], setup["mirrored"]
    concrete = _mirrored_concrete(setup)
    plan = concrete.plan
    executables = plan._scheduler._executables
    one_concrete = setup["one"]._function_for(setup["one_step"]).get_concrete_function(setup["x"], setup["labels"])
    one_executables = one_concrete.plan._scheduler._executables
    clock = time.perf_counter_ns
    events: list[tuple[str, str, int, int]] = []  # (kind, name, start, end)
    last_feeds: dict[str, dict[str, np.ndarray]] = {}

    def wrap(executable: Any, kind: str, name: str) -> None:
        raw = executable.run

        def run(feeds: dict[str, np.ndarray]) -> Any:
            start = clock()
            try:
                return raw(feeds)
            finally:
                events.append((kind, name, start, clock()))
                last_feeds[name] = feeds

        executable.run = run

    raw_all_reduce = local.all_reduce

    def all_reduce(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return raw_all_reduce(*args, **kwargs)
        finally:
            events.append(("comm", "all_reduce", start, clock()))

    segments = [(s.name, s.device) for s in plan.segments]
    for executable, (name, _device) in zip(executables, segments):
        wrap(executable, "segment", name)
    for executable in one_executables:
        wrap(executable, "one", "one_device")
    local.all_reduce = all_reduce
    iterator = setup["iterator"]
    x, labels = setup["x"], setup["labels"]
    per_step: list[dict[str, float]] = []
    one_steps: list[dict[str, float]] = []
    meter = CpuMeter()
    mark = meter.start()
    try:
        for _ in range(rounds):
            time.sleep(SETTLE)
            for _ in range(steps):
                events.clear()
                t0 = clock()
                xs, ys = next(iterator)
                t1 = clock()
                out = mirrored.run(setup["mir_step"], args=(xs, ys))
                t2 = clock()
                float(mirrored.reduce("SUM", out, axis=None))
                t3 = clock()
                per_step.append(_split(list(events), segments, t0, t1, t2, t3))
            time.sleep(SETTLE)
            for _ in range(steps):
                events.clear()
                t0 = clock()
                setup["one"].run(setup["one_step"], args=(x, labels))
                t1 = clock()
                ort = sum(e - s for kind, _, s, e in events if kind == "one")
                one_steps.append({"wall": (t1 - t0) / 1e3, "ort": ort / 1e3})
    finally:
        local.all_reduce = raw_all_reduce
        for executable in list(executables) + list(one_executables):
            executable.__dict__.pop("run", None)
    foreign = meter.foreign(mark)

    # Each forward/backward segment alone (nothing else running), and OneDevice's segment alone.
    alone: dict[str, float] = {}
    for executable, (name, _device) in zip(executables, segments):
        feeds = last_feeds.get(name)
        if feeds is None:
            continue
        time.sleep(SETTLE)
        times = []
        for _ in range(rounds):
            start = clock()
            for _ in range(steps):
                executable.run(feeds)
            times.append((clock() - start) / steps / 1e3)
        alone[name] = median(times)
    if "one_device" in last_feeds and len(one_executables) == 1:
        time.sleep(SETTLE)
        times = []
        for _ in range(rounds):
            start = clock()
            for _ in range(steps):
                one_executables[0].run(last_feeds["one_device"])
            times.append((clock() - start) / steps / 1e3)
        alone["one_device"] = median(times)

    keys = per_step[0].keys() if per_step else ()
    result = {key: median([s[key] for s in per_step]) for key in keys}
    return {
        "steps": len(per_step),
        "segments": [{"name": n, "device": d, "nodes": len(s.nodes) if hasattr(s, "nodes") else None}
                     for (n, d), s in zip(segments, plan.segments)],
        "all_reduce_tasks": sum(1 for c in plan.comms if c.op == "AllReduce"),
        "reader_sums": len({n.meta[SUMMED_GROUP] for n in plan.graph.nodes if SUMMED_GROUP in n.meta}),
        "all_reduce_bytes": int(sum(plan.graph_value(c.inputs[0]).nbytes for c in plan.comms if c.op == "AllReduce")),
        "median_us": result,
        "alone_us": alone,
        "one_device_us": {key: median([s[key] for s in one_steps]) for key in ("wall", "ort")} if one_steps else {},
        "gd_version": getattr(gd, "__version__", None),
        "foreign": foreign,
    }


def _split(events: list[tuple[str, str, int, int]], segments: list[tuple[str, str]], t0: int, t1: int, t2: int,
           t3: int) -> dict[str, float]:
    """One step's timeline -> microseconds per part."""
    us = 1e3
    seg = {name: 0.0 for name, _ in segments}
    per_device: dict[str, float] = collections.defaultdict(float)
    device_of = dict(segments)
    intervals = []
    comm = 0.0
    for kind, name, start, end in events:
        intervals.append((start, end))
        if kind == "segment":
            seg[name] += (end - start) / us
            per_device[device_of[name]] += (end - start) / us
        elif kind == "comm":
            comm += (end - start) / us
    # Time covered by at least one segment or all-reduce, and by two segments at once.
    busy = 0
    cursor = t1
    for start, end in sorted(intervals):
        start = max(start, cursor)
        if end > start:
            busy += end - start
            cursor = end
    seg_iv = sorted((s, e) for kind, _, s, e in events if kind == "segment")
    both = 0
    for i, (s1, e1) in enumerate(seg_iv):
        for s2, e2 in seg_iv[i + 1:]:
            both += max(0, min(e1, e2) - max(s1, s2))
    first_start = min((s for s, _ in intervals), default=t1)
    last_end = max((e for _, e in intervals), default=t2)
    # The critical path: forward/backward segments (before the first all-reduce), the all-reduces, the update
    # segments (after the last all-reduce), and the hand-offs between them; these parts add up to `run`.
    comms = [(s, e) for kind, _, s, e in events if kind == "comm"]
    phases: dict[str, float] = {}
    if comms and seg_iv:
        comm_start, comm_end = min(s for s, _ in comms), max(e for _, e in comms)
        before = [(s, e) for s, e in seg_iv if e <= comm_start]
        after = [(s, e) for s, e in seg_iv if s >= comm_end]
        if before and after:
            fb_end, upd_start = max(e for _, e in before), min(s for s, _ in after)
            phases = {
                "path:dispatch": (min(s for s, _ in before) - t1) / us,
                "path:forward_backward": (fb_end - min(s for s, _ in before)) / us,
                "path:to_all_reduce": (comm_start - fb_end) / us,
                "path:all_reduce": (comm_end - comm_start) / us,
                "path:to_update": (upd_start - comm_end) / us,
                "path:update": (max(e for _, e in after) - upd_start) / us,
                "path:return": (t2 - max(e for _, e in after)) / us,
            }
    out = {
        "step": (t3 - t0) / us,
        "next": (t1 - t0) / us,
        "run": (t2 - t1) / us,
        "reduce": (t3 - t2) / us,
        "all_reduce": comm,
        "busy": busy / us,
        "concurrent": both / us,
        "idle_in_run": (t2 - t1 - busy) / us,
        "before_first": (first_start - t1) / us,
        "after_last": (t2 - last_end) / us,
    }
    out.update(phases)
    out.update({f"seg:{name}": value for name, value in seg.items()})
    out.update({f"dev:{device}": value for device, value in per_device.items()})
    return out


def _thread_accounting(setup: dict[str, Any], steps: int, rounds: int) -> dict[str, Any] | None:
    """CPU time and run-queue wait per step of each of this process's Python threads (Linux schedstat).

    ``/proc/self/task/<tid>/schedstat`` gives, per thread, the nanoseconds spent on a CPU and the
    nanoseconds spent runnable but waiting for one. Measured for the two Mirrored variants (dataset
    input and PerReplica halves), interleaved, without the instrumentation's timers.

    Returns:
        ``{variant: {"wall_us": ..., "threads": {group: {"cpu_us", "wait_us"}}}}``, or None where
        schedstat is unavailable.
    """
    def groups() -> dict[str, list[int]]:
        out: dict[str, list[int]] = collections.defaultdict(list)
        for thread in threading.enumerate():
            if thread.native_id is None:
                continue
            if thread is threading.main_thread():
                out["coordinating (main) thread"].append(thread.native_id)
            elif thread.name.startswith("graphdist-prefetch"):
                out["input prefetch thread"].append(thread.native_id)
            elif thread.name.startswith("graphdist-device"):
                out["device threads (ORT segments)"].append(thread.native_id)
        return out

    def read(tids: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
        totals = {}
        for group, ids in tids.items():
            cpu = wait = 0
            for tid in ids:
                try:
                    fields = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
                except OSError:
                    continue
                cpu += int(fields[0])
                wait += int(fields[1])
            totals[group] = (cpu, wait)
        return totals

    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        return None
    names = (_MIR, _MIR_PR)
    calls = setup["calls"]
    for name in names:
        calls[name]()
    tids = groups()
    sums: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(lambda: [0.0, 0.0]) for name in names}
    walls: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in (names if index % 2 == 0 else names[::-1]):
            time.sleep(SETTLE)
            before = read(tids)
            start = time.perf_counter_ns()
            for _ in range(steps):
                calls[name]()
            walls[name].append((time.perf_counter_ns() - start) / steps / 1e3)
            after = read(tids)
            for group in tids:
                sums[name][group][0] += (after[group][0] - before[group][0]) / 1e3
                sums[name][group][1] += (after[group][1] - before[group][1]) / 1e3
    total_steps = steps * rounds
    return {name: {"wall_us": median(walls[name]),
                   "threads": {group: {"cpu_us": cpu / total_steps, "wait_us": wait / total_steps}
                               for group, (cpu, wait) in sums[name].items()}}
            for name in names}


# ---------------------------------------------------------------------------------- run
def run(rounds: int | None = None, quick: bool = False, calls: int | None = None, tf: bool = True,
        tf_venv: Path = TF_VENV, sizes: Sequence[int] = SIZES, batch: int = BATCH,
        tf_cross_device_ops: str = TF_CROSS_DEVICE_OPS, tf_threads: tuple[int, int] = TF_THREADS,
        max_rounds: int | None = None, budget_s: float | None = None, wait_s: float | None = None,
        breakdown: bool = True) -> dict[str, Any]:
    """Measures the variants (see the module docstring).

    Args:
        rounds: Quiet rounds wanted (default :data:`ROUNDS`; ``quick``: 3).
        quick: A smoke run (few rounds and calls, no waiting; noisy).
        calls: Steps per variant per round (default :data:`CALLS`; ``quick``: 3).
        tf: Include TensorFlow when its environment exists.
        tf_venv: TensorFlow's environment.
        sizes: Layer widths (the smoke test uses a tiny MLP).
        batch: Global batch size (even).
        tf_cross_device_ops: TensorFlow Mirrored's all-reduce (see ``tf_mirrored_train.py``).
        tf_threads: TensorFlow's ``(intra_op, inter_op)`` threads.
        max_rounds: Most rounds in all (default 3 x ``rounds``; ``quick``: ``rounds``).
        budget_s: Seconds of timing after which no more rounds start once ``rounds`` ran (default 150).
        wait_s: Seconds to wait at most for a quiet machine before the first round (default 30; quick: 0).
        breakdown: Also run the instrumented pass (where graphdist Mirrored's time goes).

    Returns:
        ``{"name", "machine", "config", "checks", "tf", "us", "us_min", "samples_per_s",
        "samples_per_s_best", "ratios", "goal_met", "breakdown", "raw", ...}``. ``ratios``: throughput
        ratios (medians over the used rounds of the in-round ratio): ``mirrored/tf_mirrored``,
        ``mirrored/one_device``, ``tf_mirrored/tf_default``, ``one_device/tf_default``.
        ``goal_met``: graphdist Mirrored's throughput above TensorFlow Mirrored's (None when TF was not measured).
    """
    from graphdist.runtime.devices import thread_budget

    info = machine_info()
    rounds = rounds or (3 if quick else ROUNDS)
    calls = calls or (3 if quick else CALLS)
    max_rounds = max_rounds or (rounds if quick else 3 * rounds)
    budget_s = 150.0 if budget_s is None else budget_s
    wait_s = (0.0 if quick else 30.0) if wait_s is None else wait_s
    patience = 0.0 if quick else PATIENCE
    sizes = tuple(sizes)
    if batch % 2:
        raise ValueError(f"batch must be even (two replicas), got {batch}")

    setup = _build(sizes, batch)
    initial = _params(setup["one_model"])
    x, labels = setup["x"], setup["labels"]

    # --- checks: one step of each from the same weights
    ref_loss, ref_params = reference_step(initial, x, labels, LEARNING_RATE, batch)
    checks: dict[str, Any] = {"loss_reference": ref_loss}
    start = time.perf_counter()
    loss_mir = setup["calls"][_MIR]()
    first_call = {"mirrored": time.perf_counter() - start}
    start = time.perf_counter()
    loss_one = float(setup["calls"][_ONE]())
    first_call["one_device"] = time.perf_counter() - start
    checks.update(loss_mirrored=loss_mir, loss_one_device=loss_one)
    mir_params, one_params = _params(setup["mir_model"]), _params(setup["one_model"])
    checks["mirrored_vs_one_device"] = _compare("graphdist Mirrored vs OneDevice after one step", mir_params,
                                                one_params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss_mir, loss_one, rtol=1e-5, err_msg="loss: Mirrored vs OneDevice")
    checks["mirrored_vs_reference"] = _compare("graphdist Mirrored vs float64 numpy", mir_params, ref_params,
                                               rtol=1e-4, atol=1e-6)
    checks["one_device_vs_reference"] = _compare("graphdist OneDevice vs float64 numpy", one_params, ref_params,
                                                 rtol=1e-4, atol=1e-6)
    replica_copies = setup["mirrored"].experimental_local_results(setup["mir_model"].trainable_variables[0])
    checks["mirrored_replicas_equal"] = bool(all(np.array_equal(np.asarray(replica_copies[0]), np.asarray(c))
                                                 for c in replica_copies[1:]))
    concrete = _mirrored_concrete(setup)
    plan_info = {"segments": [(s.name, s.device) for s in concrete.plan.segments],
                 "comms": sum(1 for c in concrete.plan.comms if c.op == "AllReduce"),
                 "threads_per_device": thread_budget(len(DEVICES)), "one_device_threads": thread_budget(1),
                 "cross_device_ops": repr(getattr(setup["mirrored"], "cross_device_ops", None))}

    variants: dict[str, Callable[[int], float]] = {name: timed(fn) for name, fn in setup["calls"].items()}

    # --- TensorFlow
    tf_result: dict[str, Any] = {"status": "not requested"}
    tf_process: TFMirroredProcess | None = None
    tf_default: TFMirroredProcess | None = None
    meter = CpuMeter()
    tmp = tempfile.TemporaryDirectory()
    times: dict[str, list[float]] = {}
    foreign: list[float] = []
    waited = 0.0
    load_start = load_end = None
    try:
        python = tf_venv / "bin" / "python"
        if tf and not python.exists():
            tf_result = {"status": "skipped", "reason": f"no TensorFlow environment at {tf_venv} (create it with "
                                                         "`python -m benchmarks.bench_train_step --setup-tf`)"}
        elif tf:
            data = Path(tmp.name) / "data.npz"
            arrays = {"x": x, "labels": labels, "lr": np.float32(LEARNING_RATE), "global_batch": np.int64(batch)}
            arrays.update({_param_key(i): a for i, a in enumerate(initial)})
            np.savez(data, **arrays)
            try:
                got = _tf_check(python, data, tf_cross_device_ops, tf_threads, Path(tmp.name) / "check.npz")
                names = [_param_key(i) for i in range(len(initial))]
                for variant in ("mirrored", "default"):
                    checks[f"loss_tf_{variant}"] = float(got[f"{variant}_loss"])
                    checks[f"tf_{variant}_vs_reference"] = _compare(
                        f"TensorFlow {variant} vs float64 numpy", [got[f"{variant}_{n}"] for n in names], ref_params,
                        rtol=1e-4, atol=1e-6)
                checks["tf_mirrored_vs_graphdist_mirrored"] = _compare(
                    "TensorFlow Mirrored vs graphdist Mirrored", [got[f"mirrored_{n}"] for n in names], mir_params,
                    rtol=1e-4, atol=1e-6)
                checks["tf_mirrored_replicas_equal"] = bool(got["mirrored_replicas_equal"])
                tf_process = TFMirroredProcess(python, data, tf_cross_device_ops, tf_threads, ("mirrored",))
                meter.pids.append(tf_process.pid)
                tf_default = TFMirroredProcess(python, data, "default", TF_DEFAULT_THREADS, ("default",))
                meter.pids.append(tf_default.pid)
                variants[_TFM] = tf_process.blocker("mirrored")
                variants[_TFD] = tf_default.blocker("default")
                tf_result = {"status": "measured", **{k: v for k, v in tf_process.info.items() if k != "ready"},
                             "default": {k: v for k, v in tf_default.info.items() if k != "ready"}}
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
                tf_result = {"status": "failed", "reason": str(err)}
                logger.warning("TensorFlow part skipped: %s", err)

        # --- timing, interleaved
        names = [name for name in ORDER if name in variants]
        timing = quiet_rounds(variants, names, meter, calls=calls, rounds=rounds, max_rounds=max_rounds,
                              budget_s=budget_s, wait_s=wait_s, patience=patience, settle=SETTLE, foreign=foreign,
                              quiet_window=1.0)
        times, waited = timing["times"], timing["waited"]
        load_start, load_end = [round(v, 2) for v in timing["load_start"] or []] or None, \
            [round(v, 2) for v in timing["load_end"] or []] or None
    finally:
        for process in (tf_process, tf_default):
            if process is not None:
                process.close()
        tmp.cleanup()

    parts = None
    if breakdown:
        wait_quiet(CpuMeter(), 0.0 if quick else 20.0, 1.0)
        parts = _breakdown(setup, steps=calls, rounds=max(3, min(rounds, 7)))
        parts["threads"] = _thread_accounting(setup, steps=calls, rounds=max(2, min(rounds, 6)))

    final = _params(setup["mir_model"]) + _params(setup["one_model"])
    checks["finite_after_timing"] = bool(all(np.isfinite(a).all() for a in final))
    quiet = [i for i, share in enumerate(foreign) if share <= QUIET]
    used = quiet if len(quiet) >= min(MIN_QUIET, rounds) else list(range(len(foreign)))

    def throughput_ratio(a: str, b: str) -> float | None:
        if a not in times or b not in times or not used:
            return None
        return median([times[b][i] / times[a][i] for i in used])  # samples/s of a over b = time b / time a

    us = {name: median([values[i] for i in used]) for name, values in times.items()}
    us_min = {name: min(values) for name, values in times.items()}
    ratios = {"mirrored/tf_mirrored": throughput_ratio(_MIR, _TFM),
              "mirrored/one_device": throughput_ratio(_MIR, _ONE),
              "mirrored_halves/mirrored": throughput_ratio(_MIR_PR, _MIR),
              "tf_mirrored/tf_default": throughput_ratio(_TFM, _TFD),
              "one_device/tf_default": throughput_ratio(_ONE, _TFD)}
    goal = ratios["mirrored/tf_mirrored"]
    quartiles = None
    if _MIR in times and _TFM in times and len(used) >= 2:
        q = statistics.quantiles([times[_TFM][i] / times[_MIR][i] for i in used], n=4)
        quartiles = [q[0], q[2]]
    disturbed = [i for i, share in enumerate(foreign) if share > QUIET]
    disturbed_summary = None
    if len(disturbed) >= 3:
        disturbed_summary = {
            "rounds": len(disturbed),
            "foreign": median([foreign[i] for i in disturbed]),
            "us": {name: median([values[i] for i in disturbed]) for name, values in times.items()},
        }
    return {
        "name": NAME,
        "machine": info,
        "config": {"sizes": list(sizes), "batch": batch, "learning_rate": LEARNING_RATE, "devices": list(DEVICES),
                   "rounds": rounds, "rounds_run": len(foreign), "calls": calls, "quiet_threshold": QUIET,
                   "settle_s": SETTLE, "waited_s": waited, "tf_cross_device_ops": tf_cross_device_ops,
                   "tf_threads": list(tf_threads)},
        "plan": plan_info,
        "first_call_s": first_call,
        "checks": checks,
        "tf": tf_result,
        "us": us,
        "us_min": us_min,
        "samples_per_s": {name: batch / (value / 1e6) for name, value in us.items()},
        "samples_per_s_best": {name: batch / (value / 1e6) for name, value in us_min.items()},
        "ratios": ratios,
        "foreign": foreign,
        "quiet": len(quiet),
        "used_quiet": used is quiet,
        "loadavg": {"start": load_start, "end": load_end},
        "goal_met": None if goal is None else bool(goal > 1.0),
        "goal_ratio_quartiles": quartiles,
        "disturbed": disturbed_summary,
        "breakdown": parts,
        "raw": times,
    }


# ------------------------------------------------------------------------------- TF scan
def tf_scan(rounds: int = 9, calls: int = 20, tf_venv: Path = TF_VENV,
            settings: Sequence[tuple[str, tuple[int, int]]] | None = None) -> dict[str, Any]:
    """TensorFlow Mirrored's step time per (cross-device ops, (intra-op, inter-op)) setting, interleaved.

    One TF process per setting (thread pools are per process), all alive at once; each round asks
    every process for one block of ``calls`` steps, the order reversed every other round.
    """
    settings = list(settings or [(ops, threads) for ops in ("default", "reduction_to_one", "hierarchical_copy")
                                 for threads in ((1, 2), (2, 2), (2, 1))])
    chosen_setting = (TF_CROSS_DEVICE_OPS, TF_THREADS)
    if chosen_setting in settings:  # the benchmark's setting first: the ratios are relative to it
        settings.remove(chosen_setting)
        settings.insert(0, chosen_setting)
    python = tf_venv / "bin" / "python"
    sizes, batch = SIZES, BATCH
    rng = np.random.default_rng(0)
    arrays: dict[str, Any] = {"lr": np.float32(LEARNING_RATE), "global_batch": np.int64(batch)}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        arrays[f"w{i}"] = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        arrays[f"b{i}"] = np.zeros(fan_out, np.float32)
    arrays["x"] = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    arrays["labels"] = rng.integers(0, sizes[-1], batch).astype(np.int64)
    processes: dict[str, TFMirroredProcess] = {}
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.npz"
        np.savez(data, **arrays)
        try:
            for ops, threads in settings:
                label = f"{ops}, intra {threads[0]}, inter {threads[1]}"
                processes[label] = TFMirroredProcess(python, data, ops, threads, variants=("mirrored",), wait=False)
            for process in processes.values():
                process.ready()
            blocks = {label: p.blocker("mirrored") for label, p in processes.items()}
            labels = list(blocks)
            times = {label: [] for label in labels}
            for index in range(rounds):
                for label in (labels if index % 2 == 0 else labels[::-1]):
                    time.sleep(SETTLE)
                    times[label].append(blocks[label](calls))
            chosen = {label: p.info["variants"]["mirrored"]["cross_device_ops"] for label, p in processes.items()}
        finally:
            for process in processes.values():
                process.close()
    first = next(iter(times), None)
    return {"rounds": rounds, "calls": calls, "us": {label: median(v) for label, v in times.items()},
            "us_min": {label: min(v) for label, v in times.items()}, "cross_device_ops": chosen,
            "vs_first": {label: median([a / b for a, b in zip(v, times[first])]) for label, v in times.items()},
            "first": first, "loadavg": loadavg(2), "date": time.strftime("%Y-%m-%d")}


# ------------------------------------------------------------------------------ reports
def _ratio_text(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.3f}x"


def table(results: dict[str, Any]) -> str:
    """A plain-text table of :func:`run`'s results."""
    cfg = results["config"]
    lines = [
        f"MLP {'-'.join(map(str, cfg['sizes']))}, global batch {cfg['batch']}, SGD {cfg['learning_rate']}: "
        f"{cfg['rounds_run']} rounds x {cfg['calls']} steps; {results['quiet']} quiet rounds "
        f"(medians over {'those' if results['used_quiet'] else 'all rounds'}); load {results['loadavg']}",
        f"  {'variant':<40}{'median ms':>10}{'samples/s':>11}{'min ms':>9}{'best samples/s':>16}",
    ]
    for name in ORDER:
        if name in results["us"]:
            lines.append(f"  {name:<40}{results['us'][name] / 1e3:>10.2f}{results['samples_per_s'][name]:>11.0f}"
                         f"{results['us_min'][name] / 1e3:>9.2f}{results['samples_per_s_best'][name]:>16.0f}")
    r = results["ratios"]
    lines.append(f"  throughput Mirrored/TF Mirrored {_ratio_text(r['mirrored/tf_mirrored'])}, Mirrored/OneDevice "
                 f"{_ratio_text(r['mirrored/one_device'])}, TF Mirrored/TF default "
                 f"{_ratio_text(r['tf_mirrored/tf_default'])}; goal (ahead of TF Mirrored): "
                 f"{'not measured' if results['goal_met'] is None else ('met' if results['goal_met'] else 'NOT met')}")
    if results["tf"]["status"] != "measured":
        lines.append(f"  TensorFlow {results['tf']['status']}: {results['tf'].get('reason', '')}")
    parts = results.get("breakdown")
    if parts:
        m = parts["median_us"]
        lines.append("  graphdist Mirrored step (instrumented, median us): " + ", ".join(
            f"{key} {value:.0f}" for key, value in m.items()))
        lines.append("  segments alone (us): " + ", ".join(f"{k} {v:.0f}" for k, v in parts["alone_us"].items()))
        lines.append("  OneDevice (instrumented): "
                     + ", ".join(f"{k} {v:.0f}" for k, v in parts["one_device_us"].items()))
    return "\n".join(lines)


def _fill(parts: list[str]) -> str:
    def fill(part: str) -> str:
        if not part or part[0] in "#|":
            return part
        indent = "  " if part.startswith("- ") else ""
        return textwrap.fill(part, width=100, subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False)

    return "\n".join(fill(part) for part in parts)


def _verdict(results: dict[str, Any]) -> str:
    """The goal's verdict, with the spread of the in-round ratios when it straddles 1."""
    if results["goal_met"] is None:
        return "not measured (no TensorFlow)"
    quartiles = results.get("goal_ratio_quartiles")
    if not quartiles:
        return "**met**" if results["goal_met"] else "**not met**"
    low, high = quartiles
    spread = f"the middle half of the in-round ratios spans {low:.3f}x-{high:.3f}x"
    if low > 1.0:
        return f"**met** ({spread})"
    if results["goal_met"]:
        return f"**met on the median only**: a tie within the noise ({spread})"
    if high >= 1.0:
        return f"**not met**: a tie within the noise ({spread})"
    return f"**not met** ({spread})"


def _reading(results: dict[str, Any]) -> list[str]:
    """Paragraphs that explain the numbers (from the instrumented pass and the disturbed rounds)."""
    out = []
    b, us, r = results.get("breakdown"), results["us"], results["ratios"]
    m = b["median_us"] if b else {}
    if "path:forward_backward" in m:
        serial = sum(m[k] for k in ("path:dispatch", "path:to_all_reduce", "path:all_reduce", "path:to_update",
                                    "path:update", "path:return")) + m["reduce"] + m["next"]
        before = [seg["name"] for seg in b["segments"] if seg["name"] in b["alone_us"]][:2]
        alone_text = " and ".join(f"{b['alone_us'][name]:.0f}" for name in before)
        one = b["one_device_us"]
        text = (
            f"Reading: the two forward/backward segments run side by side ({m['path:forward_backward']:.0f} us for "
            f"both; alone they take {alone_text} us), and then "
            f"the step is serial: {m['path:all_reduce']:.0f} us of all-reduces on the coordinating thread, "
            f"{m['path:update']:.0f} us of SGD update segment on cpu:1, "
            f"{m['path:dispatch'] + m['path:to_all_reduce'] + m['path:to_update'] + m['path:return']:.0f} us of "
            "dispatch and hand-offs between the coordinating thread and the device threads, and "
            f"{m['reduce'] + m['next']:.0f} us of `strategy.reduce` and `next()`: {serial:.0f} us, "
            f"{serial / m['step']:.0%} of the instrumented step, during which one of the two cores idles. "
            f"OneDevice keeps both cores busy for its whole step (one ORT segment with two intra-op threads, "
            f"{one.get('ort', float('nan')):.0f} us of {one.get('wall', float('nan')):.0f} us) and needs no "
            f"all-reduce, so on a 2-core machine data parallelism over logical devices does not pay: Mirrored / "
            f"OneDevice = {_ratio_text(r['mirrored/one_device'])} in throughput.")
        if r.get("tf_mirrored/tf_default") is not None:
            text += (f" TensorFlow pays the same structural price: its Mirrored step reaches "
                     f"{_ratio_text(r['tf_mirrored/tf_default'])} of its default strategy's throughput.")
        out.append(text)
    threads = b.get("threads") if b else None
    if threads and _MIR in threads and _MIR_PR in threads:
        ds, pr = threads[_MIR], threads[_MIR_PR]
        pf = ds["threads"].get("input prefetch thread", {"cpu_us": 0.0, "wait_us": 0.0})
        dev = "device threads (ORT segments)"
        extra_dev = ds["threads"].get(dev, {}).get("cpu_us", 0.0) - pr["threads"].get(dev, {}).get("cpu_us", 0.0)
        halves = r.get("mirrored_halves/mirrored")
        out.append(
            f"Input: `next(iterator)` itself takes {m.get('next', float('nan')):.0f} us; the distributed "
            f"dataset's prefetch thread then produces the next element while the devices compute, using "
            f"{pf['cpu_us']:.0f} us of CPU per step and waiting {pf['wait_us']:.0f} us per step for a core (both "
            f"cores run device threads then); the device threads' CPU time differs by {extra_dev:+.0f} us per "
            f"step from the PerReplica variant's. In this pass the dataset step took {ds['wall_us']:.0f} us, the "
            f"PerReplica step {pr['wall_us']:.0f} us"
            + (f"; in the timed rounds the PerReplica variant has {halves:.3f}x the dataset variant's throughput."
               if halves else ".")
            + " TensorFlow's input pipeline runs in its own C++ threads, which compete for the same two cores.")
    d = results.get("disturbed")
    if d and _MIR in d["us"] and _ONE in d["us"]:
        quiet_ratio = us[_ONE] / us[_MIR]
        text = (f"Under load: in the {d['rounds']} disturbed rounds (other processes used a median "
                f"{d['foreign']:.0%} of the CPU time, excluded from the table) OneDevice took "
                f"{d['us'][_ONE] / 1e3:.2f} ms per step and Mirrored {d['us'][_MIR] / 1e3:.2f} ms (Mirrored / "
                f"OneDevice throughput {d['us'][_ONE] / d['us'][_MIR]:.2f}x, {quiet_ratio:.2f}x in the quiet "
                "rounds): a session with one intra-op thread per device loses less to a busy core than one whose "
                "two threads must both make progress.")
        if _TFM in d["us"]:
            text += f" TensorFlow Mirrored: {d['us'][_TFM] / 1e3:.2f} ms."
        out.append(text)
    return out


def markdown(results: dict[str, Any], notes: Sequence[str] = ()) -> str:
    """This benchmark's section of BENCHMARKS.md (with its own machine line).

    Args:
        results: From :func:`run`.
        notes: Extra paragraphs appended at the end (e.g. the TF scan, the reading of the numbers).
    """
    cfg, checks, tf, r = results["config"], results["checks"], results["tf"], results["ratios"]
    info = results["machine"]
    arch = "-".join(map(str, cfg["sizes"]))
    plan = results["plan"]
    tf_line = ""
    if tf["status"] == "measured":
        mv = tf["variants"]["mirrored"]
        devices = ", ".join(d.rsplit("/", 1)[-1].removeprefix("device:") for d in mv["devices"])
        tf_line = (f"TensorFlow {tf['tensorflow']}: `{mv['strategy']}` on {devices} with "
                   f"`{mv['cross_device_ops']}`, intra-op {tf['intra_op']}, inter-op {tf['inter_op']} threads; the "
                   f"default strategy in a process of its own with intra-op {tf['default']['intra_op']}, inter-op "
                   f"{tf['default']['inter_op']} (as in the MLP training step section).")
    parts = [
        "## MLP training throughput: Mirrored on 2 logical devices",
        "",
        f"Training throughput (samples/s = global batch / step time) of the MLP {arch} (ReLU, He init, seed 0), "
        f"global batch {cfg['batch']}, softmax cross-entropy averaged over the global batch, SGD "
        f"{cfg['learning_rate']}, float32, on two logical CPU devices of one process:",
        "",
        f"- **graphdist Mirrored**: `gd.MirroredStrategy([\"cpu:0\", \"cpu:1\"])` (`{plan['cross_device_ops']}`, "
        f"the in-process ring all-reduce; {plan['threads_per_device']} intra-op thread per device), "
        "`model.make_train_step(SGD(0.01), 256)`; input "
        "`strategy.experimental_distribute_dataset(Dataset.from_tensors((x, labels)).repeat())` (which prefetches "
        "in a thread of its own), each step "
        "`float(strategy.reduce(\"SUM\", strategy.run(step, args=next(it)), axis=None))`.",
        "- **graphdist Mirrored, PerReplica halves** (diagnostic): the same, but each step builds "
        "`gd.PerReplica((x[:128], x[128:]))` from the fixed global batch instead of the dataset.",
        f"- **graphdist OneDevice**: `gd.OneDeviceStrategy(\"cpu:0\")`, `strategy.run(step, args=(x, labels))` on "
        f"the whole batch ({plan['one_device_threads']} intra-op threads).",
        "- **TensorFlow Mirrored**: `benchmarks/tf_mirrored_train.py` in `.bench-venvs/tf`: the physical CPU split "
        "with `tf.config.set_logical_device_configuration(cpu, [LogicalDeviceConfiguration()] * 2)`, "
        "`tf.distribute.MirroredStrategy([\"/cpu:0\", \"/cpu:1\"], cross_device_ops)`, `tf.Variable`s in its "
        "scope, a `tf.function` (no XLA) that takes `next(iterator)` of "
        "`strategy.experimental_distribute_dataset(from_tensors((x, labels)).repeat().prefetch(2))`, runs "
        "`strategy.run(replica_step)` (GradientTape, `ReplicaContext.all_reduce(SUM, grads)`, "
        "`assign_sub(lr * g)`) and returns `strategy.reduce(SUM, loss)`; the loss fetched with `.numpy()` "
        "every step.",
        "- **TensorFlow, default strategy** (reference): the same script and input path under "
        "`tf.distribute.get_strategy()`.",
        "",
        "Checks (one step from the same initial weights): graphdist Mirrored vs OneDevice largest relative "
        f"difference {checks['mirrored_vs_one_device']:.1e} (`assert_allclose` rtol 1e-5, atol 1e-6); against an "
        f"independent float64 numpy step (rtol 1e-4, atol 1e-6): Mirrored {checks['mirrored_vs_reference']:.1e}, "
        f"OneDevice {checks['one_device_vs_reference']:.1e}"
        + (f", TensorFlow Mirrored {checks['tf_mirrored_vs_reference']:.1e}, TensorFlow default "
           f"{checks['tf_default_vs_reference']:.1e}; TensorFlow Mirrored vs graphdist Mirrored "
           f"{checks['tf_mirrored_vs_graphdist_mirrored']:.1e}; TensorFlow's two replicas hold identical "
           f"copies: {'yes' if checks['tf_mirrored_replicas_equal'] else 'no'}." if "tf_mirrored_vs_reference" in checks
           else "."),
        "",
        f"Method: each round times every variant for {cfg['calls']} steps in a row after a "
        f"{cfg['settle_s'] * 1e3:.0f} ms pause, the order reversed every other round; TensorFlow runs in a "
        "subprocess that times one block per request, so its blocks interleave with graphdist's. The machine is "
        "shared: the benchmark reads `/proc/stat` and its own processes' CPU time during every block and marks "
        f"a round disturbed when other processes used more than {cfg['quiet_threshold']:.0%} of the CPU time; "
        f"disturbed rounds are repeated (within a time budget) until {cfg['rounds']} are quiet. "
        f"{results['quiet']} of {cfg['rounds_run']} rounds were quiet; medians over "
        f"{'those' if results['used_quiet'] else 'all rounds (too few quiet ones)'}, *best* = the fastest round. "
        "Ratios are throughput ratios, medians over the same rounds of the ratio within a round. Source: "
        "`benchmarks/bench_mirrored_train.py`.",
        "",
        "Machine for these numbers: " + machine_markdown(info).split("\n", 2)[2].replace("\n- ", "; ")
        .removeprefix("- ") + f"; load average at the first round {results['loadavg']['start']}, after the last "
        f"{results['loadavg']['end']}.",
        "",
        "**Goal:** graphdist Mirrored's throughput ahead of TensorFlow's MirroredStrategy (same model, batch, "
        "devices).",
        "",
        "| variant | median ms/step | median samples/s | best ms/step | best samples/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ORDER:
        if name in results["us"]:
            label = f"*{name}* (diagnostic)" if name in DIAGNOSTIC else name
            parts.append(f"| {label} | {results['us'][name] / 1e3:.2f} | {results['samples_per_s'][name]:,.0f} | "
                         f"{results['us_min'][name] / 1e3:.2f} | {results['samples_per_s_best'][name]:,.0f} |")
    verdict = _verdict(results)
    parts += [
        "",
        f"Throughput graphdist Mirrored / TensorFlow Mirrored = **{_ratio_text(r['mirrored/tf_mirrored'])}**; "
        f"graphdist Mirrored / graphdist OneDevice = **{_ratio_text(r['mirrored/one_device'])}**; TensorFlow "
        f"Mirrored / TensorFlow default = {_ratio_text(r['tf_mirrored/tf_default'])}; graphdist OneDevice / "
        f"TensorFlow default = {_ratio_text(r['one_device/tf_default'])}. Goal: {verdict}. " + tf_line,
    ]
    if tf["status"] != "measured":
        parts.append(f"TensorFlow was {tf['status']}: {tf.get('reason', '')}")
    b = results.get("breakdown")
    if b:
        m, alone, one = b["median_us"], b["alone_us"], b["one_device_us"]
        seg_names = [s["name"] for s in b["segments"]]
        parts += [
            "",
            "### Where graphdist Mirrored's step spends its time",
            "",
            f"An instrumented pass ({b['steps']} steps, median per step; timers around every segment executable's "
            "`run`, the communicator's `all_reduce`, `next(iterator)`, `strategy.run` and `strategy.reduce`, "
            "installed from the benchmark; other processes used "
            f"{'?' if b.get('foreign') is None else format(b['foreign'], '.0%')} of the CPU time meanwhile). "
            f"The plan: {len(seg_names)} ONNX Runtime segments "
            f"({', '.join(seg['name'] + ' on ' + seg['device'] for seg in b['segments'])}) and "
            f"{b['all_reduce_tasks']} all-reduces of {b['all_reduce_bytes']:,} B per replica in all; "
            f"{b.get('reader_sums', 0)} gradients summed inside the segment of the replica "
            "that updates them (`LowerSingleReaderAllReducesPass`).",
            "",
            "Critical path of one step (the parts of `strategy.run` add up to it):",
            "",
            "| part | us/step |",
            "|---|---:|",
            f"| whole step (next + run + reduce) | {m['step']:.0f} |",
            f"| `next(iterator)` (distributed dataset) | {m['next']:.0f} |",
            f"| `strategy.run` | {m['run']:.0f} |",
        ]
        path = [("path:dispatch", "dispatch: `strategy.run` to the first segment's start"),
                ("path:forward_backward", "forward + backward, both devices at once"),
                ("path:to_all_reduce", "hand-off: last device thread done to the first all-reduce"),
                ("path:all_reduce", f"{b['all_reduce_tasks']} all-reduces (coordinating thread)"),
                ("path:to_update", "hand-off: last all-reduce to the update segment"),
                ("path:update", "update segment (SGD)"),
                ("path:return", "return: outputs to `strategy.run`'s result")]
        for key, label in path:
            if key in m:
                parts.append(f"| &nbsp;&nbsp;{label} | {m[key]:.0f} |")
        parts += [
            f"| `strategy.reduce` + `float` | {m['reduce']:.0f} |",
            "",
            "Per segment (ONNX Runtime `run`, in the step; *alone*: the same segment and feeds run by themselves, "
            "nothing else running):",
            "",
            "| segment | device | in the step us | alone us |",
            "|---|---|---:|---:|",
        ]
        for seg in b["segments"]:
            name = seg["name"]
            parts.append(f"| {name} | {seg['device']} | {m.get('seg:' + name, 0):.0f} | "
                         f"{alone.get(name, float('nan')):.0f} |")
        parts += [
            "",
            f"The two forward/backward segments overlap for {m['concurrent']:.0f} us per step; time in "
            f"`local.all_reduce` {m['all_reduce']:.0f} us; time in `strategy.run` with no segment and no "
            f"all-reduce running {m['idle_in_run']:.0f} us.",
            "",
            "| *OneDevice step, same pass* | us/step |",
            "|---|---:|",
            f"| `strategy.run` | {one.get('wall', 0):.0f} |",
            f"| its one ORT segment (2 intra-op threads) | {one.get('ort', 0):.0f} |",
            f"| the segment alone | {alone.get('one_device', float('nan')):.0f} |",
        ]
        threads = b.get("threads")
        if threads and _MIR in threads and _MIR_PR in threads:
            ds, pr = threads[_MIR], threads[_MIR_PR]
            parts += [
                "",
                "CPU time per step of each thread, from the kernel's per-thread `schedstat` (time on a CPU, and "
                "time runnable but waiting for one), both Mirrored variants interleaved without the timers above:",
                "",
                "| thread | dataset: CPU us/step | dataset: waiting for a core | PerReplica halves: CPU us/step | "
                "halves: waiting for a core |",
                "|---|---:|---:|---:|---:|",
            ]
            for group in ds["threads"]:
                d, h = ds["threads"][group], pr["threads"].get(group, {"cpu_us": 0.0, "wait_us": 0.0})
                parts.append(f"| {group} | {d['cpu_us']:.0f} | {d['wait_us']:.0f} | {h['cpu_us']:.0f} | "
                             f"{h['wait_us']:.0f} |")
            parts.append(f"| *step wall time* | {ds['wall_us']:.0f} | | {pr['wall_us']:.0f} | |")
    reading = _reading(results)
    if reading:
        parts += ["", *[p for paragraph in reading for p in (paragraph, "")][:-1]]
    scan = results.get("tf_scan")
    if scan:
        parts += [
            "",
            "### TensorFlow Mirrored's settings",
            "",
            f"Which cross-device ops and thread pools TensorFlow Mirrored gets was chosen by `--tf-scan` "
            f"(measured {scan.get('date', '')}): one TF process per setting, all alive at once, {scan['rounds']} "
            f"interleaved rounds of {scan['calls']} steps (load average afterwards {scan['loadavg']}). Every "
            "setting trains correctly; NCCL is GPU-only. TensorFlow's own choice on a CPU-only machine (`default`) "
            "is `CollectiveAllReduce`.",
            "",
            f"| cross-device ops, threads | median ms/step | best ms/step | step time vs {scan['first']} "
            "(median in-round ratio) |",
            "|---|---:|---:|---:|",
        ]
        for label in sorted(scan["us"], key=lambda k: scan["us"][k]):
            parts.append(f"| `{scan['cross_device_ops'][label]}` ({label}) | {scan['us'][label] / 1e3:.2f} | "
                         f"{scan['us_min'][label] / 1e3:.2f} | {scan['vs_first'][label]:.3f}x |")
    parts += ["", *notes] if notes else []
    return _fill(parts)


def write_section(text: str, path: Path = BENCHMARKS_MD) -> Path:
    """Replaces this benchmark's section of BENCHMARKS.md, or appends it; leaves every other section alone
    (the machine section too: this section states its own machine)."""
    return replace_section(NAME, text, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints a table, optionally updates BENCHMARKS.md.

    Returns:
        0, or 1 when graphdist Mirrored is measured behind TensorFlow Mirrored.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_mirrored_train",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help=f"quiet rounds wanted (default {ROUNDS})")
    parser.add_argument("--calls", type=int, default=None, help=f"steps per variant per round (default {CALLS})")
    parser.add_argument("--quick", action="store_true", help="a few rounds of a few steps: a smoke run")
    parser.add_argument("--budget", type=float, default=None, help="seconds of timing for repeated rounds (150)")
    parser.add_argument("--no-tf", action="store_true", help="leave TensorFlow out")
    parser.add_argument("--tf-cross-device-ops", default=TF_CROSS_DEVICE_OPS,
                        choices=("default", "reduction_to_one", "hierarchical_copy"))
    parser.add_argument("--tf-threads", default=",".join(map(str, TF_THREADS)),
                        help="INTRA,INTER threads of TF Mirrored (default %(default)s)")
    parser.add_argument("--tf-scan", action="store_true", help="time TF Mirrored's settings against each other, exit")
    parser.add_argument("--scan-json", metavar="FILE", help="a saved `--tf-scan --json` result to include")
    parser.add_argument("--note", action="append", default=[], help="a paragraph to append to the section")
    parser.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    parser.add_argument("--write", action="store_true", help="replace or append this section of BENCHMARKS.md")
    parser.add_argument("-v", "--verbose", action="store_true", help="log per-round times")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")
    if args.tf_scan:
        scan = tf_scan(rounds=args.rounds or 9, calls=args.calls or CALLS)
        for label, value in sorted(scan["us"].items(), key=lambda kv: kv[1]):
            print(f"  {label:<40}{value / 1e3:>8.2f} ms  (min {scan['us_min'][label] / 1e3:.2f}; "
                  f"{scan['cross_device_ops'][label]})")
        print(f"  load {scan['loadavg']}")
        if args.json:
            Path(args.json).write_text(json.dumps(scan, indent=1))
        return 0
    threads = tuple(int(v) for v in args.tf_threads.split(","))
    results = run(rounds=args.rounds, quick=args.quick, calls=args.calls, tf=not args.no_tf, budget_s=args.budget,
                  tf_cross_device_ops=args.tf_cross_device_ops, tf_threads=threads)  # type: ignore[arg-type]
    if args.scan_json:
        results["tf_scan"] = json.loads(Path(args.scan_json).read_text())
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.write:
        print(f"wrote {write_section(markdown(results, args.note))}")
    return 0 if results["goal_met"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
