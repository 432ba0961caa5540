"""Cluster specs: jobs, task addresses and the MPI rank of every task.

A cluster is a set of named jobs (``chief``, ``worker``, ``ps``,
``evaluator``), each a list of task addresses, plus the role of the current
process (task type and index). The JSON format is TensorFlow's ``TF_CONFIG``::

    {"cluster": {"worker": ["host1:2222", "host2:2222"], "ps": ["host3:2222"]},
     "task": {"type": "worker", "index": 0}}

graphdist processes talk through MPI, never through the addresses: an
address only says which host a task runs on. Every task has an MPI rank,
given by :func:`task_rank`: tasks are numbered job by job in the order
chief, worker, ps, evaluator (so ``graphdist launch`` starts the chief as
rank 0, then the workers, then the ps tasks).

This is the runtime's view of a cluster (the ps server reads it); the
cluster resolvers of :mod:`graphdist.distribute.cluster` build on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from graphdist.errors import ClusterConfigError

__all__ = ["ClusterSpec", "JOB_ORDER", "task_rank", "rank_task", "parse_config", "check_task", "environment_config"]

JOB_ORDER = ("chief", "worker", "ps", "evaluator")
"""Known job names, in MPI rank order."""


class ClusterSpec:
    """The jobs of a cluster and their task addresses (like ``tf.train.ClusterSpec``).

    Args:
        cluster: ``{job: [address, ...]}`` (or ``{job: {index: address}}``),
            another ``ClusterSpec``, or ``None`` / ``{}`` for an empty cluster.

    Raises:
        ClusterConfigError: A job name is unknown, a job is not a list of
            address strings, or a sparse job's indices are not ints.
    """

    def __init__(self, cluster: Mapping[str, Any] | ClusterSpec | None = None) -> None:
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        if cluster is None:
            cluster = {}
        if not isinstance(cluster, Mapping):
            raise ClusterConfigError(f"cluster must be a dict of job name -> list of addresses, got "
                                     f"{type(cluster).__name__}")
        self._jobs: dict[str, dict[int, str]] = {}
        for job, tasks in cluster.items():
            if job not in JOB_ORDER:
                raise ClusterConfigError(f"cluster has an unknown job {job!r}; the roles are {', '.join(JOB_ORDER)}")
            self._jobs[job] = _tasks_of(job, tasks)
        if len(self._jobs.get("chief", {})) > 1:
            raise ClusterConfigError(f"cluster lists {len(self._jobs['chief'])} chief tasks; a cluster has at most "
                                     "one chief (use 'worker' for the others)")

    @property
    def jobs(self) -> list[str]:
        """Job names, in rank order."""
        return [job for job in JOB_ORDER if job in self._jobs]

    def num_tasks(self, job_name: str) -> int:
        """Number of tasks of ``job_name`` (0 for an absent job)."""
        return len(self._jobs.get(job_name, {}))

    def task_indices(self, job_name: str) -> list[int]:
        """Sorted task indices of ``job_name``."""
        return sorted(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """The address of one task."""
        tasks = self._job(job_name)
        if task_index not in tasks:
            raise ClusterConfigError(f"job {job_name!r} has no task {task_index}; its indices are "
                                     f"{sorted(tasks)}")
        return tasks[task_index]

    def job_tasks(self, job_name: str) -> list[str]:
        """Addresses of ``job_name``'s tasks in index order."""
        tasks = self._job(job_name)
        return [tasks[i] for i in sorted(tasks)]

    def as_dict(self) -> dict[str, Any]:
        """``{job: [address, ...]}`` (a dict ``{index: address}`` for sparse jobs)."""
        out: dict[str, Any] = {}
        for job in self.jobs:
            tasks = self._jobs[job]
            dense = sorted(tasks) == list(range(len(tasks)))
            out[job] = [tasks[i] for i in sorted(tasks)] if dense else dict(tasks)
        return out

    def _job(self, job_name: str) -> dict[int, str]:
        if job_name not in self._jobs:
            raise ClusterConfigError(f"the cluster has no job {job_name!r}; its jobs are {self.jobs}")
        return self._jobs[job_name]

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterSpec) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()})"


def _tasks_of(job: str, tasks: Any) -> dict[int, str]:
    if isinstance(tasks, Mapping):
        out = {}
        for index, address in tasks.items():
            try:
                number = int(index)
            except (TypeError, ValueError):
                raise ClusterConfigError(f"job {job!r}: task index {index!r} is not an int") from None
            out[number] = _address(job, number, address)
        return out
    if isinstance(tasks, str) or not isinstance(tasks, Sequence):
        raise ClusterConfigError(f"job {job!r} must be a list of addresses like ['host:port'], got {tasks!r}")
    return {i: _address(job, i, address) for i, address in enumerate(tasks)}


def _address(job: str, index: int, address: Any) -> str:
    if not isinstance(address, str) or not address:
        raise ClusterConfigError(f"job {job!r} task {index}: the address must be a non-empty string like "
                                 f"'localhost:2222', got {address!r}")
    return address


def task_rank(spec: ClusterSpec, task_type: str, task_id: int) -> int:
    """The MPI rank of a task: tasks numbered job by job in :data:`JOB_ORDER`."""
    rank = 0
    for job in spec.jobs:
        indices = spec.task_indices(job)
        if job == task_type:
            return rank + indices.index(task_id)
        rank += len(indices)
    raise ClusterConfigError(f"task {task_type}:{task_id} is not in the cluster {spec.as_dict()}")


def rank_task(spec: ClusterSpec, rank: int) -> tuple[str, int]:
    """The ``(task_type, task_id)`` of MPI rank ``rank`` (inverse of :func:`task_rank`)."""
    first = 0
    for job in spec.jobs:
        indices = spec.task_indices(job)
        if rank < first + len(indices):
            return job, indices[rank - first]
        first += len(indices)
    raise ClusterConfigError(f"rank {rank} is outside the cluster ({first} tasks)")


def parse_config(text: str, source: str = "TF_CONFIG") -> tuple[ClusterSpec, str | None, int | None, dict]:
    """Parses a ``TF_CONFIG``-style JSON string.

    Returns:
        ``(cluster_spec, task_type, task_id, extra)`` where ``extra`` holds
        graphdist's additions (``local_devices``) and ``rpc_layer``.

    Raises:
        ClusterConfigError: Malformed JSON, a missing ``cluster``, an unknown
            task type, a task index out of range or not an int.
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterConfigError(f"{source} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); "
                                 'expected {"cluster": {"worker": ["host:port", ...]}, '
                                 '"task": {"type": "worker", "index": 0}}') from None
    if not isinstance(config, dict):
        raise ClusterConfigError(f"{source} must be a JSON object with 'cluster' and 'task', got "
                                 f"{type(config).__name__}")
    unknown = sorted(set(config) - {"cluster", "task", "rpc_layer", "environment", "local_devices"})
    if unknown:
        raise ClusterConfigError(f"{source} has unknown key(s) {unknown}; the keys are cluster, task, rpc_layer, "
                                 "environment (and graphdist's local_devices)")
    spec = ClusterSpec(config.get("cluster") or {})
    task = config.get("task") or {}
    if not isinstance(task, dict):
        raise ClusterConfigError(f"{source}: 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}, "
                                 f"got {task!r}")
    task_type = task.get("type")
    task_id = task.get("index")
    if task_type is not None or task_id is not None:
        task_type, task_id = check_task(spec, task_type, 0 if task_id is None else task_id, source)
    extra = {key: config[key] for key in ("rpc_layer", "local_devices") if key in config}
    if "local_devices" in extra:
        devices = extra["local_devices"]
        if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
            raise ClusterConfigError(f"{source}: local_devices must be a non-empty list of device strings like "
                                     f"['cpu:0', 'cpu:1'], got {devices!r}")
    return spec, task_type, task_id, extra


def check_task(spec: ClusterSpec, task_type: Any, task_id: Any, source: str) -> tuple[str, int]:
    """``(task_type, task_id)`` checked against ``spec``; ``source`` names the config in messages."""
    if task_type not in JOB_ORDER:
        raise ClusterConfigError(f"{source}: task type {task_type!r} is unknown; use one of {', '.join(JOB_ORDER)}")
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise ClusterConfigError(f"{source}: task index must be an int, got {task_id!r}")
    if spec and task_type not in spec.jobs:
        raise ClusterConfigError(f"{source}: the task is a {task_type!r} but the cluster has no {task_type!r} job "
                                 f"(jobs: {', '.join(spec.jobs)})")
    if spec and task_id not in spec.task_indices(task_type):
        count = spec.num_tasks(task_type)
        raise ClusterConfigError(f"{source}: task index {task_id} is out of range for job {task_type!r}, which has "
                                 f"{count} task(s) (indices {spec.task_indices(task_type)})")
    return task_type, task_id


def environment_config() -> tuple[ClusterSpec, str | None, int | None, dict, str | None]:
    """The cluster of ``GRAPHDIST_CONFIG``, else ``TF_CONFIG``.

    Returns:
        ``(cluster_spec, task_type, task_id, extra, source)``: :func:`parse_config`'s
        result and the variable it came from; an empty cluster and ``None``
        source when neither variable is set.
    """
    source = "GRAPHDIST_CONFIG" if os.environ.get("GRAPHDIST_CONFIG") else "TF_CONFIG"
    text = os.environ.get(source, "")
    if not text.strip():
        return ClusterSpec(), None, None, {}, None
    return (*parse_config(text, source), source)
