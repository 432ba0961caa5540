"""The parameter server (``gd.Server``) and the workers' client, over MPI.

A ps task holds variable shards by key and answers requests from workers,
one at a time, in arrival order (so updates from different workers are
applied asynchronously, each atomically):

* ``create``: store the initial value unless the key exists (the first
  worker to create a variable initialises it); reply with the stored value,
  so every worker starts from the same values;
* ``pull``: reply with the current value;
* ``push``: add the pushed update (new value minus the value the worker
  pulled at step start, i.e. ``-learning_rate * gradient`` for SGD) to the
  stored value; reply with the result;
* ``assign``: replace the stored value (eager ``variable.assign``);
* ``stop``: the worker is done; the server returns from :meth:`Server.join`
  once every worker has stopped.

Messages are MPI point-to-point messages on ``COMM_WORLD``: a JSON header
(tag :data:`TAG_REQUEST`), then the payload as a raw numpy buffer (tag
:data:`TAG_PAYLOAD`); replies (tag :data:`TAG_REPLY`) go straight into the
worker's preallocated array. No pickling, no home-made network protocol.

Timeouts: a worker waits at most ``timeout`` seconds
(``GRAPHDIST_COLLECTIVE_TIMEOUT``, default 300) for a reply and then raises
:class:`~graphdist.CollectiveTimeoutError` naming the ps task. A server that
hears nothing from its unfinished workers for that long raises one naming
them (a worker that died cannot say ``stop``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphdist.errors import ClusterConfigError, CollectiveTimeoutError, GraphdistError, InvalidArgumentError
from graphdist.runtime.cluster_spec import ClusterSpec, environment_config, rank_task, task_rank

__all__ = ["Server", "PSClient", "TAG_REQUEST", "TAG_PAYLOAD", "TAG_REPLY", "main"]

logger = logging.getLogger(__name__)

TAG_REQUEST, TAG_PAYLOAD, TAG_REPLY = 7101, 7102, 7103


def _poll(request: Any, timeout: float, on_timeout: Any) -> None:
    """Tests ``request`` until it completes; calls ``on_timeout()`` (which raises) after ``timeout`` s."""
    start = time.monotonic()
    while not request.Test():
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            on_timeout()
        if elapsed > 2e-4:
            time.sleep(min(1e-3, elapsed / 50))


def _worker_ranks(spec: ClusterSpec) -> list[int]:
    return [task_rank(spec, job, i) for job in ("chief", "worker") if job in spec.jobs
            for i in spec.task_indices(job)]


class Server:
    """A parameter server task (``tf.distribute.Server`` for ``job_name="ps"``).

    Args:
        server_or_cluster_def: A :class:`ClusterSpec` (or its dict).
        job_name: Must be ``"ps"`` (workers run the training program, not a server).
        task_index: This ps task's index.
        protocol: Accepted for compatibility; processes talk through MPI.
        config: Ignored.
        start: Accepted for compatibility (the server serves in :meth:`join`).
        timeout: Seconds without a request from an unfinished worker before
            :meth:`join` fails (default ``GRAPHDIST_COLLECTIVE_TIMEOUT`` or 300).

    Raises:
        ClusterConfigError: ``job_name`` is not ``"ps"``, the task is not in
            the cluster, or this MPI rank is not that task's rank.
    """

    def __init__(self, server_or_cluster_def: Any, job_name: str | None = None, task_index: int | None = None,
                 protocol: str | None = None, config: Any = None, start: bool = True,
                 timeout: float | None = None) -> None:
        from graphdist.runtime.comm.mpi import default_timeout, world

        self._spec = ClusterSpec(server_or_cluster_def)
        if job_name != "ps":
            raise ClusterConfigError(f"gd.Server runs ps tasks (job_name='ps'), got job_name={job_name!r}; workers "
                                     "run the training program with a strategy instead")
        self.task_index = 0 if task_index is None else int(task_index)
        self._rank = task_rank(self._spec, "ps", self.task_index)
        self._comm = world()
        if self._comm.Get_size() != sum(self._spec.num_tasks(j) for j in self._spec.jobs if j != "evaluator"):
            raise ClusterConfigError(f"the cluster {self._spec.as_dict()} does not match this MPI job of "
                                     f"{self._comm.Get_size()} process(es); start it with graphdist launch")
        if self._comm.Get_rank() != self._rank:
            raise ClusterConfigError(f"ps {self.task_index} is MPI rank {self._rank} in this cluster, but this "
                                     f"process is rank {self._comm.Get_rank()}")
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self._values: dict[str, np.ndarray] = {}
        self._requests = {"create": 0, "pull": 0, "push": 0, "assign": 0}

    @property
    def target(self) -> str:
        """This server's address."""
        return self._spec.task_address("ps", self.task_index)

    def start(self) -> None:
        """Accepted for compatibility: the server answers requests inside :meth:`join`."""

    def join(self) -> None:
        """Serves requests until every worker has sent ``stop``.

        Raises:
            CollectiveTimeoutError: No request from the unfinished workers for ``timeout`` seconds.
        """
        from mpi4py import MPI

        waiting = set(_worker_ranks(self._spec))
        status = MPI.Status()
        last = time.monotonic()
        idle = 0
        while waiting:
            if not self._comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST, status=status):
                idle += 1
                if time.monotonic() - last > self.timeout:
                    names = ", ".join(f"{job} {i} (rank {r})" for r in sorted(waiting)
                                      for job, i in [rank_task(self._spec, r)])
                    raise CollectiveTimeoutError(
                        f"ps {self.task_index}: no request for {self.timeout:g} s from {names}, which have not "
                        "finished (dead or stuck); raise GRAPHDIST_COLLECTIVE_TIMEOUT if workers are just slow")
                time.sleep(0 if idle < 200 else 5e-4)
                continue
            idle = 0
            last = time.monotonic()
            source = status.Get_source()
            header = bytearray(status.Get_count(MPI.BYTE))
            self._comm.Recv([header, MPI.BYTE], source=source, tag=TAG_REQUEST)
            request = json.loads(header.decode())
            if request["op"] == "stop":
                waiting.discard(source)
                continue
            self._serve(source, request)
        logger.info("ps %d: every worker finished (%s)", self.task_index, self._requests)

    def _serve(self, source: int, request: dict[str, Any]) -> None:
        op, key = request["op"], request["key"]
        self._requests[op] = self._requests.get(op, 0) + 1
        payload = None
        if op in ("create", "push", "assign"):
            payload = np.empty(request["shape"], np.dtype(request["dtype"]))
            receive = self._comm.Irecv(payload.reshape(-1) if payload.ndim == 0 else payload, source=source,
                                       tag=TAG_PAYLOAD)
            _poll(receive, self.timeout, lambda: self._lost(source, f"the payload of its {op} of {key!r}"))
        if op == "create":
            stored = self._values.setdefault(key, payload)
        elif key not in self._values:
            raise GraphdistError(f"ps {self.task_index}: rank {source} asked to {op} {key!r}, which no worker created")
        elif op == "push":
            stored = self._values[key]
            np.add(stored, payload, out=stored)
        elif op == "assign":
            stored = self._values[key]
            np.copyto(stored, payload)
        else:
            stored = self._values[key]
        reply = self._comm.Isend(stored.reshape(-1) if stored.ndim == 0 else stored, dest=source, tag=TAG_REPLY)
        _poll(reply, self.timeout, lambda: self._lost(source, f"the reply to its {op} of {key!r}"))

    def _lost(self, source: int, what: str) -> None:
        job, index = rank_task(self._spec, source)
        raise CollectiveTimeoutError(f"ps {self.task_index}: {job} {index} (rank {source}) did not take {what} "
                                     f"within {self.timeout:g} s (dead or stuck)")


class PSClient:
    """A worker's connection to the ps tasks of ``spec``.

    Args:
        spec: The cluster.
        timeout: Seconds to wait for a reply (default ``GRAPHDIST_COLLECTIVE_TIMEOUT`` or 300).

    Raises:
        ClusterConfigError: The MPI job does not match the cluster.
    """

    def __init__(self, spec: ClusterSpec, timeout: float | None = None) -> None:
        from graphdist.runtime.comm.mpi import default_timeout, world

        self._spec = spec
        self._comm = world()
        expected = sum(spec.num_tasks(j) for j in spec.jobs if j != "evaluator")
        if self._comm.Get_size() != expected:
            raise ClusterConfigError(
                f"the cluster has {expected} tasks (workers and ps) but this MPI job has {self._comm.Get_size()} "
                f"process(es); start it with graphdist launch --workers {spec.num_tasks('worker')} "
                f"--ps {spec.num_tasks('ps')}")
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self._lock = threading.Lock()
        self._stopped = False
        atexit.register(self.stop)

    def ps_rank(self, ps_index: int) -> int:
        """MPI rank of ps task ``ps_index``."""
        return task_rank(self._spec, "ps", ps_index)

    def request(self, op: str, ps_index: int, key: str, like: np.ndarray, payload: np.ndarray | None = None
                ) -> np.ndarray:
        """Sends one request and returns the ps's reply (an array shaped like ``like``)."""
        if op not in ("create", "pull", "push", "assign"):
            raise InvalidArgumentError(f"unknown ps request {op!r}")
        dest = self.ps_rank(ps_index)
        header = {"op": op, "key": key, "dtype": like.dtype.str, "shape": list(like.shape)}
        reply = np.empty(like.shape, like.dtype)
        with self._lock:
            sends = [self._comm.Isend([json.dumps(header).encode(), _byte()], dest=dest, tag=TAG_REQUEST)]
            if payload is not None:
                data = np.ascontiguousarray(payload, dtype=like.dtype)
                sends.append(self._comm.Isend(data.reshape(-1) if data.ndim == 0 else data, dest=dest,
                                              tag=TAG_PAYLOAD))
            receive = self._comm.Irecv(reply.reshape(-1) if reply.ndim == 0 else reply, source=dest, tag=TAG_REPLY)

            def fail() -> None:
                raise CollectiveTimeoutError(
                    f"ps {ps_index} (rank {dest}) did not answer the {op} of {key!r} within {self.timeout:g} s "
                    "(dead or stuck); check its output; raise GRAPHDIST_COLLECTIVE_TIMEOUT if it is just slow")

            for request in [*sends, receive]:
                _poll(request, self.timeout, fail)
        return reply

    def stop(self) -> None:
        """Tells every ps task that this worker is done (once; also at exit)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            message = json.dumps({"op": "stop", "key": ""}).encode()
            sends = [self._comm.Isend([message, _byte()], dest=self.ps_rank(i), tag=TAG_REQUEST)
                     for i in self._spec.task_indices("ps")]
            for request in sends:
                _poll(request, min(self.timeout, 10.0), _raise_stop_timeout)
        except Exception as err:  # noqa: BLE001 - at exit, a dead ps must not hide the real outcome
            logger.warning("could not tell the ps tasks that this worker stopped: %s", err)


def _raise_stop_timeout() -> None:
    raise CollectiveTimeoutError("a ps task did not take this worker's stop message within 10 s")


def _byte() -> Any:
    from mpi4py import MPI

    return MPI.BYTE


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m graphdist.runtime.ps_server``: serve this process's ps task (from ``GRAPHDIST_CONFIG``)."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    spec, task_type, task_id, _, _ = environment_config()
    if task_type != "ps":
        print(f"graphdist ps server: this task is {task_type!r}, not 'ps' (GRAPHDIST_CONFIG / TF_CONFIG)",
              file=sys.stderr)
        return 2
    try:
        Server(spec, job_name="ps", task_index=task_id).join()
    except GraphdistError as err:
        print(f"graphdist ps server: {type(err).__name__}: {err}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)  # MPI_Finalize would wait for the dead workers
    return 0


if __name__ == "__main__":
    sys.exit(main())
