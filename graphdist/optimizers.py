"""Optimizers (``gd.optimizers``): SGD with momentum, Adam, AdamW, RMSprop and Adagrad (Keras' formulas).

``apply_gradients(zip(grads, vars))`` is called in traced code (inside
``strategy.run``). In a replica context it first sums the gradients over all
replicas with ``ReplicaContext.all_reduce`` (sync data parallel, like
tf.distribute), then records each variable's update as ``assign`` nodes.
Slot variables (momentum, Adam moments, the step counter) are created on the
first call, through the current strategy. ``get_config()`` / ``deserialize``
and ``get("rmsprop")`` give optimizers by name (``model.compile`` and saved
Keras models use them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError, TracingError
from graphdist.trace.tracer import current_trace
from graphdist.trace.variables import Variable, read_variable

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "get", "deserialize"]

logger = logging.getLogger(__name__)


def _number(value: Any, what: str, *, low: float = 0.0, high: float | None = None, strict_low: bool = False) -> float:
    """``value`` as a float after checking it is a real number in the documented range.

    Args:
        value: The argument.
        what: ``"SGD: momentum"``: who takes it, for the message.
        low: Smallest allowed value (excluded when ``strict_low``).
        high: Values must be below it (``None``: no upper bound).
        strict_low: Whether ``low`` itself is excluded.

    Raises:
        InvalidArgumentError: ``value`` is not a real number (a string, a bool, a schedule, NaN) or is
            outside the range.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value):
        kind = "a callable (learning-rate schedules are not supported)" if callable(value) else \
            f"{value!r} ({type(value).__name__})"
        raise InvalidArgumentError(f"{what} must be a finite real number, got {kind}; pass a float")
    if (value <= low if strict_low else value < low) or (high is not None and value >= high):
        bounds = f"{'(' if strict_low else '['}{low:g}, {'inf)' if high is None else f'{high:g})'}"
        raise InvalidArgumentError(f"{what} must be in {bounds}, got {value!r}")
    return float(value)


def _pair(item: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InvalidArgumentError(f"{name}.apply_gradients takes (gradient, variable) pairs, e.g. "
                                   f"zip(grads, variables); got an item of type {type(item).__name__}")
    return item[0], item[1]


class Optimizer:
    """Base class: gradient aggregation, slot variables and the update loop."""

    def __init__(self, learning_rate: float, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"optimizer name must be a non-empty string, got {name!r}")
        self.learning_rate = _number(learning_rate, f"{name}: learning_rate", strict_low=True)
        self._name = name
        self._slots: dict[tuple[int, str], Variable] = {}
        self._slot_keys: dict[tuple[int, str], str] = {}
        self._tracked: dict[int, int] = {}  # id(variable) -> position, in first-update order
        self._pending: dict[str, np.ndarray] = {}  # restored slot values awaiting their slot
        # Restored slot values matched to their variable by a checkpoint's object graph, until the slot exists.
        self._restored: dict[tuple[int, str], tuple[Variable, np.ndarray]] = {}
        self.iterations = Variable(np.int64(0), name=f"{name}/iterations", trainable=False)

    def variables(self) -> list[Variable]:
        """The optimizer's own state (iterations and slots)."""
        return [self.iterations, *self._slots.values()]

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (``type(self)(**config)`` makes an equal, fresh optimizer)."""
        return {"learning_rate": self.learning_rate, "name": self._name}

    def _slot(self, variable: Variable, kind: str, initial_value: float = 0.0) -> Variable:
        key = (id(variable), kind)
        slot = self._slots.get(key)
        if slot is None:
            position = self._tracked.setdefault(id(variable), len(self._tracked))
            checkpoint_key = f"slots/{position}/{variable._name}/{kind}"
            initial = self._pending.pop(checkpoint_key, None)
            restored = self._restored.pop(key, None)
            if restored is not None and restored[0] is variable:
                initial = restored[1]
            if initial is None or initial.shape != variable.shape:
                initial = np.full(variable.shape, initial_value, variable.dtype)
            slot = Variable(initial.astype(variable.dtype), name=f"{self._name}/{variable._name}/{kind}",
                            trainable=False)
            slot._slot_primary = variable  # a strategy that splits variables splits the slot the same way
            self._slots[key] = slot
            self._slot_keys[key] = checkpoint_key
        return slot

    def _checkpoint_variables(self) -> dict[str, Variable]:
        """Checkpoint keys of the optimizer's state (stable across fresh builds)."""
        out = {"iterations": self.iterations}
        out.update({self._slot_keys[key]: slot for key, slot in self._slots.items()})
        return out

    def _restore_pending(self, values: dict[str, np.ndarray]) -> None:
        """Keeps restored slot values whose slots are created later (lazily)."""
        self._pending.update(values)

    def _restore_slot(self, variable: Variable, kind: str, value: np.ndarray) -> None:
        """Keeps the restored value of ``variable``'s slot ``kind`` until the slot is created (lazily)."""
        self._restored[(id(variable), kind)] = (variable, value)

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Variable]]) -> None:
        """Aggregates gradients across replicas, then updates each variable."""
        pairs = [_pair(item, self._name) for item in grads_and_vars]
        if current_trace() is None:
            raise TracingError(f"{self._name}.apply_gradients must run in traced code: call it inside "
                               "strategy.run(...) or a @gd.function step")
        for _, variable in pairs:
            if not isinstance(variable, Variable):
                raise InvalidArgumentError(f"apply_gradients: expected (gradient, gd.Variable) pairs, got a "
                                           f"{type(variable).__name__} as the variable")
        pairs = _drop_missing_gradients(pairs, self._name)
        grads = self._aggregate([g for g, _ in pairs])
        step = read_variable(self.iterations) + np.int64(1)
        shared: dict[np.dtype, Any] = {}  # per-step values computed once per dtype
        for grad, variable in zip(grads, [v for _, v in pairs]):
            if variable.dtype not in shared:
                shared[variable.dtype] = self._prepare(step, variable.dtype)
            grad = np.asarray(grad, dtype=variable.dtype) if not hasattr(grad, "value") else grad.astype(variable.dtype)
            self._update(variable, grad, shared[variable.dtype])
        self.iterations.assign(step)

    @staticmethod
    def _aggregate(grads: list[Any]) -> list[Any]:
        from graphdist.distribute.replica_context import get_replica_context

        context = get_replica_context()
        if context is None or not grads:
            return grads
        return context.all_reduce("SUM", grads)

    def _prepare(self, step: Any, dtype: np.dtype) -> Any:
        """Values shared by every variable's update in this step (e.g. Adam's bias correction)."""
        return None

    def _update(self, variable: Variable, grad: Any, shared: Any) -> None:
        raise NotImplementedError


def _drop_missing_gradients(pairs: list[tuple[Any, Variable]], name: str) -> list[tuple[Any, Variable]]:
    """The pairs with a gradient; as TF: none at all is an error, some missing a warning naming them."""
    missing = [v.name for g, v in pairs if g is None]
    if pairs and len(missing) == len(pairs):
        raise InvalidArgumentError(f"{name}.apply_gradients: no gradients provided for any variable: {missing}; the "
                                   "loss does not depend on them (was it computed inside the GradientTape, from "
                                   "the variables themselves rather than numpy copies of them?)")
    if missing:
        logger.warning("%s.apply_gradients: gradients do not exist for variables %s when minimizing the loss; "
                       "they are left unchanged", name, missing)
    return [(g, v) for g, v in pairs if g is not None]


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum, as in Keras.

    ``v = momentum * v - lr * g``; ``w += v`` (Nesterov: ``w += momentum * v - lr * g``).
    """

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0, nesterov: bool = False,
                 name: str = "SGD") -> None:
        super().__init__(learning_rate, name)
        self.momentum = _number(momentum, "SGD: momentum", high=1.0)
        self.nesterov = bool(nesterov)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}

    def _update(self, variable: Variable, grad: Any, shared: Any) -> None:
        lr = variable.dtype.type(self.learning_rate)
        if self.momentum == 0.0:
            variable.assign(read_variable(variable) - lr * grad)
            return
        momentum = variable.dtype.type(self.momentum)
        velocity = self._slot(variable, "momentum")
        new_velocity = momentum * read_variable(velocity) - lr * grad
        velocity.assign(new_velocity)
        delta = momentum * new_velocity - lr * grad if self.nesterov else new_velocity
        variable.assign(read_variable(variable) + delta)


class Adam(Optimizer):
    """Adam (Kingma & Ba), with Keras' epsilon placement.

    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``;
    ``w -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)``.
    """

    def __init__(self, learning_rate: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, name: str = "Adam") -> None:
        super().__init__(learning_rate, name)
        self.beta_1 = _number(beta_1, f"{name}: beta_1", high=1.0)
        self.beta_2 = _number(beta_2, f"{name}: beta_2", high=1.0)
        self.epsilon = _number(epsilon, f"{name}: epsilon")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}

    def _prepare(self, step: Any, dtype: np.dtype) -> Any:
        """The bias-corrected learning rate of this step."""
        kind = dtype.type
        b1, b2 = kind(self.beta_1), kind(self.beta_2)
        t = step.astype(dtype)
        return kind(self.learning_rate) * np.sqrt(kind(1) - np.power(b2, t)) / (kind(1) - np.power(b1, t))

    def _update(self, variable: Variable, grad: Any, lr_t: Any) -> None:
        dtype = variable.dtype.type
        b1, b2 = dtype(self.beta_1), dtype(self.beta_2)
        m, v = self._slot(variable, "m"), self._slot(variable, "v")
        new_m = b1 * read_variable(m) + (dtype(1) - b1) * grad
        new_v = b2 * read_variable(v) + (dtype(1) - b2) * (grad * grad)
        m.assign(new_m)
        v.assign(new_v)
        variable.assign(read_variable(variable) - lr_t * new_m / (np.sqrt(new_v) + dtype(self.epsilon)))


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as Keras applies it.

    ``w -= lr * weight_decay * w`` first, then the Adam step. Every variable it
    updates is decayed (Keras' ``exclude_from_weight_decay`` is not offered).
    """

    def __init__(self, learning_rate: float = 0.001, weight_decay: float = 0.004, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, name: str = "AdamW") -> None:
        super().__init__(learning_rate, beta_1, beta_2, epsilon, name)
        self.weight_decay = _number(weight_decay, f"{name}: weight_decay")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "weight_decay": self.weight_decay}

    def _update(self, variable: Variable, grad: Any, lr_t: Any) -> None:
        kind = variable.dtype.type
        decay = kind(self.learning_rate) * kind(self.weight_decay)
        variable.assign(read_variable(variable) - decay * read_variable(variable))
        super()._update(variable, grad, lr_t)


class RMSprop(Optimizer):
    """RMSprop, as in Keras: ``ms = rho ms + (1-rho) g^2``; ``step = lr g / sqrt(ms + eps)``.

    With ``momentum``: ``mom = momentum mom + step``; ``w -= mom`` (else ``w -= step``).
    ``centered``: ``ms - mg^2`` replaces ``ms`` (``mg = rho mg + (1-rho) g``).
    """

    def __init__(self, learning_rate: float = 0.001, rho: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-7, centered: bool = False, name: str = "RMSprop") -> None:
        super().__init__(learning_rate, name)
        self.rho = _number(rho, f"{name}: rho", high=1.0)
        self.momentum = _number(momentum, f"{name}: momentum", high=1.0)
        self.epsilon = _number(epsilon, f"{name}: epsilon")
        self.centered = bool(centered)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered}

    def _update(self, variable: Variable, grad: Any, shared: Any) -> None:
        kind = variable.dtype.type
        rho, one = kind(self.rho), kind(1)
        mean_square = self._slot(variable, "rms")
        new_ms = rho * read_variable(mean_square) + (one - rho) * (grad * grad)
        mean_square.assign(new_ms)
        denominator = new_ms
        if self.centered:
            mean_grad = self._slot(variable, "mg")
            new_mg = rho * read_variable(mean_grad) + (one - rho) * grad
            mean_grad.assign(new_mg)
            denominator = new_ms - new_mg * new_mg
        step = kind(self.learning_rate) * grad / np.sqrt(denominator + kind(self.epsilon))
        if self.momentum > 0.0:
            velocity = self._slot(variable, "momentum")
            step = kind(self.momentum) * read_variable(velocity) + step
            velocity.assign(step)
        variable.assign(read_variable(variable) - step)


class Adagrad(Optimizer):
    """Adagrad, as in Keras: ``acc += g^2``; ``w -= lr g / sqrt(acc + eps)`` (``acc`` starts at
    ``initial_accumulator_value``).
    """

    def __init__(self, learning_rate: float = 0.001, initial_accumulator_value: float = 0.1,
                 epsilon: float = 1e-7, name: str = "Adagrad") -> None:
        super().__init__(learning_rate, name)
        self.initial_accumulator_value = _number(initial_accumulator_value, f"{name}: initial_accumulator_value")
        self.epsilon = _number(epsilon, f"{name}: epsilon")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon}

    def _update(self, variable: Variable, grad: Any, shared: Any) -> None:
        kind = variable.dtype.type
        accumulator = self._slot(variable, "accumulator", self.initial_accumulator_value)
        new_acc = read_variable(accumulator) + grad * grad
        accumulator.assign(new_acc)
        step = kind(self.learning_rate) * grad / np.sqrt(new_acc + kind(self.epsilon))
        variable.assign(read_variable(variable) - step)


_CLASSES: dict[str, type[Optimizer]] = {cls.__name__: cls for cls in (SGD, Adam, AdamW, RMSprop, Adagrad)}


def get(identifier: Any) -> Optimizer:
    """An optimizer: ``identifier`` itself, or a fresh one with Keras' defaults for a name (``"sgd"``,
    ``"adam"``, ``"adamw"``, ``"rmsprop"``, ``"adagrad"``; any case).

    Raises:
        InvalidArgumentError: Neither an optimizer nor a known name.
    """
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, str):
        for name, cls in _CLASSES.items():
            if name.lower() == identifier.lower():
                return cls()
    raise InvalidArgumentError(f"optimizer must be one of {sorted(n.lower() for n in _CLASSES)} or a "
                               f"gd.optimizers optimizer, got {identifier!r}")


def deserialize(config: dict[str, Any]) -> Optimizer:
    """The optimizer ``{"class_name": ..., "config": get_config()}`` describes.

    Raises:
        InvalidArgumentError: Unknown class or arguments.
    """
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"optimizer config must be a dict {{'class_name': ..., 'config': {{...}}}} (from "
                                   f"get_config), got {type(config).__name__}")
    cls = _CLASSES.get(config.get("class_name", ""))
    if cls is None:
        raise InvalidArgumentError(f"unknown optimizer class {config.get('class_name')!r}; known: {sorted(_CLASSES)}")
    try:
        return cls(**config.get("config", {}))
    except TypeError as err:
        raise InvalidArgumentError(f"optimizer {cls.__name__}: {err}") from err
