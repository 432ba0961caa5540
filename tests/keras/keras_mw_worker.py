"""One worker of the multi-worker gd.keras test (run under mpiexec): fit/evaluate/predict under
MultiWorkerMirroredStrategy, results written to ``--out/rank<r>.npz``.

Each rank seeds its initial weights differently: equal results show that worker 0's values were
broadcast and that the workers agreed on the shuffling order. ``model.save`` writes
``--out/saved`` (the chief only).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = gd.MultiWorkerMirroredStrategy(devices=["cpu:0"])
    rank = strategy.cluster_resolver.task_id or 0
    gd.keras.utils.set_random_seed(rank)
    with strategy.scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(16, activation="relu", input_shape=(64,)),
                                     gd.keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.SGD(0.2), metrics=["accuracy"],
                      loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = digits()
    history = model.fit(data.x_train[:149], data.y_train[:149], batch_size=32, epochs=2, verbose=0,
                        sample_weight=np.linspace(0.5, 1.5, 149))  # each worker weighs its slice's examples
    loss, accuracy = model.evaluate(data.x_test[:70], data.y_test[:70], batch_size=32, verbose=0)
    predictions = model.predict(data.x_test[:70], batch_size=32)
    model.save(Path(args.out) / "saved")  # the chief writes it; its serving plan gathers across workers
    np.savez(Path(args.out) / f"rank{rank}.npz", *model.get_weights(), loss=np.array(history.history["loss"]),
             accuracy=np.array(history.history["accuracy"]), eval=np.array([loss, accuracy]),
             predictions=predictions)


if __name__ == "__main__":
    main()
