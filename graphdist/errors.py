"""Exceptions raised by graphdist.

Every error graphdist raises derives from :class:`GraphdistError`. Errors about
a bad argument also derive from ``ValueError`` or ``TypeError`` so that code
written against Python conventions keeps working. Messages name the offending
argument, op, shape, file or rank and say how to fix it.
"""

from __future__ import annotations

__all__ = [
    "GraphdistError",
    "TracingError",
    "AxisError",
    "GraphError",
    "InvalidArgumentError",
    "PlanError",
    "BackendError",
    "DeviceError",
    "CheckpointError",
    "ClusterConfigError",
    "CollectiveTimeoutError",
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


class NumericsError(InvalidArgumentError, FloatingPointError):
    """A NaN or an infinity appeared in a step's values while ``gd.debugging.enable_check_numerics()`` is on
    (TF raises ``InvalidArgumentError`` there, Python's floating-point checks ``FloatingPointError``: both
    catch it). The message names the op that made it, its step and device.
    """
