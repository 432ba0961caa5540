"""One worker of the multi-worker gradient-bucketing test (run by ``graphdist launch --workers 2``).

Trains the same MLP (SGD, ``--steps`` global batches of digits) twice under
``MultiWorkerMirroredStrategy``: without packing (one MPI all-reduce per
gradient, one backward segment) and with
``CommunicationOptions(bytes_per_pack=BYTES_PER_PACK)`` and
``GRAPHDIST_OVERLAP=1`` (gradients packed, the backward pass cut at the
packs). Writes to ``--out/rank<r>.npz``: each variant's final weights and
losses, each plan's cross-worker all-reduce tasks, segment names and the
forward/backward segments the plan lets a cross-worker all-reduce overlap, and
from the timeline of the bucketed plan's second step (recorded in process,
:func:`graphdist.runtime.timeline.record`) whether a cross-worker
collective ran while a segment computed, and its MPI waits.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP
from graphdist.runtime import timeline
from graphdist.runtime.tasks import overlapping_segments

GLOBAL_BATCH = 128
#: Wide enough that the backward pass of the first layer (the last overlap sub-segment) takes a while.
SIZES = (64, 256, 256, 10)
#: Gradient bytes, last layer first: 40 + 10240 + 1024 + 262144 + 1024 + 65536 (and the 4-byte loss sum),
#: so at this size the packs are [loss, b3, W3, b2, W2, b1] and [W1] (by the order autodiff emits them).
BYTES_PER_PACK = 280_000


def _overlapping(events: list[timeline.Event]) -> int:
    """Number of cross-worker all-reduces that ran (in part) while a segment of the forward and backward
    pass (phase 0) computed: none without the overlap cut, where every gradient waits for that segment."""
    segments = [(e.start, e.start + e.duration) for e in events if e.cat == "segment" and ".p0" in e.name]
    found = 0
    for event in events:
        if event.cat == "collective" and event.args.get("op") == "CrossWorkerAllReduce":
            end = event.start + event.duration
            found += any(start < end and event.start < stop for start, stop in segments)
    return found


def train(options: Any, devices: int, steps: int, overlap: bool) -> dict[str, Any]:
    os.environ["GRAPHDIST_OVERLAP"] = "1" if overlap else "0"  # read when the step is compiled (first call)
    strategy = gd.MultiWorkerMirroredStrategy(devices=[f"cpu:{i}" for i in range(devices)],
                                              communication_options=options)
    rank = strategy.cluster_resolver.task_id
    with strategy.scope():
        model = MLP(SIZES, seed=100 + rank, trainable=True)  # worker 0's initial values are broadcast
        optimizer = gd.optimizers.SGD(0.5)
    train_step = model.make_train_step(optimizer, global_batch_size=GLOBAL_BATCH)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(train_step, args=(x, labels)), axis=None)

    data = digits()
    dataset = gd.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).take(GLOBAL_BATCH * steps)
    losses, steps_events, plan = [], [], None
    for index, (x, labels) in enumerate(strategy.experimental_distribute_dataset(dataset.batch(GLOBAL_BATCH))):
        if index == 0:  # compiles
            losses.append(float(step(x, labels)))
            plan = step.get_concrete_function(x, labels).plan
            continue
        with timeline.record() as recorded:
            losses.append(float(step(x, labels)))
        steps_events += recorded
    cross = [c for c in plan.comms if c.op == "CrossWorkerAllReduce"]
    may_overlap = overlapping_segments(plan.segments, plan.comms)
    return {"losses": np.array(losses), "weights": [np.asarray(v.numpy()) for v in model.trainable_variables],
            "cross": len(cross), "sequences": [int(c.attrs["sequence"]) for c in cross],
            "segments": [s.name for s in plan.segments],
            "plan_overlaps": sorted({name for c in cross for name in may_overlap.get(c.name, []) if ".p0" in name}),
            "overlapping": sum(_overlapping(events) for events in steps_events),
            "mpi_waits": sum(1 for events in steps_events for e in events if e.name == "MPI wait"), "rank": rank}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    plain = train(None, args.devices, args.steps, overlap=False)
    options = gd.experimental.CommunicationOptions(bytes_per_pack=BYTES_PER_PACK)
    packed = train(options, args.devices, args.steps, overlap=True)
    out: dict[str, Any] = {}
    for label, result in (("plain", plain), ("packed", packed)):
        out[f"{label}_losses"] = result["losses"]
        out[f"{label}_cross"] = result["cross"]
        out[f"{label}_sequences"] = np.array(result["sequences"])
        out[f"{label}_segments"] = np.array(result["segments"])
        out[f"{label}_plan_overlaps"] = np.array(result["plan_overlaps"], dtype=str)
        out[f"{label}_overlapping"] = result["overlapping"]
        out[f"{label}_mpi_waits"] = result["mpi_waits"]
        out.update({f"{label}_var{i}": w for i, w in enumerate(result["weights"])})
    np.savez(Path(args.out) / f"rank{plain['rank']}.npz", **out)


if __name__ == "__main__":
    main()
