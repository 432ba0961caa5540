"""ONNX Runtime backend (``"ort"``, the default).

Devices:

* ``cpu:N`` runs on ``CPUExecutionProvider`` with the thread budget given to
  :meth:`OrtBackend.compile` (all host cores when none is given). Every
  logical CPU device shares one compile target, ``"cpu"``.
* ``cuda:N`` runs on ``CUDAExecutionProvider`` (device ``N``) with CPU as the
  fallback for ops CUDA lacks, only when the CUDA driver reports GPU ``N``.
  If ONNX Runtime cannot start its CUDA provider the compile fails instead of
  silently running on the CPU.
* ``tpu:N`` is not supported: use backend ``"tvm"``.

Providers are always named explicitly: ``onnxruntime-gpu`` lists CUDA as
available even on machines without a GPU. Sessions are created with
``enable_fallback=0``: by default ONNX Runtime's Python layer reacts to a
provider failure (at session creation or in ``run``) by printing to stdout and
retrying on other providers, which would be a silent fallback.

Disk cache (ONNX Runtime's documented *offline* graph optimization): the first
compile of a segment creates a session at ``ORT_ENABLE_EXTENDED`` with
``optimized_model_filepath`` set, so ONNX Runtime writes the optimized graph
(constant folding, fusions such as MatMul+Add+Relu -> ``com.microsoft``
``FusedGemm``) to a temporary file in the cache directory; that file is
renamed to ``model.ort2.onnx`` and its SHA-256, with the cache key it is
stored under, is written next to it in ``model.ort2.onnx.sha256`` (both
renames are atomic; a file copied from another entry is rejected). Nothing
is read from or written to a cache directory another user could write, or
through a symbolic link (:func:`graphdist.backends.base.cache_entry_allowed`:
a planted model with a recomputed checksum is never run; the segment is
compiled in memory, with one warning). EXTENDED is the highest
level whose saved model is portable; layout optimizations (level ALL) are
hardware specific, so they are not saved but applied again when a session is
created. The session that runs is always created from the optimized file at
``ORT_ENABLE_ALL``, in the first process and in later ones alike, so every
process runs exactly the same graph. A later process whose cache directory
holds a file with a matching checksum skips the optimization
(``disk_cache_hits``); a missing checksum, a mismatch, or a file ONNX Runtime
cannot load is discarded and the segment is compiled again (``compiles``).
The cache key (see :func:`graphdist.backends.base.cache_key`) includes the
ONNX Runtime version and the target, as the offline mode requires the same
version, providers and options.

Large segments skip the offline step: a segment of more than
:data:`OFFLINE_MAX_NODES` nodes is compiled into one session at
``ORT_ENABLE_ALL`` straight from its own bytes, in every process alike (so
every process still runs the same graph), and nothing is written to or read
from the disk cache for it. The offline step costs a whole extra session in
the first process and saves only ONNX Runtime's optimization passes in later
ones; measured on a 30,000-node segment (``benchmarks/bench_compile_time.py``'s
ladder): EXTENDED + save 3.9 s, then the session from the saved model 2.9 s,
against 4.0 s for one session from the segment itself. For the segments of
ordinary steps (hundreds to a few thousand nodes) the extra session costs
milliseconds, and the disk cache is kept.

Disabled optimizer: every session (the one that writes the EXTENDED model to
the disk cache included) is created with ONNX Runtime's ``NoopElimination``
rewrite rule disabled (:data:`DISABLED_OPTIMIZERS`). In onnxruntime 1.31 that
rule decides whether a float64 scalar initializer is the identity of an
``Add``/``Sub`` (0) or ``Mul``/``Div`` (1) at float32 precision, and removes the
node: ``m + 1.37e-46``, ``m - 1e-50``, ``m * (1 + 1e-10)`` and ``m / (1 + 1e-10)``
silently become ``m`` in float64 graphs (when ``m`` is computed by a node and
the result is not a graph output). For float32 models the cost is nil: the
784-512-512-10 MLP's optimized graph is the same node for node, and its
forward time (batch 256) is unchanged. Files written before this fix (``model.ort.onnx``) may hold such
wrongly simplified graphs; the optimized model therefore has a new file name,
:data:`OPTIMIZED_MODEL_FILE`, and the old files are never read.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphdist import stats
from graphdist.backends.base import (
    cache_entry_allowed,
    discard_artifact,
    make_cache_dir,
    prepare_model,
    read_verified_artifact,
    write_artifact_checksum,
)
from graphdist.backends.ort_memory import use_shared_arena
from graphdist.errors import BackendError
from graphdist.runtime.devices import Device, check_available, host_cores, parse_device
from graphdist.runtime.tasks import MICRO_BATCHES_KEY

if TYPE_CHECKING:
    import onnx
    import onnxruntime

__all__ = ["DISABLED_OPTIMIZERS", "OFFLINE_MAX_NODES", "OPTIMIZED_MODEL_FILE", "OrtBackend", "OrtExecutable"]

logger = logging.getLogger(__name__)

#: Name of the optimized model in a segment's cache directory (``model.ort.onnx`` before
#: :data:`DISABLED_OPTIMIZERS`: those files may hold wrongly simplified float64 graphs).
OPTIMIZED_MODEL_FILE = "model.ort2.onnx"
#: ONNX Runtime optimizers disabled in every session (see the module docstring): NoopElimination
#: compares float64 constants with 0 and 1 at float32 precision and drops real float64 ops.
DISABLED_OPTIMIZERS: tuple[str, ...] = ("NoopElimination",)
#: Segments with more nodes than this are compiled without the offline (disk-cached) optimized model: one
#: session instead of two in the first process (see the module docstring).
OFFLINE_MAX_NODES = 20_000
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*")


def _ort() -> Any:
    """Imports onnxruntime on first use (it takes ~0.2 s to import)."""
    import onnxruntime

    return onnxruntime


def _clean(err: BaseException) -> str:
    """Returns an ONNX Runtime error message on one line, without its code."""
    text = " ".join(str(err).split())
    return _ORT_PREFIX.sub("", text) or type(err).__name__


def _describe_feed(value: object) -> str:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return type(value).__name__
    return f"{dtype}{list(shape)}"


def _describe_input(arg: Any) -> str:
    kind = arg.type.removeprefix("tensor(").removesuffix(")")
    kind = {"float": "float32", "double": "float64"}.get(kind, kind)
    return f"{arg.name}: {kind}{list(arg.shape)}"


class OrtExecutable:
    """A segment compiled into an ``onnxruntime.InferenceSession``.

    Attributes:
        session: The session (exposed for benchmarks).
        name: The segment's graph name, used in error messages.
        device: The device it runs on.
        input_names: Graph input names, in order.
        output_names: Graph output names, in order.
    """

    def __init__(
        self, session: onnxruntime.InferenceSession, name: str, device: Device
    ) -> None:
        self.session = session
        self.name = name
        self.device = device
        self.input_names = [arg.name for arg in session.get_inputs()]
        self.output_names = [arg.name for arg in session.get_outputs()]
        self._run = _direct_run(session)

    def __repr__(self) -> str:
        return f"OrtExecutable({self.name!r}, device={str(self.device)!r})"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the segment on ``feeds`` (one array per input name).

        Raises:
            BackendError: ONNX Runtime rejected the feeds or failed; the
                message names the segment, the feeds given and the inputs
                expected.
        """
        try:
            return self._run(self.output_names, feeds)
        except Exception as err:
            raise self._error(err, feeds) from err

    def _error(self, err: Exception, feeds: dict[str, Any]) -> BackendError:
        names = set(self.input_names)
        missing = [n for n in self.input_names if n not in feeds]
        unexpected = [n for n in feeds if n not in names]
        hints = []
        if missing:
            hints.append(f"missing feed(s) {', '.join(map(repr, missing))}")
        if unexpected:
            hints.append(f"unexpected feed(s) {', '.join(map(repr, unexpected))}")
        given = (
            ", ".join(f"{k}: {_describe_feed(v)}" for k, v in feeds.items()) or "none"
        )
        expected = ", ".join(_describe_input(arg) for arg in self.session.get_inputs())
        hint = f" ({'; '.join(hints)})" if hints else ""
        return BackendError(
            f"ONNX Runtime could not run segment {self.name!r} on {self.device}: "
            f"{_clean(err)}{hint}. Feeds given: {given}. Inputs expected: {expected}. "
            "Pass one array per expected input with that dtype and shape."
        )


class OrtBackend:
    """Compiles segments into ONNX Runtime sessions (see the module docstring).

    Attributes:
        name: ``"ort"``.
        device_kinds: The device kinds it compiles for.
    """

    name = "ort"
    device_kinds = ("cpu", "cuda")

    def __repr__(self) -> str:
        return "OrtBackend()"

    @property
    def version(self) -> str:
        """``"onnxruntime-<version>"``."""
        return f"onnxruntime-{_ort().__version__}"

    def target(self, device: Device | str) -> str:
        """Returns ``"cpu"`` for every ``cpu:N`` and ``"cuda:N"`` for GPUs.

        Raises:
            BackendError: ``device`` is a TPU core.
        """
        device = parse_device(device)
        if device.kind == "tpu":
            raise BackendError(
                f"backend 'ort' cannot run on {device}: TPU-like devices are "
                "compiled whole by TVM; use backend 'tvm' for tpu devices"
            )
        return "cpu" if device.kind == "cpu" else str(device)

    def compile(
        self,
        model: onnx.ModelProto,
        device: Device | str,
        *,
        threads: int | None = None,
        cache_dir: Path | None = None,
        shared: dict[str, Any] | None = None,
    ) -> OrtExecutable:
        """Creates a session for ``model`` on ``device``.

        Args:
            model: The segment (not modified; its IR version is lowered on a
                copy when ONNX Runtime cannot read it).
            device: ``cpu:N`` or an available ``cuda:N``.
            threads: Intra-op threads; ``None`` means all host cores.
            cache_dir: Where the optimized model is persisted and reused from;
                ``None`` disables the disk cache (so does a segment of more than
                :data:`OFFLINE_MAX_NODES` nodes).
            shared: Not used (sessions share nothing).

        Raises:
            BackendError: The model is invalid or ONNX Runtime cannot load
                it, or the device is a TPU core.
            DeviceError: The device is a GPU this machine does not have.
        """
        device = parse_device(device)
        self.target(device)
        check_available(device)
        name = model.graph.name or "<unnamed>"
        threads = threads or host_cores()
        pattern = not _micro_batched(model)
        if cache_dir is not None and len(model.graph.node) > OFFLINE_MAX_NODES:
            logger.info("segment %s has %d nodes (> %d): compiled without the offline optimized model",
                        name, len(model.graph.node), OFFLINE_MAX_NODES)
            cache_dir = None
        if cache_dir is not None:
            cached = self._load_cached(cache_dir, name, device, threads, pattern)
            if cached is not None:
                stats.increment("disk_cache_hits")
                return cached
        data = prepare_model(model).SerializeToString()
        if cache_dir is not None:
            data = self._optimize_to_disk(data, cache_dir, name, device, threads)
        session = self._session(data, name, device, threads, pattern=pattern)
        stats.increment("compiles")
        return OrtExecutable(session, name, device)

    def _options(self, threads: int, level: str = "ORT_ENABLE_ALL") -> Any:
        ort = _ort()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.log_severity_level = 3
        use_shared_arena(ort, options)  # one CPU arena for all segments' sessions (graphdist/backends/ort_memory.py)
        return options

    @staticmethod
    def _providers(device: Device) -> list[Any]:
        if device.kind == "cuda":
            return [
                ("CUDAExecutionProvider", {"device_id": str(device.index)}),
                "CPUExecutionProvider",
            ]
        return ["CPUExecutionProvider"]

    def _session(
        self,
        data: bytes,
        name: str,
        device: Device,
        threads: int,
        options: Any = None,
        pattern: bool = True,
    ) -> onnxruntime.InferenceSession:
        """Creates a session from serialized model bytes, wrapping failures (``pattern``: ONNX Runtime's
        memory pattern, see :func:`_micro_batched`).
        """
        if options is None:
            options = self._options(threads)
            options.enable_mem_pattern = pattern
        try:
            session = _ort().InferenceSession(
                data,
                sess_options=options,
                providers=self._providers(device),
                enable_fallback=0,  # no silent provider switch, no prints
                disabled_optimizers=list(DISABLED_OPTIMIZERS),
            )
        except Exception as err:
            raise BackendError(
                f"ONNX Runtime cannot load segment {name!r} for {device}: {_clean(err)}. "
                "Check the segment with onnx.checker.check_model(model, full_check=True)."
            ) from err
        if (
            device.kind == "cuda"
            and "CUDAExecutionProvider" not in session.get_providers()
        ):
            raise BackendError(
                f"ONNX Runtime could not start its CUDA provider for {device} "
                f"(providers started: {session.get_providers()}); check that the "
                "CUDA and cuDNN libraries onnxruntime-gpu needs are installed, or "
                f"use 'cpu:{device.index}'"
            )
        return session

    def _optimize_to_disk(
        self, data: bytes, cache_dir: Path, name: str, device: Device, threads: int
    ) -> bytes:
        """Has ONNX Runtime save the EXTENDED-optimized model in ``cache_dir``.

        Returns:
            The optimized model's bytes, or ``data`` unchanged when the cache
            directory cannot be written, or another user could write it
            (:func:`~graphdist.backends.base.cache_entry_allowed`; the compile
            then goes on without the disk cache).
        """
        if not cache_entry_allowed(cache_dir):
            return data
        final = cache_dir / OPTIMIZED_MODEL_FILE
        tmp = cache_dir / f".{uuid.uuid4().hex}.tmp.onnx"
        options = self._options(threads, "ORT_ENABLE_EXTENDED")
        options.optimized_model_filepath = str(tmp)
        options.add_session_config_entry("session.save_model_format", "ONNX")
        try:
            make_cache_dir(cache_dir)
            self._session(data, name, device, threads, options)
            optimized = tmp.read_bytes()
            tmp.replace(final)
            write_artifact_checksum(final)
        except OSError as err:
            logger.warning(
                "cannot write the ONNX Runtime disk cache in %s: %s", cache_dir, err
            )
            return data
        except BackendError as err:
            # An invalid model fails again, with this message, when the caller
            # creates its session from ``data``; a valid one runs uncached.
            logger.debug("ONNX Runtime did not save an optimized model: %s", err)
            return data
        finally:
            with contextlib.suppress(OSError):  # a leftover temporary file is harmless
                tmp.unlink(missing_ok=True)
        return optimized

    def _load_cached(
        self, cache_dir: Path, name: str, device: Device, threads: int, pattern: bool = True
    ) -> OrtExecutable | None:
        """Returns an executable from a valid cached optimized model, else
        ``None`` after discarding whatever invalid files were there.
        """
        path = cache_dir / OPTIMIZED_MODEL_FILE
        data = read_verified_artifact(path, "cached model")
        if data is None:
            return None
        try:
            session = self._session(data, name, device, threads, pattern=pattern)
        except BackendError as err:
            logger.warning(
                "cached model %s cannot be loaded (%s); recompiling", path, err
            )
            discard_artifact(path)
            return None
        return OrtExecutable(session, name, device)



def _direct_run(session: onnxruntime.InferenceSession) -> Any:
    """``session.run`` without the Python wrapper's feed check, which is quadratic in the number of inputs.

    ``InferenceSession.run`` (onnxruntime 1.31) first looks up every input
    name in a *list* of the feed names: 1.25 s per call for a segment with
    20,000 inputs (a model whose 20,000 weights are variables), against
    0.025 s for the run itself. The C++ session it then calls checks the
    feeds as well (a missing or unknown input is an error naming it, which
    :meth:`OrtExecutable.run` reports), and graphdist uses neither of the
    wrapper's other duties (provider fallback is disabled; feeds are numpy
    arrays, not ``OrtValue`` s of another session). Falls back to
    ``session.run`` where the C++ session is not reachable.
    """
    raw = getattr(session, "_sess", None)
    if raw is None or not callable(getattr(raw, "run", None)):
        return session.run

    def run(output_names: list[str], feeds: dict[str, Any]) -> list[np.ndarray]:
        return raw.run(output_names, feeds, None)

    return run


def _micro_batched(model: onnx.ModelProto) -> bool:
    """Whether the segment computes several micro-batches (gradient accumulation, marked by
    ``graphdist.compile.plan``). ONNX Runtime's memory pattern allocates one block for the whole
    run's planned tensors, which keeps every micro-batch's activations; without it each is freed when
    its last reader ends: measured on MLP 784-2048-2048-10, 8 micro-batches of 1024 rows, peak RSS 796 ->
    505 MiB at the same step time (BENCHMARKS.md "Gradient accumulation").
    """
    return any(prop.key == MICRO_BATCHES_KEY for prop in model.metadata_props)
