"""Apache TVM backend (``"tvm"``): ONNX segment -> Relax -> target code -> Relax VM.

Pipeline (TVM 0.27, pinned in ``pyproject.toml``; its API changes between
releases):

1. The segment is prepared for TVM's ONNX frontend
   (:func:`graphdist.backends.tvm_onnx.prepare_for_tvm`): transposed matmuls
   become one ``Einsum``, and the ops where TVM's semantics differ from
   numpy's (NaN in ``Max``/``Min``/``Clip``, boolean ``Equal``, integer
   ``Pow``) are rewritten.
2. ``tvm.relax.frontend.onnx.from_onnx(model, keep_params_in_input=False)``:
   initializers become constants (the shapes and axes the frontend must see
   statically), graph inputs stay function parameters in ONNX order.
3. Target pipeline:

   * ``cpu:N`` -> ``llvm`` for the host CPU (``-mcpu`` from LLVM's host
     detection): legalize, fuse (``FuseOps``/``FuseTIR``), then the
     hand-written schedules of :mod:`graphdist.backends.tvm_schedules`
     (register-tiled vectorized matmul, parallel elementwise, reductions).
     ``GRAPHDIST_TVM_SCHEDULES=none`` leaves TVM's default code (slow; for
     comparisons). With ``GRAPHDIST_TVM_TUNE=<trials>`` MetaSchedule tunes the segment
     instead (``tune_relax`` with that trial budget, database in
     ``<cache dir>/tvm-tuning``, shared by all segments and reused by later
     runs when no other user can write it, else a temporary one), and the
     tuned records are applied by ``compile_relax``; any function tuning did
     not cover keeps the hand-written schedule.
   * ``cuda:N`` -> ``cuda`` with dlight's default GPU rules. Code generation
     needs no GPU (:func:`build` + :meth:`BuiltModule.export` work anywhere);
     running needs one.
   * ``tpu:N`` -> the TPU-like target. No TPU-like hardware exists on this
     machine: its cores are simulated on the host. A tpu segment is a whole
     replica step (TPUStrategy compiles whole steps), built for ``llvm`` with
     the CPU schedules, and each simulated core runs it with its share of the
     host's threads.

4. ``tvm.compile`` -> ``relax.VirtualMachine`` on the host (or CUDA) device.

Disk cache: the built module is exported with ``export_library`` to
``module.so`` in the segment's cache directory (temporary name, then an
atomic rename), with its SHA-256 and cache key in ``module.so.sha256``, only
when the cache directory is private to this user (owned by them, not
writable by group or others, no symbolic links; otherwise no ``.so`` is loaded
from it or written to it, with a warning: see
:func:`graphdist.backends.base.cache_entry_allowed`). A later process
with the same cache key (segment bytes, target, TVM version, schedule version)
loads it with ``tvm.runtime.load_module`` instead of compiling
(``disk_cache_hits`` instead of ``compiles`` in :mod:`graphdist.stats`). A
missing checksum, a mismatch, a library that does not load, or one that loads
but is no Relax executable (the VM cannot start on it: "Module has no function
'vm_load_executable'") is discarded with a warning and the segment is compiled
again.

Shared builds: segments that differ only in their names (the replicas of a
step traced once and replicated by ``ReplicatePass`` compute the same thing
on different devices) share one build per compile cache: a segment's
*structure key* hashes it with every value and node name replaced by its
position, and a second segment with the same key gets its own VM on the
library already built (``shared_builds`` in :mod:`graphdist.stats`).

Threads: TVM's parallel loops run on a thread pool that belongs to the
calling thread. An executable sizes the pool of the thread that runs it to its
thread budget (``runtime.config_threadpool``) so that logical devices running
side by side share the cores instead of oversubscribing them.

ONNX Runtime fallback (:mod:`graphdist.backends.tvm_fallback`): a segment
with an op TVM's frontend cannot convert, or an op on the denylist of forms
TVM 0.27 computes wrong or cannot build, is compiled by the ``ort`` backend
instead (``TvmBackend.compile`` returns a
:class:`~graphdist.backends.tvm_fallback.FallbackExecutable`), with a warning
on this module's logger naming the op and the segment (once per op type per
process; ``tvm_fallbacks`` in :mod:`graphdist.stats`). Segments on ``tpu:N``
have no fallback: they raise :class:`BackendError` naming the op.

Errors of TVM never reach the user unwrapped: an op the frontend cannot
convert (:class:`TvmConversionError`, where there is no fallback), or a failed
build, raises :class:`BackendError` naming the segment and the op.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import logging
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphdist import stats
from graphdist.backends.base import (
    cache_dir,
    cache_entry_allowed,
    discard_artifact,
    make_cache_dir,
    read_verified_artifact,
    write_artifact_checksum,
)
from graphdist.backends.tvm_fallback import (
    FallbackExecutable,
    TvmConversionError,
    Unsupported,
    compile_on_ort,
    unsupported_nodes,
)
from graphdist.backends.tvm_onnx import prepare_for_tvm
from graphdist.errors import BackendError
from graphdist.runtime.buffers import aligned, is_aligned
from graphdist.runtime.devices import Device, check_available, host_cores, parse_device

if TYPE_CHECKING:
    import onnx

__all__ = [
    "structure_key",
    "MODULE_FILE",
    "SCHEDULE_VERSION",
    "BuiltModule",
    "TvmBackend",
    "TvmConversionError",
    "TvmExecutable",
    "build",
    "hand_schedules_enabled",
    "tune_trials",
]

logger = logging.getLogger(__name__)

#: File name of the exported module in a segment's cache directory.
MODULE_FILE = "module.so"
#: Bumped by hand when TVM's pipeline changes what is generated; the source of this module and of the
#: schedules and rewrites it uses is hashed into the cache key as well (:func:`_code_version`).
SCHEDULE_VERSION = "2"
#: Default CUDA architecture when no GPU is present to ask (Ampere; any ``sm_XX`` can be given).
DEFAULT_CUDA_ARCH = "sm_80"
#: Byte alignment TVM requires of a buffer it reads without copying.
_CONVERT_ERROR = re.compile(r"Error converting operator (\w+)")
_NOT_SUPPORTED = re.compile(r"operators are not supported for frontend ONNX: ([\w, ]+)")
@functools.cache
def _tvm() -> Any:
    """Imports tvm on first use (about a second; most processes never need it); cached, as every segment
    call asks for it.
    """
    # TVM's thread pool otherwise pins the calling thread to core 0 when it is configured: the user's
    # main thread (and every thread it starts later, ONNX Runtime's included) would then share one
    # core, and so would the scheduler's device threads. Unpinned, they keep the process's affinity
    # (graphdist launch's per-worker cores included). A user's own setting wins.
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    try:
        import tvm
        from tvm import relax  # noqa: F401 - registers the relax namespace on the tvm module
    except ImportError as err:  # an optional dependency: the base install runs ONNX Runtime only
        raise BackendError(f"the tvm backend needs Apache TVM, which is not installed here ({err}); install it "
                           "with `pip install 'graphdist[tvm]'`, or use backend='ort' (the default)") from None
    return tvm


@functools.cache
def _code_version() -> str:
    """Short hash of the modules that decide the generated code (a changed schedule invalidates the cache)."""
    from graphdist.backends import tvm_onnx, tvm_schedules

    digest = hashlib.sha256()
    from graphdist.backends import tvm_fallback, tvm_legalize

    for module in (sys.modules[__name__], tvm_onnx, tvm_schedules, tvm_fallback, tvm_legalize):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:10]


def tune_trials() -> int:
    """Returns the MetaSchedule trial budget from ``GRAPHDIST_TVM_TUNE`` (0: hand-written schedules).

    Raises:
        BackendError: The variable is not a non-negative integer.
    """
    text = os.environ.get("GRAPHDIST_TVM_TUNE", "").strip()
    if not text:
        return 0
    try:
        trials = int(text)
    except ValueError:
        trials = -1
    if trials < 0:
        raise BackendError(
            f"GRAPHDIST_TVM_TUNE={text!r} is not a trial count; set it to a non-negative integer "
            "(e.g. GRAPHDIST_TVM_TUNE=64) or unset it to use the hand-written schedules"
        )
    return trials


# ---------------------------------------------------------------------------- targets


@functools.cache
def _host_cpu() -> str:
    """LLVM's name for the host CPU (``skylake-avx512``, ``znver3``...), or ``""`` when unknown."""
    tvm = _tvm()
    get = tvm.get_global_func("target.llvm_get_system_cpu", allow_missing=True)
    try:
        return str(get()) if get is not None else ""
    except Exception:  # noqa: BLE001 - unknown host CPU: generic code
        return ""


def _llvm_target(threads: int | None = None) -> Any:
    tvm = _tvm()
    spec: dict[str, Any] = {"kind": "llvm", "num-cores": threads or host_cores()}
    cpu = _host_cpu()
    if cpu and cpu != "generic":
        spec["mcpu"] = cpu
    return tvm.target.Target(spec)


def _cuda_target(arch: str | None = None) -> Any:
    tvm = _tvm()
    if arch is None:
        arch = DEFAULT_CUDA_ARCH
        device = tvm.cuda(0)
        if device.exist:
            arch = "sm_" + device.compute_version.replace(".", "")
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host=_llvm_target())


def _target_for(kind: str, threads: int | None = None, cuda_arch: str | None = None) -> Any:
    if kind == "cuda":
        return _cuda_target(cuda_arch)
    return _llvm_target(threads)


# ---------------------------------------------------------------------------- building


@dataclass
class BuiltModule:
    """A segment compiled by TVM (not yet loaded on a device).

    Attributes:
        executable: TVM's relax executable.
        kind: Device kind it was built for (``cpu``, ``cuda``, ``tpu``).
        target: The TVM target.
        seconds: Build time (tuning included).
        tuned_trials: MetaSchedule trials used (0: hand-written schedules).
    """

    executable: Any
    kind: str
    target: Any
    seconds: float
    tuned_trials: int = 0

    def export(self, path: str | Path) -> Path:
        """Writes the module as a shared library (``export_library``), atomically.

        Returns:
            The written path.

        Raises:
            BackendError: TVM could not link or write the library.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{uuid.uuid4().hex}.tmp{path.suffix}")
        try:
            self.executable.export_library(str(tmp))
            tmp.replace(path)
        except Exception as err:
            tmp.unlink(missing_ok=True)
            raise BackendError(f"TVM could not export the {self.kind} module to {path}: {_first_line(err)}") from err
        return path


def build(model: onnx.ModelProto, device: Device | str = "cpu:0", *, threads: int | None = None,
          cuda_arch: str | None = None, tune: int | None = None) -> BuiltModule:
    """Compiles ``model`` with TVM for ``device``'s kind without needing the device.

    Args:
        model: The ONNX segment (not modified).
        device: ``cpu:N``, ``cuda:N`` or ``tpu:N``; only its kind matters.
        threads: Thread count the CPU code is built for.
        cuda_arch: CUDA architecture (``"sm_90"``); default: the GPU's, else ``sm_80``.
        tune: MetaSchedule trials for CPU targets; ``None`` reads ``GRAPHDIST_TVM_TUNE``.

    Raises:
        TvmConversionError: The frontend cannot convert an op, or an op is on the fallback's denylist.
        BackendError: TVM fails to build.
    """
    device = parse_device(device)
    tvm = _tvm()
    name = model.graph.name or "<unnamed>"
    trials = tune_trials() if tune is None else tune
    start = time.perf_counter()
    mod = _import_onnx(model, name)
    target = _target_for(device.kind, threads, cuda_arch)
    try:
        if device.kind == "cuda":
            executable = _build_cuda(tvm, mod, target)
            trials = 0
        elif trials > 0:
            executable = _build_tuned(tvm, mod, target, trials, name)
        else:
            executable = _build_cpu(tvm, mod, target)
    except BackendError:
        raise
    except Exception as err:
        raise BackendError(
            f"TVM could not build segment {name!r} for {device.kind} ({target.kind.name}): {_first_line(err)}. "
            "Use backend 'ort' for this segment, or report the op pattern."
        ) from err
    return BuiltModule(executable, device.kind, target, time.perf_counter() - start, trials)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def _import_onnx(model: onnx.ModelProto, name: str) -> Any:
    from tvm.relax.frontend.onnx import from_onnx

    prepared = prepare_for_tvm(model)
    denied = unsupported_nodes(prepared)
    if denied:
        described = "; ".join(f"op {u.op!r} (node {u.node!r}): {u.reason}" for u in denied)
        raise TvmConversionError(f"TVM cannot run segment {name!r} correctly: {described}", tuple(denied))
    # The frontend prints "Error converting operator X, with inputs: ..." to stdout before re-raising
    # the converter's bare exception: captured here, so the op is named in the error and nothing leaks.
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return from_onnx(prepared, keep_params_in_input=False)
    except Exception as err:
        match = _CONVERT_ERROR.search(printed.getvalue())
        listed = _NOT_SUPPORTED.search(str(err))
        ops = [match.group(1)] if match else [op.strip() for op in listed.group(1).split(",")] if listed else []
        op = f" op {', '.join(map(repr, ops))}" if ops else ""
        reason = f"TVM's ONNX frontend cannot convert it: {_first_line(err)}"
        nodes = {op_type: next((n.name for n in prepared.graph.node if n.op_type == op_type), "") for op_type in ops}
        raise TvmConversionError(
            f"TVM's ONNX frontend cannot convert segment {name!r}{op}: {_first_line(err)}. "
            "Use backend 'ort' or 'reference' for this function.",
            tuple(Unsupported(op_type, node, reason) for op_type, node in nodes.items()),
        ) from err


def _legalize(tvm: Any) -> Any:
    """TVM's legalization with graphdist's overrides (:mod:`graphdist.backends.tvm_legalize`)."""
    from graphdist.backends.tvm_legalize import legalize_overrides

    return tvm.relax.transform.LegalizeOps(customize_legalize_map=legalize_overrides())


def _cpu_passes(tvm: Any) -> Any:
    relax = tvm.relax
    return tvm.transform.Sequential([
        _legalize(tvm),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])


def hand_schedules_enabled() -> bool:
    """False when ``GRAPHDIST_TVM_SCHEDULES=none``: TVM's default (serial, unvectorized) CPU code, for
    benchmarks and for telling a schedule bug from a TVM bug.
    """
    return os.environ.get("GRAPHDIST_TVM_SCHEDULES", "").strip().lower() not in ("none", "0", "off")


def _build_cpu(tvm: Any, mod: Any, target: Any) -> Any:
    from tvm.s_tir import dlight

    from graphdist.backends.tvm_schedules import cpu_rules

    with target:
        mod = _cpu_passes(tvm)(mod)
        if hand_schedules_enabled():
            mod = dlight.ApplyDefaultSchedule(*cpu_rules())(mod)
    return tvm.compile(mod, target)


def _build_cuda(tvm: Any, mod: Any, target: Any) -> Any:
    from tvm.s_tir import dlight

    gpu = dlight.gpu
    with target:
        mod = tvm.relax.get_pipeline("zero")(_legalize(tvm)(mod))
        mod = dlight.ApplyDefaultSchedule(gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(),
                                          gpu.Fallback())(mod)
    return tvm.compile(mod, target)


def _tuning_dir() -> Path:
    return cache_dir() / "tvm-tuning"


@contextlib.contextmanager
def _tuning_work_dir() -> Iterator[Path]:
    """Where MetaSchedule keeps its database: ``<cache dir>/tvm-tuning`` when no other user could have written
    records there (they decide the generated code: :func:`~graphdist.backends.base.cache_entry_allowed`, which
    warns otherwise), else a fresh private temporary directory, deleted afterwards.
    """
    work_dir = _tuning_dir()
    if cache_entry_allowed(work_dir):
        make_cache_dir(work_dir)
        yield work_dir
        return
    with tempfile.TemporaryDirectory(prefix="graphdist-tvm-tuning-") as scratch:
        yield Path(scratch)


def _missing_modules(*names: str) -> list[str]:
    """The named modules that cannot be imported (optional dependencies not installed)."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def _build_tuned(tvm: Any, mod: Any, target: Any, trials: int, name: str) -> Any:
    """MetaSchedule: tune the fused module, then compile the original module with the database.

    As measured (PLATFORM-NOTES), ``compile_relax`` must get the module as the
    frontend produced it: given the already fused module it silently applies
    nothing.
    """
    missing = _missing_modules("xgboost", "psutil", "cloudpickle")
    if missing:
        raise BackendError(f"GRAPHDIST_TVM_TUNE needs MetaSchedule's {', '.join(missing)}, not installed here; "
                           "install them with `pip install 'graphdist[tune]'`, or unset GRAPHDIST_TVM_TUNE")
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.dlight import ApplyDefaultSchedule

    from graphdist.backends.tvm_schedules import cpu_rules

    with target:
        fused = _cpu_passes(tvm)(mod)
    start = time.perf_counter()
    # A smaller population than MetaSchedule's default (512): on 2 cores the default spends minutes
    # evolving candidates before the first measurement of a small budget.
    search = ms.search_strategy.EvolutionarySearch(population_size=64, init_min_unmeasured=16, genetic_num_iters=2)
    with _tuning_work_dir() as work_dir, _loggers_kept():
        logger.info("tuning segment %r with MetaSchedule: %d trials (database %s)", name, trials, work_dir)
        database = ms.relax_integration.tune_relax(
            mod=fused, params={}, target=target, work_dir=str(work_dir), max_trials_global=trials,
            num_trials_per_iter=min(64, trials), strategy=search,
        )
    logger.info("tuned segment %r in %.1f s", name, time.perf_counter() - start)
    stats.increment("tvm_tuning_runs")
    with target, database, tvm.transform.PassContext(opt_level=3, config={"relax.backend.use_cuda_graph": False}):
        applied = _cpu_passes(tvm)(mod)
        applied = tvm.relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(applied)
        applied = ApplyDefaultSchedule(*cpu_rules())(applied)
    return tvm.compile(applied, target)


@contextlib.contextmanager
def _loggers_kept() -> Iterator[None]:
    """Undoes what MetaSchedule's ``logging.config.dictConfig`` does to the process's other loggers: it
    disables every logger that exists (``disable_existing_loggers``), graphdist's and the user's included.
    """
    before = {name: logger.disabled for name, logger in logging.Logger.manager.loggerDict.items()
              if isinstance(logger, logging.Logger)}
    try:
        yield
    finally:
        for name, disabled in before.items():
            logging.getLogger(name).disabled = disabled


# ---------------------------------------------------------------------------- executables

_thread_pool_size = threading.local()


def _size_thread_pool(threads: int) -> None:
    """Sizes the calling thread's TVM worker pool (TVM keeps one pool per calling thread)."""
    if getattr(_thread_pool_size, "value", None) == threads:
        return
    configure = _tvm().get_global_func("runtime.config_threadpool", allow_missing=True)
    if configure is not None:
        configure(0, threads)  # mode 0: all cores (pinning is off, see _tvm)
    _thread_pool_size.value = threads


class TvmExecutable:
    """A segment loaded on the Relax VM.

    Attributes:
        name: The segment's graph name.
        device: The device it runs on.
        input_names: Graph input names, in order (the Relax function's parameters).
        output_names: Graph output names, in order.
        input_types: ``(dtype, shape)`` expected per input.
        library: The loaded runtime module (exposed for tests and benchmarks).
    """

    def __init__(self, library: Any, model: onnx.ModelProto, device: Device, threads: int) -> None:
        tvm = _tvm()
        self.library = library
        self.name = model.graph.name or "<unnamed>"
        self.device = device
        self.threads = threads
        initializers = {init.name for init in model.graph.initializer}
        graph_inputs = [value for value in model.graph.input if value.name not in initializers]
        self.input_names = [value.name for value in graph_inputs]
        self.output_names = [value.name for value in model.graph.output]
        self.input_types = {value.name: _value_type(value) for value in graph_inputs}
        self._tvm_device = tvm.cuda(device.index) if device.kind == "cuda" else tvm.cpu(0)
        self._vm = tvm.relax.VirtualMachine(library, self._tvm_device)
        self._main = self._vm["main"]
        self._lock = threading.Lock()  # one VM: calls on it are serialized
        self._zero_copy = device.kind != "cuda"  # host memory: numpy and TVM can share buffers

    def __repr__(self) -> str:
        return f"TvmExecutable({self.name!r}, device={str(self.device)!r})"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the segment on ``feeds`` (one array per input name).

        Raises:
            BackendError: A feed is missing, has the wrong dtype or shape, or TVM failed.
        """
        args = [self._tensor(self._feed(name, feeds)) for name in self.input_names]
        with self._lock:
            _size_thread_pool(self.threads)
            try:
                result = self._main(*args)
            except Exception as err:
                raise BackendError(f"TVM failed running segment {self.name!r} on {self.device}: "
                                   f"{_first_line(err)}") from err
        outputs = [result] if hasattr(result, "numpy") else list(result)
        if self._zero_copy:
            # The arrays keep TVM's buffers alive (DLPack), so the VM cannot hand them out again.
            return [np.from_dlpack(out) for out in outputs]
        return [np.asarray(out.numpy()) for out in outputs]

    def _tensor(self, value: np.ndarray) -> Any:
        runtime = _tvm().runtime
        # TVM rejects the strides numpy gives empty arrays.
        if not self._zero_copy or not value.size:
            return runtime.tensor(value, self._tvm_device)
        if not (is_aligned(value) and value.flags.writeable):
            # DLPack cannot mark a read-only export, and TVM needs 64-byte alignment: one aligned numpy
            # copy (several times cheaper than TVM's own upload for the small feeds of a step).
            value = aligned(value, copy=not value.flags.writeable)
        # No copy: TVM reads numpy's buffer (variables and TVM's own outputs are aligned already).
        return runtime.from_dlpack(value)

    def _feed(self, name: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
        if name not in feeds:
            expected = ", ".join(f"{n}: {d}{_dims(s)}" for n, (d, s) in self.input_types.items())
            raise BackendError(f"segment {self.name!r} on {self.device}: missing feed {name!r}. "
                               f"Inputs expected: {expected}.")
        value = np.asarray(feeds[name])
        dtype, shape = self.input_types[name]
        if value.dtype != dtype or len(value.shape) != len(shape) or any(
                want is not None and got != want for got, want in zip(value.shape, shape)):
            raise BackendError(
                f"segment {self.name!r} on {self.device}: feed {name!r} is {value.dtype}{list(value.shape)}, "
                f"expected {dtype}{_dims(shape)}; pass an array of that dtype and shape"
            )
        # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
        return value if value.flags.c_contiguous else value.copy(order="C")


def _value_type(value: Any) -> tuple[np.dtype, tuple[int | None, ...]]:
    """The dtype and shape of a graph input; symbolic dimensions are ``None``."""
    from onnx.helper import tensor_dtype_to_np_dtype

    tensor = value.type.tensor_type
    shape = tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in tensor.shape.dim)
    return np.dtype(tensor_dtype_to_np_dtype(tensor.elem_type)), shape


def _dims(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class TvmBackend:
    """Compiles segments with Apache TVM (see the module docstring).

    Attributes:
        name: ``"tvm"``.
        device_kinds: The device kinds it compiles for.
    """

    name = "tvm"
    device_kinds = ("cpu", "cuda", "tpu")

    def __repr__(self) -> str:
        return "TvmBackend()"

    @property
    def version(self) -> str:
        """``"tvm-<version>-s<schedule version>[-tuned<trials>]"`` (part of the cache key)."""
        trials = tune_trials()
        tuned = f"-tuned{trials}" if trials else ""
        schedules = "" if hand_schedules_enabled() else "-noschedules"
        return f"tvm-{_tvm().__version__}-s{SCHEDULE_VERSION}.{_code_version()}{schedules}{tuned}"

    def target(self, device: Device | str) -> str:
        """``"llvm"`` for ``cpu:N``, ``"cuda:N"`` for GPUs, ``"tpu"`` for the simulated TPU-like cores,
        each followed by the host CPU the code is built for (``"llvm -mcpu=znver4"``).

        Part of the cache key: all three build host code for this CPU (the GPU's too, around its
        kernels), so a cache copied between an Intel and an AMD host never runs the other's code.
        """
        device = parse_device(device)
        kind = "llvm" if device.kind == "cpu" else "tpu" if device.kind == "tpu" else str(device)
        cpu = _host_cpu()
        return f"{kind} -mcpu={cpu}" if cpu else kind

    def compile(self, model: onnx.ModelProto, device: Device | str, *, threads: int | None = None,
                cache_dir: Path | None = None,
                shared: dict[str, Any] | None = None) -> TvmExecutable | FallbackExecutable:
        """Builds (or loads from ``cache_dir``) ``model`` for ``device`` and loads it on the VM.

        A segment TVM cannot convert correctly (:class:`TvmConversionError`) is compiled by the ``ort``
        backend instead (with a warning; its artefacts in ``cache_dir/ort-fallback``), except on
        ``tpu:N``.

        Raises:
            BackendError: TVM cannot build the segment; or it cannot convert it and the device is a
                ``tpu:N`` or ONNX Runtime cannot run it either.
            DeviceError: The device is a GPU this machine does not have (use :func:`build` to
                generate its code anyway).
        """
        device = parse_device(device)
        if device.kind == "cuda":
            check_available(device)
        threads = threads or host_cores()
        name = model.graph.name or "<unnamed>"
        key = f"tvm/{structure_key(model, self.target(device), self.version, threads)}"
        library = shared.get(key) if shared is not None else None
        if library is not None:
            stats.increment("shared_builds")
            return TvmExecutable(library, model, device, threads)
        if cache_dir is not None:
            cached = _executable_from_cache(cache_dir, model, device, threads)
            if cached is not None:
                stats.increment("disk_cache_hits")
                if shared is not None:
                    shared[key] = cached.library
                return cached
        try:
            built = build(model, device, threads=threads)
        except TvmConversionError as err:
            return compile_on_ort(model, device, threads, cache_dir, err)
        stats.increment("compiles")
        logger.debug("built segment %r for %s in %.2f s", name, device, built.seconds)
        if cache_dir is not None:
            _store(built, cache_dir, name)
        if shared is not None:
            shared[key] = built.executable
        return TvmExecutable(built.executable, model, device, threads)


def structure_key(model: onnx.ModelProto, target: str, version: str, threads: int) -> str:
    """The SHA-256 of ``model`` with every value named by its first position and nodes unnamed (its
    computation, not its names), with the target, version and thread budget it is built for.
    """
    import onnx as onnx_module

    canonical = onnx_module.ModelProto()
    canonical.CopyFrom(model)
    graph = canonical.graph
    names: dict[str, str] = {}

    def rename(name: str) -> str:
        return "" if not name else names.setdefault(name, f"v{len(names)}")

    graph.name, graph.doc_string = "", ""
    for value in [*graph.input, *graph.initializer]:
        value.name = rename(value.name)
    for node in graph.node:
        node.name = ""
        node.ClearField("metadata_props")
        node.input[:] = [rename(n) for n in node.input]
        node.output[:] = [rename(n) for n in node.output]
    for value in [*graph.output, *graph.value_info]:
        value.name = rename(value.name)
    digest = hashlib.sha256(canonical.SerializeToString(deterministic=True))
    for part in (target, version, str(threads)):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


def _store(built: BuiltModule, directory: Path, name: str) -> None:
    """Exports ``built`` into the disk cache (a failure is logged: the compile goes on uncached).

    The caller keeps running the in-memory module: loading the file just written would be
    redundant, and the dynamic loader returns an already opened library for a path it has seen.
    """
    path = directory / MODULE_FILE
    if not cache_entry_allowed(directory):
        return
    try:
        make_cache_dir(directory)
        built.export(path)
        write_artifact_checksum(path)
    except (OSError, BackendError) as err:
        logger.warning("cannot write the TVM disk cache for segment %r in %s: %s", name, directory, err)


def _executable_from_cache(directory: Path, model: onnx.ModelProto, device: Device,
                           threads: int) -> TvmExecutable | None:
    """An executable on the cached library, or ``None`` (after discarding a library the VM cannot run)."""
    name = model.graph.name or "<unnamed>"
    library = _load_cached(directory, name)
    if library is None:
        return None
    try:
        return TvmExecutable(library, model, device, threads)
    except Exception as err:  # noqa: BLE001 - whatever TVM raises for a library that is no Relax executable
        logger.warning("cached TVM module %s of segment %r cannot be run (%s); discarded, recompiling",
                       directory / MODULE_FILE, name, _first_line(err))
        discard_artifact(directory / MODULE_FILE)
        return None


def _load_cached(directory: Path, name: str) -> Any:
    """Returns the cached library when its checksum matches, else ``None`` (discarding bad files)."""
    path = directory / MODULE_FILE
    if read_verified_artifact(path, f"cached TVM module of segment {name!r}") is None:
        return None
    try:
        return _tvm().runtime.load_module(str(path))
    except Exception as err:  # noqa: BLE001 - any load failure: compile again
        logger.warning("cached TVM module %s cannot be loaded (%s); recompiling", path, _first_line(err))
        discard_artifact(path)
        return None
