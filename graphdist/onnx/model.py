"""``gd.onnx.load``: an ONNX model as trainable, distributable graphdist code.

::

    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.onnx.load("model.onnx")          # float initializers -> MirroredVariables
    probs = model(x)                                 # eager: numpy in, numpy out

    @gd.function
    def train_step(x, labels):
        def replica_step(x, labels):
            with gd.GradientTape() as tape:
                logits = model(x)                    # traced: the ONNX graph is inlined
                loss = gd.nn.compute_average_loss(gd.nn.sparse_softmax_cross_entropy(labels, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica_step, args=(x, labels))

    model.save("trained.onnx")                       # onnxruntime.InferenceSession runs it

The model is imported at its own opset (:func:`graphdist.ir.from_onnx`) with
its variables as graph inputs (:mod:`graphdist.onnx.prepare`); calling it in
a trace inlines that graph (:func:`graphdist.trace.inline.inline_graph`) with
the variables' traced reads, so it is replicated, differentiated and compiled
like any numpy step. Eager calls run a ``gd.function`` of that call, one
compiled specialisation per input shape, reading the variables' current
values on every call.

``training=True`` runs the model's training form: ``Dropout`` drops (random,
so replicas and runs differ). ``BatchNormalization`` keeps its running
statistics frozen by default (``load(..., batch_norm="frozen")``); with
``batch_norm="update"`` it normalises with the batch's statistics and moves
its running mean and variance (when they are variables): in a multi-replica
step by the mean over the replicas of each replica's new value, as
``gd.keras.layers.BatchNormalization(synchronized=False)``.
Models older than opset 15 (BatchNormalization) or 12 (Dropout) are
converted up with ONNX's version converter for it.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from graphdist.compile.function import Function
from graphdist.compile.gc_pause import paused_gc
from graphdist.distribute.replica_context import get_replica_context
from graphdist.distribute.strategy import get_strategy
from graphdist.errors import GraphError, InvalidArgumentError, TracingError
from graphdist.ir.batch import BatchDim
from graphdist.ir.graph import Graph
from graphdist.ir.onnx_checks import tensor_array
from graphdist.ir.onnx_io import from_onnx
from graphdist.ir.onnx_schema_ops import UNKNOWN_RANK
from graphdist.ir.value_operands import CONTROL_OPERANDS, bind_model_inputs, static_input_names, with_input_shapes
from graphdist.onnx.files import read_model, write_model
from graphdist.onnx.prepare import (
    BATCH_NORM_MODES,
    clean_model,
    running_statistics,
    training_model,
    variable_initializers,
    with_variables_as_inputs,
)
from graphdist.onnx.prepare import promote_constants as promote
from graphdist.trace.inline import inline_graph
from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import current_trace
from graphdist.trace.variables import Variable, read_variable

__all__ = ["load", "OnnxModel"]

logger = logging.getLogger(__name__)

#: Imported graphs kept per model for distinct values of shape-deciding inputs (least recently used go).
MAX_SPECIALISATIONS = 16


def load(model: onnx.ModelProto | bytes | str | os.PathLike[str], trainable: bool = True,
         frozen: Sequence[str] | None = None, *, base_dir: str | os.PathLike[str] | None = None,
         promote_constants: bool = True, batch_norm: str = "frozen") -> OnnxModel:
    """Loads an ONNX model (a path, an ``onnx.ModelProto`` or its bytes; any opset ONNX Runtime runs).

    Made inside a strategy's scope, the model's floating-point initializers
    become ``gd.Variable`` s of that strategy, named by their initializer
    names (those that decide shapes, such as a ``Resize``'s ``scales``, stay
    constants).

    Exporters that write weights as ``Constant`` nodes (Paddle2ONNX) get
    them as variables too: with ``trainable=True``, a floating-point
    ``Constant`` that feeds a weight input (Conv/ConvTranspose ``W``/``B``,
    Gemm ``B``/``C``, either MatMul operand, the bias ``Add`` ed to one of
    those, BatchNormalization/LayerNormalization/InstanceNormalization
    ``scale``/``bias``) becomes an initializer and so a trainable variable,
    named by the Constant's output; BatchNormalization's running mean and
    variance become frozen (non-trainable) variables, as Keras'
    ``moving_mean``/``moving_variance``. :attr:`OnnxModel.promoted_constants`
    lists them (and the load logs how many).

    Args:
        model: Path of an ``.onnx`` file (external data is read from next to
            it), a ``ModelProto`` (copied; never changed) or its serialized bytes.
        trainable: ``False``: every initializer stays a constant (no variables).
        frozen: Initializer names that become non-trainable variables (not in
            ``trainable_variables``; still saved, and moved by training-mode
            BatchNormalization when they are its running statistics).
        base_dir: For a ``ModelProto`` or bytes whose tensors are stored as
            external data: the directory holding those files (a path's
            external data is always read from the file's own directory, and
            never from the current directory).
        promote_constants: ``False``: ``Constant`` nodes stay constants
            (only initializers become variables).
        batch_norm: What ``model(x, training=True)`` does to
            BatchNormalization. ``"frozen"`` (default): it keeps the
            inference form, normalising with the running statistics, which
            do not move (fine-tuning practice, and what keeps a multi-replica
            step equal to one device on the global batch); ``"update"``: it
            normalises with the batch's statistics and moves the running
            ones as Keras' ``fit`` does (in a multi-replica step by the mean
            of the replicas' new values).

    Returns:
        An :class:`OnnxModel`.

    Raises:
        GraphError: The file is missing, truncated or not ONNX, its external
            data is missing or has no directory to be read from, a value is
            defined twice, a tensor's data does not match its dims, or the
            model uses an op or value graphdist and ONNX Runtime cannot run
            (the message names it).
        InvalidArgumentError: ``frozen`` names an unknown initializer, or is
            given with ``trainable=False``; ``batch_norm`` is not
            ``"frozen"`` or ``"update"``.
    """
    if batch_norm not in BATCH_NORM_MODES:
        raise InvalidArgumentError(f"gd.onnx.load: batch_norm must be one of {', '.join(map(repr, BATCH_NORM_MODES))}"
                                   f", got {batch_norm!r}")
    with paused_gc():  # importing a large model makes millions of objects and frees none (see gc_pause)
        proto, source = read_model(model, base_dir=base_dir)
        return OnnxModel(proto, source=source, trainable=trainable, frozen=frozen,
                         promote_constants=promote_constants, batch_norm=batch_norm)


class OnnxModel:
    """An imported ONNX model: call it eagerly or in traced code; train its variables; save it.

    Create it with :func:`load`.

    Attributes:
        name: The model's graph name (else the file's stem).
        input_names: The inputs a call takes, in order (initializers excluded).
        output_names: The outputs, in order.
        promoted_constants: Names of the ``Constant`` nodes made variables
            (see :func:`load`), weights first, then running statistics.
    """

    def __init__(self, proto: onnx.ModelProto, *, source: str | None = None, trainable: bool = True,
                 frozen: Sequence[str] | None = None, promote_constants: bool = True,
                 batch_norm: str = "frozen") -> None:
        self._source = source
        stem = os.path.splitext(os.path.basename(source))[0] if source else ""
        self.name = proto.graph.name or stem or "onnx_model"
        promotion = promote(proto) if trainable and promote_constants else None
        self.promoted_constants = promotion.names if promotion is not None else []
        if promotion is not None and promotion.names:
            proto = promotion.model  # saved with the promoted weights as initializers
            logger.info("%s: promoted %d Constant node(s) to variables (%d weights, %d running statistics)",
                        self._what(), len(promotion.names), len(promotion.weights), len(promotion.statistics))
        self._proto = proto
        self._batch_norm = batch_norm
        self._clean = clean_model(proto)
        initializers = {t.name for t in proto.graph.initializer}
        self.input_names = [vi.name for vi in proto.graph.input if vi.name not in initializers]
        self.output_names = [vi.name for vi in proto.graph.output]
        frozen_names = self._check_frozen(frozen, trainable)
        names = variable_initializers(self._clean) if trainable else []
        unknown = sorted(set(frozen_names) - set(names))
        if unknown:
            raise InvalidArgumentError(
                f"gd.onnx.load: frozen names {unknown}, which are not floating-point initializers of "
                f"{self._what()} (they are: {_some(names)})")
        self._strategy = get_strategy()
        wanted = set(names)
        arrays = {t.name: tensor_array(t, self._what()) for t in self._clean.graph.initializer if t.name in wanted}
        statistics = running_statistics(self._clean)  # Keras' moving_mean/moving_variance: never trained
        self._variables = [Variable(arrays[n], name=n, trainable=n not in frozen_names and n not in statistics)
                           for n in names]
        self._variable_names = list(names)
        self._import = with_variables_as_inputs(self._clean, names)
        static = set(static_input_names(self._import)) & set(self.input_names)
        self._static = [i for i, name in enumerate(self.input_names) if name in static]
        # Integer and boolean scalars deciding an If or a Loop (a sample rate, a trip count): eager calls
        # specialise on their values (in a trace a numpy value is a constant, on which inline_graph inlines the
        # taken branch or unrolls the loop); a traced value keeps the node. Data tensors are never specialised.
        control = set(static_input_names(self._import, CONTROL_OPERANDS)) & set(self.input_names) - static
        self._control = [i for i, name in enumerate(self.input_names) if name in control and _is_flag(proto, name)]
        self._graphs: OrderedDict[tuple, tuple[Graph, list[str]]] = OrderedDict()
        self._functions: OrderedDict[tuple, Function] = OrderedDict()
        self._plain_graph: Graph | None = None
        #: Why the model is imported per call's input shapes (a value of unknown rank at load), else None.
        self._deferred: str | None = None
        if not self._static:
            try:
                self._graph_for(False, {})  # import now: an op graphdist cannot run fails at load, naming it
            except GraphError as err:
                if UNKNOWN_RANK not in str(err):
                    raise
                self._deferred = str(err)
                logger.info("%s is imported at its first call, with that call's input shapes: %s", self._what(), err)
        logger.info("loaded %s: %d input(s), %d output(s), %d variable(s) (%d trainable)", self._what(),
                    len(self.input_names), len(self.output_names), len(self._variables),
                    len(self.trainable_variables))

    # ---------------------------------------------------------------- structure
    @property
    def variables(self) -> list[Variable]:
        """The variables made from the model's initializers, in initializer order."""
        return list(self._variables)

    @property
    def trainable_variables(self) -> list[Variable]:
        """The variables that are not frozen."""
        return [v for v in self._variables if v.trainable]

    @property
    def graph(self) -> Graph:
        """The model as a ``gd.Graph``, its initializers constants holding the values it was loaded with."""
        if self._plain_graph is None:
            self._plain_graph = self._imported(self._clean)
        return self._plain_graph

    @property
    def distribute_strategy(self) -> Any:
        """The strategy that was current at load (its variables belong to it; eager calls run under it)."""
        return self._strategy

    def _what(self) -> str:
        return f"ONNX file {self._source!r}" if self._source else f"ONNX model {self.name!r}"

    @staticmethod
    def _check_frozen(frozen: Sequence[str] | None, trainable: bool) -> list[str]:
        if frozen is None:
            return []
        if isinstance(frozen, str) or not all(isinstance(n, str) for n in frozen):
            raise InvalidArgumentError(f"gd.onnx.load: frozen must be a list of initializer names, got {frozen!r}")
        if frozen and not trainable:
            raise InvalidArgumentError("gd.onnx.load: frozen names variables to keep, but trainable=False makes "
                                       "every initializer a constant; give one or the other")
        return list(frozen)

    # ------------------------------------------------------------------- import
    def _imported(self, model: onnx.ModelProto) -> Graph:
        try:
            graph = from_onnx(model)
        except GraphError as err:
            raise GraphError(f"cannot load {self._what()}: {err}") from None
        graph.name = self.name
        return graph

    def _graph_for(self, training: bool, static: dict[str, np.ndarray],
                   shapes: dict[str, tuple] | None = None) -> tuple[Graph, list[str]]:
        """The graph to inline (variables as its last inputs) and the variables its extra outputs update.

        ``shapes``: the call's input shapes, for a model imported per call (:attr:`_deferred`).
        """
        key = (training, tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(static.items())),
               tuple(sorted((shapes or {}).items())))
        entry = self._graphs.get(key)
        if entry is None:
            model, updates = self._import, []
            if shapes:
                model = with_input_shapes(model, shapes)
            if training:
                form = training_model(model, self._variable_names, self._batch_norm)
                if form is not None:
                    model, updates = form.model, [variable for _, variable in form.updates]
            if static:
                model = bind_model_inputs(model, static)
            entry = self._graphs[key] = (self._imported(model), updates)
            if len(self._graphs) > MAX_SPECIALISATIONS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        return entry

    # --------------------------------------------------------------------- call
    def __call__(self, *args: Any, training: bool = False, **kwargs: Any) -> Any:
        """Runs the model: numpy in and out eagerly, traced tensors in and out inside a trace.

        Args:
            *args: One value per input, in :attr:`input_names` order.
            training: Run the training form (Dropout drops; BatchNormalization
                as :func:`load`'s ``batch_norm`` says: frozen by default).
            **kwargs: Inputs by name (instead of, or after, positional ones).

        Returns:
            The output (one output), or a tuple in :attr:`output_names` order.

        Raises:
            InvalidArgumentError: Missing, repeated or unknown inputs.
            TracingError: A dtype, rank or static dimension mismatch, or a
                traced value for an input that decides shapes.
        """
        values = self._arguments(args, kwargs)
        if current_trace() is not None:
            return self._traced(values, bool(training), own_opset=False)
        return self._eager(values, bool(training))

    def _arguments(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        names = self.input_names
        if len(args) > len(names):
            raise InvalidArgumentError(f"{self._what()} takes {len(names)} input(s) ({', '.join(names)}); got "
                                       f"{len(args)} positional arguments")
        values: dict[str, Any] = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise InvalidArgumentError(f"{self._what()} has no input {name!r}; its inputs are "
                                           f"{', '.join(names)}")
            if name in values:
                raise InvalidArgumentError(f"{self._what()}: input {name!r} given twice (by position and name)")
            values[name] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise InvalidArgumentError(f"{self._what()}: missing input(s) {', '.join(missing)}; it takes "
                                       f"{', '.join(names)}")
        return [values[n] for n in names]

    def _static_values(self, values: Sequence[Any]) -> dict[str, np.ndarray]:
        """The values of the inputs that decide shapes or control flow; traced ones are specialised on the
        value the call being traced passes (``gd.function`` then keys its cache on that value).
        """
        static = {}
        for index in self._static:
            value = values[index]
            if isinstance(value, Tensor):
                known = value.tracer.specialise(value.value)
                if known is None:
                    raise TracingError(
                        f"{self._what()}: input {self.input_names[index]!r} decides output shapes or control "
                        f"flow, so its value must be known when tracing, and here it is computed by the step "
                        f"(or given as a gd.TensorSpec); pass it to the gd.function as a numpy array (the step "
                        f"is then compiled for that value) or compute it with numpy outside the step")
                value = known
            static[self.input_names[index]] = np.asarray(value)
        return static

    def _traced(self, values: Sequence[Any], training: bool, own_opset: bool) -> Any:
        static = self._static_values(values)
        values = self._known_control_values(values)
        data = [v for i, v in enumerate(values) if i not in self._static]
        graph, updates = self._graph_for(training, static, self._call_shapes(values) if self._deferred else None)
        reads = [read_variable(v) for v in self._variables]
        outputs = inline_graph(graph, [*data, *reads], batch_axis=0, own_opset=own_opset)
        count = len(self.output_names)
        if updates:
            self._move_statistics(outputs[count:], updates)
        outputs = outputs[:count]
        return outputs[0] if count == 1 else tuple(outputs)

    def _known_control_values(self, values: Sequence[Any]) -> list[Any]:
        """``values`` with each traced flag that decides an If or a Loop replaced by its value when the call being
        traced passed it as a plain numpy array (the same for every replica): the taken branch is then inlined
        (``gd.function`` keys its cache on the value). A per-replica or computed flag stays traced, and the node
        is kept.
        """
        values = list(values)
        for index in self._control:
            value = values[index]
            if isinstance(value, Tensor):
                known = value.tracer.specialise(value.value)
                if known is not None:
                    values[index] = known
        return values

    def _call_shapes(self, values: Sequence[Any]) -> dict[str, tuple]:
        """The data inputs' shapes in this call; a per-replica batch dimension stays a symbol, so that the
        graph follows the batch (re-planning) and each replica's share of it.
        """
        shapes = {}
        for index, value in enumerate(values):
            if index in self._static:
                continue
            shape = value.value.shape if isinstance(value, Tensor) else np.shape(value)
            shapes[self.input_names[index]] = tuple("batch" if isinstance(d, BatchDim) else int(d) for d in shape)
        return shapes

    def _move_statistics(self, values: list[Any], names: list[str]) -> None:
        """Assigns training-mode BatchNormalization's new running statistics (replicas' mean in a replica)."""
        context = get_replica_context()
        if context is not None:
            values = list(context.all_reduce("MEAN", list(values)))
        by_name = dict(zip(self._variable_names, self._variables))
        for name, value in zip(names, values):
            by_name[name].assign(value)

    def _eager(self, values: list[Any], training: bool) -> Any:
        arrays = [np.asarray(v.numpy() if isinstance(v, Variable) else v) for v in values]
        static = {i: arrays[i] for i in (*self._static, *self._control)}
        key = (training, tuple((i, a.dtype.str, a.shape, a.tobytes()) for i, a in sorted(static.items())))
        fn = self._functions.get(key)
        if fn is None:
            def call(*dynamic: Any) -> Any:
                full = list(dynamic)
                for index in sorted(static):
                    full.insert(index, static[index])
                result = self._traced(full, training, own_opset=True)
                return result if isinstance(result, tuple) else (result,)

            call.__name__ = "".join(c if c.isalnum() else "_" for c in self.name) or "onnx_model"
            fn = self._functions[key] = Function(call, strategy=self._strategy, name=call.__name__)
            if len(self._functions) > MAX_SPECIALISATIONS:
                self._functions.popitem(last=False)
        self._functions.move_to_end(key)
        result = fn(*[a for i, a in enumerate(arrays) if i not in static])
        result = tuple(np.asarray(r) for r in result)
        return result[0] if len(result) == 1 else result

    # --------------------------------------------------------------------- save
    def to_onnx(self) -> onnx.ModelProto:
        """The model as loaded, with the variables' current values as its initializers (a new proto; promoted
        ``Constant`` nodes become initializers).
        """
        proto = onnx.ModelProto()
        proto.CopyFrom(self._proto)
        current = dict(zip(self._variable_names, self._variables))
        for tensor in proto.graph.initializer:
            variable = current.get(tensor.name)
            if variable is not None:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
                tensor.CopyFrom(numpy_helper.from_array(np.asarray(variable.numpy(), dtype=dtype), tensor.name))
        return proto

    def save(self, path: str | os.PathLike[str]) -> str:
        """Writes the model with the variables' current values as its initializers (atomically).

        Everything else (inputs, outputs, nodes, opsets, metadata) is the
        model as loaded, so ``onnxruntime.InferenceSession(path)`` runs it;
        the ``Constant`` nodes promoted to variables (:attr:`promoted_constants`)
        are written as initializers of the same names instead.

        Returns:
            The path written.

        Raises:
            StorageError: The file cannot be written (disk full, read-only filesystem, permission denied);
                also an ``OSError``. An earlier file at ``path`` is left intact.
        """
        written = write_model(self.to_onnx(), path)
        logger.info("saved %s with %d variable(s) to %s", self.name, len(self._variables), written)
        return written

    def input_specs(self) -> list[tuple[tuple[int | None, ...], np.dtype]]:
        """Each input's declared shape (unknown dimensions ``None``) and dtype, in :attr:`input_names` order."""
        declared = {vi.name: vi for vi in self._proto.graph.input}
        specs = []
        for name in self.input_names:
            tensor_type = declared[name].type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
            specs.append((dims, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
        return specs

    def output_shapes(self) -> list[tuple[int | None, ...]] | None:
        """Each output's shape as imported (symbolic dimensions ``None``); ``None`` before the model is imported
        (models with shape-deciding inputs are imported per call).
        """
        if not self._graphs:
            return None
        graph = next(iter(self._graphs.values()))[0]
        outputs = graph.outputs[:len(self.output_names)]
        return [tuple(d if isinstance(d, int) else None for d in v.shape) for v in outputs]

    def __repr__(self) -> str:
        return (f"<gd.onnx.OnnxModel {self.name!r} inputs={self.input_names} outputs={self.output_names} "
                f"variables={len(self._variables)} strategy={self._strategy!r}>")


def _is_flag(proto: onnx.ModelProto, name: str) -> bool:
    """Whether graph input ``name`` is declared an integer or boolean tensor of one element."""
    declared = next(vi.type for vi in proto.graph.input if vi.name == name)
    tensor = declared.tensor_type if declared.WhichOneof("value") == "tensor_type" else None
    if tensor is None or not tensor.elem_type or not tensor.HasField("shape"):
        return False
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    kind = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).kind
    return kind in "iub" and None not in dims and int(np.prod(dims)) == 1


def _some(names: Sequence[str], limit: int = 8) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names)} in all)"
