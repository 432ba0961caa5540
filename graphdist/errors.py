"""Exceptions raised by graphdist.

Every error graphdist raises derives from :class:`GraphdistError`. Errors about
a bad argument also derive from ``ValueError`` or ``TypeError`` so that code
written against Python conventions keeps working; :class:`StorageError` (a save
the disk refused) is also an ``OSError``. Messages name the offending
argument, op, shape, file or rank and say how to fix it.
"""

from __future__ import annotations

import errno as errno_codes
import os

__all__ = [
    "GraphdistError",
    "TracingError",
    "AxisError",
    "GraphError",
    "PreconditionError",
    "PostconditionError",
    "PipelineOrderError",
    "InvalidArgumentError",
    "PlanError",
    "BackendError",
    "DeviceError",
    "CheckpointError",
    "ClusterConfigError",
    "CollectiveTimeoutError",
    "StorageError",
    "NumericsError",
]


class GraphdistError(Exception):
    """Base class of every error graphdist raises."""


class TracingError(GraphdistError, TypeError):
    """User code did something a trace cannot represent (data-dependent
    control flow, an unsupported numpy call, a tensor turned concrete).
    """


class AxisError(TracingError, ValueError, IndexError):
    """An ``axis`` argument is out of range or repeated (like numpy's AxisError)."""


class GraphError(GraphdistError, ValueError):
    """A graph is malformed: failed verification, bad op attributes or
    incompatible shapes.
    """


class PreconditionError(GraphError):
    """A pass was given a graph it cannot rewrite (its ``requires`` failed); the message names the pass."""


class PostconditionError(GraphError):
    """A pass left a graph that breaks its own promise (``ensures``) or a graph invariant (``verify``); the
    message names the pass.
    """


class PipelineOrderError(GraphError):
    """A pass pipeline puts a pass before one it must run after; raised when the pipeline is built."""


class InvalidArgumentError(GraphdistError, ValueError):
    """An argument to a graphdist API has a bad value (unknown reduce op,
    mismatched structures, wrong axis for a non-distributed value...).
    """


class PlanError(GraphdistError, ValueError):
    """A plan cannot be built, loaded or run with the given inputs."""


class BackendError(GraphdistError, RuntimeError):
    """A backend failed to compile or run a segment."""


class DeviceError(GraphdistError, ValueError):
    """A device string is malformed or names a device that does not exist."""


class CheckpointError(GraphdistError, ValueError):
    """A checkpoint cannot be written or read."""


class ClusterConfigError(GraphdistError, ValueError):
    """A cluster configuration (TF_CONFIG, GRAPHDIST_CONFIG, resolver
    arguments) is invalid.
    """


class CollectiveTimeoutError(GraphdistError, TimeoutError):
    """A collective or remote wait did not complete within its timeout."""


#: What to do about the usual reasons a save fails (by ``errno``).
_STORAGE_ADVICE = {
    errno_codes.ENOSPC: "the filesystem holding it is full: free some space there or save to another disk",
    errno_codes.EDQUOT: "your disk quota there is used up: free some space or save elsewhere",
    errno_codes.EROFS: "it is on a read-only filesystem: save to a writable path (or remount it read-write)",
    errno_codes.EACCES: "permission denied: save to a directory you can write, or change its permissions",
    errno_codes.EPERM: "the operation is not permitted there: save to a directory you can write",
    errno_codes.EFBIG: "the file is larger than the filesystem allows: save to another filesystem",
    errno_codes.EIO: "the disk reported an I/O error: check it, and save to another disk",
}


class StorageError(GraphdistError, OSError):
    """A save could not be written: the disk is full, the target is read-only, permission is denied...

    Also an ``OSError`` (with the ``errno``, ``strerror`` and ``filename`` of the failure, ``filename`` being the
    user's target, not a temporary file), so ``except OSError`` keeps working. graphdist's saves are atomic:
    when one raises this, the previous copy of the target is unchanged.
    """

    def __init__(self, message: str, *, errno: int | None = None, strerror: str | None = None,
                 filename: str | None = None) -> None:
        super().__init__(message)
        self.errno, self.strerror, self.filename = errno, strerror, filename

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    @classmethod
    def from_os_error(cls, err: OSError, target: str | os.PathLike[str], what: str) -> StorageError:
        """The error of a save of ``target`` (by ``what``, e.g. ``"Checkpoint.save"``) that failed with ``err``.

        The message names ``target`` (never the hidden temporary file the save was writing), the system's
        reason and what to do.
        """
        reason = err.strerror or str(err) or type(err).__name__
        code = errno_codes.errorcode.get(err.errno, "") if err.errno is not None else ""
        advice = _STORAGE_ADVICE.get(err.errno, "check the path and the disk, then save again")
        return cls(f"{what}: cannot write {os.fspath(target)}: {reason}{f' ({code})' if code else ''}; {advice}. "
                   "The previous copy, if any, is unchanged.", errno=err.errno, strerror=err.strerror,
                   filename=os.fspath(target))


class NumericsError(InvalidArgumentError, FloatingPointError):
    """A NaN or an infinity appeared in a step's values while ``gd.debugging.enable_check_numerics()`` is on
    (TF raises ``InvalidArgumentError`` there, Python's floating-point checks ``FloatingPointError``: both
    catch it). The message names the op that made it, its step and device.
    """
