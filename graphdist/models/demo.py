"""``make demo``: the seeds' Keras example on real handwritten digits.

As the tf.distribute guide shows for Keras: create the model and its
optimizer inside ``strategy.scope()`` of ``gd.MirroredStrategy(["cpu:0",
"cpu:1"])`` (two logical CPU devices), ``compile``, then ``fit`` distributes
itself: every global batch of 64 is split 32 + 32 between the replicas, the
whole step (two replicas' forward and backward passes, each gradient summed
on the replica that updates it, the Adam updates spread over both devices,
the loss and accuracy sums) is one compiled plan.
Data: scikit-learn's bundled digits (1,797 8x8 images, 80/20 split).

Shows a progress bar per epoch (one line per epoch when the output is not a
terminal), evaluates on the test set, prints the train step's plan, saves the
model (``model.save``) and loads it back under ``OneDeviceStrategy`` to check
its predictions, and trains the same model on ``OneDeviceStrategy`` to check
that both strategies reach the same weights. Exits with status 1 if the test
accuracy is below 95% or a check fails::

    python -m graphdist.models.demo [--epochs 10] [--batch 64] [--devices cpu:0,cpu:1] [--save DIR] [--no-compare]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits

__all__ = ["main", "build_model", "TARGET_ACCURACY"]

logger = logging.getLogger(__name__)

TARGET_ACCURACY = 0.95
keras = gd.keras


def build_model(strategy: gd.Strategy, hidden: int = 128, learning_rate: float = 0.01, seed: int = 0) -> keras.Model:
    """The digits classifier (64 -> hidden ReLU -> 10 logits), created and compiled in ``strategy``'s scope."""
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Dense(hidden, activation="relu", input_shape=(64,)),
            keras.layers.Dense(10),
        ], name="digits")
        model.compile(optimizer=gd.optimizers.Adam(learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def _console():  # -> rich.console.Console
    from rich.console import Console

    return Console(soft_wrap=True, highlight=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns 0 on success, 1 when accuracy or a check fails."""
    parser = argparse.ArgumentParser(prog="python -m graphdist.models.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    parser.add_argument("--batch", type=int, default=64, help="global batch size (default 64)")
    parser.add_argument("--devices", default="cpu:0,cpu:1", help="MirroredStrategy devices (default cpu:0,cpu:1)")
    parser.add_argument("--save", default="build/demo/digits_model", help="where model.save writes the model")
    parser.add_argument("--no-compare", action="store_true", help="skip the OneDeviceStrategy comparison")
    args = parser.parse_args(argv)
    console = _console()
    data = digits()
    strategy = gd.MirroredStrategy(args.devices.split(","))
    console.print(f"[bold]graphdist {gd.__version__}[/bold]: digits with gd.keras on {strategy!r}")

    model = build_model(strategy)
    start = time.perf_counter()
    history = model.fit(data.x_train, data.y_train, batch_size=args.batch, epochs=args.epochs,
                        validation_data=(data.x_test, data.y_test))
    console.print(f"trained in {time.perf_counter() - start:.2f} s")
    loss, accuracy = model.evaluate(data.x_test, data.y_test, batch_size=args.batch)
    console.print(f"evaluate: test loss {loss:.4f}, test accuracy {accuracy:.4f}")

    console.rule("the train step's plan")
    console.print(model.train_plan().summary(), markup=False)

    console.rule("saved model")
    path = model.save(args.save)
    with gd.OneDeviceStrategy("cpu:0").scope():
        loaded = keras.load_model(path)
    saved_matches = np.allclose(loaded.predict(data.x_test), model.predict(data.x_test), rtol=1e-5, atol=1e-5)
    console.print(f"model.save -> {path}; reloaded under OneDeviceStrategy: predictions "
                  f"{'equal' if saved_matches else 'DIFFER'}")

    failures = []
    if not saved_matches:
        failures.append("the reloaded model predicts differently")
    if not args.no_compare:
        console.rule("same training on OneDeviceStrategy('cpu:0')")
        reference = build_model(gd.OneDeviceStrategy("cpu:0"))
        reference_history = reference.fit(data.x_train, data.y_train, batch_size=args.batch, epochs=args.epochs,
                                          verbose=0)
        drift = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))
        loss_drift = abs(history.history["loss"][-1] - reference_history.history["loss"][-1])
        console.print(f"max weight difference Mirrored vs OneDevice {drift:.2g}; last epoch loss difference "
                      f"{loss_drift:.2g}")
        if drift > 1e-3:
            failures.append("MirroredStrategy and OneDeviceStrategy trained different weights")
    console.rule("result")
    console.print(f"test accuracy {accuracy:.3f} (target {TARGET_ACCURACY})")
    if accuracy < TARGET_ACCURACY:
        failures.append(f"test accuracy {accuracy:.3f} is below {TARGET_ACCURACY}")
    if failures:
        print("FAIL: " + "; ".join(failures), file=sys.stderr)
        return 1
    same = "" if args.no_compare else "; Mirrored equals OneDevice"
    console.print(f"[green]OK[/green]: accuracy >= {TARGET_ACCURACY}; the saved model reloads{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
