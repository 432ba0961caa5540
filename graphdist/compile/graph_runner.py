"""Running a graph by itself (an imported ONNX model) on numpy arrays.

:class:`GraphRunner` compiles the graph as a ``gd.function`` that inlines it
at the graph's own opset (no conversion), so every op keeps the form the
model was written in. Inputs that decide shapes (a Reshape's ``shape`` fed as
a graph input, see :mod:`graphdist.ir.value_operands`) are bound as
constants: like Python values in a ``tf.function`` signature, the same value
reuses the compiled function and a new value compiles another. Given an ONNX
model, the binding happens before import, so ONNX's inference and
graphdist's shape rules both see the values. The other inputs are ordinary
arguments (one compiled function per shape and dtype, as for any
``gd.function``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import numpy as np
import onnx

from graphdist.compile.function import Function
from graphdist.compile.target import CompileTarget
from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import Graph
from graphdist.ir.onnx_io import from_onnx
from graphdist.ir.onnx_schema_ops import type_of
from graphdist.ir.value_operands import bind_model_inputs, static_input_names, static_inputs
from graphdist.trace.inline import inline_graph

__all__ = ["GraphRunner", "MAX_STATIC_VARIANTS"]

logger = logging.getLogger(__name__)

#: Compiled functions kept per runner for distinct values of shape-deciding inputs (least recently used go).
MAX_STATIC_VARIANTS = 64


class GraphRunner:
    """Calls a graph or ONNX model on numpy arrays: ``runner(*arrays) -> [outputs]``.

    Args:
        model: A :class:`~graphdist.ir.Graph` or an ``onnx.ModelProto``.
        backend: Backend of the compiled functions (default: graphdist's default, ``ort``).
        strategy: Strategy whose devices run it (default: the default strategy).

    Attributes:
        input_names: The inputs, in call order.
        static: Positions of the inputs bound as constants (values that decide shapes).

    Raises:
        GraphError: The model cannot be imported (see :func:`graphdist.ir.from_onnx`).
    """

    def __init__(self, model: Graph | onnx.ModelProto, *, backend: str | None = None,
                 strategy: CompileTarget | None = None) -> None:
        self.backend = backend
        self.strategy = strategy
        self._model: onnx.ModelProto | None = None
        self._graph: Graph | None = None
        if isinstance(model, Graph):
            self._graph = model
            self.input_names = [v.name for v in model.inputs]
            self.static = static_inputs(model)
        else:
            self._model = model
            initializers = {t.name for t in model.graph.initializer}
            self.input_names = [vi.name for vi in model.graph.input if vi.name not in initializers]
            for vi in model.graph.input:  # before any import: a sequence input is refused up front
                type_of(vi.type, f"graph input {vi.name!r}", lambda axis: "")
            static = set(static_input_names(model))
            self.static = [i for i, name in enumerate(self.input_names) if name in static]
            if not self.static:
                self._graph = from_onnx(model)
        self.name = self._graph.name if self._graph is not None else (model.graph.name or "model")
        self._functions: OrderedDict[tuple, Function] = OrderedDict()

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        """Runs the graph; returns its outputs in order (numpy arrays)."""
        if len(arrays) != len(self.input_names):
            raise InvalidArgumentError(f"graph {self.name!r} takes {len(self.input_names)} input(s) "
                                       f"({', '.join(self.input_names)}); got {len(arrays)}")
        arrays = [np.asarray(a) for a in arrays]
        constants = {i: arrays[i] for i in self.static}
        fn = self._function(constants)
        result = fn(*[a for i, a in enumerate(arrays) if i not in constants])
        return list(result) if isinstance(result, tuple) else [result]

    def _function(self, constants: dict[int, np.ndarray]) -> Function:
        key = tuple((i, a.dtype.str, a.shape, a.tobytes()) for i, a in sorted(constants.items()))
        fn = self._functions.get(key)
        if fn is None:
            fn = Function(self._traced(constants), backend=self.backend, strategy=self.strategy, name=self.name)
            self._functions[key] = fn
            if len(self._functions) > MAX_STATIC_VARIANTS:
                self._functions.popitem(last=False)
                logger.warning("graph %s: more than %d distinct values of its shape inputs (%s); the oldest "
                               "compiled function is dropped", self.name, MAX_STATIC_VARIANTS,
                               ", ".join(self.input_names[i] for i in self.static))
        self._functions.move_to_end(key)
        return fn

    def _specialized(self, constants: dict[int, np.ndarray]) -> tuple[Graph, bool]:
        """The graph to inline, and whether ``constants`` are still its inputs (else they are bound)."""
        if self._graph is not None:
            return self._graph, True
        values = {self.input_names[i]: a for i, a in constants.items()}
        return from_onnx(bind_model_inputs(self._model, values)), False

    def _traced(self, constants: dict[int, np.ndarray]) -> Any:
        graph, constants_are_inputs = self._specialized(constants)

        def run_graph(*dynamic: Any) -> Any:
            args: list[Any] = list(dynamic)
            if constants_are_inputs:
                for index in sorted(constants):
                    args.insert(index, constants[index])
            return tuple(inline_graph(graph, args, own_opset=True))

        run_graph.__name__ = "".join(c if c.isalnum() else "_" for c in self.name) or "graph"
        return run_graph
