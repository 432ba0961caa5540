"""One worker of the multi-process re-planning test (run under ``graphdist launch``).

Loads a plan directory exported by one process, re-plans it for
``MultiWorkerMirroredStrategy`` (or, with ``--strategy parameter_server``,
``ParameterServerStrategy``; this worker's devices), runs ``--steps`` steps
on the global batches of ``--inputs`` (each worker takes its share of each
global batch), and writes this rank's losses and variables to
``--out/rank<r>.npz``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import graphdist as gd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plan")
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", choices=["multi_worker_mirrored", "parameter_server"],
                        default="multi_worker_mirrored")
    args = parser.parse_args()

    devices = [f"cpu:{i}" for i in range(args.devices)]
    if args.strategy == "parameter_server":
        strategy = gd.ParameterServerStrategy(devices=devices)
    else:
        strategy = gd.MultiWorkerMirroredStrategy(devices=devices)
    rank = strategy.cluster_resolver.task_id
    plan = gd.load_plan(args.plan).replan(strategy)
    with np.load(args.inputs) as data:
        x, labels = data["x"], data["labels"]
    losses = []
    for step in range(args.steps):
        rows = slice(step * len(x) // args.steps, (step + 1) * len(x) // args.steps)
        losses.append(float(plan(x[rows], labels[rows])))
    np.savez(Path(args.out) / f"rank{rank}.npz", losses=np.asarray(losses), **plan.variables)


if __name__ == "__main__":
    main()
