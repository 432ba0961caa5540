"""Running a graph by itself (an imported ONNX model) on numpy arrays.

:class:`GraphRunner` compiles the graph as a ``gd.function`` that inlines it
at the graph's own opset (no conversion), so every op keeps the form the
model was written in. Inputs that decide shapes (a Reshape's ``shape`` fed as
a graph input, see :func:`graphdist.ir.value_operands.static_inputs`) are
bound as constants: like Python values in a ``tf.function`` signature, the
same value reuses the compiled function and a new value compiles another.
The other inputs are ordinary arguments (one compiled function per shape and
dtype, as for any ``gd.function``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import numpy as np

from graphdist.compile.function import Function
from graphdist.errors import InvalidArgumentError
from graphdist.ir.graph import Graph
from graphdist.ir.value_operands import static_inputs
from graphdist.trace.inline import inline_graph

__all__ = ["GraphRunner", "MAX_STATIC_VARIANTS"]

logger = logging.getLogger(__name__)

#: Compiled functions kept per runner for distinct values of shape-deciding inputs (least recently used go).
MAX_STATIC_VARIANTS = 64


class GraphRunner:
    """Calls ``graph`` on numpy arrays: ``runner(*arrays) -> [outputs]``.

    Args:
        graph: The graph (e.g. ``gd.ir.from_onnx(path)``).
        backend: Backend of the compiled functions (default: graphdist's default, ``ort``).
        strategy: Strategy whose devices run it (default: the default strategy).

    Attributes:
        static: Positions of the inputs bound as constants (values that decide shapes).
    """

    def __init__(self, graph: Graph, *, backend: str | None = None, strategy: Any = None) -> None:
        self.graph = graph
        self.backend = backend
        self.strategy = strategy
        self.static = static_inputs(graph)
        self._functions: OrderedDict[tuple, Function] = OrderedDict()

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        """Runs the graph; returns its outputs in order (numpy arrays)."""
        if len(arrays) != len(self.graph.inputs):
            names = ", ".join(v.name for v in self.graph.inputs)
            raise InvalidArgumentError(f"graph {self.graph.name!r} takes {len(self.graph.inputs)} input(s) "
                                       f"({names}); got {len(arrays)}")
        arrays = [np.asarray(a) for a in arrays]
        constants = {i: arrays[i] for i in self.static}
        fn = self._function(constants)
        result = fn(*[a for i, a in enumerate(arrays) if i not in constants])
        return list(result) if isinstance(result, tuple) else [result]

    def _function(self, constants: dict[int, np.ndarray]) -> Function:
        key = tuple((i, a.dtype.str, a.shape, a.tobytes()) for i, a in sorted(constants.items()))
        fn = self._functions.get(key)
        if fn is None:
            fn = Function(self._traced(constants), backend=self.backend, strategy=self.strategy,
                          name=self.graph.name)
            self._functions[key] = fn
            if len(self._functions) > MAX_STATIC_VARIANTS:
                self._functions.popitem(last=False)
                logger.warning("graph %s: more than %d distinct values of its shape inputs (%s); the oldest "
                               "compiled function is dropped", self.graph.name, MAX_STATIC_VARIANTS,
                               ", ".join(self.graph.inputs[i].name for i in self.static))
        self._functions.move_to_end(key)
        return fn

    def _traced(self, constants: dict[int, np.ndarray]) -> Any:
        graph = self.graph

        def run_graph(*dynamic: Any) -> Any:
            args: list[Any] = list(dynamic)
            for index in sorted(constants):
                args.insert(index, constants[index])
            outputs = inline_graph(graph, args, own_opset=True)
            return tuple(outputs)

        run_graph.__name__ = "".join(c if c.isalnum() else "_" for c in graph.name) or "graph"
        return run_graph
