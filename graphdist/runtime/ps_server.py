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

Checks: the server validates every request against what it holds (the key
exists, except for ``create``; the worker's shape and dtype equal the
stored ones; the payload has that many bytes). A request that fails a check
is answered with a refusal (tag :data:`TAG_REFUSAL`, a JSON message) instead
of a value: that worker raises :class:`~graphdist.InvalidArgumentError`
naming the key, both shapes and dtypes and the fix, and the server keeps
serving everyone.

Timeouts and lost workers: a worker waits at most ``timeout`` seconds
(``GRAPHDIST_COLLECTIVE_TIMEOUT``, default 300) for a reply and then raises
:class:`~graphdist.CollectiveTimeoutError` naming the ps task. Under
``graphdist launch`` the server reads the job's status folder
(:mod:`graphdist.runtime.launch_status`) twice a second while idle, and
while it waits on one worker: a worker that ended without saying ``stop``
(killed, crashed) is dropped, and the server goes on serving the others
(asynchronous training tolerates a lost worker). Without that folder, a
server that hears nothing from its unfinished workers for ``timeout``
seconds raises a ``CollectiveTimeoutError`` naming them.
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
from graphdist.runtime import launch_status, rendezvous
from graphdist.runtime.cluster_spec import ClusterSpec, environment_config, rank_task, task_rank

__all__ = ["Server", "PSClient", "TAG_REQUEST", "TAG_PAYLOAD", "TAG_REPLY", "TAG_REFUSAL", "main", "run_ps_task",
           "shared_client"]

logger = logging.getLogger(__name__)

TAG_REQUEST, TAG_PAYLOAD, TAG_REPLY, TAG_REFUSAL = 7101, 7102, 7103, 7104
OPS = ("create", "pull", "push", "assign")
_WITH_PAYLOAD = ("create", "push", "assign")
_CHECK_ENDED_S = 0.5  # how often a waiting server looks for workers that ended (launch status folder)
_REFUSAL_BYTES = 4096


def _poll(request: Any, timeout: float, on_timeout: Any, peer_ended: Any = None) -> bool:
    """Tests ``request`` until it completes (returns True); calls ``on_timeout()`` (which raises) after
    ``timeout`` s; returns False as soon as ``peer_ended()`` (asked every half second) says the peer is gone.
    """
    start = time.monotonic()
    next_check = start + _CHECK_ENDED_S
    while not request.Test():
        now = time.monotonic()
        elapsed = now - start
        if elapsed > timeout:
            on_timeout()
        if peer_ended is not None and now > next_check:
            if peer_ended():
                return False
            next_check = now + _CHECK_ENDED_S
        if elapsed > 2e-4:
            time.sleep(min(1e-3, elapsed / 50))
    return True


def _describe(dtype: Any, shape: Sequence[int]) -> str:
    return f"{np.dtype(dtype)}{list(shape)}"


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
        from graphdist.runtime.comm.mpi_world import default_timeout, world

        self._spec = ClusterSpec(server_or_cluster_def)
        if job_name != "ps":
            raise ClusterConfigError(f"gd.Server runs ps tasks (job_name='ps'), got job_name={job_name!r}; workers "
                                     "run the training program with a strategy instead")
        self.task_index = 0 if task_index is None else int(task_index)
        self._rank = task_rank(self._spec, "ps", self.task_index)
        self._comm = world(self._spec, "ps", self.task_index)
        if self._comm.Get_size() != sum(self._spec.num_tasks(j) for j in self._spec.jobs if j != "evaluator"):
            raise ClusterConfigError(f"the cluster {self._spec.as_dict()} does not match this MPI job of "
                                     f"{self._comm.Get_size()} process(es); start it with graphdist launch")
        if self._comm.Get_rank() != self._rank:
            raise ClusterConfigError(f"ps {self.task_index} is MPI rank {self._rank} in this cluster, but this "
                                     f"process is rank {self._comm.Get_rank()}")
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self._values: dict[str, np.ndarray] = {}
        self._creators: dict[str, int] = {}
        self._requests = {"create": 0, "pull": 0, "push": 0, "assign": 0, "refused": 0}
        self._lost: dict[int, str] = {}

    @property
    def target(self) -> str:
        """This server's address."""
        return self._spec.task_address("ps", self.task_index)

    @property
    def lost_workers(self) -> dict[int, str]:
        """``{rank: how it ended}`` of the workers that ended without saying ``stop``."""
        return dict(self._lost)

    def start(self) -> None:
        """Accepted for compatibility: the server answers requests inside :meth:`join`."""

    def join(self) -> None:
        """Serves requests until every worker has sent ``stop`` (or, under ``graphdist launch``, ended).

        Raises:
            CollectiveTimeoutError: No request from the unfinished workers for ``timeout`` seconds.
        """
        from mpi4py import MPI

        waiting = set(_worker_ranks(self._spec))
        status = MPI.Status()
        last = next_check = time.monotonic()
        idle = 0
        while waiting:
            if not self._comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST, status=status):
                idle += 1
                now = time.monotonic()
                if now > next_check:
                    self._drop_ended(waiting)
                    next_check = now + _CHECK_ENDED_S
                if waiting and now - last > self.timeout:
                    raise CollectiveTimeoutError(
                        f"ps {self.task_index}: no request for {self.timeout:g} s from {self._names(waiting)}, "
                        "which have not finished (dead or stuck); raise GRAPHDIST_COLLECTIVE_TIMEOUT if workers "
                        "are just slow")
                time.sleep(0 if idle < 200 else 5e-4)
                continue
            idle = 0
            last = time.monotonic()
            source = status.Get_source()
            header = bytearray(status.Get_count(MPI.BYTE))
            self._comm.Recv([header, MPI.BYTE], source=source, tag=TAG_REQUEST)
            request = _parse_header(header)
            if request.get("op") == "stop":
                waiting.discard(source)
                continue
            if source in self._lost:
                continue  # a request a lost worker sent before it ended
            self._serve(source, request)
        logger.info("ps %d: every worker finished (%s)%s", self.task_index, self._requests,
                    f"; lost: {self._names(self._lost)}" if self._lost else "")

    def _drop_ended(self, waiting: set[int]) -> None:
        """Stops waiting for workers whose process ended without saying ``stop``."""
        for rank in sorted(waiting):
            ended, how = _task_exit(rank)
            if not ended:
                continue
            waiting.discard(rank)
            if how is not None:
                self._lose(rank, how)

    def _lose(self, rank: int, how: str) -> None:
        if rank not in self._lost:
            self._lost[rank] = how
            logger.warning("ps %d: %s ended without saying stop (%s); serving the other workers", self.task_index,
                           self._names([rank]), how)

    def _ended(self, rank: int) -> bool:
        """Whether ``rank`` ended while the server waits on it; then it is lost."""
        ended, how = _task_exit(rank)
        if ended:
            self._lose(rank, how or "it ended")
        return ended

    def _names(self, ranks: Any) -> str:
        return ", ".join(f"{job} {i} (rank {r})" for r in sorted(ranks) for job, i in [rank_task(self._spec, r)])

    def _serve(self, source: int, request: dict[str, Any]) -> None:
        op, key = request.get("op"), request.get("key")
        payload = None
        if op in _WITH_PAYLOAD:
            payload = self._receive_payload(source, op, key)
            if payload is None:
                return  # the worker ended meanwhile
        problem = _request_problem(request, payload) or self._holding_problem(op, key, request, source)
        if problem:
            self._refuse(source, op, key, problem)
            return
        self._requests[op] += 1
        dtype, shape = np.dtype(request["dtype"]), tuple(request["shape"])
        value = None if payload is None else np.frombuffer(payload, dtype).reshape(shape)
        if op == "create":
            if key not in self._values:
                self._values[key], self._creators[key] = value.copy(), source
            stored = self._values[key]
        elif op == "push":
            stored = self._values[key]
            np.add(stored, value, out=stored)
        elif op == "assign":
            stored = self._values[key]
            np.copyto(stored, value)
        else:
            stored = self._values[key]
        reply = self._comm.Isend(stored.reshape(-1) if stored.ndim == 0 else stored, dest=source, tag=TAG_REPLY)
        _poll(reply, self.timeout, lambda: self._lost_timeout(source, f"the reply to its {op} of {key!r}"),
              lambda: self._ended(source))

    def _receive_payload(self, source: int, op: str, key: Any) -> bytearray | None:
        """The raw bytes of the payload that follows a request (whatever its size: checked afterwards)."""
        from mpi4py import MPI

        status = MPI.Status()
        start = time.monotonic()
        next_check = start + _CHECK_ENDED_S
        while True:
            message = self._comm.Improbe(source=source, tag=TAG_PAYLOAD, status=status)
            if message is not None:
                break
            now = time.monotonic()
            if now - start > self.timeout:
                self._lost_timeout(source, f"the payload of its {op} of {key!r}", sent=True)
            if now > next_check:
                if self._ended(source):
                    return None
                next_check = now + _CHECK_ENDED_S
            time.sleep(1e-4)
        payload = bytearray(status.Get_count(MPI.BYTE))
        receive = message.Irecv([payload, MPI.BYTE])
        done = _poll(receive, self.timeout, lambda: self._lost_timeout(source, f"the payload of its {op} of {key!r}",
                                                                        sent=True), lambda: self._ended(source))
        return payload if done else None

    def _holding_problem(self, op: str, key: str, request: dict[str, Any], source: int) -> str:
        """Why the request does not fit what this server holds ('' when it does)."""
        stored = self._values.get(key)
        if stored is None:
            if op == "create":
                return ""
            return (f"no worker created {key!r} on ps {self.task_index}; every worker must create the same "
                    "variables (inside strategy.scope()) in the same order before using them")
        theirs = _describe(request["dtype"], request["shape"])
        ours = _describe(stored.dtype, stored.shape)
        if theirs == ours:
            return ""
        creator = self._names([self._creators[key]]) if key in self._creators else "a worker"
        return (f"this worker's {key!r} is {theirs}, but ps {self.task_index} holds {ours} (created by {creator}); "
                "every worker must create the same variables, with the same shapes and dtypes, in the same order")

    def _refuse(self, source: int, op: Any, key: Any, problem: str) -> None:
        self._requests["refused"] += 1
        logger.warning("ps %d: refused the %s of %r from %s: %s", self.task_index, op, key, self._names([source]),
                       problem)
        message = json.dumps({"error": problem}).encode()[:_REFUSAL_BYTES]
        refusal = self._comm.Isend([message, _byte()], dest=source, tag=TAG_REFUSAL)
        _poll(refusal, self.timeout, lambda: self._lost_timeout(source, f"the refusal of its {op} of {key!r}"),
              lambda: self._ended(source))

    def _lost_timeout(self, source: int, what: str, sent: bool = False) -> None:
        job, index = rank_task(self._spec, source)
        verb = "send" if sent else "take"
        raise CollectiveTimeoutError(f"ps {self.task_index}: {job} {index} (rank {source}) did not {verb} {what} "
                                     f"within {self.timeout:g} s (dead or stuck)")


def _task_exit(rank: int) -> tuple[bool, str | None]:
    """``(ended, how it failed)`` of task ``rank``: from the launch status folder under ``graphdist launch``,
    else from the job's connections (tasks started on their own); ``how`` is ``None`` for a clean end.
    """
    status = launch_status.read_exit(rank)
    if status is not None:
        code = int(status["returncode"])
        return True, None if code == 0 else launch_status.describe_exit(code)
    outcome = rendezvous.task_ended(rank)
    if outcome is None:
        return False, None
    return True, None if outcome == "finished" else outcome


def _parse_header(header: bytearray) -> dict[str, Any]:
    try:
        request = json.loads(header.decode())
    except (UnicodeDecodeError, ValueError):
        return {"op": None, "key": None, "malformed": True}
    return request if isinstance(request, dict) else {"op": None, "key": None, "malformed": True}


def _request_problem(request: dict[str, Any], payload: bytearray | None) -> str:
    """What is wrong with a request on its own ('' if nothing): op, key, dtype, shape, payload size."""
    op, key = request.get("op"), request.get("key")
    if request.get("malformed") or op not in OPS:
        return f"unknown request {op!r} (a graphdist ps serves {', '.join(OPS)} and stop)"
    if not isinstance(key, str) or not key:
        return f"the request names no variable (key {key!r})"
    try:
        dtype = np.dtype(request.get("dtype"))
        shape = tuple(int(d) for d in request.get("shape"))
    except (TypeError, ValueError):
        return f"the request's dtype {request.get('dtype')!r} or shape {request.get('shape')!r} is not valid"
    if dtype.hasobject or any(d < 0 for d in shape):
        return f"the request's value {dtype}{list(shape)} cannot be held by a ps"
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if payload is not None and len(payload) != expected:
        return f"its {op} of {key!r} sent {len(payload)} bytes, but a {dtype}{list(shape)} value has {expected}"
    return ""


class PSClient:
    """A worker's connection to the ps tasks of ``spec``.

    Args:
        spec: The cluster.
        timeout: Seconds to wait for a reply (default ``GRAPHDIST_COLLECTIVE_TIMEOUT`` or 300).
        task: This worker's ``(task_type, task_id)``: a worker started on its own joins the job's
            tasks (:func:`graphdist.runtime.comm.mpi.world`).

    Raises:
        ClusterConfigError: The MPI job does not match the cluster.
    """

    def __init__(self, spec: ClusterSpec, timeout: float | None = None,
                 task: tuple[str, int] | None = None) -> None:
        from graphdist.runtime.comm.mpi_world import default_timeout, world

        self._spec = spec
        self._comm = world(spec, *task) if task is not None else world()
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
        launch_status.record_joined()  # from now on, graphdist launch counts this worker as lost if it dies

    def ps_rank(self, ps_index: int) -> int:
        """MPI rank of ps task ``ps_index``."""
        return task_rank(self._spec, "ps", ps_index)

    def request(self, op: str, ps_index: int, key: str, like: np.ndarray, payload: np.ndarray | None = None
                ) -> np.ndarray:
        """Sends one request and returns the ps's reply (an array shaped like ``like``).

        Raises:
            InvalidArgumentError: ``op`` is unknown, ``payload`` is not shaped like ``like``, or the ps
                refused the request (no such variable, another shape or dtype than the one it holds).
            CollectiveTimeoutError: The ps did not answer within ``timeout`` seconds.
        """
        if op not in OPS:
            raise InvalidArgumentError(f"unknown ps request {op!r}; one of {', '.join(OPS)}")
        if (payload is None) != (op not in _WITH_PAYLOAD):
            raise InvalidArgumentError(f"a ps {op} {'needs' if op in _WITH_PAYLOAD else 'takes no'} payload")
        like = np.asarray(like)
        data = None
        if payload is not None:
            data = np.asarray(payload, dtype=like.dtype)
            data = data if data.flags.c_contiguous else np.ascontiguousarray(data)  # (keeps 0-d arrays 0-d)
            if data.shape != like.shape:
                raise InvalidArgumentError(f"the payload of the {op} of {key!r} is {_describe(data.dtype, data.shape)}"
                                           f", the variable {_describe(like.dtype, like.shape)}")
        dest = self.ps_rank(ps_index)
        header = {"op": op, "key": key, "dtype": like.dtype.str, "shape": list(like.shape)}
        reply = np.empty(like.shape, like.dtype)
        with self._lock:
            sends = [self._comm.Isend([json.dumps(header).encode(), _byte()], dest=dest, tag=TAG_REQUEST)]
            if data is not None:
                sends.append(self._comm.Isend(data.reshape(-1) if data.ndim == 0 else data, dest=dest,
                                              tag=TAG_PAYLOAD))
            receive = self._comm.Irecv(reply.reshape(-1) if reply.ndim == 0 else reply, source=dest, tag=TAG_REPLY)

            def fail() -> None:
                raise CollectiveTimeoutError(
                    f"ps {ps_index} (rank {dest}) did not answer the {op} of {key!r} within {self.timeout:g} s "
                    "(dead or stuck); check its output; raise GRAPHDIST_COLLECTIVE_TIMEOUT if it is just slow")

            for send in sends:
                _poll(send, self.timeout, fail, lambda: self._check_ps_alive(dest))
            refusal = self._wait_reply(receive, dest, fail)
        if refusal is not None:
            raise InvalidArgumentError(f"ps {ps_index} (rank {dest}) refused the {op} of {key!r}: {refusal}")
        return reply

    def _wait_reply(self, receive: Any, dest: int, fail: Any) -> str | None:
        """Waits for the reply, or a refusal: then cancels the reply's receive and returns the ps's reason."""
        from mpi4py import MPI

        status = MPI.Status()
        start = time.monotonic()
        polls = 0
        while not receive.Test():
            polls += 1
            if polls % 8 == 0:
                message = self._comm.Improbe(source=dest, tag=TAG_REFUSAL, status=status)
                if message is not None:
                    text = bytearray(status.Get_count(MPI.BYTE))
                    message.Recv([text, MPI.BYTE])
                    receive.Cancel()
                    receive.Wait()
                    return str(json.loads(text.decode()).get("error", "no reason given"))
            elapsed = time.monotonic() - start
            if elapsed > self.timeout:
                fail()
            if polls % 512 == 0:
                self._check_ps_alive(dest)
            if elapsed > 2e-4:
                time.sleep(min(1e-3, elapsed / 50))
        return None

    def _check_ps_alive(self, dest: int) -> bool:
        """Raises when the ps task ``dest`` was lost (a job of tasks started on their own knows at once)."""
        how = rendezvous.lost_tasks().get(dest)
        if how is not None:
            from graphdist.runtime.comm.mpi import TaskLostError, skip_finalize

            joined = rendezvous.current()
            message = (f"{joined.describe(dest) if joined else f'rank {dest}'} was lost: {how}; the job cannot go "
                       "on without the variables it held: restart it (from the last checkpoint)")
            self._stopped = True  # nobody to say stop to
            skip_finalize(message)
            raise TaskLostError(message)
        return False

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


# ------------------------------------------------- the workers' side: plan tasks
_clients: list[PSClient] = []


def shared_client(spec: ClusterSpec, task_type: str | None = None, task_id: int | None = None) -> PSClient:
    """One client per process and cluster (it tells the ps tasks once that this worker stopped).

    The latest one asked for serves the plans' ``PSPull`` / ``PSPush`` tasks (:func:`run_ps_task`).
    """
    for client in _clients:
        if client._spec == spec:
            _clients.remove(client)
            _clients.append(client)
            return client
    client = PSClient(spec, task=(task_type, task_id) if task_type is not None and task_id is not None else None)
    _clients.append(client)
    return client


def run_ps_task(op: str, attrs: dict[str, Any], buffers: list[np.ndarray]) -> list[np.ndarray]:
    """Runs a plan's ``PSPull`` / ``PSPush`` task through this process's parameter-server client.

    Raises:
        ClusterConfigError: No ParameterServerStrategy (hence no client) was created in this process.
    """
    if not _clients:
        raise ClusterConfigError("this plan pulls and pushes variables on parameter servers, but no "
                                 "ParameterServerStrategy was created in this process; create it first")
    client = _clients[-1]
    part = buffers[0]
    start, stop = attrs.get("row_start"), attrs.get("row_stop")
    if start is not None:
        part = part[int(start): int(stop)]
    if op == "PSPull":
        return [client.request("pull", int(attrs["ps"]), attrs["key"], part)]
    return [client.request("push", int(attrs["ps"]), attrs["key"], part, part)]



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
