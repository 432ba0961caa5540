"""Reference backend (``"reference"``): ``onnx.reference.ReferenceEvaluator``.

A pure-Python ONNX interpreter: slow, but an independent correctness oracle
for the other backends. It runs on the host for every device kind, persists
nothing on disk (every real construction counts as a ``compiles``), and checks
feeds against the declared graph inputs (names and element types) before
running, so it rejects what ONNX Runtime rejects instead of silently
computing in another dtype.

Where onnx's reference computes an op wrongly, graphdist registers a corrected
kernel (:mod:`graphdist.backends.reference_fixes`). Ops of the ``graphdist``
domain can be given as ``onnx.reference.op_run.OpRun``
subclasses (``custom_ops``); they are passed to the evaluator as ``new_ops``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphdist import stats
from graphdist.backends.reference_fixes import REFERENCE_FIXES
from graphdist.errors import BackendError
from graphdist.runtime.devices import Device, parse_device

if TYPE_CHECKING:
    import onnx
    from onnx.reference.op_run import OpRun

__all__ = ["ReferenceBackend", "ReferenceExecutable"]

logger = logging.getLogger(__name__)


def _input_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """Returns the numpy dtype of every typed tensor graph input."""
    from onnx.helper import tensor_dtype_to_np_dtype

    initializers = {init.name for init in model.graph.initializer}
    dtypes = {}
    for value in model.graph.input:
        elem_type = value.type.tensor_type.elem_type
        if (
            value.name in initializers
            or not value.type.HasField("tensor_type")
            or not elem_type
        ):
            continue
        try:
            dtypes[value.name] = np.dtype(tensor_dtype_to_np_dtype(elem_type))
        except (KeyError, TypeError, ValueError):
            continue
    return dtypes


class ReferenceExecutable:
    """A segment loaded into a ``ReferenceEvaluator``.

    Attributes:
        evaluator: The evaluator.
        name: The segment's graph name, used in error messages.
        input_names: Graph input names, in order.
        output_names: Graph output names, in order.
    """

    def __init__(self, evaluator: Any, name: str, dtypes: dict[str, np.dtype]) -> None:
        self.evaluator = evaluator
        self.name = name
        self.input_names = list(evaluator.input_names)
        self.output_names = list(evaluator.output_names)
        self._dtypes = dtypes

    def __repr__(self) -> str:
        return f"ReferenceExecutable({self.name!r})"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the segment on ``feeds`` (one array per input name).

        Raises:
            BackendError: A feed is missing or has the wrong dtype, or the
                evaluator failed; the message names the segment and the feeds.
        """
        self._check(feeds)
        try:
            outputs = self.evaluator.run(None, feeds)
        except Exception as err:
            raise self._error(f"{type(err).__name__}: {err}", feeds) from err
        return [np.asarray(out) for out in outputs]

    def _check(self, feeds: dict[str, Any]) -> None:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise self._error(f"missing feed(s) {', '.join(map(repr, missing))}", feeds)
        for name, dtype in self._dtypes.items():
            given = getattr(feeds[name], "dtype", None)
            if given is not None and given != dtype:
                raise self._error(
                    f"feed {name!r} has dtype {given}, expected {dtype}", feeds
                )

    def _error(self, reason: str, feeds: dict[str, Any]) -> BackendError:
        given = ", ".join(
            f"{k}: {getattr(v, 'dtype', type(v).__name__)}{list(getattr(v, 'shape', ()))}"
            for k, v in feeds.items()
        )
        expected = ", ".join(
            f"{n}: {self._dtypes[n]}" if n in self._dtypes else n
            for n in self.input_names
        )
        return BackendError(
            f"reference evaluator could not run segment {self.name!r}: {reason}. "
            f"Feeds given: {given or 'none'}. Inputs expected: {expected}."
        )


class ReferenceBackend:
    """Runs segments with ``onnx.reference`` on the host.

    Args:
        custom_ops: ``OpRun`` subclasses implementing non-standard ops (the
            ``graphdist`` domain), passed to the evaluator as ``new_ops``.

    Attributes:
        name: ``"reference"``.
        device_kinds: The device kinds it runs segments of: ``cpu``, and the
            simulated ``tpu`` cores (evaluated on the host); never a GPU.
    """

    name = "reference"
    device_kinds = ("cpu", "tpu")

    def __init__(self, custom_ops: list[type[OpRun]] | None = None) -> None:
        self.custom_ops: list[type[OpRun]] = list(custom_ops or [])

    def __repr__(self) -> str:
        return f"ReferenceBackend(custom_ops={[op.__name__ for op in self.custom_ops]})"

    @property
    def version(self) -> str:
        """``"onnx-<version>"``."""
        import onnx

        return f"onnx-{onnx.__version__}"

    def target(self, device: Device | str) -> str:
        """Returns ``"host"``: every device is evaluated on the host."""
        parse_device(device)
        return "host"

    def compile(
        self,
        model: onnx.ModelProto,
        device: Device | str,
        *,
        threads: int | None = None,
        cache_dir: Path | None = None,
        shared: dict[str, Any] | None = None,
    ) -> ReferenceExecutable:
        """Builds an evaluator for ``model``; ``threads`` and ``cache_dir``
        are ignored.

        Raises:
            BackendError: The evaluator rejects the model.
        """
        from onnx.reference import ReferenceEvaluator

        parse_device(device)
        name = model.graph.name or "<unnamed>"
        try:
            evaluator = ReferenceEvaluator(model, new_ops=[*REFERENCE_FIXES, *self.custom_ops])
        except Exception as err:
            raise BackendError(
                f"reference evaluator cannot load segment {name!r}: "
                f"{type(err).__name__}: {err}. Check the segment with "
                "onnx.checker.check_model(model, full_check=True), and register "
                "custom ops with ReferenceBackend(custom_ops=[...])."
            ) from err
        stats.increment("compiles")
        return ReferenceExecutable(evaluator, name, _input_dtypes(model))
