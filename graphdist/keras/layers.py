"""Keras-style layers (``gd.keras.layers``) whose weights are ``gd.Variable`` s.

A layer creates its weights in :meth:`Layer.build` with :meth:`Layer.add_weight`,
through the strategy that is current (``strategy.scope()``), so a layer built
in a ``MirroredStrategy`` scope holds ``MirroredVariable`` s and one built in a
``CentralStorageStrategy`` scope holds variables on the parameter device. A
layer given ``input_shape`` is built at construction; otherwise on its first
call. :meth:`Layer.call` is plain numpy / ``gd.nn`` code, so it runs eagerly on
arrays and is traced inside ``strategy.run`` and ``gd.function``.

Layers: :class:`Dense`, :class:`Conv2D`, :class:`MaxPool2D`, :class:`Flatten`,
:class:`Dropout`, :class:`LayerNormalization`, :class:`BatchNormalization`
(``synchronized=True`` computes the batch statistics over all replicas),
:class:`Embedding`, :class:`ReLU` and :class:`Activation`.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.distribute.replica_context import get_replica_context
from graphdist.distribute.strategy import get_strategy, has_strategy
from graphdist.errors import InvalidArgumentError
from graphdist.keras import activations, initializers
from graphdist.trace import nn
from graphdist.trace.variables import Variable

__all__ = [
    "Layer",
    "Dense",
    "Conv2D",
    "MaxPool2D",
    "MaxPooling2D",
    "AveragePooling2D",
    "AvgPool2D",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling2D",
    "Flatten",
    "Reshape",
    "Softmax",
    "Dropout",
    "LayerNormalization",
    "BatchNormalization",
    "Embedding",
    "ReLU",
    "Activation",
    "Add",
    "Concatenate",
    "get_layer_class",
]

_name_counters: defaultdict[str, itertools.count] = defaultdict(itertools.count)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower()


def unique_name(base: str) -> str:
    """``base``, then ``base_1``, ``base_2``... (like Keras' automatic layer names)."""
    index = next(_name_counters[base])
    return base if index == 0 else f"{base}_{index}"


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"{what} must be a positive int, got {value!r}")
    return int(value)


def _pair(value: Any, what: str) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)):
        return (_positive_int(value, what),) * 2
    if isinstance(value, Sequence) and len(value) == 2:
        return _positive_int(value[0], what), _positive_int(value[1], what)
    raise InvalidArgumentError(f"{what} must be an int or a pair of ints, got {value!r}")


def _padding(value: Any, what: str) -> str:
    if not isinstance(value, str) or value.lower() not in ("valid", "same"):
        raise InvalidArgumentError(f"{what}: padding must be 'valid' or 'same', got {value!r}")
    return value.lower()


class Layer:
    """Base class of every layer (and of :class:`graphdist.keras.Model`).

    Args:
        name: Layer name (default: the class name in snake case, made unique).
        trainable: Whether the layer's weights are trained.
        dtype: Floating-point dtype of the weights (default float32).
        input_shape: Shape of one example (without the batch); when given, the
            layer is built immediately in the current strategy's scope.
    """

    def __init__(self, name: str | None = None, trainable: bool = True, dtype: Any = "float32",
                 input_shape: Sequence[int] | None = None) -> None:
        self.name = name or unique_name(_snake(type(self).__name__))
        self.trainable = bool(trainable)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise InvalidArgumentError(f"{type(self).__name__}: dtype must be floating point, got {self.dtype}")
        self.built = False
        self._weights: list[Variable] = []
        self._weight_names: list[str] = []
        self._strategy = get_strategy()  # captured at creation, like Keras
        self._build_input_shape: tuple[int | None, ...] | None = None
        self._input_shape_arg = None if input_shape is None else tuple(int(d) for d in input_shape)
        if self._input_shape_arg is not None and type(self).build is not Layer.build:
            self._maybe_build((None, *self._input_shape_arg))

    # ------------------------------------------------------------ weights
    def add_weight(self, name: str, shape: Sequence[int], initializer: Any = "zeros", trainable: bool = True
                   ) -> Variable:
        """Creates a ``gd.Variable`` ``"<layer>/<name>"`` through the current strategy."""
        _, init = initializers.get(initializer, f"{self.name}: initializer of {name}")
        value = np.asarray(init(tuple(int(d) for d in shape), self.dtype), dtype=self.dtype)
        variable = Variable(value, name=f"{self.name}/{name}", trainable=trainable and self.trainable)
        self._weights.append(variable)
        self._weight_names.append(name)
        return variable

    @property
    def weights(self) -> list[Variable]:
        """All weights, trainable first (Keras' order)."""
        return self.trainable_weights + self.non_trainable_weights

    @property
    def trainable_weights(self) -> list[Variable]:
        """Weights updated by the optimizer (none while ``layer.trainable`` is false; compile again
        after changing it, as in Keras).
        """
        return [v for v in self._weights if v.trainable] if self.trainable else []

    @property
    def non_trainable_weights(self) -> list[Variable]:
        """Weights not updated by gradients (e.g. batch-norm moving statistics, a frozen layer's weights)."""
        trainable = {id(v) for v in self.trainable_weights}
        return [v for v in self._all_weights() if id(v) not in trainable]

    trainable_variables = trainable_weights
    non_trainable_variables = non_trainable_weights

    @property
    def variables(self) -> list[Variable]:
        """Same as :attr:`weights`."""
        return self.weights

    def _all_weights(self) -> list[Variable]:
        return list(self._weights)

    def _named_weights(self) -> Iterator[tuple[str, Variable]]:
        yield from zip(self._weight_names, self._weights)

    def count_params(self) -> int:
        """Number of scalar weights."""
        return sum(int(np.prod(v.shape, dtype=np.int64)) for v in self.weights)

    # ------------------------------------------------------------- calling
    def build(self, input_shape: tuple[int | None, ...]) -> None:
        """Creates the weights for inputs of ``input_shape`` (batch first, possibly ``None``)."""

    def call(self, inputs: Any, training: bool = False) -> Any:
        """The layer's computation (numpy / ``gd.nn`` code; traced or eager)."""
        raise NotImplementedError(f"{type(self).__name__} must define call(inputs, training=False)")

    def __call__(self, inputs: Any, training: bool = False) -> Any:
        from graphdist.keras import functional

        if functional.is_symbolic(inputs):
            return functional.symbolic_call(self, inputs)
        inputs = self._cast_inputs(inputs)
        if not self.built:
            first = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
            self._maybe_build(tuple(first.shape) if hasattr(first, "shape") else tuple(np.shape(first)))
        return self.call(inputs, training=training)

    def _cast_inputs(self, inputs: Any) -> Any:
        """Floating-point inputs in the layer's dtype, as Keras casts them (float64 data runs a float32
        layer in float32); integer inputs (labels, token ids) are left alone.
        """
        def cast(leaf: Any) -> Any:
            dtype = getattr(leaf, "dtype", None)
            if dtype is None or not hasattr(leaf, "astype") or np.dtype(dtype).kind != "f" or dtype == self.dtype:
                return leaf
            return leaf.astype(self.dtype)

        return nest.map_structure(cast, inputs)

    def _maybe_build(self, input_shape: tuple[int | None, ...]) -> None:
        with self._build_scope():
            self.build(input_shape)
        self._build_input_shape = tuple(input_shape)
        self.built = True

    def _build_scope(self) -> contextlib.AbstractContextManager:
        """The current strategy when one is entered, else the strategy the layer was created under."""
        if has_strategy() or get_strategy() is self._strategy:
            return contextlib.nullcontext()
        return self._strategy.scope()

    # -------------------------------------------------------------- config
    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (JSON-able) that rebuild this layer."""
        config: dict[str, Any] = {"name": self.name, "trainable": self.trainable, "dtype": self.dtype.name}
        if self._input_shape_arg is not None:
            config["input_shape"] = list(self._input_shape_arg)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Layer:
        """A new layer from :meth:`get_config`'s output."""
        return cls(**config)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} built={self.built}>"


# -------------------------------------------------------------------- core
class Dense(Layer):
    """``activation(inputs @ kernel + bias)`` over the last axis.

    Args:
        units: Output width.
        activation: Name (``"relu"``, ``"softmax"``...) or function; default linear.
        use_bias: Add a bias vector.
        kernel_initializer: Initialiser name or ``f(shape, dtype)``.
        bias_initializer: Initialiser name or ``f(shape, dtype)``.
        **kwargs: :class:`Layer` arguments (``input_shape``, ``name``...).
    """

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros", **kwargs: Any) -> None:
        self.units = _positive_int(units, "Dense: units")
        self.activation = activations.get(activation, "Dense: activation")
        self.use_bias = bool(use_bias)
        self.kernel_initializer = kernel_initializer
        self.bias_initializer = bias_initializer
        super().__init__(**kwargs)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        if len(input_shape) < 2 or input_shape[-1] is None:
            raise InvalidArgumentError(f"{self.name}: Dense needs inputs of rank >= 2 with a known last axis, got "
                                       f"shape {input_shape}; add a Flatten layer or give input_shape")
        self.kernel = self.add_weight("kernel", (input_shape[-1], self.units), self.kernel_initializer)
        self.bias = self.add_weight("bias", (self.units,), self.bias_initializer) if self.use_bias else None

    def call(self, inputs: Any, training: bool = False) -> Any:
        _check_last_axis(self, inputs, self.kernel.shape[0])
        y = inputs @ self.kernel
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "activation": activations.serialize(self.activation),
                "use_bias": self.use_bias, "kernel_initializer": _init_name(self.kernel_initializer),
                "bias_initializer": _init_name(self.bias_initializer)}


def _check_last_axis(layer: Layer, inputs: Any, expected: int) -> None:
    shape = tuple(inputs.shape)
    if not shape or shape[-1] != expected:
        raise InvalidArgumentError(
            f"{layer.name}: expected inputs whose last axis has {expected} values (the layer was built for "
            f"{layer._build_input_shape}), got shape {shape}; feed data of the shape the model was built for")


def _init_name(initializer: Any) -> str:
    name, _ = initializers.get(initializer, "initializer")
    if not isinstance(initializer, str):
        raise InvalidArgumentError(f"a custom initializer ({name}) cannot be saved in a model config; use a named one")
    return name


class Conv2D(Layer):
    """2-D convolution over ``NHWC`` images (kernel ``(KH, KW, C_in, filters)``, as in Keras).

    Args:
        filters: Number of output channels.
        kernel_size: Int or pair.
        strides: Int or pair.
        padding: ``"valid"`` or ``"same"``.
        activation: Name or function; default linear.
        use_bias: Add a per-filter bias.
        kernel_initializer: Initialiser name or function.
        bias_initializer: Initialiser name or function.
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 activation: Any = None, use_bias: bool = True, kernel_initializer: Any = "glorot_uniform",
                 bias_initializer: Any = "zeros", **kwargs: Any) -> None:
        self.filters = _positive_int(filters, "Conv2D: filters")
        self.kernel_size = _pair(kernel_size, "Conv2D: kernel_size")
        self.strides = _pair(strides, "Conv2D: strides")
        self.padding = _padding(padding, "Conv2D")
        self.activation = activations.get(activation, "Conv2D: activation")
        self.use_bias = bool(use_bias)
        self.kernel_initializer = kernel_initializer
        self.bias_initializer = bias_initializer
        super().__init__(**kwargs)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise InvalidArgumentError(f"{self.name}: Conv2D needs NHWC images (batch, height, width, channels), got "
                                       f"shape {input_shape}; reshape to (batch, H, W, C)")
        shape = (*self.kernel_size, input_shape[-1], self.filters)
        self.kernel = self.add_weight("kernel", shape, self.kernel_initializer)
        self.bias = self.add_weight("bias", (self.filters,), self.bias_initializer) if self.use_bias else None

    def call(self, inputs: Any, training: bool = False) -> Any:
        _check_last_axis(self, inputs, self.kernel.shape[2])
        y = nn.conv2d(inputs, self.kernel, self.bias, stride=self.strides, padding=self.padding.upper())
        return self.activation(y)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding,
                "activation": activations.serialize(self.activation), "use_bias": self.use_bias,
                "kernel_initializer": _init_name(self.kernel_initializer),
                "bias_initializer": _init_name(self.bias_initializer)}


class MaxPool2D(Layer):
    """Max pooling over ``NHWC`` images.

    Args:
        pool_size: Int or pair (default 2).
        strides: Int, pair or ``None`` (= ``pool_size``).
        padding: ``"valid"`` or ``"same"``.
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, pool_size: Any = 2, strides: Any = None, padding: str = "valid", **kwargs: Any) -> None:
        self.pool_size = _pair(pool_size, f"{type(self).__name__}: pool_size")
        self.strides = self.pool_size if strides is None else _pair(strides, f"{type(self).__name__}: strides")
        self.padding = _padding(padding, type(self).__name__)
        super().__init__(**kwargs)

    def call(self, inputs: Any, training: bool = False) -> Any:
        return nn.max_pool2d(inputs, self.pool_size, self.strides, padding=self.padding.upper())

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding}


MaxPooling2D = MaxPool2D


class AveragePooling2D(MaxPool2D):
    """Average pooling over ``NHWC`` images (``"same"``: each window averages only its pixels inside the
    image, as Keras does).

    Args:
        pool_size: Int or pair (default 2).
        strides: Int, pair or ``None`` (= ``pool_size``).
        padding: ``"valid"`` or ``"same"``.
        **kwargs: :class:`Layer` arguments.
    """

    def call(self, inputs: Any, training: bool = False) -> Any:
        return nn.avg_pool2d(inputs, self.pool_size, self.strides, padding=self.padding.upper())


AvgPool2D = AveragePooling2D


class GlobalAveragePooling2D(Layer):
    """The mean over the spatial axes of ``NHWC`` images: ``(batch, C)`` (``keepdims``: ``(batch, 1, 1, C)``)."""

    _reduce = staticmethod(np.mean)

    def __init__(self, keepdims: bool = False, **kwargs: Any) -> None:
        self.keepdims = bool(keepdims)
        super().__init__(**kwargs)

    def call(self, inputs: Any, training: bool = False) -> Any:
        if len(inputs.shape) != 4:
            raise InvalidArgumentError(f"{self.name}: expects NHWC images (rank 4), got shape {tuple(inputs.shape)}")
        return self._reduce(inputs, axis=(1, 2), keepdims=self.keepdims)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "keepdims": self.keepdims}


class GlobalMaxPooling2D(GlobalAveragePooling2D):
    """The maximum over the spatial axes of ``NHWC`` images: ``(batch, C)`` (``keepdims``: ``(batch, 1, 1, C)``)."""

    _reduce = staticmethod(np.max)


class Flatten(Layer):
    """Reshapes ``(batch, d1, d2, ...)`` to ``(batch, d1 * d2 * ...)``."""

    def call(self, inputs: Any, training: bool = False) -> Any:
        shape = tuple(inputs.shape)
        return np.reshape(inputs, (shape[0], int(np.prod(shape[1:], dtype=np.int64))))


class Reshape(Layer):
    """Reshapes each example to ``target_shape`` (the batch axis is kept; one entry may be ``-1``).

    Args:
        target_shape: The new shape of one example.
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, target_shape: Sequence[int], **kwargs: Any) -> None:
        try:
            self.target_shape = tuple(int(d) for d in target_shape)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"Reshape: target_shape must be a sequence of ints, got {target_shape!r}") \
                from None
        if sum(d == -1 for d in self.target_shape) > 1 or any(d == 0 or d < -1 for d in self.target_shape):
            raise InvalidArgumentError(f"Reshape: target_shape takes positive sizes and at most one -1, got "
                                       f"{self.target_shape}")
        super().__init__(**kwargs)

    def call(self, inputs: Any, training: bool = False) -> Any:
        shape = tuple(inputs.shape)
        size = int(np.prod(shape[1:], dtype=np.int64))
        known = int(np.prod([d for d in self.target_shape if d != -1], dtype=np.int64))
        if (-1 in self.target_shape and size % known) or (-1 not in self.target_shape and size != known):
            raise InvalidArgumentError(f"{self.name}: cannot reshape examples of shape {shape[1:]} ({size} values) "
                                       f"to {self.target_shape}")
        return np.reshape(inputs, (shape[0], *self.target_shape))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "target_shape": list(self.target_shape)}


class Dropout(Layer):
    """Inverted dropout while training (``gd.nn.dropout``); the identity otherwise.

    Args:
        rate: Fraction of inputs dropped, in ``[0, 1)``.
        seed: Optional seed of the mask (see ``gd.nn.dropout`` for what it fixes).
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, rate: float, seed: int | None = None, **kwargs: Any) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise InvalidArgumentError(f"Dropout: rate must be a float in [0, 1), got {rate!r}")
        self.rate = float(rate)
        self.seed = seed
        super().__init__(**kwargs)

    def call(self, inputs: Any, training: bool = False) -> Any:
        return nn.dropout(inputs, self.rate, seed=self.seed, training=bool(training))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


class ReLU(Layer):
    """``max(x, 0)`` as a layer."""

    def call(self, inputs: Any, training: bool = False) -> Any:
        return nn.relu(inputs)


class Softmax(Layer):
    """``softmax`` along ``axis`` as a layer.

    Args:
        axis: Axis (or axes) normalised (default -1).
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, axis: Any = -1, **kwargs: Any) -> None:
        self.axis = list(axis) if isinstance(axis, (list, tuple)) else int(axis)
        super().__init__(**kwargs)

    def call(self, inputs: Any, training: bool = False) -> Any:
        return nn.softmax(inputs, axis=self.axis)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis}


class Activation(Layer):
    """Applies an activation (by name or function).

    Args:
        activation: Name (``"relu"``, ``"softmax"``...) or function.
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, activation: Any, **kwargs: Any) -> None:
        self.activation = activations.get(activation, "Activation")
        super().__init__(**kwargs)

    def call(self, inputs: Any, training: bool = False) -> Any:
        return self.activation(inputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "activation": activations.serialize(self.activation)}


class Add(Layer):
    """Sums a list of inputs of one shape (for functional models)."""

    def call(self, inputs: Any, training: bool = False) -> Any:
        _check_list(self, inputs)
        total = inputs[0]
        for value in inputs[1:]:
            total = total + value
        return total


class Concatenate(Layer):
    """Concatenates a list of inputs along ``axis`` (for functional models).

    Args:
        axis: Axis joined (default the last).
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, axis: int = -1, **kwargs: Any) -> None:
        self.axis = int(axis)
        super().__init__(**kwargs)

    def call(self, inputs: Any, training: bool = False) -> Any:
        _check_list(self, inputs)
        return np.concatenate(list(inputs), axis=self.axis)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis}


def _check_list(layer: Layer, inputs: Any) -> None:
    if not isinstance(inputs, (list, tuple)) or len(inputs) < 2:
        raise InvalidArgumentError(f"{layer.name}: {type(layer).__name__} takes a list of at least two inputs")


class Embedding(Layer):
    """Rows of an ``(input_dim, output_dim)`` table selected by integer ids.

    Args:
        input_dim: Vocabulary size.
        output_dim: Embedding width.
        embeddings_initializer: Initialiser name or function (default uniform in [-0.05, 0.05]).
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, input_dim: int, output_dim: int, embeddings_initializer: Any = "random_uniform",
                 **kwargs: Any) -> None:
        self.input_dim = _positive_int(input_dim, "Embedding: input_dim")
        self.output_dim = _positive_int(output_dim, "Embedding: output_dim")
        self.embeddings_initializer = embeddings_initializer
        super().__init__(**kwargs)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.embeddings = self.add_weight("embeddings", (self.input_dim, self.output_dim),
                                          self.embeddings_initializer)

    def call(self, inputs: Any, training: bool = False) -> Any:
        if inputs.dtype.kind not in "iu":
            inputs = inputs.astype(np.int64)  # Keras casts float ids too
        return nn.embedding(inputs, self.embeddings)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "input_dim": self.input_dim, "output_dim": self.output_dim,
                "embeddings_initializer": _init_name(self.embeddings_initializer)}


# ----------------------------------------------------------- normalisation
def _axis(axis: Any, rank: int, what: str) -> int:
    if not isinstance(axis, (int, np.integer)) or not -rank <= axis < rank:
        raise InvalidArgumentError(f"{what}: axis {axis!r} is out of range for inputs of rank {rank}")
    return int(axis) % rank


class LayerNormalization(Layer):
    """Normalises each example over ``axis`` (``gd.nn.layer_norm``), then scales and shifts.

    Args:
        axis: Axis normalised (default the last).
        epsilon: Added to the variance (Keras' default 1e-3).
        center: Learn a shift ``beta``.
        scale: Learn a scale ``gamma``.
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, axis: int = -1, epsilon: float = 1e-3, center: bool = True, scale: bool = True,
                 **kwargs: Any) -> None:
        self.axis, self.epsilon, self.center, self.scale = axis, float(epsilon), bool(center), bool(scale)
        super().__init__(**kwargs)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        axis = _axis(self.axis, len(input_shape), f"{self.name}: LayerNormalization")
        shape = (input_shape[axis],) + (1,) * (len(input_shape) - axis - 1)
        self.gamma = self.add_weight("gamma", shape, "ones") if self.scale else None
        self.beta = self.add_weight("beta", shape, "zeros") if self.center else None

    def call(self, inputs: Any, training: bool = False) -> Any:
        return nn.layer_norm(inputs, self.gamma, self.beta, axis=self.axis, epsilon=self.epsilon)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon, "center": self.center,
                "scale": self.scale}


class BatchNormalization(Layer):
    """Batch normalisation over every axis but ``axis`` (the channels).

    Training: normalises with the batch's mean and (biased) variance and
    moves ``moving_mean``/``moving_variance`` towards them
    (``moving = moving * momentum + batch * (1 - momentum)``). Inference:
    normalises with the moving statistics.

    In a multi-replica strategy each replica sees its slice of the global
    batch. With ``synchronized=False`` each normalises with its own slice's
    statistics (as Keras does) and the moving statistics move towards the
    mean of the replicas' statistics (all-reduced, so the mirrored copies stay
    equal). With ``synchronized=True`` the sums behind the mean and variance
    are all-reduced first, so every replica normalises with the statistics of
    the whole global batch: training then equals one device on the same
    global batch.

    Args:
        axis: The channel axis (default the last, NHWC).
        momentum: Moving-average momentum.
        epsilon: Added to the variance.
        center: Learn a shift ``beta``.
        scale: Learn a scale ``gamma``.
        synchronized: Cross-replica batch statistics.
        **kwargs: :class:`Layer` arguments.
    """

    def __init__(self, axis: int = -1, momentum: float = 0.99, epsilon: float = 1e-3, center: bool = True,
                 scale: bool = True, synchronized: bool = False, **kwargs: Any) -> None:
        if not 0.0 <= momentum <= 1.0:
            raise InvalidArgumentError(f"BatchNormalization: momentum must be in [0, 1], got {momentum!r}")
        self.axis, self.momentum, self.epsilon = axis, float(momentum), float(epsilon)
        self.center, self.scale, self.synchronized = bool(center), bool(scale), bool(synchronized)
        super().__init__(**kwargs)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        axis = _axis(self.axis, len(input_shape), f"{self.name}: BatchNormalization")
        channels = input_shape[axis]
        shape = (channels,) + (1,) * (len(input_shape) - axis - 1)
        self.gamma = self.add_weight("gamma", shape, "ones") if self.scale else None
        self.beta = self.add_weight("beta", shape, "zeros") if self.center else None
        self.moving_mean = self.add_weight("moving_mean", shape, "zeros", trainable=False)
        self.moving_variance = self.add_weight("moving_variance", shape, "ones", trainable=False)

    def call(self, inputs: Any, training: bool = False) -> Any:
        if not training:
            return nn.batch_norm(inputs, self.moving_mean, self.moving_variance, self.beta, self.gamma,
                                 variance_epsilon=self.epsilon)
        mean, variance = self._batch_statistics(inputs)
        self._update_moving(mean, variance)
        return nn.batch_norm(inputs, mean, variance, self.beta, self.gamma, variance_epsilon=self.epsilon)

    def _batch_statistics(self, inputs: Any) -> tuple[Any, Any]:
        """Mean and biased variance over the reduced axes (of the global batch when synchronized)."""
        rank = len(inputs.shape)
        axis = _axis(self.axis, rank, f"{self.name}: BatchNormalization")
        reduced = tuple(i for i in range(rank) if i != axis)
        count = int(np.prod([inputs.shape[i] for i in reduced], dtype=np.int64))
        total = np.sum(inputs, axis=reduced, keepdims=True)
        squares = np.sum(inputs * inputs, axis=reduced, keepdims=True)
        squeeze = tuple(i for i in reduced if i < axis)  # keep the weights' (C, 1, ...) layout
        total, squares = np.squeeze(total, axis=squeeze), np.squeeze(squares, axis=squeeze)
        context = get_replica_context()
        denominator: Any = np.asarray(max(count, 1), dtype=inputs.dtype)
        if self.synchronized and context is not None:
            # Traced once for any replica count: with one replica the all-reduce is lowered away.
            total, squares, denominator = context.all_reduce(
                "SUM", [total, squares, np.asarray(count, dtype=inputs.dtype)])
            denominator = np.maximum(denominator, np.asarray(1, dtype=inputs.dtype))
        mean = total / denominator
        variance = np.maximum(squares / denominator - mean * mean, np.asarray(0, dtype=inputs.dtype))
        return mean, variance

    def _update_moving(self, mean: Any, variance: Any) -> None:
        keep = self.dtype.type(self.momentum)
        new_mean = self.moving_mean * keep + mean * (self.dtype.type(1) - keep)
        new_variance = self.moving_variance * keep + variance * (self.dtype.type(1) - keep)
        context = get_replica_context()
        if not self.synchronized and context is not None:
            # Replicas saw different slices: move every mirrored copy by the replicas' mean.
            new_mean, new_variance = context.all_reduce("MEAN", [new_mean, new_variance])
        self.moving_mean.assign(new_mean)
        self.moving_variance.assign(new_variance)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "axis": self.axis, "momentum": self.momentum, "epsilon": self.epsilon,
                "center": self.center, "scale": self.scale, "synchronized": self.synchronized}


_LAYERS = {cls.__name__: cls for cls in (Dense, Conv2D, MaxPool2D, AveragePooling2D, GlobalAveragePooling2D,
                                          GlobalMaxPooling2D, Flatten, Reshape, Dropout, LayerNormalization,
                                          BatchNormalization, Embedding, ReLU, Softmax, Activation, Add, Concatenate)}


def get_layer_class(name: str) -> type[Layer]:
    """The built-in layer class called ``name`` (for loading saved models).

    Raises:
        InvalidArgumentError: No built-in layer has that name.
    """
    cls = _LAYERS.get(name)
    if cls is None:
        raise InvalidArgumentError(f"unknown layer class {name!r} in a saved model; built-in layers are "
                                   f"{sorted(_LAYERS)} (custom layers cannot be loaded from a config)")
    return cls
