"""``make demo``: train an MLP on real handwritten digits with graphdist.

Trains :class:`models.mlp.MLP` (64-128-10) on scikit-learn's bundled digits
(1,797 8x8 images, 80/20 train/test split) with the custom training loop of
the tf.distribute guide, on ``gd.MirroredStrategy(["cpu:0", "cpu:1"])`` (two
logical CPU devices): the dataset is batched by the global batch size and
distributed with ``experimental_distribute_dataset``; each step is a
``@gd.function`` that calls ``strategy.run(train_step, ...)`` and
``strategy.reduce("SUM", ...)``, traced once into one graph (two replicas'
forward and backward passes, an all-reduce per gradient, the Adam update),
partitioned per device and run. The same training on
``gd.OneDeviceStrategy("cpu:0")`` runs too, for comparison.

Prints a progress line per epoch, the rewritten graph's collectives and the
plan, checks that both strategies reach the same weights and accuracy and that
the compiled forward pass equals plain numpy, saves a checkpoint, and exits
with status 1 if the test accuracy is below 95% or any check fails::

    python -m models.demo [--epochs 10] [--batch 64] [--devices cpu:0,cpu:1] [--checkpoint PATH]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

import graphdist as gd
from models.datasets import digits
from models.mlp import MLP

__all__ = ["main", "train"]

logger = logging.getLogger(__name__)

TARGET_ACCURACY = 0.95


def _console():  # -> rich.console.Console
    from rich.console import Console

    return Console(soft_wrap=True, highlight=False)


def _op_counts(graph: gd.Graph) -> str:
    counts = Counter(n.qualified_op for n in graph.nodes)
    return ", ".join(f"{op} x{n}" for op, n in counts.most_common())


def train(strategy: gd.Strategy, epochs: int = 10, batch: int = 64, hidden: int = 128, learning_rate: float = 0.01,
          seed: int = 0, log=print) -> tuple[MLP, gd.optimizers.Adam, gd.Function, float]:
    """Trains the digits MLP with the guide's custom loop; returns model, optimizer, step and test accuracy."""
    data = digits(seed=seed)
    with strategy.scope():
        model = MLP((64, hidden, 10), seed=seed, trainable=True)
        optimizer = gd.optimizers.Adam(learning_rate)
    train_step = model.make_train_step(optimizer, global_batch_size=batch)

    @gd.function
    def distributed_train_step(x, labels):
        per_replica_losses = strategy.run(train_step, args=(x, labels))
        return strategy.reduce(gd.ReduceOp.SUM, per_replica_losses, axis=None)

    dataset = gd.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        epoch_data = dataset.shuffle(len(data.x_train), seed=seed + epoch).batch(batch, drop_remainder=True)
        losses = [distributed_train_step(x, labels)
                  for x, labels in strategy.experimental_distribute_dataset(epoch_data)]
        seconds = time.perf_counter() - start
        accuracy = model.accuracy(data.x_test, data.y_test, gd.OneDeviceStrategy("cpu:0"))
        log(f"epoch {epoch:2d}/{epochs}  loss {np.mean(losses):.4f}  test accuracy {accuracy:.3f}  "
            f"{len(losses) * batch / seconds:,.0f} samples/s")
    return model, optimizer, distributed_train_step, model.accuracy(data.x_test, data.y_test,
                                                                    gd.OneDeviceStrategy("cpu:0"))


def _collective_rows(graph: gd.Graph) -> list[str]:
    lines = graph.summary().splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("#"))
    return lines[header:header + 2] + [line for line in lines[header + 2:] if "graphdist." in line]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns 0 on success, 1 when accuracy or a check fails."""
    parser = argparse.ArgumentParser(prog="python -m models.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    parser.add_argument("--batch", type=int, default=64, help="global batch size (default 64)")
    parser.add_argument("--devices", default="cpu:0,cpu:1", help="MirroredStrategy devices (default cpu:0,cpu:1)")
    parser.add_argument("--checkpoint", default="build/demo/digits_mlp.npz", help="where to save the checkpoint")
    args = parser.parse_args(argv)
    console = _console()
    strategy = gd.MirroredStrategy(args.devices.split(","))
    console.print(f"[bold]graphdist {gd.__version__}[/bold]: digits MLP, custom training loop on {strategy!r}")
    start = time.perf_counter()
    model, optimizer, step, accuracy = train(strategy, args.epochs, args.batch, log=console.print)
    console.print(f"trained in {time.perf_counter() - start:.2f} s")

    concrete = step.get_concrete_function(*_example_step_inputs(strategy, args.batch))
    rewritten = concrete.graph("rewritten")
    console.rule("rewritten train step: collectives")
    console.print(f"{len(rewritten.nodes)} nodes: {_op_counts(rewritten)}", markup=False)
    console.print("\n".join(_collective_rows(rewritten)), markup=False)
    console.rule("plan")
    console.print(concrete.plan.summary(), markup=False)

    console.rule("same training on OneDeviceStrategy('cpu:0')")
    reference, _, _, reference_accuracy = train(gd.OneDeviceStrategy("cpu:0"), args.epochs, args.batch,
                                                log=lambda *_: None)
    drift = max(float(np.abs(a.numpy() - b.numpy()).max())
                for a, b in zip(model.trainable_variables, reference.trainable_variables))
    console.print(f"OneDevice test accuracy {reference_accuracy:.3f}; Mirrored {accuracy:.3f}; "
                  f"max weight difference {drift:.2g}")

    data = digits()
    logits = gd.OneDeviceStrategy("cpu:0").run(model.forward, args=(data.x_test,))
    expected = model.reference_forward(data.x_test)
    path = gd.train.Checkpoint(model=model, optimizer=optimizer).save(args.checkpoint)
    console.rule("result")
    console.print(f"test accuracy {accuracy:.3f} (target {TARGET_ACCURACY}); checkpoint saved to {path}")
    failures = []
    if not np.allclose(logits, expected, rtol=1e-4, atol=1e-4):
        failures.append("the compiled forward pass differs from numpy")
    if drift > 1e-3 or abs(accuracy - reference_accuracy) > 0.01:
        failures.append("MirroredStrategy and OneDeviceStrategy trained different weights")
    if accuracy < TARGET_ACCURACY:
        failures.append(f"test accuracy {accuracy:.3f} is below {TARGET_ACCURACY}")
    if failures:
        print("FAIL: " + "; ".join(failures), file=sys.stderr)
        return 1
    console.print("[green]OK[/green]: compiled forward pass equals numpy; Mirrored equals OneDevice")
    return 0


def _example_step_inputs(strategy: gd.Strategy, batch: int) -> tuple:
    data = digits()
    dataset = gd.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).batch(batch, drop_remainder=True)
    return next(iter(strategy.experimental_distribute_dataset(dataset)))


if __name__ == "__main__":
    sys.exit(main())
