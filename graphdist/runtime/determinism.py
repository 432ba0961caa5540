"""The process-wide op-determinism switch (``gd.config.experimental.enable_op_determinism``).

Steps compiled while it is on cut the global batch into :func:`chunks` fixed
chunks and sum them in one fixed tree (``ChunkBatchReductionsPass``,
``LowerDeterministicReductionsPass``), so their results are the same bits
under any supported strategy and replica count. The switch is read when a
step is compiled: a step compiled before keeps what it was compiled with,
and an exported plan records it.
"""

from __future__ import annotations

import threading

from graphdist.errors import InvalidArgumentError

__all__ = ["DEFAULT_CHUNKS", "enable", "disable", "chunks"]

#: Chunks of the global batch when ``enable_op_determinism()`` names none: replica counts 1, 2, 4 and 8 divide it.
DEFAULT_CHUNKS = 8

_lock = threading.Lock()
_chunks: int | None = None


def enable(chunks: int = DEFAULT_CHUNKS) -> None:
    """Turns op determinism on for the steps compiled from now on.

    Raises:
        InvalidArgumentError: ``chunks`` is not a power of two.
    """
    global _chunks
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1 or chunks & (chunks - 1):
        raise InvalidArgumentError(f"enable_op_determinism: chunks must be a power of two (1, 2, 4, 8, 16...): the "
                                   f"global batch is cut into that many equal chunks, got {chunks!r}")
    with _lock:
        _chunks = chunks


def disable() -> None:
    """Turns op determinism off again (the default)."""
    global _chunks
    with _lock:
        _chunks = None


def chunks() -> int | None:
    """The chunks of the global batch while op determinism is on, else ``None``."""
    return _chunks
