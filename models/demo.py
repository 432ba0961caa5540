"""``make demo``: trace, compile and run an MLP forward pass with graphdist.

The demo takes a batch of real 8x8 digit images (scikit-learn's bundled
``load_digits``, 64 features scaled to [0, 1]), and runs the forward pass of
:class:`models.mlp.MLP` on ``gd.OneDeviceStrategy("cpu:0")`` twice:

1. eagerly, ``strategy.run(model.forward, args=(x,))``;
2. inside a ``@gd.function`` step that calls ``strategy.run`` and
   ``strategy.reduce("MEAN", ..., axis=0)`` (mean logits per class).

It prints the traced graph and the compiled plan, checks both results against
the plain-numpy :meth:`~models.mlp.MLP.reference_forward` and exits with
status 1 if they differ::

    python -m models.demo [--batch 256] [--hidden 64]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

import graphdist as gd
from models.mlp import MLP

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["load_batch", "main"]

logger = logging.getLogger(__name__)

RTOL = 1e-5
ATOL = 1e-5


def load_batch(batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The first ``batch`` digits of scikit-learn's ``load_digits``.

    Args:
        batch: Number of images (at most 1,797).

    Returns:
        ``(x, y)``: float32 features of shape ``(batch, 64)`` in [0, 1] and
        int64 labels of shape ``(batch,)``.

    Raises:
        SystemExit: scikit-learn is not installed (it is the ``data`` extra).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("models.demo needs scikit-learn: pip install -e '.[data]'") from None
    digits = load_digits()
    features = digits.data.astype(np.float32)
    features /= features.max()
    return features[:batch], digits.target[:batch].astype(np.int64)


def _console() -> Console:
    """A rich console that never wraps long lines (plain text when piped)."""
    from rich.console import Console

    return Console(soft_wrap=True, highlight=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        0 when graphdist matches numpy, 1 otherwise.
    """
    parser = argparse.ArgumentParser(prog="python -m models.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="images per batch (default 256)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden layer width (default 64)")
    args = parser.parse_args(argv)

    console = _console()
    x, labels = load_batch(args.batch)
    model = MLP(sizes=(x.shape[1], args.hidden, args.hidden, 10), seed=0)
    strategy = gd.OneDeviceStrategy("cpu:0")
    console.print(f"[bold]graphdist {gd.__version__}[/bold]: {model!r} on {strategy!r}, "
                  f"digits batch {x.shape} (labels {np.bincount(labels, minlength=10).tolist()} per class)")

    # 1. strategy.run: traced once, compiled, executed.
    start = time.perf_counter()
    logits = strategy.run(model.forward, args=(x,))
    first = time.perf_counter() - start
    start = time.perf_counter()
    logits = strategy.run(model.forward, args=(x,))
    second = time.perf_counter() - start

    # 2. A gd.function step: run + reduce traced into one graph and one plan.
    @gd.function
    def step(x: np.ndarray) -> np.ndarray:
        per_replica = strategy.run(model.forward, args=(x,))
        return strategy.reduce("MEAN", per_replica, axis=0)

    concrete = step.get_concrete_function(x)
    mean_logits = step(x)

    console.rule("traced graph of step")
    console.print(concrete.graph("traced").summary(), markup=False)
    console.rule("plan")
    console.print(concrete.plan.summary(), markup=False)
    console.rule("result")
    console.print(f"strategy.run(model.forward): logits {logits.shape} {logits.dtype}; "
                  f"first call {first * 1e3:.1f} ms (trace + compile), second {second * 1e3:.2f} ms")
    console.print(f"step (mean logits per class): {np.array2string(mean_logits, precision=3)}", markup=False)

    expected = model.reference_forward(x)
    try:
        np.testing.assert_allclose(logits, expected, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(mean_logits, expected.mean(axis=0), rtol=RTOL, atol=ATOL)
    except AssertionError as err:
        print(f"MISMATCH: graphdist differs from numpy (rtol={RTOL}, atol={ATOL}):\n{err}", file=sys.stderr)
        return 1
    diff = max(float(np.abs(logits - expected).max()), float(np.abs(mean_logits - expected.mean(axis=0)).max()))
    console.print(f"[green]OK[/green]: graphdist matches numpy, max abs diff {diff:.3g} "
                  f"over {logits.size + mean_logits.size} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
