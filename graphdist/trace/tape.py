"""``gd.GradientTape`` and ``gd.grad``: mark a target and sources for autodiff.

Inside traced code (``strategy.run``, ``gd.function``) ``tape.gradient``
emits a ``graphdist.Gradient(target, *sources)`` node; ``AutodiffPass``
expands it into backward ops. Sources may be variables (their value at the
time of the call) or traced tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.errors import TracingError
from graphdist.ir.graph import GRAPHDIST_DOMAIN
from graphdist.trace.tracer import current_trace

__all__ = ["GradientTape", "grad", "value_and_grad", "stop_gradient"]

_EAGER_HINT = (
    "gradients are computed on traced graphs: call this code inside strategy.run(...) or a "
    "@gd.function step"
)


def _as_traced(ctx: Any, source: Any) -> Any:
    from graphdist.trace.numpy_api import _as_tensor
    from graphdist.trace.tensor import Tensor
    from graphdist.trace.variables import Variable, read_variable

    if isinstance(source, Variable):
        return read_variable(source)
    if isinstance(source, Tensor):
        return source
    return _as_tensor(ctx, source)


_UNCONNECTED = ("zero", "none")


def _reaches(target: Any, sources: list[Any]) -> list[bool]:
    """For each source value: does ``target`` depend on it (not only through ``StopGradient``)?"""
    wanted = {id(v) for v in sources}
    found: set[int] = set()
    seen: set[int] = set()
    stack = [target]
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if id(value) in wanted:
            found.add(id(value))
        node = value.producer
        if node is not None and node.op_type != "StopGradient":
            stack.extend(v for v in node.inputs if v is not None)
    return [id(v) in found for v in sources]


def _check_target(target: Any) -> None:
    """Refuses a target that is not a value (``None``: a loss function that returns nothing)."""
    from graphdist.trace.tensor import Tensor
    from graphdist.trace.variables import Variable

    if isinstance(target, (Tensor, Variable, int, float, np.ndarray, np.generic)) and not isinstance(target, bool):
        return
    kind = "None" if target is None else f"a {type(target).__name__}"
    hint = (" (did the loss function forget to return its value?)" if target is None else
            "; give a traced value (or a list of them)")
    raise TracingError(f"tape.gradient(target, sources): target is {kind}{hint}; the target must be the traced "
                       "loss, a floating-point value computed from the sources")


def gradients(target: Any, sources: Any, unconnected_gradients: str = "zero") -> Any:
    """d(sum(target))/d(source) for every source in the nest ``sources``.

    Args:
        target: The traced value to differentiate (summed).
        sources: A nest of variables or traced tensors.
        unconnected_gradients: ``"zero"`` (zeros for a source the target does
            not depend on) or ``"none"`` (``None`` for it, TF's default).
    """
    if unconnected_gradients not in _UNCONNECTED:
        raise TracingError(f"unconnected_gradients must be 'zero' or 'none', got {unconnected_gradients!r}")
    ctx = current_trace()
    if ctx is None:
        raise TracingError(_EAGER_HINT)
    if isinstance(target, (list, tuple)) and target:  # TF: the gradient of the targets' sum
        for item in target:
            _check_target(item)
        target = functools.reduce(lambda a, b: a + b, [np.sum(_as_traced(ctx, t)) for t in target])
    _check_target(target)
    target = _as_traced(ctx, target)
    if target.dtype.kind != "f":
        raise TracingError(f"gradient target must be floating point, got {target.dtype}")
    from graphdist.trace.variables import Variable

    leaves, treedef = nest.flatten(sources)
    if not leaves:
        return sources
    values = [_as_traced(ctx, leaf).value for leaf in leaves]
    for leaf, value in zip(leaves, values):
        if value.dtype.kind != "f":
            name = leaf.name if isinstance(leaf, Variable) else f"%{value.name}"
            raise TracingError(f"cannot differentiate with respect to {name} of dtype {value.dtype}: "
                               "only floating-point sources have gradients")
    outs = ctx.emit("Gradient", [target.value, *values], {}, domain=GRAPHDIST_DOMAIN, name="gradient")
    if unconnected_gradients == "none":
        outs = [out if connected else None for out, connected in zip(outs, _reaches(target.value, values))]
    return nest.unflatten(treedef, outs)


class GradientTape:
    """Records a computation for differentiation (like ``tf.GradientTape``).

    Args:
        persistent: Allow several ``gradient`` calls (always true here: the
            tape only marks targets in the traced graph).
        watch_accessed_variables: Accepted for compatibility.
    """

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        self.persistent = persistent
        self._used = False

    def __enter__(self) -> GradientTape:
        if current_trace() is None:
            raise TracingError("GradientTape used outside traced code: " + _EAGER_HINT)
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def watch(self, tensor: Any) -> None:
        """Marks ``tensor`` as a source (every traced tensor can be one already)."""

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: str = "zero") -> Any:
        """Gradients of ``sum(target)`` with respect to each source in the nest ``sources``.

        Unconnected sources get zeros (``unconnected_gradients="zero"``, graphdist's
        default) or ``None`` (``"none"``, TensorFlow's default).
        """
        if self._used and not self.persistent:
            raise TracingError("GradientTape.gradient can only be called once on a non-persistent tape; "
                               "use GradientTape(persistent=True)")
        self._used = True
        if output_gradients is not None:
            target = target * output_gradients
        return gradients(target, sources, unconnected_gradients=str(unconnected_gradients).lower())


def grad(fn: Callable[..., Any], argnums: int | tuple[int, ...] = 0) -> Callable[..., Any]:
    """A function returning d(sum(fn(*args)))/d(args[argnums]) (use inside traced code)."""
    return _grad_impl(fn, argnums, with_value=False)


def value_and_grad(fn: Callable[..., Any], argnums: int | tuple[int, ...] = 0) -> Callable[..., Any]:
    """Like :func:`grad`, returning ``(fn(*args), gradients)``."""
    return _grad_impl(fn, argnums, with_value=True)


def _grad_impl(fn: Callable[..., Any], argnums: int | tuple[int, ...], with_value: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = current_trace()
        if ctx is None:
            raise TracingError(f"gd.grad({getattr(fn, '__name__', 'fn')}) called eagerly: " + _EAGER_HINT)
        indices = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        traced_args = list(args)
        for i in indices:
            traced_args[i] = nest.map_structure(lambda a: _as_traced(ctx, a), args[i])
        value = fn(*traced_args, **kwargs)
        sources = tuple(traced_args[i] for i in indices)
        grads = gradients(value, sources)
        grads = grads[0] if isinstance(argnums, int) else grads
        return (value, grads) if with_value else grads

    return wrapper


def stop_gradient(x: Any) -> Any:
    """``x`` itself, treated as a constant by autodiff (like ``tf.stop_gradient``); eager: ``x``."""
    ctx = current_trace()
    if ctx is None:
        return x
    from graphdist.trace.numpy_api import _as_tensor

    tensor = _as_traced(ctx, x) if not isinstance(x, (int, float)) else _as_tensor(ctx, x)
    return ctx.emit1("StopGradient", [tensor.value], {}, domain=GRAPHDIST_DOMAIN, name="stop_gradient")

