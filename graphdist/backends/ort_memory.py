"""One CPU memory arena for every ONNX Runtime session graphdist creates in a process.

By default each ``InferenceSession`` owns a CPU arena that keeps, after a run, the most memory that
session ever needed. A plan is several sessions (one per segment: per device, per communication phase,
and with FSDP's one-layer-at-a-time order one per layer and phase), so the process keeps the *sum* of
the segments' peaks although they run a few at a time. ONNX Runtime's documented way out is an arena
registered with the environment (``onnxruntime.create_and_register_allocator``) that sessions opt into
with the session option ``session.use_env_allocators = 1``: then the process keeps the most the
segments need at once.

The arena grows by what is requested (``kSameAsRequested``), not by powers of two, so it holds what was
asked for. Measured (``benchmarks/bench_fsdp.py``, 784-4096-4096-4096-10 MLP, Adam, 2 logical CPUs):
peak RSS of FSDP one layer at a time 2,646 MiB -> 1,778 MiB, of Mirrored 2,402 -> 2,196 MiB, step time
unchanged within noise (each session's arena with the default options: 4-5x slower steps without any arena).

``GRAPHDIST_ORT_SHARED_ARENA=0`` turns it off (each session its own arena, ONNX Runtime's default). A
process that registered its own CPU allocator with ONNX Runtime keeps it: graphdist's sessions then share
that one.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from graphdist.errors import InvalidArgumentError

__all__ = ["SHARED_ARENA_ENV", "shared_arena_enabled", "use_shared_arena"]

logger = logging.getLogger(__name__)

#: Environment variable: ``0`` gives every session its own arena (ONNX Runtime's default); ``1`` (default) shares one.
SHARED_ARENA_ENV = "GRAPHDIST_ORT_SHARED_ARENA"

#: ``OrtArenaCfg``'s ``arena_extend_strategy``: 1 is ``kSameAsRequested`` (0, the default, rounds up to powers of two).
_SAME_AS_REQUESTED = 1

_lock = threading.Lock()
_registered = False


def shared_arena_enabled() -> bool:
    """Whether ``GRAPHDIST_ORT_SHARED_ARENA`` asks for the shared arena (yes unless ``0``/``false``/``off``/``no``).

    Raises:
        InvalidArgumentError: The variable holds something other than a boolean word.
    """
    text = os.environ.get(SHARED_ARENA_ENV, "1").strip().lower()
    if text in ("1", "true", "on", "yes", ""):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise InvalidArgumentError(f"{SHARED_ARENA_ENV}={text!r} is not understood; set it to 1 (one CPU arena for all of "
                               "graphdist's ONNX Runtime sessions, the default) or 0 (one arena per session)")


def use_shared_arena(ort: Any, options: Any) -> None:
    """Makes a session created with ``options`` allocate CPU memory from the process's shared arena.

    Registers the arena with ONNX Runtime's environment on first use. Does nothing when switched off.

    Args:
        ort: The ``onnxruntime`` module.
        options: The ``SessionOptions`` of a session about to be created.
    """
    if not shared_arena_enabled():
        return
    _register(ort)
    options.add_session_config_entry("session.use_env_allocators", "1")


def _register(ort: Any) -> None:
    global _registered
    with _lock:
        if _registered:
            return
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        try:
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, _SAME_AS_REQUESTED, -1, -1))
        except Exception as err:  # noqa: BLE001 - the process registered its own: sessions share that one
            logger.debug("ONNX Runtime has a CPU allocator registered already (%s); sessions share it", err)
        _registered = True
