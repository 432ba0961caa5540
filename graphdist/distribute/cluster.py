"""Cluster resolvers: where a strategy's cluster and this process's role come from.

The cluster itself (``ClusterSpec``, the ``TF_CONFIG`` JSON format, the MPI
rank of every task) is :mod:`graphdist.runtime.cluster_spec`, re-exported
here. Resolvers:

* :class:`TFConfigClusterResolver` reads ``GRAPHDIST_CONFIG``, else
  ``TF_CONFIG`` (same JSON; graphdist may add ``"local_devices": [...]``, the
  devices of this task, which ``graphdist launch --devices-per-worker`` sets);
* :class:`SimpleClusterResolver` wraps a spec and a role given in code;
* :class:`MPIClusterResolver` derives the roles from the MPI ranks of the
  running job (``num_ps`` ps tasks after the workers, optionally a chief);
* :class:`SlurmClusterResolver` reads the Slurm job step (``srun``).

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
    "SlurmClusterResolver",
    "expand_hostlist",
    "expand_tasks_per_node",
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
        from graphdist.runtime.comm.mpi_world import world

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


class SlurmClusterResolver(ClusterResolver):
    """Roles from the Slurm job step this process runs in (TensorFlow's ``SlurmClusterResolver``).

    Reads ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_STEP_NODELIST``
    (a Slurm host list such as ``node[01-04,07]``) and
    ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``); Slurm's default block
    distribution places the first tasks on the first node. Process ids are
    given to the jobs in the order of ``jobs``; a task's address is its node
    and ``port_base`` plus its index among the tasks on that node.

    A task started by ``srun`` without an MPI plugin joins the others as a
    task started by hand does (:mod:`graphdist.runtime.comm.mpi_join`: it
    listens on that address); under an MPI plugin that MPICH's process
    manager interface accepts, the MPI ranks must follow graphdist's task
    order (chief, workers, ps: give ``jobs`` in that order).

    Args:
        jobs: ``{job name: number of tasks}`` (default: every task a worker).
        port_base: First port of the tasks on each node.
        gpus_per_node: GPUs of each node (default: this node's count).
        gpus_per_task: GPUs of each task (default: ``gpus_per_node`` split among the node's tasks).
        tasks_per_node: ``{node: tasks}`` instead of ``SLURM_STEP_TASKS_PER_NODE``.
        auto_set_gpu: Sets ``CUDA_VISIBLE_DEVICES`` to this task's GPUs (when there are GPUs).
        rpc_layer: Reported by :meth:`master`.

    Raises:
        ClusterConfigError: Not inside a Slurm job step (a variable is missing or malformed), or
            ``jobs`` asks for another number of tasks than the step has.
    """

    def __init__(self, jobs: Mapping[str, int] | None = None, port_base: int = 8888,
                 gpus_per_node: int | None = None, gpus_per_task: int | None = None,
                 tasks_per_node: Mapping[str, int] | None = None, auto_set_gpu: bool = True,
                 rpc_layer: str | None = None) -> None:
        rank = _slurm_int("SLURM_PROCID")
        total = _slurm_int("SLURM_STEP_NUM_TASKS", fallback="SLURM_NTASKS")
        hosts = expand_hostlist(_slurm_var("SLURM_STEP_NODELIST", fallback="SLURM_JOB_NODELIST"))
        if tasks_per_node is None:
            counts = expand_tasks_per_node(_slurm_var("SLURM_STEP_TASKS_PER_NODE",
                                                      fallback="SLURM_TASKS_PER_NODE"))
            tasks_per_node = dict(zip(hosts, counts))
        placed = [(host, local) for host in hosts for local in range(int(tasks_per_node.get(host, 0)))]
        if len(placed) != total:
            raise ClusterConfigError(f"SlurmClusterResolver: the step has {total} tasks but its nodes hold "
                                     f"{len(placed)} ({dict(tasks_per_node)})")
        jobs = dict(jobs) if jobs is not None else {"worker": total}
        if sum(jobs.values()) != total:
            raise ClusterConfigError(f"SlurmClusterResolver: jobs {jobs} ask for {sum(jobs.values())} tasks but the "
                                     f"step has {total} (srun --ntasks); make them add up")
        cluster: dict[str, list[str]] = {}
        roles = [(job, index) for job, count in jobs.items() for index in range(int(count))]
        for (job, _), (host, local) in zip(roles, placed):
            cluster.setdefault(job, []).append(f"{host}:{int(port_base) + local}")
        self._spec = ClusterSpec(cluster)
        self.task_type, self.task_id = roles[rank]
        self.rpc_layer = rpc_layer
        self.local_devices = None
        here = placed[rank][0]
        node_tasks = int(tasks_per_node[here])
        self._gpus_per_node = gpus_per_node
        per_task = gpus_per_task if gpus_per_task is not None else (
            (gpus_per_node if gpus_per_node is not None else super().num_accelerators().get("GPU", 0)) // node_tasks)
        self._gpus_per_task = per_task
        if auto_set_gpu and per_task:
            first = placed[rank][1] * per_task
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(first, first + per_task))

    def cluster_spec(self) -> ClusterSpec:
        """The cluster of the step's tasks."""
        return self._spec

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: Any = None) -> dict[str, int]:
        """``{"GPU": gpus per task}`` (empty without GPUs)."""
        return {"GPU": self._gpus_per_task} if self._gpus_per_task else {}


def expand_hostlist(hostlist: str) -> list[str]:
    """The hosts of a Slurm host list, in order: ``"n[1-2],m5,o[03-04]"`` -> ``n1 n2 m5 o03 o04``.

    Raises:
        ClusterConfigError: A bracket is unbalanced or a range is malformed.
    """
    hosts: list[str] = []
    for item in _split_outside_brackets(hostlist):
        if "[" not in item:
            hosts.append(item)
            continue
        prefix, _, rest = item.partition("[")
        body, close, suffix = rest.partition("]")
        if not close or "[" in body:
            raise ClusterConfigError(f"Slurm host list {hostlist!r}: unbalanced brackets in {item!r}")
        for part in body.split(","):
            start, dash, stop = part.partition("-")
            if not start.isdigit() or (dash and not stop.isdigit()):
                raise ClusterConfigError(f"Slurm host list {hostlist!r}: {part!r} is not a number or range")
            for number in range(int(start), int(stop if dash else start) + 1):
                hosts += [f"{prefix}{number:0{len(start)}d}{host}" for host in expand_hostlist(suffix) or [""]]
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's ``SLURM_STEP_TASKS_PER_NODE``: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.split(","):
        count, _, repeat = part.partition("(x")
        if not count.strip().isdigit() or (repeat and not repeat.rstrip(")").isdigit()):
            raise ClusterConfigError(f"Slurm tasks per node {text!r}: {part!r} is not N or N(xM)")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts


def _split_outside_brackets(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    return [item for item in [*items, current] if item]


def _slurm_var(name: str, fallback: str | None = None) -> str:
    value = os.environ.get(name) or (os.environ.get(fallback) if fallback else None)
    if not value:
        raise ClusterConfigError(f"SlurmClusterResolver: {name} is not set; it works inside a Slurm job step "
                                 "(srun), or pass the cluster with TF_CONFIG / SimpleClusterResolver")
    return value


def _slurm_int(name: str, fallback: str | None = None) -> int:
    value = _slurm_var(name, fallback)
    if not value.strip().isdigit():
        raise ClusterConfigError(f"SlurmClusterResolver: {name}={value!r} is not a number")
    return int(value)
