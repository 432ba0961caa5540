"""Tensor parallelism (ModelParallelStrategy, mesh (1, 2)) vs MirroredStrategy on the same 2 logical CPUs.

An MLP with 4096-wide layers (default 784-4096-4096-10, 20.0 M parameters)
trains with Adam on one global batch under
``MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=gd.NcclAllReduce())``
(each replica half the batch, gradients all-reduced) and under
``ModelParallelStrategy`` on mesh ``(1, 2)`` (the Megatron layout: first
kernel and bias split by columns, second kernel by rows; the whole batch on
both devices, one all-reduce of the block's output). Each variant runs in its
own child process. Reported per variant:

* parameter + optimizer-state bytes each device holds, from the plan
  (:func:`graphdist.passes.lower_layouts.variable_bytes_per_device`);
* peak RSS of the process (both devices share host memory: a split variable
  is stored once, as its blocks, so RSS shows transient buffers rather than
  the per-device halving);
* median step time over ``steps`` timed steps after one warm-up step;
* bytes into collectives per step: measured (the recorded step's
  collectives, ``graphdist.runtime.timeline``) and predicted (the plan's
  collective nodes), and the bytes sent between devices the summary's
  estimate gives;
* the weights' checksum after the steps (the variants must agree).

    python -m benchmarks.bench_model_parallel [--quick] [--steps N] [--write]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from benchmarks import median_ms, peak_rss_bytes, run_child, update_section

__all__ = ["NAME", "SIZES", "run", "child", "markdown", "main"]

NAME = "model_parallel"
#: Layer sizes of the default model.
SIZES = (784, 4096, 4096, 10)
BATCH = 64


def _strategy(kind: str) -> Any:
    import graphdist as gd

    if kind == "mirrored":
        return gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=gd.NcclAllReduce())
    mesh = gd.experimental.DeviceMesh((1, 2), ("batch", "model"), ["cpu:0", "cpu:1"])
    layout_map = gd.experimental.LayoutMap(mesh)
    layout_map["dense_0/kernel"] = (None, "model")
    layout_map["dense_0/bias"] = ("model",)
    layout_map["dense_1/kernel"] = ("model", None)
    return gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name="batch")


def _collective_bytes(graph: Any) -> tuple[int, int]:
    """``(payload into collectives, estimated bytes sent between devices)`` of a rewritten graph, per step."""
    from graphdist.ir.comm_ops import is_communication, is_runtime_check
    from graphdist.ir.render import moved_bytes

    groups: dict[str, list[Any]] = {}
    for node in graph.nodes:
        if is_communication(node) and not is_runtime_check(node) and node.op_type != "Transfer":
            groups.setdefault(node.attrs.get("group_key", node.name), []).append(node)
    payload = sum(int(n.inputs[0].nbytes or 0) for nodes in groups.values() for n in nodes)
    sent = sum(int(moved_bytes(nodes[0].op_type, len(nodes), nodes[0].inputs[0].nbytes, nodes[0].attrs) or 0)
               for nodes in groups.values())
    return payload, sent


def child(kind: str, sizes: tuple[int, ...], batch: int, steps: int) -> dict[str, Any]:
    """Trains in this process and returns its measurements (run in a fresh process for a clean RSS)."""
    import graphdist as gd
    from graphdist.models.mlp import MLP
    from graphdist.passes.lower_layouts import variable_bytes_per_device
    from graphdist.runtime import timeline

    strategy = _strategy(kind)
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
    with timeline.record() as recorded:
        train(*args)
    measured = sum(int(e.args["bytes"]) * len(e.args["participants"]) for e in recorded[0] if e.cat == "collective")
    step_ms = median_ms(lambda: train(*args), steps)
    graph = train.get_concrete_function(*args).graph("rewritten")
    predicted, sent = _collective_bytes(graph)
    return {"kind": kind, "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "bytes_per_device": variable_bytes_per_device(graph), "peak_rss_bytes": peak_rss_bytes(),
            "step_ms": step_ms, "collective_bytes_measured": measured, "collective_bytes_predicted": predicted,
            "sent_bytes_estimate": sent,
            "checksum": float(sum(np.abs(v.numpy()).sum(dtype=np.float64) for v in model.trainable_variables))}


def run(sizes: tuple[int, ...] = SIZES, batch: int = BATCH, steps: int = 3, timeout: float = 900.0
        ) -> dict[str, Any]:
    """Both variants in child processes, and their ratios."""
    mirrored, split = (run_child("benchmarks.bench_model_parallel",
                                 ["--child", kind, "--sizes", ",".join(map(str, sizes)), "--batch", str(batch),
                                  "--steps", str(steps)], timeout) for kind in ("mirrored", "tensor"))
    return {"sizes": list(sizes), "batch": batch, "steps": steps, "mirrored": mirrored, "tensor": split,
            "bytes_ratio": split["bytes_per_device"] / mirrored["bytes_per_device"],
            "step_ratio": split["step_ms"] / mirrored["step_ms"],
            "same_weights": bool(np.isclose(split["checksum"], mirrored["checksum"], rtol=1e-5))}


def _row(label: str, r: dict[str, Any]) -> str:
    return (f"| {label} | {r['bytes_per_device'] / 2**20:,.1f} MiB | {r['peak_rss_bytes'] / 2**20:,.0f} MiB | "
            f"{r['step_ms']:,.1f} ms | {r['collective_bytes_measured'] / 2**20:,.2f} MiB | "
            f"{r['collective_bytes_predicted'] / 2**20:,.2f} MiB | {r['sent_bytes_estimate'] / 2**20:,.2f} MiB |")


def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    params = results["mirrored"]["params"]
    return "\n".join([
        "## Tensor parallelism vs Mirrored on 2 logical devices", "",
        f"MLP {'-'.join(map(str, results['sizes']))} ({params / 1e6:.1f} M parameters), Adam, global batch "
        f"{results['batch']}; `MirroredStrategy([\"cpu:0\", \"cpu:1\"], cross_device_ops=gd.NcclAllReduce())` vs "
        "`ModelParallelStrategy` on mesh (1, 2) with the Megatron layout (first kernel and bias by columns, second "
        f"kernel by rows); median of {results['steps']} steps, each variant in its own process "
        "(`python -m benchmarks.bench_model_parallel`).", "",
        "| variant | parameters + Adam state per device (plan) | peak RSS | step | into collectives per step "
        "(measured) | (plan) | sent between devices (estimate) |", "|---|---|---|---|---|---|---|",
        _row("Mirrored(2)", results["mirrored"]), _row("ModelParallel (1, 2)", results["tensor"]), "",
        f"Tensor parallel / Mirrored: bytes per device {results['bytes_ratio']:.3f}, step time "
        f"{results['step_ratio']:.3f}; same weights after the steps: {results['same_weights']}. Mirrored all-reduces "
        "every gradient (the weights' size); the split MLP all-reduces one activation (batch x 4096) per step. "
        "Both devices share the host's memory and cores, so peak RSS does not show the per-device halving and "
        "the step times compare two ways of using the same two cores.", ""])


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model (not the 4096-wide one)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--sizes", default=None, help="layer sizes, comma-separated")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--child", choices=("mirrored", "tensor"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else ((64, 64, 64, 10) if args.quick else SIZES)
    if args.child:
        print(json.dumps(child(args.child, sizes, args.batch, args.steps)))
        return
    results = run(sizes, args.batch, args.steps)
    text = markdown(results)
    print(text)
    if args.write:
        update_section(NAME, text)


if __name__ == "__main__":
    main()
