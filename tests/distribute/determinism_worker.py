"""One process of the op-determinism tests: trains a model and writes the digest of its losses and weights.

``--strategy one_device | mirrored2 | multi_worker`` (the last under mpiexec, ``--devices`` per worker);
``--deterministic 0|1``. Writes ``--out/rank<r>.npz`` with the losses, the weights and their digest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import graphdist as gd
from tests.distribute.determinism_common import MODELS, digest, train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--strategy", choices=("one_device", "mirrored2", "multi_worker"), required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--deterministic", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.deterministic:
        gd.config.experimental.enable_op_determinism()
    rank = 0
    if args.strategy == "one_device":
        strategy = gd.OneDeviceStrategy("cpu:0")
    elif args.strategy == "mirrored2":
        strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    else:
        strategy = gd.MultiWorkerMirroredStrategy(devices=[f"cpu:{i}" for i in range(args.devices)])
        rank = strategy.cluster_resolver.task_id
    losses, weights = train(strategy, args.model)
    np.savez(Path(args.out) / f"rank{rank}.npz", losses=np.array(losses), digest=np.array(digest(losses, weights)),
             **{f"var{i}": w for i, w in enumerate(weights)})


if __name__ == "__main__":
    main()
