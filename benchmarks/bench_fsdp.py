"""FSDP (weights over the batch axis of ModelParallelStrategy's mesh) vs Mirrored: memory inside a step and step time.

An MLP (default 784-4096-4096-4096-10, 37.8 M parameters) trains with Adam on 2 logical CPU devices in
three variants, each in its own child process (its own peak RSS):

* ``mirrored``: ``MirroredStrategy(["cpu:0", "cpu:1"])``, every weight whole on every replica;
* ``fsdp``: ``ModelParallelStrategy`` on mesh ``(2,)`` with every kernel and bias laid out over the batch axis
  (``ShardParametersPass``), one layer's gathered weights at a time (``LimitParameterGathersPass``);
* ``fsdp_unordered``: the same with ``LimitParameterGathersPass`` switched off, as plans were before it: every
  gather free to run at the start of the step.

Reported per variant: parameter + optimizer-state bytes per device (the plan's count), the most bytes of
gathered weights alive at once on one device during a step (the scheduler's values, watched on one extra
step after the timed ones), peak RSS of the process, and the median step time after a warm-up step, with
the ratios against Mirrored in the same run.

With ``--hosts`` (root: network namespaces, :mod:`benchmarks.netns`), the same comparison across 2 hosts of one
core each, every task started on its own host with its ``TF_CONFIG``, on shaped links (10 Gbit/s and 1 Gbit/s):
``MultiWorkerMirroredStrategy`` against FSDP over the batch axis of mesh ``(2,)`` spanning the hosts (one layer at
a time, unordered, and with the next layer's gathers prefetched: ``LimitParameterGathersPass(prefetch=1)``),
MLP ``HOST_SIZES``, median step time of ``HOST_STEPS`` steps per run, runs interleaved.

    python -m benchmarks.bench_fsdp [--quick] [--steps N] [--hosts] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import median_ms, mlp_training, peak_rss_bytes, run_child, update_section, weights_checksum

__all__ = ["NAME", "SIZES", "VARIANTS", "HOST_VARIANTS", "run", "run_hosts", "child", "host_worker", "gathered_bytes",
           "markdown",
           "hosts_markdown", "main"]

NAME = "fsdp"
SIZES = (784, 4096, 4096, 4096, 10)
BATCH = 32
VARIANTS = ("mirrored", "fsdp", "fsdp_unordered")
#: Across hosts: the variants, the model, the global batch, the timed steps per run and the links.
HOST_VARIANTS = ("mirrored", "fsdp", "fsdp_unordered", "fsdp_prefetch1")
HOST_SIZES = (784, 2048, 2048, 2048, 10)
HOST_BATCH = 64
HOST_STEPS = 8
HOST_LINKS = {"10 Gbit/s": "10gbit", "1 Gbit/s": "1gbit"}


def _set_gather_order(variant: str) -> None:
    """``fsdp_unordered``: what the pipeline did before ``LimitParameterGathersPass``; ``fsdp_prefetch1``: the pass
    with one layer gathered ahead (this benchmark's process only)."""
    from graphdist.passes.base import PassResult
    from graphdist.passes.limit_parameter_gathers import LimitParameterGathersPass

    if variant == "fsdp_unordered":
        LimitParameterGathersPass.call = lambda self, graph, ctx: PassResult(graph, False)  # type: ignore[method-assign]
    elif variant == "fsdp_prefetch1":
        original = LimitParameterGathersPass.__init__
        LimitParameterGathersPass.__init__ = lambda self, prefetch=0: original(self, 1)  # type: ignore[method-assign]


def _strategy(variant: str, workers: bool = False) -> Any:
    import graphdist as gd

    devices = None if workers else ["cpu:0", "cpu:1"]
    if variant == "mirrored":
        return gd.MultiWorkerMirroredStrategy() if workers else gd.MirroredStrategy(devices)
    _set_gather_order(variant)
    mesh = gd.experimental.DeviceMesh((2,), ("batch",), devices)
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["kernel"] = ("batch", None)
    layout_map["bias"] = ("batch",)
    return gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")


def gathered_bytes(train: Any, args: tuple) -> tuple[int, dict[str, int]]:
    """Runs one step of an FSDP plan watching the scheduler's values.

    Returns:
        The most bytes of gathered weights alive at once on one device, and per layer (``unit_of``) the bytes
        of one device's copy of its forward gathers.
    """
    from graphdist.passes.limit_parameter_gathers import unit_of
    from graphdist.runtime.scheduler import Scheduler

    plan = train.get_concrete_function(*args).plan
    gathers = {c.name for c in plan.comms if c.op == "AllGather" and c.name.startswith("fsdp.")}
    device_of = {name: device for c in plan.comms if c.name in gathers for name, device in zip(c.outputs, c.devices)}
    most, layers = [0], {}
    original = Scheduler._finish

    def watch(self: Any, task: Any, outputs: Any, env: dict[str, Any], *rest: Any) -> None:
        original(self, task, outputs, env, *rest)
        alive: dict[str, int] = {}
        for name in env:
            if name in device_of:
                alive[device_of[name]] = alive.get(device_of[name], 0) + np.asarray(env[name]).nbytes
        most[0] = max(most[0], *alive.values(), 0)
        if task.name in gathers and task.name.endswith(".forward"):
            layer, _ = unit_of(task.name)  # every participant gets the same bytes
            layers[layer] = layers.get(layer, 0) + np.asarray(outputs[0]).nbytes

    Scheduler._finish = watch  # type: ignore[method-assign]
    try:
        train(*args)
    finally:
        Scheduler._finish = original  # type: ignore[method-assign]
    return most[0], layers


def child(variant: str, sizes: tuple[int, ...], batch: int, steps: int) -> dict[str, Any]:
    """Trains in this process and returns its measurements (run in a fresh process for a clean RSS)."""
    from graphdist.passes.shard_optimizer_state import state_bytes_per_replica
    from graphdist.passes.shard_parameters import parameter_bytes_per_replica

    model, _, train, args = mlp_training(_strategy(variant), sizes, batch)
    step_ms = median_ms(lambda: train(*args), steps)
    concrete = train.get_concrete_function(*args)
    graph = concrete.graph("rewritten")
    return {"variant": variant, "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "bytes_per_device": parameter_bytes_per_replica(graph) + state_bytes_per_replica(graph),
            "gathered_peak_bytes": gathered_bytes(train, args)[0], "segments": len(concrete.plan.segments),
            "peak_rss_bytes": peak_rss_bytes(), "step_ms": step_ms, "checksum": weights_checksum(model)}


def host_worker(variant: str, sizes: tuple[int, ...], batch: int, steps: int, out: str) -> None:
    """One task of a 2-host job (started with its TF_CONFIG): trains and times; the chief writes the result."""
    from benchmarks import median

    strategy = _strategy(variant, workers=True)
    model, _, train, args = mlp_training(strategy, sizes, batch)
    train(*args)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train(*args)
        times.append((time.perf_counter() - start) * 1e3)
    # On every worker: reading a weight sharded across the workers is a collective they all take part in.
    result = {"step_ms": median(times), "checksum": weights_checksum(model),
              "segments": len(train.get_concrete_function(*args).plan.segments)}
    if strategy.extended.should_checkpoint:
        Path(out).write_text(json.dumps(result))


def run_hosts(sizes: tuple[int, ...] = HOST_SIZES, batch: int = HOST_BATCH, steps: int = HOST_STEPS,
              rounds: int = 2, links: tuple[str, ...] = tuple(HOST_LINKS)) -> dict[str, Any]:
    """Every host variant on every link, ``rounds`` interleaved runs each; the fastest run's median step counts.

    Raises:
        RuntimeError: Network namespaces cannot be made here, fewer than 2 cores, or a task failed.
    """
    from benchmarks.netns import HostBed, Link, run_worker_tasks, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"bench_fsdp --hosts needs network namespaces: {reason}")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise RuntimeError("bench_fsdp --hosts needs 2 cores (one per host)")
    args = ["--sizes", ",".join(map(str, sizes)), "--batch", str(batch), "--steps", str(steps)]
    results: dict[str, Any] = {"sizes": list(sizes), "batch": batch, "steps": steps, "rounds": rounds, "links": {}}
    for name in links:
        runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in HOST_VARIANTS}
        with HostBed(2, link=Link(rate=HOST_LINKS[name]), cpus=[cores[0], cores[1]]) as bed:
            for index in range(rounds):
                for variant in HOST_VARIANTS if index % 2 == 0 else HOST_VARIANTS[::-1]:
                    runs[variant].append(run_worker_tasks(bed, 2, "benchmarks.bench_fsdp", ["--child", variant, *args],
                                                          {}, 900))
        best = {variant: min(found, key=lambda r: r["step_ms"]) for variant, found in runs.items()}
        base = best["mirrored"]
        for result in best.values():
            result["step_ratio"] = result["step_ms"] / base["step_ms"]
            result["same_weights"] = bool(np.isclose(result["checksum"], base["checksum"], rtol=1e-4))
        results["links"][name] = best
    return results


def run(sizes: tuple[int, ...] = SIZES, batch: int = BATCH, steps: int = 5, timeout: float = 900.0) -> dict[str, Any]:
    """Every variant in a child process, and the ratios against Mirrored."""
    results: dict[str, Any] = {"sizes": list(sizes), "batch": batch, "steps": steps}
    for variant in VARIANTS:
        results[variant] = run_child("benchmarks.bench_fsdp", ["--child", variant, "--sizes",
                                                                ",".join(map(str, sizes)), "--batch", str(batch),
                                                                "--steps", str(steps)], timeout)
    base = results["mirrored"]
    for variant in VARIANTS[1:]:
        got = results[variant]
        got["bytes_ratio"] = got["bytes_per_device"] / base["bytes_per_device"]
        got["rss_ratio"] = got["peak_rss_bytes"] / base["peak_rss_bytes"]
        got["step_ratio"] = got["step_ms"] / base["step_ms"]
        got["same_weights"] = bool(np.isclose(got["checksum"], base["checksum"], rtol=1e-4))
    return results


def _row(label: str, r: dict[str, Any]) -> str:
    ratios = (f" | {r['bytes_ratio']:.3f} | {r['rss_ratio']:.2f} | {r['step_ratio']:.2f}" if "bytes_ratio" in r
              else " | 1 | 1 | 1")
    return (f"| {label} | {r['bytes_per_device'] / 2**20:,.1f} MiB | {r['gathered_peak_bytes'] / 2**20:,.1f} MiB"
            f" | {r['segments']} | {r['peak_rss_bytes'] / 2**20:,.0f} MiB | {r['step_ms']:,.1f} ms{ratios} |")


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    labels = {"mirrored": "Mirrored(2)", "fsdp": "FSDP, mesh (2,), one layer at a time",
              "fsdp_unordered": "FSDP, mesh (2,), gathers unordered"}
    params = results["mirrored"]["params"]
    same = all(results[v]["same_weights"] for v in VARIANTS[1:])
    return "\n".join([
        "## FSDP: one layer's gathered weights at a time", "",
        f"MLP {'-'.join(map(str, results['sizes']))} ({params / 1e6:.1f} M parameters), Adam, global batch "
        f"{results['batch']}, 2 logical CPU devices in one process; median of {results['steps']} steps after a "
        "warm-up; each variant in its own process (`python -m benchmarks.bench_fsdp`). \"Gathered peak\" is the "
        "most bytes of gathered weights alive at once on one device during a step (the scheduler's values); "
        "ratios are against Mirrored in the same run.", "",
        "| variant | parameters + Adam state per device (plan) | gathered peak per device | segments | peak RSS "
        "(process) | step | bytes ratio | RSS ratio | step ratio |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_row(labels[v], results[v]) for v in VARIANTS), "",
        f"Same weights after the steps in every variant: {same}. In one process the devices share host memory, so "
        "the process RSS counts both devices' shards (the whole model once) plus the step's transient buffers; "
        "the per-device columns are what one device of a multi-host run would hold.", ""])


def hosts_markdown(results: dict[str, Any]) -> str:
    """The across-hosts part of the section."""
    labels = {"mirrored": "MultiWorkerMirrored", "fsdp": "FSDP, one layer at a time",
              "fsdp_unordered": "FSDP, gathers unordered", "fsdp_prefetch1": "FSDP, next layer prefetched"}
    links = list(results["links"])
    rows = [f"| {labels[v]} | " + " | ".join(f"{results['links'][link][v]['step_ms']:,.1f} ms "
                                             f"({results['links'][link][v]['step_ratio']:.2f})" for link in links)
            + f" | {results['links'][links[0]][v]['segments']} |" for v in HOST_VARIANTS]
    same = all(r["same_weights"] for link in results["links"].values() for r in link.values())
    return "\n".join([
        f"Across 2 hosts (network namespaces, one core each, each task started with its TF_CONFIG; links shaped "
        f"by rate), MLP {'-'.join(map(str, results['sizes']))}, Adam, global batch {results['batch']}, mesh (2,) "
        f"spanning the hosts; median of {results['steps']} steps, the faster of {results['rounds']} interleaved "
        "runs (`python -m benchmarks.bench_fsdp --hosts`); in brackets the ratio to MultiWorkerMirrored.", "",
        "| variant | " + " | ".join(links) + " | segments per worker |",
        "|---|" + "---|" * len(links) + "---|", *rows, "",
        f"Same weights after the steps in every variant: {same}.", ""])


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--sizes", default=None, help="layer sizes, comma-separated")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--hosts", action="store_true", help="also across 2 namespace hosts (root)")
    parser.add_argument("--child", choices=HOST_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else ((64, 48, 48, 10) if args.quick else SIZES)
    if args.worker:
        host_worker(args.child, sizes, args.batch, args.steps, args.out)
        return
    if args.child:
        print(json.dumps(child(args.child, sizes, args.batch, args.steps)))
        return
    text = markdown(run(sizes, args.batch, args.steps))
    if args.hosts:
        quick = {"sizes": (64, 48, 48, 10), "steps": 2, "rounds": 1} if args.quick else {}
        text += "\n" + hosts_markdown(run_hosts(**quick))
    print(text)
    if args.write:
        update_section(NAME, text)


if __name__ == "__main__":
    main()
