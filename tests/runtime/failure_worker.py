"""One task of the process-failure tests (run by ``graphdist launch``; see test_process_failures.py).

Modes:

* ``mwm``: ``MultiWorkerMirroredStrategy``; every step all-reduces over the
  workers (``strategy.reduce`` of a ``strategy.run``), ``--steps`` times;
* ``ps``: ``ParameterServerStrategy``; every step (a ``gd.function``) pulls
  ``w`` from the ps and pushes ``w + 1``; at the end the chief prints ``w``;
* ``mismatch``: worker 1 sends the ps requests that do not fit what it holds
  (another shape, another dtype, an unknown name) and prints each refusal;
  worker 0 keeps training meanwhile and afterwards, then checks that ``w``
  counts exactly its own steps (the refused requests changed nothing).

Every task prints ``ready rank=R pid=P`` after its first step, and
``finished N steps`` at the end. ``--fail-before-strategy R``: rank ``R``
exits with status 3 before making its strategy (``--leave-before-strategy
R``: with status 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import graphdist as gd

STEP_SLEEP_S = 0.05


def main() -> int:
    """Runs the mode; returns the exit status."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("mwm", "ps", "mismatch"), required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-before-strategy", type=int, default=-1)
    parser.add_argument("--leave-before-strategy", type=int, default=-1)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rank = int(os.environ["PMI_RANK"])
    if rank == args.fail_before_strategy:
        print(f"rank {rank}: failing before its strategy", flush=True)
        return 3
    if rank == args.leave_before_strategy:
        print(f"rank {rank}: nothing to do", flush=True)
        return 0
    if args.mode == "mwm":
        return synchronous(rank, args.steps)
    return asynchronous(rank, args.steps, args.mode == "mismatch", Path(args.out))


def synchronous(rank: int, steps: int) -> int:
    """All-reduces once a step over every worker."""
    strategy = gd.MultiWorkerMirroredStrategy()
    for step in range(steps):
        total = strategy.reduce("SUM", strategy.run(lambda: np.float32(1.0)), axis=None)
        assert float(total) == strategy.num_replicas_in_sync
        if step == 0:
            print(f"ready rank={rank} pid={os.getpid()}", flush=True)
        time.sleep(STEP_SLEEP_S)
    print(f"finished {steps} steps", flush=True)
    return 0


def asynchronous(rank: int, steps: int, mismatch: bool, out: Path) -> int:
    """Pushes ``+1`` to ``w`` once a step; in mismatch mode, worker 1 sends refused requests instead."""
    strategy = gd.ParameterServerStrategy()
    if mismatch and strategy.worker_index == 1:
        return send_mismatches(strategy, out)
    with strategy.scope():
        w = gd.Variable(np.zeros(4, np.float32), name="w")

    @gd.function
    def step() -> object:
        return strategy.run(lambda: w.assign_add(np.ones(4, np.float32)))

    done = 0
    flag = out / "mismatches.done"
    while done < steps or (mismatch and not flag.exists() and done < 400):
        step()
        done += 1
        if done == 1:
            print(f"ready rank={rank} pid={os.getpid()}", flush=True)
        time.sleep(STEP_SLEEP_S)
    value = w.numpy()
    print(f"finished {done} steps; w = {value.tolist()}", flush=True)
    if mismatch and not np.array_equal(value, np.full(4, done, np.float32)):
        print(f"w should count this worker's {done} steps", flush=True)
        return 1
    return 0


def send_mismatches(strategy: gd.ParameterServerStrategy, out: Path) -> int:
    """Waits for worker 0's ``w``, then sends requests the ps refuses; prints each refusal."""
    from graphdist.runtime.ps_server import shared_client

    client = shared_client(strategy.cluster_resolver.cluster_spec())
    like = np.zeros(4, np.float32)
    for _ in range(400):  # worker 0 creates w
        try:
            client.request("pull", 0, "w", like)
            break
        except gd.InvalidArgumentError:
            time.sleep(0.02)
    print(f"ready rank={os.environ['PMI_RANK']} pid={os.getpid()}", flush=True)
    attempts = {
        "wider variable": lambda: _create_wider(strategy),
        "pull float64": lambda: client.request("pull", 0, "w", np.zeros(4, np.float64)),
        "push 2 wide": lambda: client.request("push", 0, "w", np.zeros(2, np.float32), np.ones(2, np.float32)),
        "unknown name": lambda: client.request("pull", 0, "no_such_variable", like),
    }
    for label, attempt in attempts.items():
        try:
            attempt()
            print(f"{label}: NOT REFUSED", flush=True)
        except gd.InvalidArgumentError as err:
            print(f"{label}: refused: {err}", flush=True)
    (out / "mismatches.done").touch()
    print("finished 0 steps", flush=True)
    return 0


def _create_wider(strategy: gd.ParameterServerStrategy) -> None:
    with strategy.scope():
        gd.Variable(np.zeros(8, np.float32), name="w")


if __name__ == "__main__":
    sys.exit(main())
