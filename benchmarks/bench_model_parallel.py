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

And the bytes a transformer block (:class:`graphdist.models.transformer.TransformerBlock`,
heads and MLP split over ``model``) moves per step on mesh ``(2, 2)``, per
collective op: measured (the recorded step), into collectives by the plan,
sent between devices by the summary's estimate, and sent per device by the
layout lowering's cost model (``meta["bytes_per_device"]``, the layout
collectives only). ``--bytes`` runs only that part.

    python -m benchmarks.bench_model_parallel [--quick] [--steps N] [--bytes] [--write]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from benchmarks import median_ms, mlp_training, peak_rss_bytes, run_child, update_section, weights_checksum

__all__ = ["NAME", "SIZES", "TRANSFORMER", "run", "child", "transformer_child", "markdown", "transformer_markdown",
           "main"]

NAME = "model_parallel"
#: Layer sizes of the default model.
SIZES = (784, 4096, 4096, 10)
BATCH = 64
#: The transformer block of the bytes table (TransformerBlock's arguments), and its global batch.
TRANSFORMER = {"d_model": 128, "num_heads": 4, "d_ff": 512, "max_length": 32, "vocab_size": 64}
TRANSFORMER_BATCH = 32
_BYTES_KEYS = ("groups", "measured", "plan", "sent_estimate", "sent_per_device")


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
    from graphdist.passes.lower_layouts import variable_bytes_per_device
    from graphdist.runtime import timeline

    model, _, train, args = mlp_training(_strategy(kind), sizes, batch)
    with timeline.record() as recorded:
        train(*args)
    measured = sum(int(e.args["bytes"]) * len(e.args["participants"]) for e in recorded[0] if e.cat == "collective")
    step_ms = median_ms(lambda: train(*args), steps)
    graph = train.get_concrete_function(*args).graph("rewritten")
    predicted, sent = _collective_bytes(graph)
    return {"kind": kind, "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "bytes_per_device": variable_bytes_per_device(graph), "peak_rss_bytes": peak_rss_bytes(),
            "step_ms": step_ms, "collective_bytes_measured": measured, "collective_bytes_predicted": predicted,
            "sent_bytes_estimate": sent, "checksum": weights_checksum(model)}


def _transformer_strategy() -> Any:
    import graphdist as gd
    from graphdist.models.transformer import TransformerBlock

    mesh = gd.experimental.DeviceMesh((2, 2), ("batch", "model"), [f"cpu:{i}" for i in range(4)])
    return gd.experimental.ModelParallelStrategy(layout_map=TransformerBlock.get_layout_map(mesh),
                                                 batch_dim_name="batch")


def transformer_child(batch: int = TRANSFORMER_BATCH) -> dict[str, Any]:
    """One recorded step of the transformer block on mesh (2, 2): bytes per collective op, measured and predicted."""
    import graphdist as gd
    from graphdist.ir.comm_ops import is_communication, is_runtime_check
    from graphdist.ir.render import moved_bytes
    from graphdist.models.transformer import TransformerBlock
    from graphdist.runtime import timeline

    strategy = _transformer_strategy()
    with strategy.scope():
        model = TransformerBlock(**TRANSFORMER)
        optimizer = gd.optimizers.Adam(0.01)
    replica_step = model.make_train_step(optimizer, global_batch_size=batch)

    @gd.function
    def train(x: Any, labels: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    ids, labels = TransformerBlock.example_data(n=batch, length=TRANSFORMER["max_length"],
                                                vocab_size=TRANSFORMER["vocab_size"])
    args = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((ids, labels)))))
    train(*args)
    with timeline.record() as recorded:
        train(*args)
    ops: dict[str, dict[str, int]] = {}

    def row(op: str, key: str) -> dict[str, int]:
        kind = "layouts" if key.startswith("layout") else "gradients across batch groups"
        return ops.setdefault(f"{op} ({kind})", dict.fromkeys(_BYTES_KEYS, 0))

    for event in recorded[0]:
        if event.cat == "collective" and event.args["op"] not in ("Transfer", "AssertInRange"):
            row(event.args["op"], event.name)["measured"] += int(event.args["bytes"]) * len(event.args["participants"])
    groups: dict[str, list[Any]] = {}
    for node in train.get_concrete_function(*args).graph("rewritten").nodes:
        if is_communication(node) and not is_runtime_check(node) and node.op_type != "Transfer":
            groups.setdefault(node.attrs.get("group_key", node.name), []).append(node)
    for key, nodes in groups.items():
        first, entry = nodes[0], row(nodes[0].op_type, key)
        entry["groups"] += 1
        entry["plan"] += sum(int(n.inputs[0].nbytes or 0) for n in nodes)
        entry["sent_estimate"] += int(moved_bytes(first.op_type, len(nodes), first.inputs[0].nbytes, first.attrs) or 0)
        entry["sent_per_device"] += sum(int(n.meta.get("bytes_per_device", 0)) for n in nodes)
    return {"model": dict(TRANSFORMER), "batch": batch, "ops": ops,
            "params": int(sum(np.prod(v.shape) for v in model.trainable_variables))}


def run(sizes: tuple[int, ...] = SIZES, batch: int = BATCH, steps: int = 3, timeout: float = 900.0
        ) -> dict[str, Any]:
    """Both variants in child processes, and their ratios."""
    mirrored, split = (run_child("benchmarks.bench_model_parallel",
                                 ["--child", kind, "--sizes", ",".join(map(str, sizes)), "--batch", str(batch),
                                  "--steps", str(steps)], timeout) for kind in ("mirrored", "tensor"))
    return {"sizes": list(sizes), "batch": batch, "steps": steps, "mirrored": mirrored, "tensor": split,
            "bytes_ratio": split["bytes_per_device"] / mirrored["bytes_per_device"],
            "step_ratio": split["step_ms"] / mirrored["step_ms"],
            "same_weights": bool(np.isclose(split["checksum"], mirrored["checksum"], rtol=1e-5)),
            "transformer": run_child("benchmarks.bench_model_parallel", ["--child", "transformer"], timeout)}


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
        "the step times compare two ways of using the same two cores.", "",
        transformer_markdown(results["transformer"])])


def transformer_markdown(r: dict[str, Any]) -> str:
    """The bytes table of the transformer block on mesh (2, 2)."""
    m = r["model"]
    lines = [f"Bytes moved per step by a transformer block (d_model {m['d_model']}, {m['num_heads']} heads split over "
             f"`model`, d_ff {m['d_ff']} split like the MLP above, sequence {m['max_length']}, {r['params']:,} "
             f"parameters), global batch {r['batch']}, on mesh (2, 2) (`batch` x `model`), one recorded step: "
             "measured is what the step's collectives received (all participants), plan is the same from the "
             "rewritten graph, estimate is the summary's bytes sent between devices, lowering is the layout "
             "lowering's cost model (bytes each device sends, summed over devices; it prices the layouts' "
             "collectives, not the gradients' all-reduces between the batch groups).", "",
             "| collective | groups | into collectives (measured) | (plan) | sent between devices (estimate) | "
             "sent by the devices (lowering's model) |", "|---|---|---|---|---|---|"]
    total = dict.fromkeys(_BYTES_KEYS, 0)
    for op, e in sorted(r["ops"].items()):
        lowered = f"{e['sent_per_device']:,} B" if op.endswith("(layouts)") else "-"
        lines.append(f"| {op} | {e['groups']} | {e['measured']:,} B | {e['plan']:,} B | {e['sent_estimate']:,} B | "
                     f"{lowered} |")
        total = {k: total[k] + e[k] for k in total}
    lines.append(f"| all | {total['groups']} | {total['measured']:,} B | {total['plan']:,} B | "
                 f"{total['sent_estimate']:,} B | - |")
    lines += ["", "Every collective's payload in the recorded step is what the plan lists; the lowering's model, "
              "bytes each device sends (`2 (n-1)/n S` for a ring all-reduce, `(n-1)/n S` for an all-to-all), is "
              "the summary's estimate for the layouts' collectives."]
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model (not the 4096-wide one)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--sizes", default=None, help="layer sizes, comma-separated")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--bytes", action="store_true", help="only the transformer block's bytes table (printed)")
    parser.add_argument("--child", choices=("mirrored", "tensor", "transformer"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "transformer" or args.bytes:
        result = transformer_child()
        print(json.dumps(result) if args.child else transformer_markdown(result))
        return
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
