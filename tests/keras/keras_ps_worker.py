"""One worker of the ParameterServerStrategy gd.keras test (run under ``graphdist launch --ps``):
``fit`` on this worker's shard of the digits (asynchronous updates on the ps tasks), then
``evaluate`` and ``predict``; writes ``--out/worker<i>.npz``.
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
    strategy = gd.ParameterServerStrategy()
    gd.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(32, activation="relu", input_shape=(64,)),
                                     gd.keras.layers.Dense(10)])
        model.compile(optimizer=gd.optimizers.SGD(0.3), metrics=["accuracy"],
                      loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = digits()
    shard = gd.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).shard(
        strategy.num_workers, strategy.worker_index).batch(32)
    history = model.fit(shard, epochs=6, verbose=0)
    loss, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    predictions = model.predict(data.x_test)
    np.savez(Path(args.out) / f"worker{strategy.worker_index}.npz", loss=np.array(history.history["loss"]),
             eval=np.array([loss, accuracy]), predictions=predictions)


if __name__ == "__main__":
    main()
