"""Naming the op that made a NaN or an infinity (``gd.debugging.enable_check_numerics()``).

While the checks are on, the scheduler checks what each segment of a step
computes for the others (:mod:`graphdist.runtime.numerics`); a compiled
segment computes its intermediate values inside the backend, out of sight.
When one of its outputs holds NaN or infinity, :func:`name_the_op` runs that
segment again on the same feeds, built with every floating-point value it
computes as an output, and names the first op in the segment's order whose
result is not finite: its inputs were finite (it made the NaN or infinity),
or were fed to the step already holding one (the batch, or a variable). This
costs one extra compile and run, on the failing step only; a step without
NaN or infinity pays only the scheduler's check of its segments' outputs.

The segment runs again on the backend and device of the plan (else on ONNX
Runtime on the host). A segment whose result is random (``Dropout``) may not
make the NaN again: the message then names the op that computed the
non-finite output the scheduler saw, and says so.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from graphdist.errors import NumericsError
from graphdist.ir.graph import Graph, Node, Value
from graphdist.ir.onnx_io import to_onnx
from graphdist.runtime.devices import parse_device
from graphdist.runtime.numerics import NonFiniteOutputsError, count_non_finite, describe_counts

__all__ = ["name_the_op"]

logger = logging.getLogger(__name__)


def _where(node: Node) -> str:
    source = node.meta.get("source")
    return f"op {node.qualified_op} (node {node.name!r}{f', traced at {source}' if source else ''})"


def _debug_graph(graph: Graph) -> tuple[Graph, list[tuple[Node, Value]]]:
    """A copy of ``graph`` whose outputs are also every floating-point value its nodes compute."""
    debug = graph.copy()
    exposed = {id(v) for v in debug.outputs}
    watched = []
    for node in debug.nodes:
        for out in node.outputs:
            if out.dtype.kind in "fc":
                watched.append((node, out))
                if id(out) not in exposed:
                    debug.outputs.append(out)
                    exposed.add(id(out))
    return debug, watched


def _run_exposed(segment: Any, feeds: dict[str, Any], backend: Any) -> tuple[Graph, list[tuple[Node, Value]],
                                                                               dict[str, np.ndarray]]:
    from graphdist.backends import get_backend

    debug, watched = _debug_graph(segment.graph)
    model = to_onnx(debug)
    names = [v.name for v in debug.outputs]
    errors = []
    attempts = [(backend, parse_device(segment.device))]
    if getattr(backend, "name", None) != "ort" or parse_device(segment.device).kind != "cpu":
        attempts.append((get_backend("ort"), parse_device("cpu:0")))
    for candidate, device in attempts:
        try:
            executable = candidate.compile(model, device, threads=None, cache_dir=None)
            outputs = executable.run({name: feeds[name] for name in (v.name for v in debug.inputs)})
            return debug, watched, dict(zip(names, outputs))
        except Exception as err:  # noqa: BLE001 - a diagnosis must never hide the NaN it diagnoses
            errors.append(f"{getattr(candidate, 'name', candidate)} on {device}: {type(err).__name__}: {err}")
    raise RuntimeError("; ".join(errors))


def name_the_op(error: NonFiniteOutputsError, plan: Any, backend: Any, call: int) -> NumericsError:
    """The error to raise for ``error`` (a segment of ``plan`` computed NaN or infinity in call ``call``).

    Args:
        error: What the scheduler found.
        plan: The plan that ran (its segments and step name).
        backend: The backend that compiled the plan.
        call: Which call of the plan this was (1 for the first).

    Returns:
        A :class:`~graphdist.errors.NumericsError` naming the op that made the first NaN or infinity, the
        step (its function's name and the call), the device and the segment.
    """
    segment = plan.segments[error.segment]
    step = f"step {plan.graph.name!r} (call {call})"
    tail = ("The step's results are not returned and its variable updates are not applied. "
            "gd.debugging.disable_check_numerics() turns the checks off.")
    try:
        debug, watched, values = _run_exposed(segment, error.feeds, backend)
    except Exception as err:  # noqa: BLE001 - fall back on what the scheduler saw
        logger.warning("check numerics: could not run segment %s again to find the first op: %s", segment.name, err)
        return NumericsError(f"{error} of {step}; running the segment again to find the first op that made it "
                             f"failed ({err}). {tail}")
    for node, out in watched:
        array = values.get(out.name)
        nans, infs = count_non_finite(array) if array is not None else (0, 0)
        if not (nans or infs):
            continue
        fed = []
        for value in node.inputs:
            if value is None or value.producer is not None:
                continue
            fed_array = error.feeds.get(value.name, value.const_value)
            in_nans, in_infs = count_non_finite(fed_array)
            if in_nans or in_infs:
                fed.append(f"%{value.name} ({describe_counts(in_nans, in_infs, int(np.size(fed_array)))})")
        cause = (f"Its input {', '.join(fed)} already held it: a value fed to the step (the batch, or a "
                 "variable made non-finite by an earlier step)." if fed else
                 "Its inputs were finite: this op made it (a log or division of 0, a square root of a negative "
                 "number, an overflow of its dtype).")
        index = node.outputs.index(out)
        return NumericsError(
            f"check numerics: {describe_counts(nans, infs, int(np.size(array)))} in %{out.name} (output {index} of "
            f"{_where(node)}, {out.dtype}{list(np.shape(array))}), the first op of {step} to make a NaN or Inf, on "
            f"{segment.device} (segment {segment.name!r}). {cause} {tail}")
    return NumericsError(f"{error} of {step}; run again with every value exposed, the segment made no NaN or Inf "
                         "(its result is random, e.g. Dropout, or depends on the run), so the op named is the one "
                         f"whose output the step saw. {tail}")
