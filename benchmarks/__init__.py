"""Side-by-side benchmarks of graphdist against the libraries it builds on.

Each ``benchmarks/bench_*.py`` module defines ``run(**options) -> dict`` (the
measurements), ``markdown(results) -> str`` (its section of BENCHMARKS.md)
and ``main(argv) -> int``. ``python -m benchmarks.run_all`` (``make bench``)
runs every module and rewrites BENCHMARKS.md.

This package holds what they share: a description of the machine,
interleaved timing, and updating one section of BENCHMARKS.md in place.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "BENCHMARKS_MD",
    "machine_info",
    "machine_markdown",
    "median",
    "median_ms",
    "mlp_training",
    "peak_rss_bytes",
    "replace_section",
    "run_child",
    "json_child",
    "report",
    "git_commit",
    "time_interleaved",
    "update_section",
    "weights_checksum",
    "write_document",
]

logger = logging.getLogger(__name__)

#: The results file at the repository root.
BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"

_TITLE = "# graphdist benchmarks"
_INTRO = (
    "Measured with `make bench` (`python -m benchmarks.run_all`); one benchmark is refreshed with\n"
    "`python -m benchmarks.<module> --write`. Numbers are from the machine described below;\n"
    "compare them only with numbers taken on the same machine kind."
)


def _cpu_model() -> str:
    """``model name`` from /proc/cpuinfo, with family/model and cache size when given."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"

    def field(name: str) -> str | None:
        match = re.search(rf"^{name}\s*:\s*(.+)$", text, re.MULTILINE)
        return match.group(1).strip() if match else None

    model = field("model name") or platform.processor() or "unknown"
    details = [f"family {field('cpu family')} model {field('model')}"] if field("cpu family") else []
    if field("cache size"):
        details.append(f"cache {field('cache size')}")
    return f"{model} ({', '.join(details)})" if details else model


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, Any]:
    """Facts about this machine and the library versions a benchmark ran with."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": _cpu_model(),
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "arch": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime-gpu") if _version("onnxruntime") == "not installed"
        else _version("onnxruntime"),
        "graphdist": _version("graphdist"),
        "loadavg": _loadavg(),
    }


def _loadavg() -> str:
    """1/5/15-minute load averages: other work on the machine makes timings noisy."""
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except (AttributeError, OSError):
        return "unknown"


def machine_markdown(info: Mapping[str, Any]) -> str:
    """The ``## Machine`` section for ``info`` (from :func:`machine_info`)."""
    return "\n".join([
        "## Machine",
        "",
        f"- CPU: {info['cpu']}, {info['arch']}, {info['nproc']} usable cores (`nproc`), "
        f"{info['cpu_count']} in the system",
        f"- OS: {info['os']}",
        f"- Python {info['python']}, numpy {info['numpy']}, onnx {info['onnx']}, "
        f"onnxruntime {info['onnxruntime']}, graphdist {info['graphdist']}",
        f"- Measured on {info['date']}; load average when the run started: {info.get('loadavg', 'unknown')} "
        "(other work on the machine makes the timings noisier)",
    ])


def time_interleaved(variants: Mapping[str, Callable[[], Any]], rounds: int, calls: int,
                     warmup: int = 10, settle: float = 0.0) -> dict[str, list[float]]:
    """Times several ways of doing the same work, interleaved to cancel drift
    (:func:`graphdist.cli.bench.measure`, the timer of ``graphdist bench``).

    Args:
        variants: Name -> zero-argument callable.
        rounds: Number of rounds.
        calls: Calls per variant per round.
        warmup: Untimed calls of each variant before the first round.
        settle: Seconds to sleep before each timed block (spinning pool threads go idle first).

    Returns:
        Name -> per-call time in microseconds, one entry per round.
    """
    from graphdist.cli.bench import measure

    seconds = measure(variants, rounds, calls, warmup, settle=settle)
    return {name: [t * 1e6 for t in values] for name, values in seconds.items()}


def median(values: list[float]) -> float:
    """The median of ``values``."""
    return float(statistics.median(values))


def median_ms(call: Callable[[], Any], steps: int) -> float:
    """The median of ``steps`` timed calls of ``call``, in milliseconds."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return median(times) * 1e3


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (``ru_maxrss``), in bytes."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mlp_training(strategy: Any, sizes: tuple[int, ...], batch: int) -> tuple[Any, Any, Any, tuple]:
    """An MLP trained with Adam under ``strategy`` on one fixed random global batch.

    Returns:
        ``(model, optimizer, train, args)``: the model, its optimizer, the compiled step (``train(*args)`` runs
        one step and returns the summed loss) and the distributed batch; the step is compiled and run once.
    """
    import numpy as np

    import graphdist as gd
    from graphdist.models.mlp import MLP

    with strategy.scope():
        model = MLP(sizes, seed=0, trainable=True)
        optimizer = gd.optimizers.Adam(1e-4)
    replica_step = model.make_train_step(optimizer, batch)

    @gd.function
    def train(x: Any, labels: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    args = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))))
    train(*args)  # compiles, and the first step
    return model, optimizer, train, tuple(args)


def weights_checksum(model: Any) -> float:
    """Sum of the absolute values of a model's trainable weights (variants that train alike agree on it)."""
    import numpy as np

    return float(sum(np.abs(v.numpy()).sum(dtype=np.float64) for v in model.trainable_variables))


def run_child(module: str, arguments: list[str], timeout: float) -> dict[str, Any]:
    """Runs ``python -m module *arguments`` in a fresh process (its own peak RSS, nothing cached) and
    returns the JSON object it prints last.

    Raises:
        RuntimeError: The child failed (its stderr's tail in the message).
    """
    command = [sys.executable, "-m", module, *arguments]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def json_child(command: list[str], env: Mapping[str, str], timeout: float, label: dict[str, Any]) -> dict[str, Any]:
    """Runs ``command`` (a benchmark's one-case child, in the repository) and returns the JSON object it prints
    last; a failure or timeout is ``label`` with an ``"error"`` (the child's output's tail) instead of raising.
    """
    try:
        proc = subprocess.run(command, cwd=Path(__file__).resolve().parent.parent, env=dict(env),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**label, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {**label, "error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(lines[-1])


def report(args: Any, results: dict[str, Any], table: Callable[[dict[str, Any]], str],
           markdown: Callable[[dict[str, Any]], str], write: Callable[[str], Path]) -> None:
    """A benchmark command line's end: ``--output`` saves the results as JSON, ``--before`` adds an earlier
    run's, the table and the section are printed, and ``--write`` writes the section (``write(markdown)``).
    """
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
        print(f"saved {args.output}")
    if args.before:
        results["before"] = json.loads(args.before.read_text())
    print(table(results))
    print()
    print(markdown(results))
    if args.write:
        print(f"updated {write(markdown(results))}")


def git_commit() -> tuple[str | None, bool | None]:
    """HEAD of the tree benchmarked, and whether tracked files differ from it (an uncommitted refactor)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD"], capture_output=True).returncode
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head, dirty != 0


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- begin {name} -->", f"<!-- end {name} -->"


def _wrap(name: str, text: str) -> str:
    begin, end = _markers(name)
    return f"{begin}\n{text.strip()}\n{end}"


def write_document(sections: Mapping[str, str], path: Path = BENCHMARKS_MD, info: Mapping[str, Any] | None = None
                   ) -> Path:
    """Writes BENCHMARKS.md from scratch: title, machine, then ``sections`` in order.

    Args:
        sections: Benchmark name -> markdown of its section.
        path: File to write.
        info: Machine facts (default: :func:`machine_info` now).

    Returns:
        ``path``.
    """
    parts = [_TITLE, "", _INTRO, "", _wrap("machine", machine_markdown(info or machine_info()))]
    parts += ["\n" + _wrap(name, text) for name, text in sections.items()]
    path.write_text("\n".join(parts) + "\n")
    logger.info("wrote %s", path)
    return path


def replace_section(name: str, text: str, path: Path = BENCHMARKS_MD) -> Path:
    """Replaces (or appends) one benchmark's section of BENCHMARKS.md, leaving every other section alone,
    the machine section included (for benchmarks whose section states its own machine and load).

    Args:
        name: Benchmark name (the section's marker).
        text: Markdown of the section.
        path: File to update (read right before writing; created when missing).

    Returns:
        ``path``.
    """
    document = path.read_text() if path.exists() else ""
    begin, end = _markers(name)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(document):
        document = pattern.sub(lambda _m: _wrap(name, text), document, count=1)
    else:
        document = document.rstrip("\n") + ("\n\n" if document else "") + _wrap(name, text) + "\n"
    path.write_text(document)
    logger.info("updated section %r of %s", name, path)
    return path


def update_section(name: str, text: str, path: Path = BENCHMARKS_MD, info: Mapping[str, Any] | None = None) -> Path:
    """Replaces (or appends) one benchmark's section of BENCHMARKS.md, and
    refreshes the machine section; creates the file when it is missing.

    Args:
        name: Benchmark name (the section's marker).
        text: Markdown of the section.
        path: File to update.
        info: Machine facts (default: :func:`machine_info` now).

    Returns:
        ``path``.
    """
    if not path.exists():
        return write_document({name: text}, path, info)
    document = path.read_text()
    for key, body in (("machine", machine_markdown(info or machine_info())), (name, text)):
        begin, end = _markers(key)
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        if pattern.search(document):
            document = pattern.sub(lambda _m, k=key, b=body: _wrap(k, b), document, count=1)
        else:
            document = document.rstrip("\n") + "\n\n" + _wrap(key, body) + "\n"
    path.write_text(document)
    logger.info("updated section %r of %s", name, path)
    return path
