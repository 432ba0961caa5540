"""Splitting a global batch among replicas (the seeds' rule for partial batches)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["split_global_batch"]


def split_global_batch(leaves: list[Any], full: int, total: int, replicas: Any) -> list[list[Any]]:
    """Slices one global batch for ``replicas`` (indices among ``total`` replicas in sync).

    ``leaves`` share their first dimension, the batch; ``full`` is the size of
    a full global batch. Each replica gets ``ceil(full / total)`` rows, filled
    in replica order, so a partial batch goes to the first replicas and the
    replicas past its end get empty slices (see the module docstring).

    Returns:
        One list of slices (one per leaf) per replica in ``replicas``.
    """
    batch = int(np.shape(leaves[0])[0]) if leaves else 0
    per_replica = -(-full // total)
    parts = []
    for replica in replicas:
        start = min(replica * per_replica, batch)
        stop = min(start + per_replica, batch)
        parts.append([leaf[start:stop] for leaf in leaves])
    return parts
