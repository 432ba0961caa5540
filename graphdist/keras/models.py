"""``gd.keras.Model`` (subclass form) and ``gd.keras.Sequential``.

A model remembers the strategy that was current when it was created (like
Keras under ``strategy.scope()``); its layers' weights are created through
that strategy, and ``compile``/``fit``/``evaluate``/``predict``/``save`` run
under it wherever they are called (inside or outside the scope). Calling a
model (``model(x, training=True)``) is plain traced code, so a model also
serves custom training loops inside ``strategy.run``.

Subclass form::

    class MyModel(gd.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = gd.keras.layers.Dense(64, activation="relu")
            self.out = gd.keras.layers.Dense(10)

        def call(self, x, training=False):
            return self.out(self.hidden(x))
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from graphdist import nest
from graphdist import optimizers as optimizers_lib
from graphdist.distribute.strategy import get_strategy
from graphdist.errors import InvalidArgumentError
from graphdist.keras import callbacks as callbacks_lib
from graphdist.keras import functional, initializers
from graphdist.keras import losses as losses_lib
from graphdist.keras import metrics as metrics_lib
from graphdist.keras import sample_weights as weights_lib
from graphdist.keras import summary as summary_lib
from graphdist.keras.data_adapter import make_source
from graphdist.keras.layers import Layer, get_layer_class
from graphdist.keras.progress import Progress
from graphdist.keras.training import Engine, NotCompiledError, check_strategy
from graphdist.keras.validation_split import check_validation_split, split_for_validation
from graphdist.trace.variables import Variable

__all__ = ["Model", "Sequential", "FunctionalModel", "from_onnx"]

def _optimizer(identifier: Any) -> Any:
    try:
        return optimizers_lib.get(identifier)
    except InvalidArgumentError as err:
        raise InvalidArgumentError(f"compile: {err}") from None


class Model(Layer):
    """A trainable model: layers plus ``compile``/``fit``/``evaluate``/``predict``/``save``.

    Subclass it and define :meth:`call`; layers assigned as attributes (or in
    lists) are tracked in assignment order.

    Args:
        name: Model name (default: the class name in snake case, made unique).
        **kwargs: :class:`~graphdist.keras.layers.Layer` arguments.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Model:
        if cls is Model and ("inputs" in kwargs or "outputs" in kwargs or len(args) >= 2):
            return object.__new__(FunctionalModel)  # Model(inputs, outputs): the functional form
        return object.__new__(cls)

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        object.__setattr__(self, "_layers", [])
        if "input_shape" in kwargs:
            raise InvalidArgumentError(f"{type(self).__name__}: give input_shape to the first layer, not to the model")
        super().__init__(name=name, **kwargs)
        self.optimizer: Any = None
        self.loss: Any = None
        self.compiled_metrics: list[metrics_lib.Metric] = []
        self.compiled_weighted_metrics: list[metrics_lib.Metric] = []
        self.history: callbacks_lib.History | None = None
        self.stop_training = False
        self._engine: Engine | None = None
        self._output_shape: tuple[int, ...] | None = None
        self._shuffle_seed = int(initializers.generator().integers(2**31))
        self._resume: tuple[int, dict[str, list[float]], int] | None = None
        self._predict_engine: Engine | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        candidates = value if isinstance(value, (list, tuple)) else (value,)
        for item in candidates:
            if isinstance(item, Layer) and item is not self and all(item is not known for known in self._layers):
                self._layers.append(item)
        object.__setattr__(self, name, value)

    # -------------------------------------------------------------- structure
    @property
    def layers(self) -> list[Layer]:
        """The tracked layers, in order."""
        return list(self._layers)

    @property
    def distribute_strategy(self) -> Any:
        """The strategy the model was created under (it trains, evaluates and predicts under it)."""
        return self._strategy

    def _all_weights(self) -> list[Variable]:
        seen: dict[int, Variable] = {}
        for _, variable in self._named_weights():
            seen.setdefault(id(variable), variable)
        return list(seen.values())

    @property
    def trainable_weights(self) -> list[Variable]:
        """The trainable weights of the model and of every trainable layer."""
        if not self.trainable:
            return []
        seen: dict[int, Variable] = {id(v): v for v in self._weights if v.trainable}
        for layer in self._layers:
            for variable in layer.trainable_weights:
                seen.setdefault(id(variable), variable)
        return list(seen.values())

    trainable_variables = trainable_weights

    def _named_weights(self) -> Iterator[tuple[str, Variable]]:
        yield from zip(self._weight_names, self._weights)
        for index, layer in enumerate(self._layers):
            for name, variable in layer._named_weights():
                yield f"layer{index}/{name}", variable

    def _checkpoint_variables(self) -> dict[str, Variable]:
        """Checkpoint keys by position (``layer0/kernel``...): stable when the model is rebuilt."""
        return dict(self._named_weights())

    def _restore_pending(self, values: dict[str, np.ndarray]) -> None:
        """Nothing waits for values: every model variable exists once the model is built."""

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        strategy = self._strategy
        with contextlib.nullcontext() if get_strategy() is strategy else strategy.scope():
            yield

    def build(self, input_shape: Sequence[int | None]) -> None:
        """Creates every weight by running the model once, eagerly, on one example of ``input_shape``."""
        shape = tuple(1 if d is None else int(d) for d in input_shape)
        if len(shape) < 1:
            raise InvalidArgumentError(f"{self.name}: input_shape must include the batch axis, got {input_shape}")
        self._record_output(np.zeros((1, *shape[1:]), self.dtype))

    def _record_output(self, example: Any) -> None:
        """Runs the model eagerly on ``example`` (one row) to build it and learn its output shape."""
        with self._scope():
            output = self(example, training=False)
        self._output_shape = tuple(np.shape(nest.flatten(output)[0][0]))

    def __call__(self, inputs: Any, training: bool = False) -> Any:
        if self._build_input_shape is None:
            first = nest.flatten(inputs)[0][0]
            self._build_input_shape = (None, *tuple(first.shape)[1:])
        self.built = True
        return self.call(inputs, training=training)

    def count_params(self) -> int:
        return sum(int(np.prod(v.shape, dtype=np.int64)) for v in self.variables)

    def get_weights(self) -> list[np.ndarray]:
        """Copies of every weight's value (trainable first)."""
        return [np.array(v.numpy(), copy=True) for v in self.weights]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Assigns values in :meth:`get_weights`' order.

        Raises:
            InvalidArgumentError: Wrong number of arrays or a shape mismatch.
        """
        variables = self.weights
        if len(weights) != len(variables):
            raise InvalidArgumentError(
                f"set_weights: the model has {len(variables)} weights, got {len(weights)} arrays")
        for variable, value in zip(variables, weights):
            variable.assign(np.asarray(value, dtype=variable.dtype))

    def summary(self, print_fn: Any = print) -> str:
        """A table of layers, their output shapes and parameter counts (printed with ``print_fn``, returned).

        Output shapes come from one eager pass over a zero example (the layers' symbolic shapes for a
        functional model); ``?`` until the model is built, ``multiple`` for a layer called with several shapes.
        """
        text = summary_lib.summary_text(self, self._layer_output_shapes())
        if print_fn is not None:
            print_fn(text)
        return text

    def _layer_output_shapes(self) -> dict[int, str]:
        """``id(layer) -> output shape text`` of the tracked layers (see :mod:`graphdist.keras.summary`)."""
        return summary_lib.traced_output_shapes(self)

    # ---------------------------------------------------------------- compile
    def compile(self, optimizer: Any = "sgd", loss: Any = None, metrics: Sequence[Any] | None = None,
                weighted_metrics: Sequence[Any] | None = None) -> None:
        """Sets the optimizer, loss and metrics (strings or objects; see ``gd.keras.losses`` / ``metrics``).

        String optimizers (``"sgd"``: ``SGD(0.01)``, ``"adam"``, ``"adamw"``,
        ``"rmsprop"``, ``"adagrad"``: Keras' defaults) are created in the
        model's strategy scope. As in Keras, ``metrics``
        ignore sample and class weights and ``weighted_metrics`` use them
        (``sum(w * value) / sum(w)``); a weighted metric whose name a plain
        one already has is renamed ``weighted_<name>``.

        Raises:
            InvalidArgumentError: Unknown optimizer, loss or metric, or an
                optimizer created under another strategy.
        """
        if loss is None:
            raise InvalidArgumentError("compile: loss is required, e.g. loss='mse' or "
                                       "gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True)")
        with self._scope():
            optimizer = _optimizer(optimizer)
        loss = losses_lib.get(loss)
        metric_objects = _metric_objects(metrics, loss, "metrics")
        weighted_objects = _metric_objects(weighted_metrics, loss, "weighted_metrics")
        _name_weighted_metrics(metric_objects, weighted_objects)
        check_strategy(self, "compile", optimizer)
        self.optimizer, self.loss, self.compiled_metrics = optimizer, loss, metric_objects
        self.compiled_weighted_metrics = weighted_objects
        self._engine = Engine(self, optimizer, loss, metric_objects, weighted_objects)

    @property
    def metrics_names(self) -> list[str]:
        """``["loss", *metric names, *weighted metric names]``."""
        return ["loss", *(m.name for m in (*self.compiled_metrics, *self.compiled_weighted_metrics))]

    def _compiled_engine(self, what: str) -> Engine:
        if self._engine is None:
            raise NotCompiledError(f"{what}: the model must be compiled first: call model.compile(optimizer=..., "
                                   f"loss=..., metrics=[...]) before {what}")
        check_strategy(self, what)
        return self._engine

    def _prepare(self, source: Any, what: str) -> None:
        """Builds the model from the first batch's shape and learns its output shape."""
        first = source.first()
        if first is None:
            raise InvalidArgumentError(f"{what}: the input has no batches; give at least one example")
        x = first[0] if source.has_targets else first
        self._record_output(nest.map_structure(lambda leaf: np.asarray(leaf)[:1], x))

    def _fit_source(self, x: Any, y: Any, batch_size: int | None, shuffle: bool, seed: int,
                    steps_per_epoch: int | None, sample_weight: Any, class_weight: Any) -> Any:
        return make_source(x, y, batch_size, shuffle, seed, self.dtype, "fit", True, steps=steps_per_epoch,
                           sample_weight=sample_weight, class_weight=class_weight)

    # -------------------------------------------------------------------- fit
    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: Any = "auto", callbacks: Sequence[callbacks_lib.Callback] | None = None,
            validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            initial_epoch: int = 0, steps_per_epoch: int | None = None, sample_weight: Any = None,
            class_weight: dict[int, float] | None = None) -> callbacks_lib.History:
        """Trains for ``epochs`` epochs under the model's strategy; returns the :class:`History`.

        Each global batch (``batch_size`` rows of the arrays, default 32, or
        one element of a dataset) is split among the replicas; the loss is the
        mean over the global batch (per-example losses summed and divided by
        its size), so every strategy trains the same weights as one device.

        Sample weights, as in Keras: ``sample_weight`` (one weight per example
        of array input; a dataset's elements may be ``(x, y, sample_weight)``
        instead) and ``class_weight`` (``{class id: weight}``, looked up from
        integer or one-hot labels; classes left out weigh 1) multiply the
        examples' losses; the batch loss stays ``sum(w_i * loss_i) / batch
        size``. ``validation_data`` may be ``(x_val, y_val, val_sample_weight)``;
        ``class_weight`` does not apply to it. ``validation_split`` (arrays
        only, as in Keras) holds out the *last* fraction of the arrays' rows,
        taken before any shuffling, as the validation data; ``validation_data``,
        when also given, takes precedence.

        Raises:
            NotCompiledError: ``compile`` was not called.
            InvalidArgumentError: Bad input (lengths, targets out of range for
                the loss, dataset with ``y`` or ``batch_size``...), or the model
                belongs to another strategy than the current scope's.
        """
        engine = self._compiled_engine("fit")
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 0:
            raise InvalidArgumentError(f"fit: epochs must be a non-negative int, got {epochs!r}")
        if validation_split and validation_data is None:
            x, y, sample_weight, validation_data = split_for_validation(x, y, sample_weight, validation_split)
        else:
            check_validation_split(validation_split)
        self._shuffle_seed = _agreed_seed(self._strategy, self._shuffle_seed)
        source = self._fit_source(x, y, batch_size, shuffle, self._shuffle_seed, steps_per_epoch, sample_weight,
                                  class_weight)
        self._prepare(source, "fit")
        weights_lib.check_class_ids(class_weight, self._output_shape)
        validation = self._validation_source(validation_data, batch_size)
        history = callbacks_lib.History()
        callback_list = callbacks_lib.CallbackList([history, *(callbacks or [])], self,
                                                   {"epochs": epochs, "steps": source.steps, "verbose": verbose})
        self.history, self.stop_training, self._resume = history, False, None
        progress = Progress(verbose, "Epoch")
        callback_list.on_train_begin()
        epoch = int(initial_epoch)
        if self._resume is not None:
            epoch, previous, seed = self._resume
            if seed != self._shuffle_seed:
                self._shuffle_seed = seed
                source = self._fit_source(x, y, batch_size, shuffle, seed, steps_per_epoch, sample_weight,
                                          class_weight)
            history.history = {k: list(v) for k, v in previous.items()}
            history.epoch = list(range(epoch))
        logs: dict[str, float] = {}
        try:
            while epoch < epochs and not self.stop_training:
                callback_list.on_epoch_begin(epoch)
                logs = engine.run_epoch(source.epoch(epoch), True, progress, f"{epoch + 1}/{epochs}", source.steps,
                                        callback_list.on_train_batch_end,
                                        after=self._validator(engine, validation, progress))
                callback_list.on_epoch_end(epoch, logs)
                epoch += 1
        finally:
            progress.close()
        callback_list.on_train_end(logs)
        # The next fit call shuffles in new orders (a restarted run restores this seed from its backup).
        self._shuffle_seed = int(np.random.default_rng([self._shuffle_seed, 1]).integers(2**31))
        return history

    @staticmethod
    def _validator(engine: Engine, validation: Any, progress: Progress) -> Any:
        """A function adding ``val_*`` logs to an epoch's logs (``None`` without validation data); the test
        step's compile is announced in the epoch's ``progress``.
        """
        if validation is None:
            return None

        def add_validation(logs: dict[str, float]) -> dict[str, float]:
            val_logs = engine.run_epoch(validation.epoch(0), False, progress.quiet_child(), "", validation.steps)
            return {**logs, **{f"val_{k}": v for k, v in val_logs.items()}}

        return add_validation

    def _resume_from(self, epoch: int, history: dict[str, list[float]], shuffle_seed: int) -> None:
        """Called by ``BackupAndRestore``: continue ``fit`` at ``epoch`` with the backed-up history and order."""
        self._resume = (epoch, history, shuffle_seed)

    def _validation_source(self, validation_data: Any, batch_size: int | None) -> Any:
        if validation_data is None:
            return None
        if isinstance(validation_data, tuple):
            if len(validation_data) not in (2, 3):
                raise InvalidArgumentError(f"fit: validation_data must be (x_val, y_val), (x_val, y_val, "
                                           f"val_sample_weight) or a dataset, got a tuple of {len(validation_data)}")
            x_val, y_val, *weight = validation_data
            return make_source(x_val, y_val, batch_size, False, 0, self.dtype, "fit: validation_data", True,
                               sample_weight=weight[0] if weight else None)
        return make_source(validation_data, None, None, False, 0, self.dtype, "fit: validation_data", True)

    # ---------------------------------------------------------- evaluate/predict
    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, verbose: Any = "auto",
                 sample_weight: Any = None, steps: int | None = None, return_dict: bool = False) -> Any:
        """Loss (and metrics) over all of ``x``, as Keras returns them: the loss alone
        without metrics, ``[loss, *metrics]`` with them (or a dict with ``return_dict``).

        With ``sample_weight`` (one per example of array input; or datasets of
        ``(x, y, sample_weight)``) the loss is ``sum(w_i * loss_i) / examples``
        and the ``weighted_metrics`` are weighted means, as in Keras.

        Raises:
            NotCompiledError: ``compile`` was not called.
            InvalidArgumentError: Bad input (see :meth:`fit`).
        """
        engine = self._compiled_engine("evaluate")
        source = make_source(x, y, batch_size, False, 0, self.dtype, "evaluate", True, steps=steps,
                             sample_weight=sample_weight)
        self._prepare(source, "evaluate")
        progress = Progress(verbose, "Evaluate")
        try:
            logs = engine.run_epoch(source.epoch(0), False, progress, "", source.steps)
        finally:
            progress.close()
        if return_dict:
            return logs
        values = [logs[name] for name in self.metrics_names]
        return values[0] if len(values) == 1 else values

    def predict(self, x: Any, batch_size: int | None = None, verbose: Any = 0, steps: int | None = None) -> Any:
        """The model's outputs for every example of ``x``, in input order (partial last batch included)."""
        check_strategy(self, "predict")
        source = make_source(x, None, batch_size, False, 0, self.dtype, "predict", False, steps=steps)
        self._prepare(source, "predict")
        if self._engine is None and self._predict_engine is None:
            self._predict_engine = Engine(self, None, None, [])
        engine = self._engine or self._predict_engine
        progress = Progress(verbose, "Predict")
        try:
            return engine.predict(source.epoch(0), progress, source.steps)
        finally:
            progress.close()

    def train_plan(self) -> Any:
        """The compiled :class:`~graphdist.compile.plan.Plan` of the train step (full batch)."""
        return self._compiled_engine("train_plan").train_concrete_function().plan

    # ------------------------------------------------------------------ saving
    def save(self, filepath: str | os.PathLike[str], overwrite: bool = True) -> str:
        """Writes the model to directory ``filepath`` (see :mod:`graphdist.keras.saving`); returns its path."""
        from graphdist.keras.saving import save_model

        return save_model(self, filepath, overwrite=overwrite)

    def save_weights(self, filepath: str | os.PathLike[str]) -> str:
        """Writes every weight to one ``.npz`` checkpoint (atomically); returns the path."""
        from graphdist.checkpoint import Checkpoint

        return Checkpoint(model=self).save(filepath)

    def load_weights(self, filepath: str | os.PathLike[str]) -> None:
        """Restores weights written by :meth:`save_weights` (the model must be built the same way)."""
        from graphdist.checkpoint import Checkpoint

        Checkpoint(model=self).restore(filepath)

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name}

    def _example_batch(self, rows: int) -> Any:
        """A batch of ``rows`` zero examples of the model's input (what its serving plan is exported for)."""
        return np.zeros((rows, *self._build_input_shape[1:]), self.dtype)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} layers={len(self._layers)} strategy={self._strategy!r}>"


def _metric_objects(metrics: Any, loss: Any, argument: str) -> list[metrics_lib.Metric]:
    if metrics is not None and not isinstance(metrics, (list, tuple)):
        raise InvalidArgumentError(f"compile: {argument} must be a list, got {type(metrics).__name__}")
    return [metrics_lib.get(m, loss) for m in metrics or ()]


def _name_weighted_metrics(plain: list[metrics_lib.Metric], weighted: list[metrics_lib.Metric]) -> None:
    """Renames a weighted metric ``weighted_<name>`` when a plain one has its name (as Keras does);
    raises when names still repeat.
    """
    if any(w is p for w in weighted for p in plain):
        raise InvalidArgumentError("compile: the same metric object is in both metrics and weighted_metrics; "
                                   "give weighted_metrics its own object (or a name string)")
    names = {m.name for m in plain}
    for metric in weighted:
        if metric.name in names:
            metric.name = f"weighted_{metric.name}"
        names.add(metric.name)
    all_names = [m.name for m in (*plain, *weighted)]
    if len(set(all_names)) != len(all_names) or "loss" in all_names:
        raise InvalidArgumentError(f"compile: metric names must be unique and not 'loss', got {all_names}")


def _agreed_seed(strategy: Any, seed: int) -> int:
    """Worker 0's shuffling seed on every worker of a multi-worker strategy (each slices the same order)."""
    communicator = getattr(strategy, "communicator", None)
    if communicator is None:
        return seed
    return int(communicator.broadcast(np.array(seed, np.int64), root=0, name="fit shuffle seed"))


class FunctionalModel(Model):
    """A model given by its inputs and outputs (``gd.keras.Model(inputs=..., outputs=...)``).

    Args:
        inputs: A ``gd.keras.Input`` (or a list of them).
        outputs: KerasTensors computed from ``inputs`` by calling layers.
        name: Model name.
    """

    def __init__(self, inputs: Any, outputs: Any, name: str | None = None) -> None:
        super().__init__(name=name)
        self._inputs_spec, self._outputs_spec = inputs, outputs
        self._order = functional.Functional.plan(inputs, outputs)
        for tensor in self._order:
            if all(tensor.layer is not known for known in self._layers):
                self._layers.append(tensor.layer)
        first_input = nest.flatten(inputs, is_leaf=lambda v: isinstance(v, functional.KerasTensor))[0][0]
        self._build_input_shape = first_input.shape
        first_output = nest.flatten(outputs, is_leaf=lambda v: isinstance(v, functional.KerasTensor))[0][0]
        self._output_shape = (1, *first_output.shape[1:])
        self.built = True

    def call(self, inputs: Any, training: bool = False) -> Any:
        return functional.Functional.run(self._inputs_spec, self._outputs_spec, self._order, inputs, training)

    def _layer_output_shapes(self) -> dict[int, str]:
        """The recorded symbolic shapes of each layer's outputs (no pass needed)."""
        return summary_lib.symbolic_output_shapes(self._order)

    def _example_batch(self, rows: int) -> Any:
        leaves, treedef = nest.flatten(self._inputs_spec, is_leaf=lambda v: isinstance(v, functional.KerasTensor))
        return nest.unflatten(treedef, [np.zeros((rows, *leaf.shape[1:]), leaf.dtype) for leaf in leaves])

    def get_config(self) -> dict[str, Any]:
        """The architecture as JSON data: inputs, layers (each once, shared ones too) and the calls.

        Raises:
            InvalidArgumentError: A layer is not a built-in one (it could not be rebuilt from a config).
        """
        for layer in self._layers:
            get_layer_class(type(layer).__name__)  # a custom layer: refuse now, not when loading
        return functional.describe_graph(self._inputs_spec, self._outputs_spec, self._order, self._layers,
                                         name=self.name)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FunctionalModel:
        """Rebuilds the model from :meth:`get_config` (new weights, created in the current scope)."""
        layers = [get_layer_class(entry["class_name"]).from_config(entry["config"]) for entry in config["layers"]]
        inputs, outputs = functional.replay_graph(config, layers)
        return cls(inputs, outputs, name=config.get("name"))


class Sequential(Model):
    """A plain stack of layers.

    Args:
        layers: Layers, applied in order. If the first has ``input_shape``,
            the whole model is built at once (its weights created in the
            current strategy's scope).
        name: Model name.
    """

    def __init__(self, layers: Sequence[Layer] | None = None, name: str | None = None) -> None:
        super().__init__(name=name or None)
        for layer in layers or ():
            self.add(layer)

    def add(self, layer: Layer) -> None:
        """Appends a layer (built right away when the input shape is known)."""
        if not isinstance(layer, Layer):
            raise InvalidArgumentError(f"Sequential.add: expected a gd.keras.layers layer, got {type(layer).__name__}")
        self._layers.append(layer)
        first = self._layers[0]
        if first._input_shape_arg is not None:
            self.build((None, *first._input_shape_arg))
        elif first._build_input_shape is not None:
            self.build(first._build_input_shape)

    def call(self, inputs: Any, training: bool = False) -> Any:
        if not self._layers:
            raise InvalidArgumentError(f"{self.name}: the Sequential model has no layers; add some first")
        x = inputs
        for layer in self._layers:
            x = layer(x, training=training)
        return x

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name,
                "layers": [{"class_name": type(layer).__name__, "config": layer.get_config()}
                           for layer in self._layers]}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Sequential:
        layers = [get_layer_class(entry["class_name"]).from_config(entry["config"]) for entry in config["layers"]]
        return cls(layers, name=config.get("name"))


# A model whose forward pass is an ONNX graph (graphdist.keras.onnx_model; it subclasses Model, defined above).
from graphdist.keras.onnx_model import from_onnx  # noqa: E402
