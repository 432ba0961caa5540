"""Cluster resolvers: where a strategy's cluster and this process's role come from.

The cluster itself (``ClusterSpec``, the ``TF_CONFIG`` JSON format, the MPI
rank of every task) is :mod:`graphdist.runtime.cluster_spec`, re-exported
here. Resolvers:

* :class:`TFConfigClusterResolver` reads ``GRAPHDIST_CONFIG``, else
  ``TF_CONFIG`` (same JSON; graphdist may add ``"local_devices": [...]``, the
  devices of this task, which ``graphdist launch --devices-per-worker`` sets);
* :class:`SimpleClusterResolver` wraps a spec and a role given in code;
* :class:`MPIClusterResolver` derives the roles from the MPI ranks of the
  running job (``num_ps`` ps tasks after the workers, optionally a chief).

Every problem raises :class:`graphdist.ClusterConfigError` naming the field
and how to fix it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from graphdist.errors import ClusterConfigError
from graphdist.runtime.cluster_spec import (
    JOB_ORDER,
    ClusterSpec,
    check_task,
    environment_config,
    parse_config,
    rank_task,
    task_rank,
)

__all__ = [
    "ClusterSpec",
    "ClusterResolver",
    "TFConfigClusterResolver",
    "SimpleClusterResolver",
    "MPIClusterResolver",
    "JOB_ORDER",
    "task_rank",
    "rank_task",
    "parse_config",
]

logger = logging.getLogger(__name__)

class ClusterResolver:
    """Base class: the cluster, this process's role and its devices."""

    task_type: str | None = None
    task_id: int | None = None
    rpc_layer: str | None = None
    local_devices: list[str] | None = None

    def cluster_spec(self) -> ClusterSpec:
        """The cluster's :class:`ClusterSpec`."""
        raise NotImplementedError

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """Address of a task (default: this one), prefixed by ``rpc_layer://`` when given."""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        layer = rpc_layer or self.rpc_layer
        return f"{layer}://{address}" if layer else address

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: Any = None) -> dict[str, int]:
        """Accelerators on this host by kind (``{"GPU": n}``; empty without any)."""
        from graphdist.runtime.devices import num_gpus

        count = num_gpus()
        return {"GPU": count} if count else {}

    @property
    def environment(self) -> str:
        """The environment (always ``""``: no managed cluster environment)."""
        return ""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(task_type={self.task_type!r}, task_id={self.task_id!r}, "
                f"cluster={self.cluster_spec().as_dict()})")


class TFConfigClusterResolver(ClusterResolver):
    """Reads the cluster from ``GRAPHDIST_CONFIG``, else ``TF_CONFIG``.

    Args:
        task_type: Overrides the config's task type.
        task_id: Overrides the config's task index.
        rpc_layer: Overrides the config's ``rpc_layer``.
        environment: Accepted for compatibility; ignored.

    Without either variable the cluster is empty (single-process training).

    Raises:
        ClusterConfigError: The JSON is malformed, names an unknown role, or
            the task index is out of range.
    """

    def __init__(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None,
                 environment: str = "") -> None:
        spec, config_type, config_id, extra, source = environment_config()
        self._spec = spec
        self.task_type = task_type if task_type is not None else config_type
        self.task_id = task_id if task_id is not None else config_id
        if task_type is not None or task_id is not None:
            self.task_type, self.task_id = check_task(spec, self.task_type, self.task_id or 0, "task_type/task_id")
        self.rpc_layer = rpc_layer if rpc_layer is not None else extra.get("rpc_layer")
        self.local_devices = extra.get("local_devices")
        self.source = source

    def cluster_spec(self) -> ClusterSpec:
        """The cluster from the environment variable (empty without one)."""
        return self._spec


class SimpleClusterResolver(ClusterResolver):
    """A resolver from values given in code.

    Args:
        cluster_spec: A :class:`ClusterSpec` (or its dict).
        master: Ignored (no gRPC master here); accepted for compatibility.
        task_type: This process's job.
        task_id: This process's index in its job.
        environment: Ignored.
        num_accelerators: ``{"GPU": n}`` to report instead of detecting.
        rpc_layer: Reported by :meth:`master`.
        local_devices: This task's devices (default: every GPU, else ``cpu:0``).

    Raises:
        ClusterConfigError: The role is unknown or out of range.
    """

    def __init__(self, cluster_spec: ClusterSpec | Mapping[str, Any], master: str = "", task_type: str | None = None,
                 task_id: int | None = None, environment: str = "", num_accelerators: dict[str, int] | None = None,
                 rpc_layer: str | None = None, local_devices: Sequence[str] | None = None) -> None:
        self._spec = ClusterSpec(cluster_spec)
        if task_type is not None or task_id is not None:
            task_type, task_id = check_task(self._spec, task_type, 0 if task_id is None else task_id,
                                             "SimpleClusterResolver")
        self.task_type, self.task_id = task_type, task_id
        self._accelerators = num_accelerators
        self.rpc_layer = rpc_layer
        self.local_devices = list(local_devices) if local_devices is not None else None

    def cluster_spec(self) -> ClusterSpec:
        return self._spec

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: Any = None) -> dict[str, int]:
        if self._accelerators is not None:
            return dict(self._accelerators)
        return super().num_accelerators(task_type, task_id, config_proto)


class MPIClusterResolver(ClusterResolver):
    """Roles from the ranks of the running MPI job.

    Ranks are assigned as :func:`task_rank` describes: with ``has_chief``
    rank 0 is the chief, then come the workers, and the last ``num_ps`` ranks
    are ps tasks. Addresses are ``host:rank``.

    Args:
        num_ps: Number of ps tasks (the last ranks).
        has_chief: Whether rank 0 is a chief rather than worker 0.
        local_devices: This task's devices.

    Raises:
        ClusterConfigError: The job has too few ranks for the roles.
    """

    def __init__(self, num_ps: int = 0, has_chief: bool = False, local_devices: Sequence[str] | None = None) -> None:
        from graphdist.runtime.comm.mpi import world

        comm = world()
        size, rank = comm.Get_size(), comm.Get_rank()
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ClusterConfigError(f"MPIClusterResolver: num_ps must be an int >= 0, got {num_ps!r}")
        workers = size - num_ps - (1 if has_chief else 0)
        if workers < (0 if has_chief else 1):
            raise ClusterConfigError(f"MPIClusterResolver: the MPI job has {size} rank(s), too few for "
                                     f"{num_ps} ps task(s){' and a chief' if has_chief else ''} and one worker; "
                                     "start more processes (graphdist launch --workers N --ps M)")
        hosts = comm.allgather(os.uname().nodename)
        cluster: dict[str, list[str]] = {}
        roles = (["chief"] if has_chief else []) + ["worker"] * workers + ["ps"] * num_ps
        for r, role in enumerate(roles):
            cluster.setdefault(role, []).append(f"{hosts[r]}:{r}")
        self._spec = ClusterSpec(cluster)
        self.task_type, self.task_id = rank_task(self._spec, rank)
        self.local_devices = list(local_devices) if local_devices is not None else None

    def cluster_spec(self) -> ClusterSpec:
        return self._spec
