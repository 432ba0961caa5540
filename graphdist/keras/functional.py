"""The functional form of ``gd.keras`` models: ``Input``, layers called on symbolic tensors, ``Model(inputs, outputs)``.

::

    inputs = gd.keras.Input(shape=(64,))
    hidden = gd.keras.layers.Dense(32, activation="relu")(inputs)
    skip = gd.keras.layers.Dense(32)(inputs)
    outputs = gd.keras.layers.Dense(10)(gd.keras.layers.Add()([hidden, skip]))
    model = gd.keras.Model(inputs=inputs, outputs=outputs)

Calling a layer on a :class:`KerasTensor` builds the layer (its weights are
created through the current strategy, as everywhere in ``gd.keras``), works
out the output shape by running the layer once, eagerly, on one example of
zeros, and records the call. :class:`Functional` replays the recorded calls
in order, traced inside the compiled steps like any other model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.errors import InvalidArgumentError

__all__ = ["KerasTensor", "Input", "Functional", "is_symbolic", "symbolic_call", "describe_graph", "replay_graph"]


class KerasTensor:
    """A symbolic batch: shape (batch ``None``), dtype, and the layer call that produces it.

    Attributes:
        shape: ``(None, ...)``.
        dtype: numpy dtype.
    """

    def __init__(self, shape: Sequence[int | None], dtype: Any, layer: Any = None, inputs: Any = None) -> None:
        self.shape = (None, *tuple(shape)[1:])
        self.dtype = np.dtype(dtype)
        self.layer = layer
        self.inputs = inputs

    def example(self) -> np.ndarray:
        """One example of zeros of this shape (for running layers eagerly)."""
        return np.zeros((1, *self.shape[1:]), self.dtype)

    def __repr__(self) -> str:
        source = f" from {self.layer.name}" if self.layer is not None else " (input)"
        return f"<KerasTensor shape={self.shape} dtype={self.dtype.name}{source}>"


def Input(shape: Sequence[int], dtype: Any = "float32", name: str | None = None) -> KerasTensor:  # noqa: N802
    """A symbolic input of one example's ``shape`` (the batch axis is added)."""
    if isinstance(shape, int):
        shape = (shape,)
    return KerasTensor((None, *tuple(int(d) for d in shape)), dtype)


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` (or a leaf of it) is a :class:`KerasTensor`."""
    return any(isinstance(leaf, KerasTensor) for leaf in nest.flatten(value, is_leaf=_is_keras_tensor)[0])


def _is_keras_tensor(value: Any) -> bool:
    return isinstance(value, KerasTensor)


def symbolic_call(layer: Any, inputs: Any) -> KerasTensor:
    """Records ``layer(inputs)``; builds the layer and infers the output from one eager example."""
    leaves, treedef = nest.flatten(inputs, is_leaf=_is_keras_tensor)
    if not all(isinstance(leaf, KerasTensor) for leaf in leaves):
        raise InvalidArgumentError(f"{layer.name}: mix of symbolic (gd.keras.Input) and concrete inputs; call the "
                                   "layer on KerasTensors only when building a functional model")
    example = nest.unflatten(treedef, [leaf.example() for leaf in leaves])
    with layer._build_scope():
        output = np.asarray(layer(example, training=False))
    return KerasTensor(output.shape, output.dtype, layer, inputs)


class Functional:
    """Ordering and replaying the recorded layer calls of a functional model
    (:class:`graphdist.keras.models.FunctionalModel`).
    """

    @staticmethod
    def plan(inputs: Any, outputs: Any) -> list[KerasTensor]:
        """The recorded calls from ``inputs`` to ``outputs``, in an order where inputs come first.

        Raises:
            InvalidArgumentError: ``outputs`` do not depend only on ``inputs``.
        """
        sources = {id(t) for t in nest.flatten(inputs, is_leaf=_is_keras_tensor)[0]}
        order: list[KerasTensor] = []
        seen: set[int] = set()

        def visit(tensor: Any) -> None:
            if not isinstance(tensor, KerasTensor):
                raise InvalidArgumentError(f"Model: outputs must be KerasTensors made from the inputs, got "
                                           f"{type(tensor).__name__}")
            if id(tensor) in seen or id(tensor) in sources:
                return
            if tensor.layer is None:
                raise InvalidArgumentError("Model: an output depends on a gd.keras.Input that is not in inputs; "
                                           "pass every Input the outputs use")
            for parent in nest.flatten(tensor.inputs, is_leaf=_is_keras_tensor)[0]:
                visit(parent)
            seen.add(id(tensor))
            order.append(tensor)

        for output in nest.flatten(outputs, is_leaf=_is_keras_tensor)[0]:
            visit(output)
        return order

    @staticmethod
    def run(inputs: Any, outputs: Any, order: list[KerasTensor], values: Any, training: bool) -> Any:
        """Replays ``order`` on concrete or traced ``values`` given for ``inputs``."""
        input_leaves = nest.flatten(inputs, is_leaf=_is_keras_tensor)[0]
        value_leaves = nest.flatten(values)[0] if len(input_leaves) > 1 else [values]
        if len(value_leaves) != len(input_leaves):
            raise InvalidArgumentError(f"the model takes {len(input_leaves)} inputs, got {len(value_leaves)}")
        computed = {id(t): v for t, v in zip(input_leaves, value_leaves)}
        for tensor in order:
            leaves, treedef = nest.flatten(tensor.inputs, is_leaf=_is_keras_tensor)
            arguments = nest.unflatten(treedef, [computed[id(leaf)] for leaf in leaves])
            computed[id(tensor)] = tensor.layer(arguments, training=training)
        leaves, treedef = nest.flatten(outputs, is_leaf=_is_keras_tensor)
        return nest.unflatten(treedef, [computed[id(leaf)] for leaf in leaves])


# ---------------------------------------------------------------- saving the graph as JSON data
def describe_graph(inputs: Any, outputs: Any, order: list[KerasTensor], layers: list[Any],
                   name: str) -> dict[str, Any]:
    """A functional model's graph as JSON data (see :func:`replay_graph`).

    Tensors are referred to as ``{"input": i}`` or ``{"node": n}`` (the ``n``-th
    recorded call); a call's inputs are one reference or a list of them.

    Raises:
        InvalidArgumentError: Inputs or outputs nested other than in a list or tuple.
    """
    input_leaves = nest.flatten(inputs, is_leaf=_is_keras_tensor)[0]
    where = {id(tensor): {"input": i} for i, tensor in enumerate(input_leaves)}
    layer_index = {id(layer): i for i, layer in enumerate(layers)}
    nodes = []
    for n, tensor in enumerate(order):
        nodes.append({"layer": layer_index[id(tensor.layer)], "inputs": _references(tensor.inputs, where)})
        where[id(tensor)] = {"node": n}
    return {"name": name,
            "inputs": [{"shape": list(tensor.shape[1:]), "dtype": tensor.dtype.name} for tensor in input_leaves],
            "inputs_are_a_list": isinstance(inputs, (list, tuple)),
            "layers": [{"class_name": type(layer).__name__, "config": layer.get_config()} for layer in layers],
            "nodes": nodes, "outputs": _references(outputs, where)}


def replay_graph(config: dict[str, Any], layers: list[Any]) -> tuple[Any, Any]:
    """``(inputs, outputs)`` KerasTensors rebuilt by calling ``layers`` as ``config``'s nodes say."""
    inputs = [Input(entry["shape"], entry["dtype"]) for entry in config["inputs"]]
    tensors: dict[tuple[str, int], KerasTensor] = {("input", i): tensor for i, tensor in enumerate(inputs)}
    for n, node in enumerate(config["nodes"]):
        tensors[("node", n)] = layers[node["layer"]](_resolve(node["inputs"], tensors))
    outputs = _resolve(config["outputs"], tensors)
    return (inputs if config["inputs_are_a_list"] else inputs[0]), outputs


def _references(value: Any, where: dict[int, dict[str, int]]) -> Any:
    if isinstance(value, KerasTensor):
        return where[id(value)]
    if isinstance(value, (list, tuple)):
        return [_references(item, where) for item in value]
    raise InvalidArgumentError(f"model.save: a functional model's tensors may be nested in lists or tuples only, "
                               f"got {type(value).__name__}")


def _resolve(reference: Any, tensors: dict[tuple[str, int], KerasTensor]) -> Any:
    if isinstance(reference, list):
        return [_resolve(item, tensors) for item in reference]
    ((kind, index),) = reference.items()
    return tensors[(kind, int(index))]
