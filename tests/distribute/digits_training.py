"""A small training loop the strategy tests share: graphdist's MLP on scikit-learn's digits, Adam, in a custom
loop whose global batches a strategy splits with ``experimental_distribute_dataset``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import graphdist as gd
from graphdist.models.datasets import digits
from graphdist.models.mlp import MLP

DATA = digits()


class DigitsTrainer:
    """``MLP(sizes)`` and Adam made in ``strategy``'s scope; ``step(i)`` trains on global batch ``i``.

    Args:
        strategy: The strategy to train under.
        sizes: The MLP's layer widths (64 inputs, 10 classes for the digits).
        batch: The global batch size.
        x, y: The examples (default: the digits' training split).
    """

    def __init__(self, strategy: gd.Strategy, sizes: Sequence[int] = (64, 32, 10), batch: int = 32,
                 x: np.ndarray | None = None, y: np.ndarray | None = None) -> None:
        self.strategy, self.batch_size = strategy, batch
        self.x = DATA.x_train if x is None else x
        self.y = DATA.y_train if y is None else y
        with strategy.scope():
            self.model = MLP(list(sizes), seed=0, trainable=True)
            self.optimizer = gd.optimizers.Adam(0.01)
        replica_step = self.model.make_train_step(self.optimizer, batch)

        @gd.function
        def train(x: object, labels: object) -> np.ndarray:
            return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

        self.train = train

    def batch(self, i: int) -> tuple:
        """Global batch ``i``, as the strategy's distributed dataset gives it."""
        rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
        dataset = gd.data.Dataset.from_tensors((self.x[rows], self.y[rows]))
        return next(iter(self.strategy.experimental_distribute_dataset(dataset)))

    def step(self, i: int) -> float:
        """One training step on global batch ``i``; the summed loss."""
        return float(self.train(*self.batch(i)))

    def state(self) -> list[np.ndarray]:
        """The weights and the optimizer's variables."""
        return [v.numpy() for v in (*self.model.trainable_variables, *self.optimizer.variables())]

    def rewritten(self) -> gd.Graph:
        """The rewritten graph of the training step."""
        return self.train.get_concrete_function(*self.batch(0)).graph("rewritten")


def assert_same_state(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-5,
                      atol: float = 1e-6) -> None:
    """Equal weights and optimizer state, to float tolerance."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def train_imported(strategy: gd.Strategy, onnx_model: object, x: np.ndarray, y: np.ndarray, batch: int = 16
                   ) -> tuple[list[float], list[np.ndarray], object]:
    """Adam steps of an imported ONNX model (``gd.onnx.load`` in ``strategy``'s scope) over ``x`` in global
    batches of ``batch``, softmax cross-entropy on its output.

    Returns:
        The losses, the weights followed by the optimizer's variables, and the step's concrete function.
    """
    with strategy.scope():
        model = gd.onnx.load(onnx_model)
        optimizer = gd.optimizers.Adam(0.01)

    def replica_step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        with gd.GradientTape() as tape:
            per_example = gd.nn.sparse_softmax_cross_entropy(yb, model(xb))
            loss = gd.nn.compute_average_loss(per_example, global_batch_size=batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @gd.function
    def step(xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

    losses = [float(step(x[i:i + batch], y[i:i + batch])) for i in range(0, len(x), batch)]
    values = [v.numpy() for v in model.trainable_variables] + [v.numpy() for v in optimizer.variables()]
    return losses, values, step.get_concrete_function(x[:batch], y[:batch])
