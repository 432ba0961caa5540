"""Training across hosts over shaped links: 2 hosts x 1 core against 1 host x 1 core.

Each host is a network namespace of :mod:`benchmarks.netns` pinned to its own
core (``taskset``), so two hosts have twice the compute of one, as two
machines would, and every byte between them crosses a veth link through a
switch, shaped per link (``tc``: the rate; delay and loss too where the
kernel has ``netem``). The tasks are started by hand, each a plain
``python`` with its TF_CONFIG, as the seeds start a multi-worker job.

For each link (unshaped, 10 Gbit/s, 1 Gbit/s):

* **all-reduce**: float32 buffers of 4 KB to 64 MB between the two hosts,
  graphdist's MPI communicator (``strategy.communicator.all_reduce``:
  fingerprint check, then MPI's all-reduce, polled against the timeout)
  against raw mpi4py ``Allreduce`` on the same communicator, interleaved;
  **ratio = raw time / graphdist time** (goal >= 0.9);
* **training**: the MLP 784-512-512-10 (SGD), the ConvNet and the
  transformer block of ``graphdist.models`` (Adam), per-worker batch
  ``BATCH``: one host (``MultiWorkerMirroredStrategy`` alone, one core),
  two hosts (global batch ``2 x BATCH``: each worker computes what the one
  host computed), and two hosts with the gradients packed
  (``CommunicationOptions(bytes_per_pack=2 MiB)``) and the backward pass cut
  at the packs (``GRAPHDIST_OVERLAP=1``). **Scaling efficiency =
  throughput of 2 hosts / (2 x throughput of 1 host)** = 1-host step time /
  2-host step time (goal >= 0.9 for the ConvNet and the transformer block
  at 10 Gbit/s);
* **bytes on the wire** per step: host 0's interface counters (sent)
  around the timed steps, beside the plan's predicted bytes (every
  cross-worker collective's payload, which each of 2 hosts sends once
  whether MPI reduces by recursive doubling or reduce-scatter + all-gather,
  plus graphdist's 16-byte fingerprint per collective);
* **predicted step time** of 2 hosts: the 1-host step (compute) plus, per
  cross-worker collective, the measured 4 KB all-reduce time of that link
  (latency) and its payload at the link's measured all-reduce bandwidth
  (64 MB all-reduce): no overlap assumed.

Needs root (network namespaces).

    python -m benchmarks.bench_multi_host [--quick] [--write]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import machine_info, median
from benchmarks.bench_mpi_allreduce import write_section
from benchmarks.netns import HostBed, Link, run_worker_tasks, unavailable_reason

__all__ = ["NAME", "LINKS", "MODELS", "SIZES", "run", "markdown", "main", "predicted_ms", "goals"]

logger = logging.getLogger(__name__)

NAME = "multi_host"
LINKS: dict[str, Link | None] = {"unshaped veth": None, "10 Gbit/s, 50 us": Link(rate="10gbit", delay="50us"),
                                 "1 Gbit/s, 200 us": Link(rate="1gbit", delay="200us")}
MODELS = ("mlp", "convnet", "transformer")
SETUPS = ("1 host", "2 hosts", "2 hosts, packs + overlap")
SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
BATCH = 256
BYTES_PER_PACK = 2 << 20
FINGERPRINT_BYTES = 16


# ------------------------------------------------------------------ in a host
def _interface_bytes() -> tuple[int, int]:
    """``(sent, received)`` bytes of this namespace host's interface."""
    base = Path("/sys/class/net/eth0/statistics")
    if not base.exists():
        return 0, 0
    return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())


def _model(kind: str, batch: int) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    import graphdist as gd

    if kind == "mlp":
        from graphdist.models.mlp import MLP

        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, 784)).astype(np.float32)
        return (lambda: (MLP((784, 512, 512, 10), seed=0, trainable=True), gd.optimizers.SGD(0.01))), None, x, \
            rng.integers(0, 10, batch)
    if kind == "convnet":
        from graphdist.models.convnet import ConvNet as Model
    else:
        from graphdist.models.transformer import TransformerBlock as Model
    x, labels = Model.example_data(n=batch, seed=0)
    return (lambda: (Model(seed=0), gd.optimizers.Adam(0.01))), None, x, labels


def _plan_bytes(plan: Any) -> tuple[int, int]:
    """``(payload bytes, collectives)`` of the plan's cross-worker collectives (one buffer each per host)."""
    from graphdist.ir.comm_ops import CROSS_WORKER_OPS

    values = {value.name: value for value in plan.graph.values()}
    payload, count = 0, 0
    for comm in plan.comms:
        if comm.op not in CROSS_WORKER_OPS:
            continue
        value = values[comm.inputs[0]]
        payload += int(np.prod(value.shape, dtype=np.int64)) * np.dtype(value.dtype).itemsize
        count += 1
    return payload, count


def _train_worker(kind: str, steps: int, blocks: int, packed: bool, out: str) -> None:
    """Trains ``kind`` (per-worker batch BATCH) and times it; the chief writes the JSON result."""
    import graphdist as gd

    options = gd.experimental.CommunicationOptions(bytes_per_pack=BYTES_PER_PACK) if packed else None
    strategy = gd.MultiWorkerMirroredStrategy(communication_options=options)
    workers = strategy.num_replicas_in_sync
    build, _, x, labels = _model(kind, BATCH * workers)
    with strategy.scope():
        model, optimizer = build()
    replica_step = model.make_train_step(optimizer, BATCH * workers)

    @gd.function
    def step(x: Any, labels: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    (batch,) = list(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels))))
    plan = step.get_concrete_function(*batch).plan
    for _ in range(5):
        step(*batch)
    per_block = max(1, steps // blocks)
    ms = []
    sent_before = _interface_bytes()[0]
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(per_block):
            loss = step(*batch)
        ms.append((time.perf_counter() - start) / per_block * 1e3)
    sent = (_interface_bytes()[0] - sent_before) / (per_block * blocks)
    if not np.isfinite(float(loss)):
        raise SystemExit("the loss is not finite")
    payload, collectives = _plan_bytes(plan)
    if strategy.extended.should_checkpoint:
        Path(out).write_text(json.dumps({"ms": ms, "sent_bytes": sent, "payload_bytes": payload,
                                         "collectives": collectives}))


def _allreduce_worker(rounds: int, out: str) -> None:
    """Raw ``Allreduce`` against graphdist's all-reduce on the joined communicator, interleaved by round."""
    import graphdist as gd

    strategy = gd.MultiWorkerMirroredStrategy()
    communicator = strategy.communicator
    raw = communicator._comm  # the same duplicated communicator graphdist's collectives use
    from mpi4py import MPI

    results: dict[str, dict[str, list[float]]] = {}
    for size in SIZES:
        buffer = np.ones(size // 4, np.float32)
        output = np.empty_like(buffer)
        calls = max(2, min(50, (1 << 22) // size))
        times: dict[str, list[float]] = {"raw": [], "graphdist": []}
        for index in range(rounds + 1):
            order = ("raw", "graphdist") if index % 2 == 0 else ("graphdist", "raw")
            for variant in order:
                communicator.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    if variant == "raw":
                        raw.Allreduce(buffer, output, MPI.SUM)
                    else:
                        communicator.all_reduce(buffer, out=output)
                if index:  # the first round warms up
                    times[variant].append((time.perf_counter() - start) / calls * 1e3)
        results[str(size)] = times
    if strategy.extended.should_checkpoint:
        Path(out).write_text(json.dumps(results))


# ------------------------------------------------------------------ driver
def _run_tasks(bed: HostBed, hosts: int, worker_args: list[str], env: dict[str, str], timeout: float) -> dict:
    """Starts this module's worker in ``hosts`` hosts (see :func:`benchmarks.netns.run_worker_tasks`)."""
    return run_worker_tasks(bed, hosts, "benchmarks.bench_multi_host", worker_args, env, timeout)


def _measure_link(bed: HostBed, quick: bool, repeats: int) -> dict[str, Any]:
    steps, blocks = (8, 2) if quick else (40, 4)
    rounds = 2 if quick else 7
    sweep = _run_tasks(bed, 2, ["--allreduce", "--rounds", str(rounds)], {}, 600)
    allreduce = {int(size): {variant: median(values) for variant, values in times.items()}
                 for size, times in sweep.items()}
    training: dict[str, dict[str, Any]] = {}
    for kind in MODELS:
        runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in SETUPS}
        for index in range(repeats):
            for setup in SETUPS if index % 2 == 0 else SETUPS[::-1]:
                hosts = 1 if setup == "1 host" else 2
                packed = setup.endswith("overlap")
                args = ["--model", kind, "--steps", str(steps), "--blocks", str(blocks)] + (["--packed"] if packed
                                                                                             else [])
                result = _run_tasks(bed, hosts, args, {"GRAPHDIST_OVERLAP": "1" if packed else "0"}, 900)
                result["step_ms"] = median(result["ms"])
                runs[setup].append(result)
                logger.info("%s, %s: %.2f ms/step", kind, setup, result["step_ms"])
        training[kind] = {setup: min(values, key=lambda r: r["step_ms"]) | {"runs": [r["step_ms"] for r in values]}
                          for setup, values in runs.items()}
    return {"allreduce": allreduce, "training": training, "shaping": bed.shaping}


def predicted_ms(compute_ms: float, result: dict[str, Any], allreduce: dict[int, dict[str, float]],
                 hosts: int = 2) -> float:
    """A step on ``hosts`` hosts of one link: the compute plus, per cross-worker collective, the link's latency
    (the measured 4 KB all-reduce of 2 hosts, times log2(hosts): recursive doubling) and the payload at the
    measured 64 MB all-reduce rate (2 hosts send each byte once; a ring of N, 2(N-1)/N times). No overlap.
    """
    latency = allreduce[SIZES[0]]["graphdist"] * np.log2(hosts)
    per_byte = allreduce[SIZES[-1]]["graphdist"] / SIZES[-1] * (2 * (hosts - 1) / hosts)
    return compute_ms + result["collectives"] * latency + result["payload_bytes"] * per_byte


def run(quick: bool = False, repeats: int | None = None, links: Sequence[str] | None = None) -> dict[str, Any]:
    """Measures every link (see the module docstring); ``quick``: few steps, one repeat.

    Raises:
        RuntimeError: The namespace hosts cannot be made here (not root), or a task failed.
    """
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"bench_multi_host needs network namespaces: {reason}")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise RuntimeError("bench_multi_host needs 2 cores (one per host)")
    repeats = repeats or (1 if quick else 3)
    measured = {}
    for name in links or LINKS:
        with HostBed(2, link=LINKS[name], cpus=[cores[0], cores[1]]) as bed:
            measured[name] = _measure_link(bed, quick, repeats)
    for link in measured.values():
        for setups in link["training"].values():
            one = setups["1 host"]["step_ms"]
            for setup, result in setups.items():
                result["efficiency"] = one / result["step_ms"]
                if setup != "1 host":
                    result["predicted_ms"] = predicted_ms(one, result, link["allreduce"])
                    result["predicted_8_ms"] = predicted_ms(one, result, link["allreduce"], hosts=8)
    return {"name": NAME, "machine": machine_info(), "links": measured, "repeats": repeats, "quick": quick}


def _allreduce_rows(results: dict[str, Any]) -> list[str]:
    rows = ["| link | " + " | ".join(_size(s) for s in SIZES) + " |", "|---|" + "---:|" * len(SIZES)]
    for name, link in results["links"].items():
        cells = []
        for size in SIZES:
            times = link["allreduce"][size]
            cells.append(f"{times['raw']:.3f} / {times['graphdist']:.3f} ms = {times['raw'] / times['graphdist']:.2f}x")
        rows.append(f"| {name} ({link['shaping']}) | " + " | ".join(cells) + " |")
    return rows


def _training_rows(results: dict[str, Any]) -> list[str]:
    rows = ["| link | model | set-up | ms / step | examples / s | scaling efficiency | predicted ms / step | "
            "predicted, 8 hosts | sent / step (measured) | payload / step (plan) | every run (ms) |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, link in results["links"].items():
        for kind, setups in link["training"].items():
            for setup, r in setups.items():
                hosts = 1 if setup == "1 host" else 2
                predicted = f"{r['predicted_ms']:.2f}" if "predicted_ms" in r else "-"
                eight = f"{r['predicted_8_ms']:.2f}" if "predicted_8_ms" in r else "-"
                sent = f"{r['sent_bytes'] / 1e3:,.1f} KB" if hosts > 1 else "-"
                payload = f"{(r['payload_bytes'] + FINGERPRINT_BYTES * r['collectives']) / 1e3:,.1f} KB " \
                          f"({r['collectives']} coll.)" if hosts > 1 else "-"
                runs = ", ".join(f"{v:.2f}" for v in r["runs"])
                rows.append(f"| {name} | {kind} | {setup} | {r['step_ms']:.2f} | "
                            f"{BATCH * hosts / r['step_ms'] * 1e3:,.0f} | "
                            f"{'-' if hosts == 1 else format(r['efficiency'], '.2f')} | {predicted} | {eight} | "
                            f"{sent} | {payload} | {runs} |")
    return rows


def _size(size: int) -> str:
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def goals(results: dict[str, Any]) -> list[str]:
    """One line per goal of the section: what was measured against it, met or not."""
    lines = []
    fast = results["links"].get("10 Gbit/s, 50 us")
    if fast is not None:
        for kind in ("convnet", "transformer"):
            best = max(r["efficiency"] for setup, r in fast["training"][kind].items() if setup != "1 host")
            lines.append(f"- scaling efficiency >= 0.9 for the {kind} at 10 Gbit/s: best {best:.2f} "
                         f"({'met' if best >= 0.9 else 'not met'})")
    worst = min((t["raw"] / t["graphdist"], size, name) for name, link in results["links"].items()
                for size, t in link["allreduce"].items())
    large = min(t["raw"] / t["graphdist"] for link in results["links"].values()
                for size, t in link["allreduce"].items() if size >= 1 << 20)
    lines.append(f"- all-reduce >= 0.9x raw mpi4py: from 1 MB up the worst is {large:.2f}x "
                 f"({'met' if large >= 0.9 else 'not met'}); over every size {worst[0]:.2f}x at {_size(worst[1])} "
                 f"({worst[2]}){'' if worst[0] >= 0.9 else ': not met for small buffers'}")
    return lines


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    machine = results["machine"]
    return f"""## Training across hosts: 2 hosts x 1 core against 1 host x 1 core, over shaped links

Each host is a Linux network namespace pinned to its own core, joined to the other through a switch
(`benchmarks/netns.py`); the tasks are started by hand with TF_CONFIG, as the seeds start a job. Per-worker
batch {BATCH} (2 hosts: global batch {2 * BATCH}), so scaling efficiency = 1-host step time / 2-host step time
(throughput of 2 hosts / 2 x throughput of 1). Links as shaped by `tc` (the shaping column says what this
kernel applied). Best of {results['repeats']} alternating runs per set-up; every run listed. Measured
{machine['date']} on {machine.get('cpu', 'this machine')}.

All-reduce between the two hosts, float32 (raw mpi4py `Allreduce` / graphdist's communicator, median ms per
call; ratio = raw / graphdist, goal >= 0.9):

{chr(10).join(_allreduce_rows(results))}

Training:

{chr(10).join(_training_rows(results))}

Goals:

{chr(10).join(goals(results))}

"sent / step" is host 0's interface counter (everything host 0 sent per timed step: MPI's TCP traffic with
its headers); "payload / step" is what the plan's cross-worker collectives move (each host sends each
buffer once with 2 hosts) plus graphdist's 16-byte fingerprint per collective. "predicted" is the 1-host
step plus, per collective, the link's 4 KB all-reduce time and the payload at the link's 64 MB all-reduce
rate (no overlap assumed); for 8 hosts, the latency times log2(8) and the payload times 2(N-1)/N (a ring).
Reproduce (root): `python -m benchmarks.bench_multi_host --write`.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: measure, print, optionally update BENCHMARKS.md (``--worker``: one task)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_multi_host", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--links", default=None, help=f"comma-separated subset of: {', '.join(LINKS)}")
    parser.add_argument("--write", action="store_true", help="update this section of BENCHMARKS.md")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--allreduce", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=7, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=40, help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--packed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        if args.allreduce:
            _allreduce_worker(args.rounds, args.out)
        else:
            _train_worker(args.model, args.steps, args.blocks, args.packed, args.out)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    results = run(args.quick, args.repeats, args.links.split(",") if args.links else None)
    text = markdown(results)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, default=str, indent=1))
    if args.write:
        write_section(NAME, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
