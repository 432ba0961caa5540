"""Optimizers (``gd.optimizers``): SGD with momentum and Adam.

``apply_gradients(zip(grads, vars))`` is called in traced code (inside
``strategy.run``). In a replica context it first sums the gradients over all
replicas with ``ReplicaContext.all_reduce`` (sync data parallel, like
tf.distribute), then records each variable's update as ``assign`` nodes.
Slot variables (momentum, Adam moments, the step counter) are created on the
first call, through the current strategy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from graphdist.distribute.variables import Variable, read_variable
from graphdist.errors import InvalidArgumentError, TracingError
from graphdist.trace.tracer import current_trace

__all__ = ["Optimizer", "SGD", "Adam"]


class Optimizer:
    """Base class: gradient aggregation, slot variables and the update loop."""

    def __init__(self, learning_rate: float, name: str) -> None:
        if not np.isscalar(learning_rate) or learning_rate <= 0:
            raise InvalidArgumentError(f"{name}: learning_rate must be a positive number, got {learning_rate!r}")
        self.learning_rate = float(learning_rate)
        self._name = name
        self._slots: dict[tuple[int, str], Variable] = {}
        self._slot_keys: dict[tuple[int, str], str] = {}
        self._tracked: dict[int, int] = {}  # id(variable) -> position, in first-update order
        self._pending: dict[str, np.ndarray] = {}  # restored slot values awaiting their slot
        self.iterations = Variable(np.int64(0), name=f"{name}/iterations", trainable=False)

    def variables(self) -> list[Variable]:
        """The optimizer's own state (iterations and slots)."""
        return [self.iterations, *self._slots.values()]

    def _slot(self, variable: Variable, kind: str) -> Variable:
        key = (id(variable), kind)
        slot = self._slots.get(key)
        if slot is None:
            position = self._tracked.setdefault(id(variable), len(self._tracked))
            checkpoint_key = f"slots/{position}/{variable._name}/{kind}"
            initial = self._pending.pop(checkpoint_key, None)
            if initial is None or initial.shape != variable.shape:
                initial = np.zeros(variable.shape, variable.dtype)
            slot = Variable(initial.astype(variable.dtype), name=f"{self._name}/{variable._name}/{kind}",
                            trainable=False)
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

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Variable]]) -> None:
        """Aggregates gradients across replicas, then updates each variable."""
        pairs = [(g, v) for g, v in grads_and_vars]
        if current_trace() is None:
            raise TracingError(f"{self._name}.apply_gradients must run in traced code: call it inside "
                               "strategy.run(...) or a @gd.function step")
        for _, variable in pairs:
            if not isinstance(variable, Variable):
                raise InvalidArgumentError(f"apply_gradients: expected (gradient, gd.Variable) pairs, got a "
                                           f"{type(variable).__name__} as the variable")
        pairs = [(g, v) for g, v in pairs if g is not None]
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


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum, as in Keras.

    ``v = momentum * v - lr * g``; ``w += v`` (Nesterov: ``w += momentum * v - lr * g``).
    """

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0, nesterov: bool = False,
                 name: str = "SGD") -> None:
        super().__init__(learning_rate, name)
        if not 0.0 <= momentum < 1.0:
            raise InvalidArgumentError(f"SGD: momentum must be in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

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
        for label, beta in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0.0 <= beta < 1.0:
                raise InvalidArgumentError(f"Adam: {label} must be in [0, 1), got {beta!r}")
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

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
