"""``make demo``: train an MLP on real handwritten digits with graphdist.

Trains :class:`models.mlp.MLP` (64-128-10) on scikit-learn's bundled digits
(1,797 8x8 images, 80/20 train/test split) on ``gd.OneDeviceStrategy("cpu:0")``
with a custom training loop: every step is ``strategy.run(train_step, ...)``,
traced once into a graph (forward, autodiff backward, Adam update), compiled
by ONNX Runtime and executed. Prints a progress line per epoch, the traced
and rewritten graphs' op counts and the plan, checks the compiled forward pass
against plain numpy, saves a checkpoint, and exits with status 1 if the test
accuracy is below 95% or the results disagree with numpy::

    python -m models.demo [--epochs 10] [--batch 64] [--checkpoint build/demo/digits_mlp.npz]
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


def train(epochs: int = 10, batch: int = 64, hidden: int = 128, learning_rate: float = 0.01, seed: int = 0,
          log=print) -> tuple[MLP, gd.optimizers.Adam, gd.Strategy, float, list[float]]:
    """Trains the digits MLP; returns the model, optimizer, strategy, test accuracy and epoch losses."""
    data = digits(seed=seed)
    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = MLP((64, hidden, 10), seed=seed, trainable=True)
        optimizer = gd.optimizers.Adam(learning_rate)
    train_step = model.make_train_step(optimizer, global_batch_size=batch)
    losses = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        order = np.random.default_rng(seed + epoch).permutation(len(data.x_train))
        epoch_losses = []
        for lo in range(0, len(order) - batch + 1, batch):  # full batches: one compiled step
            idx = order[lo:lo + batch]
            epoch_losses.append(strategy.run(train_step, args=(data.x_train[idx], data.y_train[idx])))
        seconds = time.perf_counter() - start
        accuracy = model.accuracy(data.x_test, data.y_test, strategy)
        losses.append(float(np.mean(epoch_losses)))
        log(f"epoch {epoch:2d}/{epochs}  loss {losses[-1]:.4f}  test accuracy {accuracy:.3f}  "
            f"{len(epoch_losses) * batch / seconds:,.0f} samples/s")
    return model, optimizer, strategy, model.accuracy(data.x_test, data.y_test, strategy), losses


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns 0 on success, 1 when accuracy or the numpy check fails."""
    parser = argparse.ArgumentParser(prog="python -m models.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    parser.add_argument("--batch", type=int, default=64, help="global batch size (default 64)")
    parser.add_argument("--checkpoint", default="build/demo/digits_mlp.npz", help="where to save the checkpoint")
    args = parser.parse_args(argv)
    console = _console()
    console.print(f"[bold]graphdist {gd.__version__}[/bold]: training an MLP on scikit-learn's digits "
                  "with OneDeviceStrategy('cpu:0')")
    start = time.perf_counter()
    model, optimizer, strategy, accuracy, _ = train(args.epochs, args.batch, log=console.print)
    console.print(f"trained in {time.perf_counter() - start:.2f} s; traces {gd.stats.snapshot()['traces']}, "
                  f"compiles {gd.stats.snapshot()['compiles']}")

    step = model.make_train_step(optimizer, global_batch_size=args.batch)
    concrete = strategy._function_for(step).get_concrete_function(
        gd.TensorSpec((args.batch, 64), np.float32), gd.TensorSpec((args.batch,), np.int64))
    console.rule("train step")
    console.print(f"traced ({len(concrete.graph('traced').nodes)} nodes): {_op_counts(concrete.graph('traced'))}",
                  markup=False)
    console.print(f"rewritten ({len(concrete.graph('rewritten').nodes)} nodes): "
                  f"{_op_counts(concrete.graph('rewritten'))}", markup=False)
    console.print(concrete.plan.summary(), markup=False)

    data = digits()
    logits = strategy.run(model.forward, args=(data.x_test,))
    expected = model.reference_forward(data.x_test)
    path = gd.train.Checkpoint(model=model, optimizer=optimizer).save(args.checkpoint)
    console.rule("result")
    console.print(f"test accuracy {accuracy:.3f} (target {TARGET_ACCURACY}); checkpoint saved to {path}")
    try:
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    except AssertionError as err:
        print(f"MISMATCH: compiled forward differs from numpy:\n{err}", file=sys.stderr)
        return 1
    console.print(f"compiled forward pass matches numpy (max abs diff {np.abs(logits - expected).max():.2g})")
    if accuracy < TARGET_ACCURACY:
        print(f"FAIL: test accuracy {accuracy:.3f} is below {TARGET_ACCURACY}", file=sys.stderr)
        return 1
    console.print("[green]OK[/green]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
