"""Training-step time of the MLP: graphdist (OneDevice) vs plain numpy vs TensorFlow.

The step: the 784-512-512-10 MLP (ReLU, He init from ``graphdist.models.mlp.MLP``,
seed 0), batch 256, softmax cross-entropy averaged over the global batch,
gradients of every weight and bias, plain SGD (learning rate 0.01).

* **graphdist**: ``strategy = gd.OneDeviceStrategy("cpu:0")``; the model and
  ``gd.optimizers.SGD(0.01)`` are built in its scope; ``step =
  model.make_train_step(opt, 256)``; each timed call is ``strategy.run(step,
  args=(x, labels))`` (traced and compiled by the first call, before timing).
* **numpy**: the same step written by hand (:class:`NumpyTrainStep`):
  forward, log-sum-exp cross-entropy, backward, in-place SGD update, float32,
  from the same initial arrays. One step of each from the same start is
  compared before timing (``assert_allclose``, rtol 1e-4), so both compute
  the same thing.
* **TensorFlow** (optional): ``benchmarks/tf_train_step.py`` in its own
  environment (``.bench-venvs/tf``, made by ``--setup-tf``): raw
  ``tf.Variable`` weights, ``tf.GradientTape``, ``tf.function`` (no XLA),
  the default strategy's ``run``. It runs as a subprocess that stays alive
  and times one block of calls per request, so its rounds interleave with the
  others. Its first step is checked against numpy's too.

All three use the same number of intra-op threads: graphdist's
(``thread_budget(1)``, the cores this process may use: 2 on the reference
machine); numpy's OpenBLAS pool is limited to it with threadpoolctl when that
is installed, TensorFlow gets ``--intra-op``.

Timing: ``rounds`` rounds; every round times each variant for ``calls``
calls in a row, after a pause of :data:`SETTLE` (OpenBLAS's and ONNX
Runtime's workers spin for a while after a call and would slow down the next
variant), the order reversed every other round. The
machine may be shared: for every block the benchmark reads ``/proc/stat``
and the CPU time of its own processes (this one and TensorFlow's), and marks
the round *disturbed* when other processes used more than :data:`QUIET` of
the machine's CPU time during any block. Disturbed rounds are repeated (after
waiting up to :data:`PATIENCE` seconds for quiet) until ``rounds`` rounds were
quiet, within a round limit and a time budget. Medians are taken over the
quiet rounds (over all rounds when fewer than :data:`MIN_QUIET` are quiet);
the headline ratios are medians over rounds of the ratio within the round.
``--json FILE`` saves everything, ``--from-json FILE --write`` re-renders the
section from such a file without measuring again.

Diagnostics: the time of graphdist's ONNX Runtime session called alone
(Python overhead of ``strategy.run`` = the difference), the matrix products
of the numpy step alone, and an ONNX Runtime kernel profile of the step's
graph grouped by operator (where the time goes).

    python -m benchmarks.bench_train_step [--rounds N] [--quick] [--no-tf] [--write]
    python -m benchmarks.bench_train_step --setup-tf     # creates .bench-venvs/tf
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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import machine_info, median, update_section
from benchmarks.quiet import QUIET, CpuMeter, quiet_rounds, timed
from benchmarks.tf_serve import ServeProcess

__all__ = [
    "NAME", "SIZES", "BATCH", "LEARNING_RATE", "QUIET", "MIN_QUIET", "TF_VENV", "TF_SCRIPT",
    "NumpyTrainStep", "TFProcess", "setup_tf_venv", "run", "summarize", "table", "markdown", "main",
]

logger = logging.getLogger(__name__)

NAME = "train_step"
SIZES: tuple[int, ...] = (784, 512, 512, 10)
BATCH = 256
LEARNING_RATE = 0.01
ROUNDS = 25
CALLS = 20
#: Pause before each timed block, so the previous variant's spinning worker threads go idle: OpenBLAS's
#: workers spin for about 0.1 s after a call (measured: ONNX Runtime right after a numpy block 2x slower
#: with no pause, 1.6x after 50 ms, unaffected after 100 ms or more).
SETTLE = 0.25
#: A round is disturbed when other processes used more than this share of the machine's CPU time.
#: Fewer quiet rounds than this: medians over all rounds instead.
MIN_QUIET = 5
#: After a disturbed round, seconds to wait at most for the machine to become quiet again.
PATIENCE = 20.0
#: Where ``--setup-tf`` creates TensorFlow's environment (ignored by git).
TF_VENV = Path(__file__).resolve().parent.parent / ".bench-venvs" / "tf"
TF_SCRIPT = Path(__file__).resolve().parent / "tf_train_step.py"
#: What ``--setup-tf`` installs there.
TF_PACKAGES = ("tensorflow-cpu", "numpy")

_GD = "graphdist strategy.run"
_NP = "numpy, hand-written"
_TF = "TensorFlow, default strategy"
_ORT = "graphdist's ORT session alone"
_NPMM = "numpy, matmuls only"
HEADLINE = (_GD, _NP, _TF)
DIAGNOSTIC = (_ORT, _NPMM)
_GEMM_OPS = {"Gemm", "MatMul", "FusedMatMul", "FusedGemm", "MatMulNBits"}


# ----------------------------------------------------------------------------- numpy step
class NumpyTrainStep:
    """The MLP training step in plain numpy (float32), updating its parameters in place.

    Args:
        params: ``[w0, b0, w1, b1, ...]`` (copied), kernels ``(fan_in, fan_out)``.
        learning_rate: SGD step size.
        global_batch_size: The loss is the sum of per-example losses divided by this.
        dtype: Floating-point type of the parameters and the arithmetic (float64: a reference step).
    """

    def __init__(self, params: Sequence[np.ndarray], learning_rate: float, global_batch_size: int,
                 dtype: Any = np.float32) -> None:
        self.dtype = np.dtype(dtype)
        self.params = [np.array(p, dtype=self.dtype, order="C", copy=True) for p in params]
        self.kernels = self.params[0::2]
        self.biases = self.params[1::2]
        self.lr = self.dtype.type(learning_rate)
        self.scale = self.dtype.type(1.0 / global_batch_size)

    def __call__(self, x: np.ndarray, labels: np.ndarray) -> np.float32:
        """One step on ``(x, labels)``; returns the loss (before the update)."""
        rows = np.arange(x.shape[0])
        layers = len(self.kernels)
        acts = [x]  # inputs of each layer
        pre = []  # pre-activations of the hidden layers
        h = x
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            z = h @ w
            z += b
            if i + 1 < layers:
                pre.append(z)
                h = np.maximum(z, 0)
                acts.append(h)
            else:
                h = z
        # Softmax cross-entropy through log-sum-exp.
        shifted = h - h.max(axis=1, keepdims=True)
        exp = np.exp(shifted)
        total = exp.sum(axis=1, keepdims=True)
        loss = (np.log(total[:, 0]) - shifted[rows, labels]).sum() * self.scale
        grad = exp
        grad /= total
        grad[rows, labels] -= 1
        grad *= self.scale
        # Backward, then the update in place (each weight is read before it is changed).
        for i in reversed(range(layers)):
            w, b = self.kernels[i], self.biases[i]
            grad_w = acts[i].T @ grad
            grad_b = grad.sum(axis=0)
            if i > 0:
                grad_h = grad @ w.T
                grad_h *= pre[i - 1] > 0
            grad_w *= self.lr
            w -= grad_w
            grad_b *= self.lr
            b -= grad_b
            if i > 0:
                grad = grad_h
        return self.dtype.type(loss)

    def matmuls_only(self, x: np.ndarray) -> None:
        """The step's matrix products alone, same shapes and layouts (a diagnostic)."""
        layers = len(self.kernels)
        acts = [x]
        h = x
        for w in self.kernels:
            h = h @ w
            acts.append(h)
        grad = h
        for i in reversed(range(layers)):
            acts[i].T @ grad
            if i > 0:
                grad = grad @ self.kernels[i].T


# ------------------------------------------------------------------------ CPU accounting
# --------------------------------------------------------------------------- TensorFlow
def tf_python(venv: Path = TF_VENV) -> Path:
    """The TensorFlow environment's interpreter (may not exist)."""
    return venv / "bin" / "python"


def setup_tf_venv(venv: Path = TF_VENV, packages: Sequence[str] = TF_PACKAGES) -> tuple[bool, str]:
    """Creates ``venv`` and pip-installs ``packages`` there (TensorFlow is not a project dependency).

    Returns:
        ``(ok, message)``; on failure the message holds the end of pip's output.
    """
    python = tf_python(venv)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages],
                              capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as err:
        return False, f"cannot create {venv}: {err}"
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return False, f"pip install {' '.join(packages)} failed in {venv}: {tail}"
    return True, f"installed {' '.join(packages)} in {venv}"


class TFProcess(ServeProcess):
    """``tf_train_step.py --serve`` as a subprocess that times blocks of steps on request.

    Args:
        python: The TensorFlow environment's interpreter.
        data: The ``.npz`` with the initial weights and the batch.
        threads: Intra-op threads.
        timeout: Seconds to wait for the process to start (import, trace, warm-up).
    """

    def __init__(self, python: Path, data: Path, threads: int, timeout: float = 300.0) -> None:
        super().__init__([python, TF_SCRIPT, "--data", data, "--intra-op", threads, "--serve"], timeout)

    def block(self, calls: int) -> float:
        """Runs ``calls`` steps back to back in the TF process; returns its microseconds per call."""
        return self.us_per_call(f"run {calls}")


def _tf_check(python: Path, data: Path, threads: int, out: Path) -> dict[str, np.ndarray]:
    """One TF step from the initial weights (``tf_train_step.py --check``); its updated parameters."""
    done = subprocess.run([str(python), str(TF_SCRIPT), "--data", str(data), "--intra-op", str(threads),
                           "--check", str(out)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"tf_train_step.py --check failed: {tail}")
    with np.load(out) as npz:
        return {key: npz[key] for key in npz.files}


# ------------------------------------------------------------------------------ helpers
def _blas_info(threads: int) -> tuple[dict[str, Any], Any]:
    """numpy's BLAS (kernel, threads) and a context limiting it to ``threads`` (threadpoolctl)."""
    import contextlib

    info: dict[str, Any] = {"OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
                            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS")}
    try:
        import threadpoolctl
    except ImportError:
        info["threadpoolctl"] = False
        return info, contextlib.nullcontext()
    pools = [p for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
    if pools:
        info.update(library=pools[0].get("internal_api"), version=pools[0].get("version"),
                    architecture=pools[0].get("architecture"), default_threads=pools[0].get("num_threads"))
    info["threadpoolctl"] = True
    return info, threadpoolctl.threadpool_limits(limits=threads, user_api="blas")




def _ort_profile(model: Any, feeds: dict[str, np.ndarray], threads: int, calls: int) -> dict[str, Any]:
    """Kernel time per operator type of the step's graph (ONNX Runtime's profiler), per step."""
    import onnxruntime as ort

    from graphdist.backends import prepare_model
    from graphdist.backends.ort import DISABLED_OPTIMIZERS

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(prepare_model(model).SerializeToString(), sess_options=options,
                                       providers=["CPUExecutionProvider"],
                                       disabled_optimizers=list(DISABLED_OPTIMIZERS))
        for _ in range(max(calls // 4, 2)):
            session.run(None, feeds)
        start = time.perf_counter_ns()
        for _ in range(calls):
            session.run(None, feeds)
        wall = (time.perf_counter_ns() - start) / calls / 1e3
        events = json.loads(Path(session.end_profiling()).read_text())
    per_op: dict[str, float] = collections.defaultdict(float)
    runs: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
            runs[event["name"]] += 1
    steps = max(runs.values(), default=1)  # warm-up runs are profiled too: divide by the run count
    per_op = {op: us / steps for op, us in per_op.items()}
    kernels = sum(per_op.values())
    gemm = sum(us for op, us in per_op.items() if op in _GEMM_OPS)
    return {"wall_us": wall, "kernel_us": kernels, "gemm_us": gemm, "other_us": kernels - gemm,
            "per_op_us": dict(sorted(per_op.items(), key=lambda kv: -kv[1]))}


def _check_same(label: str, got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """assert_allclose on every parameter; returns the largest relative difference."""
    worst = 0.0
    for index, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"{label}: parameter {index}")
        worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6))))
    return worst


# ---------------------------------------------------------------------------------- run
def run(rounds: int | None = None, quick: bool = False, calls: int | None = None, tf: bool = True,
        tf_venv: Path = TF_VENV, sizes: Sequence[int] = SIZES, batch: int = BATCH,
        profile: bool = True, max_rounds: int | None = None, budget_s: float | None = None,
        wait_s: float | None = None) -> dict[str, Any]:
    """Measures the training step three ways (see the module docstring).

    Args:
        rounds: Quiet rounds wanted (default :data:`ROUNDS`; ``quick``: 3). Disturbed rounds are
            repeated, up to ``max_rounds`` rounds in all and, past ``rounds``, for ``budget_s`` seconds.
        quick: A smoke run: 3 rounds of a few calls (noisy).
        calls: Calls per variant per round (default :data:`CALLS`; ``quick``: 3).
        tf: Include TensorFlow when its environment exists.
        tf_venv: TensorFlow's environment.
        sizes: Layer widths (the smoke test uses a tiny MLP).
        batch: Global batch size.
        profile: Also profile the graph's kernels with ONNX Runtime.
        max_rounds: Most rounds in all (default 4 x ``rounds``; ``quick``: ``rounds``).
        budget_s: Seconds of timing after which no more rounds start once ``rounds`` ran (default 600).
        wait_s: Seconds to wait at most for a quiet machine before the first round (default 120; quick: 0).

    Returns:
        ``{"name", "machine", "config", "checks", "rounds", "us", "us_min", "us_all", "ratios", "quiet",
        "goal_met", "tf", "blas", "profile", ...}``. ``us``: median microseconds per call per variant over
        the quiet rounds; ``ratios``: ``graphdist/numpy`` and ``graphdist/TF``, medians over those rounds of
        the ratio within a round; ``goal_met``: graphdist faster than numpy and than TF (when measured).
    """
    import graphdist as gd
    from graphdist.models.mlp import MLP
    from graphdist.runtime.devices import thread_budget

    info = machine_info()  # before measuring: the load average says how busy the machine was
    rounds = rounds or (3 if quick else ROUNDS)
    calls = calls or (3 if quick else CALLS)
    max_rounds = max_rounds or (rounds if quick else 4 * rounds)
    budget_s = 600.0 if budget_s is None else budget_s
    wait_s = (0.0 if quick else 120.0) if wait_s is None else wait_s
    patience = 0.0 if quick else PATIENCE
    threads = thread_budget(1)
    sizes = tuple(sizes)

    # --- graphdist
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = MLP(sizes, seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(LEARNING_RATE)
    initial = [np.array(np.asarray(v), copy=True) for v in model.trainable_variables]
    step = model.make_train_step(optimizer, batch)
    (x,) = model.example_inputs(batch=batch, seed=0)
    labels = np.random.default_rng(1).integers(0, sizes[-1], batch).astype(np.int64)

    # --- numpy, and the check that both compute the same step
    numpy_step = NumpyTrainStep(initial, LEARNING_RATE, batch)
    start = time.perf_counter()
    gd_loss = float(strategy.run(step, args=(x, labels)))  # traces and compiles
    first_call_s = time.perf_counter() - start
    np_loss = float(numpy_step(x, labels))
    checks: dict[str, Any] = {"loss_graphdist": gd_loss, "loss_numpy": np_loss}
    np.testing.assert_allclose(gd_loss, np_loss, rtol=1e-4, err_msg="loss: graphdist vs numpy")
    checks["graphdist_vs_numpy"] = _check_same("graphdist vs numpy after one step",
                                               [np.asarray(v) for v in model.trainable_variables], numpy_step.params)

    concrete = strategy._function_for(step).get_concrete_function(x, labels)
    segments = concrete.plan.segments
    executable = concrete.plan._scheduler._executables[0] if len(segments) == 1 else None
    feeds: dict[str, np.ndarray] = {}
    if executable is not None:
        values = dict(zip(concrete._input_names, (x, labels)))
        values.update({name: np.array(np.asarray(v)) for name, v in concrete._variable_feeds})
        missing = [n for n in executable.input_names if n not in values]
        feeds = {} if missing else {n: values[n] for n in executable.input_names}

    blas, limit = _blas_info(threads)
    variants: dict[str, Callable[[int], float]] = {
        _GD: timed(lambda: strategy.run(step, args=(x, labels))),
        _NP: timed(lambda: numpy_step(x, labels)),
    }
    if feeds:
        session = executable.session
        variants[_ORT] = timed(lambda: session.run(None, feeds))
    variants[_NPMM] = timed(lambda: numpy_step.matmuls_only(x))

    # --- TensorFlow
    tf_result: dict[str, Any] = {"status": "not requested"}
    tf_process: TFProcess | None = None
    meter = CpuMeter()
    tmp = tempfile.TemporaryDirectory()
    try:
        python = tf_python(tf_venv)
        if tf and not python.exists():
            tf_result = {"status": "skipped", "reason": f"no TensorFlow environment at {tf_venv} (create it with "
                                                         "`python -m benchmarks.bench_train_step --setup-tf`)"}
        elif tf:
            data = Path(tmp.name) / "data.npz"
            arrays = {"x": x, "labels": labels, "lr": np.float32(LEARNING_RATE), "global_batch": np.int64(batch)}
            arrays.update({f"{'wb'[i % 2]}{i // 2}": a for i, a in enumerate(initial)})
            np.savez(data, **arrays)
            try:
                tf_params = _tf_check(python, data, threads, Path(tmp.name) / "tf_check.npz")
                reference = NumpyTrainStep(initial, LEARNING_RATE, batch)
                reference(x, labels)
                names = [f"{'wb'[i % 2]}{i // 2}" for i in range(len(initial))]
                checks["loss_tf"] = float(tf_params["loss"])
                checks["tf_vs_numpy"] = _check_same("TensorFlow vs numpy after one step",
                                                    [tf_params[n] for n in names], reference.params)
                tf_process = TFProcess(python, data, threads)
                meter.pids.append(tf_process.pid)
                variants[_TF] = tf_process.block
                tf_result = {"status": "measured", **{k: v for k, v in tf_process.info.items() if k != "ready"}}
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
                tf_result = {"status": "failed", "reason": str(err)}
                logger.warning("TensorFlow part skipped: %s", err)
        if tf_result["status"] != "measured" and tf:
            logger.info("TensorFlow: %s", tf_result.get("reason", tf_result["status"]))

        # --- timing, interleaved
        with limit:
            foreign: list[float] = []
            timing = quiet_rounds(variants, list(variants), meter, calls=calls, rounds=rounds, max_rounds=max_rounds,
                                  budget_s=budget_s, wait_s=wait_s, patience=patience, settle=SETTLE,
                                  foreign=foreign)
            times, waited = timing["times"], timing["waited"]
            load_start, load_end = timing["load_start"], timing["load_end"]
    finally:
        if tf_process is not None:
            tf_process.close()
        tmp.cleanup()

    final = [np.asarray(v) for v in model.trainable_variables] + numpy_step.params
    checks["finite_after_timing"] = bool(all(np.isfinite(a).all() for a in final))
    prof = None
    if profile and feeds:
        prof = _ort_profile(segments[0].model, feeds, threads, calls=max(calls, 10))
    return {
        "name": NAME,
        "machine": info,
        "config": {"sizes": list(sizes), "batch": batch, "learning_rate": LEARNING_RATE, "threads": threads,
                   "rounds": rounds, "rounds_run": len(foreign), "calls": calls, "quiet_threshold": QUIET,
                   "settle_s": SETTLE, "waited_s": waited},
        "first_call_s": first_call_s,
        "checks": checks,
        "blas": blas,
        "tf": tf_result,
        "graph_nodes": len(concrete.graph("rewritten").nodes),
        "segments": len(segments),
        "loadavg": {"start": load_start, "end": load_end},
        "profile": prof,
        **summarize(times, foreign, rounds),
    }


def summarize(times: dict[str, list[float]], foreign: list[float], rounds: int) -> dict[str, Any]:
    """Medians, ratios and the goal verdict from per-round times (``raw``) and disturbance shares.

    Args:
        times: Variant name -> microseconds per call, one entry per round.
        foreign: Per round, the largest share of CPU time other processes used during a block.
        rounds: Quiet rounds that were wanted.
    """
    quiet = [i for i, share in enumerate(foreign) if share <= QUIET]
    used = quiet if len(quiet) >= min(MIN_QUIET, rounds) else list(range(len(foreign)))

    def paired(a: str, b: str) -> float | None:
        if a not in times or b not in times:
            return None
        return median([times[a][i] / times[b][i] for i in used])

    us = {name: median([values[i] for i in used]) for name, values in times.items()}
    ratios = {"graphdist/numpy": paired(_GD, _NP), "graphdist/TF": paired(_GD, _TF),
              "session alone/numpy": paired(_ORT, _NP), "session alone/TF": paired(_ORT, _TF),
              "TF/numpy": paired(_TF, _NP)}
    measured = [ratios["graphdist/numpy"], ratios["graphdist/TF"]]
    measured = [r for r in measured if r is not None]
    spread = {}
    for name, values in times.items():
        chosen = [values[i] for i in used]
        q = statistics.quantiles(chosen, n=4) if len(chosen) >= 2 else [chosen[0]] * 3
        spread[name] = (q[2] - q[0]) / max(us[name], 1e-9)
    overhead = median([times[_GD][i] - times[_ORT][i] for i in used]) if _ORT in times else None
    return {
        "us": us,
        "us_min": {name: min(values) for name, values in times.items()},
        "us_all": {name: median(values) for name, values in times.items()},
        "spread": spread,
        "foreign": foreign,
        "quiet": len(quiet),
        "used_quiet": used is quiet,
        "ratios": ratios,
        "python_overhead_us": overhead,
        "goal_met": bool(measured) and all(r < 1.0 for r in measured),
        "raw": times,
    }


# ------------------------------------------------------------------------------ reports
def _rows(results: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    base = results["us"].get(_NP)
    rows = []
    for name in HEADLINE + DIAGNOSTIC:
        if name in results["us"]:
            value = results["us"][name]
            rows.append((name, value, value / base if base else float("nan"), results["us_min"][name]))
    return rows


def _ratio_text(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.3f}x"


def table(results: dict[str, Any]) -> str:
    """A plain-text table of :func:`run`'s results."""
    cfg = results["config"]
    lines = [
        f"MLP {'-'.join(map(str, cfg['sizes']))}, batch {cfg['batch']}, SGD {cfg['learning_rate']}: "
        f"{cfg['rounds_run']} rounds x {cfg['calls']} calls, {cfg['threads']} threads; "
        f"{results['quiet']} quiet rounds (medians over {'those' if results['used_quiet'] else 'all rounds'})",
        f"  {'variant':<34}{'median ms':>11}{'vs numpy':>10}{'min ms':>9}{'IQR':>7}",
    ]
    for name, value, rel, low in _rows(results):
        lines.append(f"  {name:<34}{value / 1e3:>11.3f}{rel:>9.3f}x{low / 1e3:>9.3f}"
                     f"{results['spread'][name]:>7.0%}")
    ratios = results["ratios"]
    lines.append(f"  graphdist/numpy {_ratio_text(ratios['graphdist/numpy'])}, graphdist/TF "
                 f"{_ratio_text(ratios['graphdist/TF'])} (medians of in-round ratios); goal (faster than both): "
                 f"{'met' if results['goal_met'] else 'NOT met'}")
    if results["tf"]["status"] != "measured":
        lines.append(f"  TensorFlow {results['tf']['status']}: {results['tf'].get('reason', '')}")
    prof = results.get("profile")
    if prof:
        lines.append(f"  ORT kernel profile: {prof['kernel_us'] / 1e3:.2f} ms of kernels per step, GEMMs "
                     f"{prof['gemm_us'] / 1e3:.2f} ms, other ops {prof['other_us'] / 1e3:.2f} ms; top: "
                     + ", ".join(f"{op} {us:.0f} us" for op, us in list(prof["per_op_us"].items())[:6]))
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    cfg = results["config"]
    us, ratios, tf, blas = results["us"], results["ratios"], results["tf"], results["blas"]
    arch = "-".join(map(str, cfg["sizes"]))
    out = [
        "## MLP training step",
        "",
        f"One SGD training step of the MLP {arch} (ReLU, He init, seed 0), batch {cfg['batch']}, softmax",
        f"cross-entropy averaged over the batch, learning rate {cfg['learning_rate']}, float32, written three ways:",
        "",
        "- **graphdist**: `OneDeviceStrategy(\"cpu:0\")`, model and `gd.optimizers.SGD(0.01)` built in its",
        "  scope, `step = model.make_train_step(opt, 256)`, timed calls `strategy.run(step, args=(x, labels))`",
        "  (traced and compiled once before timing; the weights are `gd.Variable`s updated by every call).",
        "- **numpy**: the same step by hand (`NumpyTrainStep`): forward, log-sum-exp cross-entropy, backward,",
        "  SGD update in place; numpy's OpenBLAS pool limited to the same thread count"
        + (" (threadpoolctl)." if blas.get("threadpoolctl") else " (threadpoolctl missing: default pool)."),
        "- **TensorFlow**: `benchmarks/tf_train_step.py` in its own environment (`.bench-venvs/tf`, made by",
        "  `python -m benchmarks.bench_train_step --setup-tf`): `tf.Variable` weights, `tf.GradientTape`,",
        "  `tf.function` (no XLA), `tf.distribute.get_strategy().run` (the default strategy), inputs as",
        "  tensors made once, the loss fetched with `.numpy()` every step. A subprocess that times one block",
        "  of steps per request, so its rounds interleave with the others.",
        "",
        "All start from the same arrays; before timing, one step of graphdist and of TensorFlow is compared",
        "with numpy's (`assert_allclose` of every updated parameter, rtol 1e-4, atol 1e-6) so the three compute",
        "the same step: largest relative difference to numpy "
        f"{results['checks']['graphdist_vs_numpy']:.1e} (graphdist)"
        + (f", {results['checks']['tf_vs_numpy']:.1e} (TensorFlow)." if "tf_vs_numpy" in results["checks"]
           else "."),
        "",
        f"Method: each round times every variant for {cfg['calls']} calls in a row after a "
        f"{cfg['settle_s'] * 1e3:.0f} ms pause",
        "(OpenBLAS's worker threads spin for about 100 ms after a call and would slow down whatever runs next),",
        "the order reversed every other round. The machine is shared: during every block the benchmark reads",
        "`/proc/stat` and its own processes' CPU time, and marks the round disturbed when other processes used",
        f"more than {cfg['quiet_threshold']:.0%} of the CPU time; disturbed rounds are repeated (up to a limit)",
        f"until {cfg['rounds']} are quiet. {results['quiet']} of {cfg['rounds_run']} rounds were quiet; the table "
        f"gives medians over {'those' if results['used_quiet'] else 'all rounds (too few quiet ones)'}",
        "and the minimum over all rounds. Ratios are medians over the same rounds of the ratio within a",
        f"round (cancels drift). {cfg['threads']} intra-op threads everywhere. "
        "Source: `benchmarks/bench_train_step.py`.",
        "",
        "**Goal:** graphdist's step faster than both the numpy step and TensorFlow's.",
        "",
        "| variant | median ms/step | vs numpy | min ms/step |",
        "|---|---:|---:|---:|",
    ]
    for name, value, rel, low in _rows(results):
        label = name if name in HEADLINE else f"*{name}* (diagnostic)"
        out.append(f"| {label} | {value / 1e3:.2f} | {rel:.3f}x | {low / 1e3:.2f} |")
    verdict = "**met**" if results["goal_met"] else "**not met**"
    out += [
        "",
        f"graphdist / numpy = **{_ratio_text(ratios['graphdist/numpy'])}**, graphdist / TensorFlow = "
        f"**{_ratio_text(ratios['graphdist/TF'])}** (medians of in-round ratios). Goal: {verdict}.",
        "",
    ]
    if ratios.get("session alone/numpy") is not None and results.get("python_overhead_us") is not None:
        out.append(f"graphdist's ONNX Runtime session called directly (same graph, no graphdist Python code): "
                   f"{_ratio_text(ratios['session alone/numpy'])} of numpy"
                   + (f", {_ratio_text(ratios['session alone/TF'])} of TensorFlow"
                      if ratios.get("session alone/TF") is not None else "")
                   + f"; `strategy.run` adds {results['python_overhead_us']:.0f} us per step "
                   "(median of the in-round differences).")
        out.append("")
    if tf["status"] == "measured":
        out.append(f"TensorFlow {tf.get('tensorflow')} (`{tf.get('strategy')}`, intra-op {tf.get('intra_op')}, "
                   f"inter-op {tf.get('inter_op')}); TensorFlow / numpy = {_ratio_text(ratios.get('TF/numpy'))}.")
    else:
        out.append(f"TensorFlow was {tf['status']}: {tf.get('reason', '')}")
    blas_line = (f"numpy's BLAS: {blas.get('library', '?')} {blas.get('version', '')}, "
                 f"{blas.get('architecture', '?')} kernels")
    if blas.get("OPENBLAS_CORETYPE"):
        blas_line += (f" (OPENBLAS_CORETYPE={blas['OPENBLAS_CORETYPE']} was set: it forces older kernels; unset it "
                      "together with OPENBLAS_L2_SIZE for this command to measure numpy at full speed)")
    out += ["", blas_line + "."]
    prof = results.get("profile")
    if prof:
        numpy_mm = us.get(_NPMM)
        out += [
            "",
            "### Where graphdist's step spends its time",
            "",
            f"The step's graph has {results['graph_nodes']} nodes after graphdist's passes, one ONNX Runtime",
            "segment. ONNX Runtime's kernel profile of that graph (ORT_ENABLE_ALL, the level graphdist runs at;",
            "per step, one profiled run, so noisier than the table):",
            "",
            "| operator | us/step |",
            "|---|---:|",
        ]
        for op, value in list(prof["per_op_us"].items())[:10]:
            out.append(f"| {op} | {value:.0f} |")
        rest = sum(list(prof["per_op_us"].values())[10:])
        if rest:
            out.append(f"| {len(prof['per_op_us']) - 10} other operator types | {rest:.0f} |")
        out += [
            "",
            f"Kernels: {prof['kernel_us'] / 1e3:.2f} ms per step, of which matrix products (Gemm, MatMul,"
            f" FusedMatMul) {prof['gemm_us'] / 1e3:.2f} ms and everything else {prof['other_us'] / 1e3:.2f} ms.",
        ]
        if numpy_mm and _NP in us:
            out.append(f"For comparison, numpy's matrix products alone take {numpy_mm / 1e3:.2f} ms of its "
                       f"{us[_NP] / 1e3:.2f} ms step.")
    return "\n".join(out).rstrip()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints a table, optionally updates BENCHMARKS.md.

    Returns:
        0, or 1 when graphdist is not faster than numpy and TensorFlow.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_train_step",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {ROUNDS})")
    parser.add_argument("--calls", type=int, default=None, help=f"calls per variant per round (default {CALLS})")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 3 calls: a smoke run")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds during which disturbed rounds are repeated (default 600)")
    parser.add_argument("--no-tf", action="store_true", help="leave TensorFlow out")
    parser.add_argument("--setup-tf", action="store_true",
                        help=f"create {TF_VENV.relative_to(TF_VENV.parent.parent)} with pip install "
                             f"{' '.join(TF_PACKAGES)}, then exit")
    parser.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    parser.add_argument("--from-json", metavar="FILE",
                        help="measure nothing: report (and with --write, write) the results saved by --json")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    parser.add_argument("-v", "--verbose", action="store_true", help="log per-round times")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")
    if args.setup_tf:
        ok, message = setup_tf_venv()
        print(message)
        return 0 if ok else 1

    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        results.update(summarize(results["raw"], results["foreign"], results["config"]["rounds"]))
    else:
        results = run(rounds=args.rounds, quick=args.quick, calls=args.calls, tf=not args.no_tf,
                      budget_s=args.budget)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.write:
        path = update_section(NAME, markdown(results), info=results["machine"])
        print(f"updated {path}")
    return 0 if results["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
