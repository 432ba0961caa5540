"""A worker that all-reduces a small value every 50 ms for up to ``--steps`` steps, printing each step (for the
failure tests: a task is killed, or its link cut, while the others wait in a collective)."""

from __future__ import annotations

import argparse
import time

import numpy as np

import graphdist as gd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2000)
args = parser.parse_args()
strategy = gd.MultiWorkerMirroredStrategy()
for step in range(args.steps):
    total = strategy.reduce("SUM", np.ones(4, np.float32), axis=None)
    print(f"step {step}: {total[0]:.0f}", flush=True)
    time.sleep(0.05)
