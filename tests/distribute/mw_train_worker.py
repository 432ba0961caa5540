"""One worker of the multi-process MultiWorkerMirroredStrategy tests (run under mpiexec).

Trains a small MLP on digits with SGD for ``--steps`` global batches and
writes, per rank, the final variables, the losses and the dataset indices
this worker was fed to ``--out/rank<r>.npz``. Each rank builds its model
with a different seed, so equal results also show that worker 0's initial
values were broadcast. ``--die-at-step S`` makes the last rank die (SIGKILL)
at step S, ``--raise-at-step S`` raise an uncaught exception (after
``--noise-lines`` lines of output), for the fault tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

GLOBAL_BATCH = 16
SIZES = (64, 16, 10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", required=True)
    parser.add_argument("--die-at-step", type=int, default=-1)
    parser.add_argument("--raise-at-step", type=int, default=-1)
    parser.add_argument("--slurm-port-base", type=int, default=0,
                        help="roles from the Slurm step (gd.cluster_resolver.SlurmClusterResolver) with this port base")
    parser.add_argument("--noise-lines", type=int, default=0,
                        help="lines written to stderr just before raising (output that must not be lost)")
    args = parser.parse_args()

    resolver = gd.cluster_resolver.SlurmClusterResolver(port_base=args.slurm_port_base) if args.slurm_port_base \
        else None
    strategy = gd.MultiWorkerMirroredStrategy(devices=[f"cpu:{i}" for i in range(args.devices)],
                                              cluster_resolver=resolver)
    rank = strategy.cluster_resolver.task_id
    with strategy.scope():
        model = MLP(SIZES, seed=100 + rank, trainable=True)
        optimizer = gd.optimizers.SGD(0.5)
    train_step = model.make_train_step(optimizer, global_batch_size=GLOBAL_BATCH)

    @gd.function
    def step(x, labels):
        return strategy.reduce("SUM", strategy.run(train_step, args=(x, labels)), axis=None)

    data = digits()
    ids = np.arange(GLOBAL_BATCH * args.steps, dtype=np.int64)
    dataset = gd.data.Dataset.from_tensor_slices((data.x_train[ids], data.y_train[ids], ids)).batch(GLOBAL_BATCH)
    losses, seen = [], []
    for index, (x, labels, batch_ids) in enumerate(strategy.experimental_distribute_dataset(dataset)):
        last = rank == strategy.num_replicas_in_sync // args.devices - 1
        if index == args.die_at_step and last:
            os.kill(os.getpid(), signal.SIGKILL)
        if index == args.raise_at_step and last:
            for line in range(args.noise_lines):
                print(f"worker {rank} log line {line}", file=sys.stderr)
            raise ValueError(f"worker {rank} cannot read batch {index}")
        losses.append(float(step(x, labels)))
        seen.extend(int(i) for part in strategy.experimental_local_results(batch_ids) for i in np.asarray(part))
    out = Path(args.out)
    values = {f"var{i}": np.asarray(v.numpy()) for i, v in enumerate(model.trainable_variables)}
    np.savez(out / f"rank{rank}.npz", losses=np.array(losses), seen=np.array(seen, np.int64),
             iterations=np.asarray(optimizer.iterations.numpy()), addresses=_addresses(), **values)


def _addresses() -> str:
    """This host's IPv4 addresses (which namespace host a rank ran on, in tests/multihost)."""
    import subprocess

    listing = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=False)
    return " ".join(field.split("/")[0] for line in listing.stdout.splitlines() for field in line.split()[3:4])


if __name__ == "__main__":
    main()
