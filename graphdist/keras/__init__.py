"""``gd.keras``: Keras-style models trained under any strategy.

Create the model (and optimizer) inside ``strategy.scope()``; ``fit``,
``evaluate`` and ``predict`` then distribute themselves::

    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(1, input_shape=(1,))])
    model.compile(loss="mse", optimizer="sgd")
    dataset = gd.data.Dataset.from_tensors((np.ones(1), np.ones(1))).repeat(100).batch(10)
    model.fit(dataset, epochs=2)
    model.evaluate(dataset)
"""

from graphdist import optimizers
from graphdist.keras import activations, backend, callbacks, initializers, layers, losses, metrics, models, utils
from graphdist.keras.callbacks import History
from graphdist.keras.functional import Input
from graphdist.keras.models import Model, Sequential
from graphdist.keras.saving import load_model
from graphdist.keras.training import NotCompiledError

__all__ = [
    "Model",
    "Sequential",
    "Input",
    "History",
    "NotCompiledError",
    "load_model",
    "layers",
    "models",
    "losses",
    "metrics",
    "callbacks",
    "optimizers",
    "activations",
    "initializers",
    "backend",
    "utils",
]
