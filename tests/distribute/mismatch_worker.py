"""A worker whose eager reduce has another shape on every task (collective mismatch detection)."""

from __future__ import annotations

import numpy as np

import graphdist as gd

strategy = gd.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
print(strategy.reduce("SUM", np.ones(2, np.float32), axis=None))  # agreed
strategy.reduce("SUM", np.ones(3 + rank, np.float32), axis=None)  # not
