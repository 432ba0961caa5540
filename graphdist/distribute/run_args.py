"""What ``strategy.run`` does with its arguments before tracing: lists become arrays, and a global array
given to a multi-replica training step is pointed out.

TensorFlow converts a Python list in ``args`` to a tensor; graphdist converts a list of numbers (or of
lists of numbers) as ``np.asarray`` would, so ``x * 2`` doubles the numbers rather than repeating the
list. A list holding arrays or other objects stays a nest (one argument per element), as it does in TF.

A plain array (not per replica) given to ``strategy.run`` under several replicas is given whole to every
replica; that is TF's meaning too, but in a step that computes gradients it usually means the global batch
was meant to be split, and the loss and gradients come out ``num_replicas`` times too large. graphdist
knows when that happens, so it says so once per replica function and argument.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError
from graphdist.trace.tensor import Tensor
from graphdist.trace.values import DistributedValues

__all__ = ["convert_lists", "lists_as_arrays", "gradient_count", "warn_global_arrays", "quiet_global_array_warning"]

logger = logging.getLogger(__name__)

_NUMBERS = (bool, int, float, complex, np.generic)


def _is_number_list(value: Any) -> bool:
    """A (nested) list whose leaves are all Python or numpy numbers."""
    if not isinstance(value, list) or not value:
        return False
    return all(isinstance(v, _NUMBERS) or _is_number_list(v) for v in value)


def _has_numbers(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(v, _NUMBERS) for v in value)


def convert_lists(value: Any, where: str) -> Any:
    """``value`` with every (nested) list of numbers made an array, as numpy would; ``where`` starts messages.

    Raises:
        InvalidArgumentError: A list that numpy cannot make one array of (ragged, or numbers mixed with
            other values).
    """
    return _convert(value, where)


def _convert(value: Any, where: str) -> Any:
    if _is_number_list(value):
        try:
            return np.asarray(value)
        except ValueError as err:  # ragged nested lists
            raise InvalidArgumentError(
                f"{where} is a list of lists of different lengths ({err}); pass an np.ndarray "
                "of one shape, or a tuple of arrays") from None
    if _has_numbers(value):
        kinds = sorted({type(v).__name__ for v in value})
        raise InvalidArgumentError(
            f"{where} is a list mixing numbers with other values ({', '.join(kinds)}); numpy "
            "cannot make one array of it. Pass np.asarray(...) of numbers, or a tuple of arrays")
    if isinstance(value, (list, tuple)):
        converted = [_convert(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return type(value)(converted) if isinstance(value, list) else tuple(converted)
    if isinstance(value, dict):
        return {k: _convert(v, f"{where}[{k!r}]") for k, v in value.items()}
    return value


def lists_as_arrays(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """``args`` and ``kwargs`` with every list of numbers made an array (``np.asarray``)."""
    new_args = tuple(_convert(a, f"strategy.run: args[{i}]") for i, a in enumerate(args))
    new_kwargs = {k: _convert(v, f"strategy.run: kwargs[{k!r}]") for k, v in kwargs.items()}
    return new_args, new_kwargs


def gradient_count(graph: Any) -> int:
    """How many ``graphdist.Gradient`` nodes (``tape.gradient`` calls) ``graph`` holds."""
    return sum(1 for node in graph.nodes if node.op_type == "Gradient")


_warned: set[tuple[Any, str]] = set()
_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("graphdist_quiet_global_arrays", default=False)


@contextlib.contextmanager
def quiet_global_array_warning(quiet: bool = True) -> Iterator[None]:
    """Within it (when ``quiet``), :func:`warn_global_arrays` says nothing: for a caller that has already
    told the user (the CLI warns about a factory's plain example arrays itself).
    """
    token = _quiet.set(quiet or _quiet.get())
    try:
        yield
    finally:
        _quiet.reset(token)


def _argument_names(fn: Callable[..., Any], count: int) -> list[str]:
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"args[{i}]" for i in range(count)]


def warn_global_arrays(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], replicas: int) -> None:
    """Warns once per (function, argument) about traced arrays given whole to each of ``replicas``."""
    if _quiet.get():
        return
    names = _argument_names(fn, len(args))
    named = list(zip(names, args)) + list(kwargs.items())
    code = getattr(getattr(fn, "__func__", fn), "__code__", None) or id(fn)
    for name, value in named:
        if isinstance(value, DistributedValues) or not isinstance(value, Tensor) or not value.shape:
            continue
        if (code, name) in _warned:
            continue
        _warned.add((code, name))
        fn_name = getattr(fn, "__name__", "fn")
        logger.warning(
            "strategy.run(%s): argument %r is one array of shape %s given whole to each of the %d replicas, and "
            "the step computes gradients, so every replica trains on the same rows and the summed loss and "
            "gradients are %dx those of one batch. To split a global batch across the replicas, pass "
            "strategy.experimental_distribute_dataset(dataset) elements or "
            "strategy.experimental_distribute_values_from_function(...); if every replica should see the "
            "whole array, this warning can be ignored", fn_name, name, tuple(value.shape), replicas, replicas)
