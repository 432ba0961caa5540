"""Backends: compile ONNX segments into executables for a device.

``get_backend(name)`` returns a registered backend: ``"ort"`` (ONNX Runtime,
the default, or ``$GRAPHDIST_BACKEND``), ``"reference"`` (``onnx.reference``,
slow, a correctness oracle) or ``"tvm"`` (Apache TVM: llvm, cuda, simulated
tpu). Compile through a :class:`CompileCache`
(``default_cache()``) so a segment is compiled once per process and its
artefacts are reused from disk by later processes::

    backend = get_backend()
    executable = default_cache().get_or_compile(backend, model, parse_device("cpu:0"))
    outputs = executable.run({"x": x})
"""

from graphdist.backends.base import (
    Backend,
    CompileCache,
    Executable,
    available_backends,
    cache_dir,
    default_cache,
    get_backend,
    prepare_model,
    register_backend,
)
from graphdist.backends.ort import OrtBackend
from graphdist.backends.reference import ReferenceBackend
from graphdist.backends.reference_ops import graphdist_reference_ops
from graphdist.backends.tvm import TvmBackend

__all__ = [
    "Backend",
    "CompileCache",
    "Executable",
    "OrtBackend",
    "ReferenceBackend",
    "TvmBackend",
    "available_backends",
    "cache_dir",
    "default_cache",
    "get_backend",
    "prepare_model",
    "register_backend",
]

register_backend(OrtBackend())
register_backend(ReferenceBackend(custom_ops=graphdist_reference_ops()))
register_backend(TvmBackend())
