"""What the op-determinism tests train: the MLP, the ConvNet and the transformer block, 20 Adam steps.

Every configuration feeds global replica ``r`` of ``N`` the rows ``[r * B/N, (r + 1) * B/N)`` of each global
batch (``experimental_distribute_values_from_function``), in one process or several, so all of them see the
same global batches. :func:`train` returns the losses (``strategy.reduce("SUM")`` of the replicas' shares of
the global mean) and the final weights.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

import graphdist as gd
from graphdist.models.convnet import ConvNet
from graphdist.models.mlp import MLP
from graphdist.models.transformer import TransformerBlock

MODELS = ("mlp", "convnet", "transformer")
GLOBAL_BATCH = 32
STEPS = 20


def make_model(name: str) -> Any:
    """A fresh model (seed 0): make it inside the strategy's scope."""
    return {"mlp": lambda: MLP((64, 32, 10), seed=0, trainable=True),
            "convnet": lambda: ConvNet(seed=0),
            "transformer": lambda: TransformerBlock(seed=0)}[name]()


def data(name: str, steps: int = STEPS) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` global batches of inputs and labels."""
    n = GLOBAL_BATCH * steps
    if name == "mlp":
        rng = np.random.default_rng(0)
        return rng.standard_normal((n, 64)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)
    return {"convnet": ConvNet.example_data, "transformer": TransformerBlock.example_data}[name](n=n)


def train(strategy: gd.Strategy, name: str, steps: int = STEPS, accumulate_steps: int = 1,
          backend: str | None = None) -> tuple[list[float], list[np.ndarray]]:
    """``steps`` Adam steps of model ``name`` under ``strategy``: (losses, final weights)."""
    with strategy.scope():
        model = make_model(name)
        optimizer = gd.optimizers.Adam(1e-2)
    replica_step = model.make_train_step(optimizer, GLOBAL_BATCH)

    @gd.function(accumulate_steps=accumulate_steps, backend=backend)
    def step(x: Any, labels: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    x_all, y_all = data(name, steps)
    losses = []
    for index in range(steps):
        rows = slice(index * GLOBAL_BATCH, (index + 1) * GLOBAL_BATCH)
        x, labels = (per_replica(strategy, array[rows]) for array in (x_all, y_all))
        losses.append(float(step(x, labels)))
    return losses, [np.array(v.numpy()) for v in model.trainable_variables]


def per_replica(strategy: gd.Strategy, batch: np.ndarray) -> Any:
    """Global replica ``r``'s contiguous share of ``batch``."""
    def rows(context: gd.ValueContext) -> np.ndarray:
        size = len(batch) // context.num_replicas_in_sync
        return batch[context.replica_id_in_sync_group * size:(context.replica_id_in_sync_group + 1) * size]

    return strategy.experimental_distribute_values_from_function(rows)


def digest(losses: list[float], weights: list[np.ndarray]) -> str:
    """SHA-256 of the losses' and weights' bits."""
    sha = hashlib.sha256(np.asarray(losses, np.float64).tobytes())
    for array in weights:
        sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def max_difference(weights: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """The largest absolute difference between two sets of weights."""
    return max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(weights, expected))
