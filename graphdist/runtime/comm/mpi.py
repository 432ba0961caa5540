"""MPI communicator between processes (mpi4py over the MPICH wheel).

:class:`MPICommunicator` runs collectives on numpy buffers between the ranks
of an MPI communicator: :meth:`~MPICommunicator.all_reduce`,
:meth:`~MPICommunicator.all_gather`, :meth:`~MPICommunicator.broadcast`,
:meth:`~MPICommunicator.reduce_scatter` and :meth:`~MPICommunicator.barrier`.
Processes talk only through MPI (no home-made network protocol).

Guarantees:

* **no copies where MPI allows**: C-contiguous inputs are handed to MPI as
  they are, results are written by MPI into one output array (``out=``, or
  a large buffer reused from the local communicator's pool once nobody holds
  it, or in place for ``broadcast`` of a writeable buffer); ``MEAN``
  divides in place; ``all_gather`` along axis 0 is a reshape of MPI's output;
* **mismatch detection**: every collective carries a sequence number and a
  fingerprint of (kind, name, reduce op, dtype, shape). Before the payload
  moves, the ranks compare fingerprints with one 32-byte all-reduce; when
  they differ every rank raises :class:`CollectiveMismatchError` listing
  what each rank called (instead of MPI silently combining unrelated
  buffers or hanging);
* **timeouts**: every wait is a non-blocking request polled against a
  deadline (``timeout`` seconds, default ``GRAPHDIST_COLLECTIVE_TIMEOUT`` or
  300). While waiting, a rank answers liveness pings on a separate control
  communicator. When the deadline passes it pings every rank and raises
  :class:`~graphdist.CollectiveTimeoutError` naming the ranks that did not
  answer (dead or stuck outside graphdist) and those that are waiting in a
  different collective. MPI errors (a peer that died) are reported the same
  way, never as a raw ``mpi4py`` traceback. After such an error the
  communicator is broken: further collectives raise at once, and the process
  skips ``MPI_Finalize`` at exit (which would wait for the dead rank).

The communicator of the whole job is :func:`default_communicator`; the
scheduler reaches it through :func:`run_comm_task` for plan communication
tasks whose op is ``CrossWorkerAllReduce`` / ``CrossWorkerAllGather``
(inserted by :class:`graphdist.passes.insert_cross_worker_collectives.InsertCrossWorkerCollectivesPass`)
or ``CrossWorkerReduceScatter`` (ZeRO-1 across workers, inserted by
:class:`graphdist.passes.shard_optimizer_state.ShardOptimizerStatePass`).
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphdist.errors import CollectiveTimeoutError, GraphdistError, InvalidArgumentError
from graphdist.ir import comm_ops
from graphdist.runtime import rendezvous, timeline
from graphdist.runtime.comm import algorithms
from graphdist.runtime.comm.mpi_world import default_timeout, skip_finalize, world

__all__ = [
    "MPICommunicator",
    "CollectiveMismatchError",
    "CommunicatorBrokenError",
    "TaskLostError",
    "default_communicator",
    "set_default_communicator",
    "run_comm_task",
    "register_group",
    "CROSS_WORKER_OPS",
    # the job's world and timeout (graphdist.runtime.comm.mpi_world), which callers of the communicator use too
    "default_timeout",
    "skip_finalize",
    "world",
]

logger = logging.getLogger(__name__)

CROSS_WORKER_OPS = comm_ops.CROSS_WORKER_OPS
"""Plan communication ops executed by this module."""

_PING, _PONG = 1, 2
_DESCRIPTION_BYTES = 160
_SPIN_SECONDS = 1e-4  # busy-poll this long, then yield the core between polls (a peer may share it)
_SLEEP_AFTER_SECONDS = 1.0  # then sleep between polls (a long wait means a peer is computing)
#: How often a waiting collective asks whether a peer's task ended (from its first second on).
_ASK_ENDED_SECONDS = 1.0
#: Name of the timeline event of a wait for an MPI request (fingerprint or payload) in a recorded step.
_WAIT_EVENT = "MPI wait"


class CollectiveMismatchError(GraphdistError, RuntimeError):
    """Ranks called different collectives (or one with different buffers) at the same point."""


class CommunicatorBrokenError(CollectiveTimeoutError):
    """A previous collective failed; the communicator cannot be used any more."""


class TaskLostError(CollectiveTimeoutError):
    """Another task of the job ended (killed, crashed, failed) while this one waited for it."""


class MPICommunicator:
    """Collectives between the ranks of an MPI communicator.

    Args:
        comm: An mpi4py communicator (default ``MPI.COMM_WORLD``); it is
            duplicated, so graphdist's traffic never mixes with the user's.
        timeout: Seconds any collective may wait (default
            :func:`default_timeout`).
        rank_names: Names of the ranks for error messages (e.g. ``["worker 0",
            "worker 1"]``); default ``"rank r"``.
        check: Compare fingerprints before every collective (mismatch
            detection); costs one small all-reduce per call.
        ended: How the task of a rank ended, ``None`` while it runs (e.g.
            :func:`~graphdist.runtime.comm.mpi_world.task_ended` where the
            communicator's ranks are the job's tasks); a collective that has
            waited a second asks it for its peers every second and fails at
            once, naming the peer, when one ended (it will never take part).

    Attributes:
        rank: This process's rank in the communicator.
        size: Number of ranks.
    """

    def __init__(self, comm: Any = None, timeout: float | None = None, rank_names: Sequence[str] | None = None,
                 check: bool = True, ended: Callable[[int], str | None] | None = None) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        base = comm if comm is not None else world()
        self._comm = base.Dup()
        self._control = base.Dup()
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.timeout = float(timeout) if timeout is not None else default_timeout()
        if self.timeout <= 0:
            raise InvalidArgumentError(f"timeout must be > 0 seconds, got {timeout}")
        if rank_names is not None and len(rank_names) != self.size:
            raise InvalidArgumentError(f"rank_names has {len(rank_names)} names for {self.size} ranks")
        self.rank_names = list(rank_names) if rank_names is not None else [f"rank {r}" for r in range(self.size)]
        self.check = bool(check)
        self._ended = ended
        self._seq = 0
        self._current = "idle"
        self._broken: str | None = None
        self._ping_buf = np.zeros(1, np.int64)
        self._pongs: list[Any] = []

    # ------------------------------------------------------------------ API
    def all_reduce(self, buffer: np.ndarray, reduce_op: str = "SUM", out: np.ndarray | None = None,
                   name: str = "", algorithm: str = "auto") -> np.ndarray:
        """Reduces ``buffer`` over all ranks; every rank gets the result.

        ``SUM`` / ``MEAN`` / ``MAX`` / ``MIN``; ``MEAN`` divides by the number
        of ranks in place (floor division for integers). ``algorithm``:
        ``"auto"`` (MPI's all-reduce; MPICH picks the algorithm by size) or
        ``"ring"`` (reduce-scatter then all-gather of the chunks, the ring
        all-reduce's bandwidth-optimal structure; every element is reduced
        on one rank only, so all ranks get bitwise equal results) or
        ``"tree"`` (an all-gather of every rank's buffer, then the pairwise
        tree ``((b0 + b1) + (b2 + b3)) + ...`` in rank order on every rank:
        the same bits whatever MPI does, for op determinism; ``size`` times
        the buffer crosses the network instead of about twice). The names
        and implementations are registered in ``graphdist.runtime.comm.algorithms``.
        """
        op = str(reduce_op).upper()
        if op not in ("SUM", "MEAN", "MAX", "MIN"):
            raise InvalidArgumentError(f"all_reduce: reduce_op must be SUM, MEAN, MAX or MIN, got {reduce_op!r}")
        method = algorithms.check_algorithm(algorithm, "mpi", "all_reduce").mpi
        send = _contiguous(buffer)
        _check_mean(op, send.dtype, "all_reduce")
        result = out if out is not None else _output(send.shape, send.dtype)
        if result.shape != send.shape or result.dtype != send.dtype:
            raise InvalidArgumentError(f"all_reduce: out is {result.dtype}{list(result.shape)}, the buffer is "
                                       f"{send.dtype}{list(send.shape)}")
        pending = self._announce("all_reduce", name, f"{op} {algorithm}", send)
        if self.size == 1:
            self._confirm(pending)
            np.copyto(result, send)
        else:
            getattr(self, str(method))(send, result, op, name, pending)
        if op == "MEAN":
            if result.dtype.kind in "iu":
                np.floor_divide(result, self.size, out=result)
            else:
                np.divide(result, np.asarray(self.size, result.dtype), out=result)
        return result

    # The algorithms' MPI implementations (named by graphdist.runtime.comm.algorithms): each confirms the
    # announced fingerprints (``pending``) before its result is used.
    def _auto_all_reduce(self, send: np.ndarray, result: np.ndarray, op: str, name: str, pending: Any) -> None:
        # The payload starts with the fingerprints, not after them: one round trip between hosts instead of
        # two. Its result is used only once the fingerprints agree; when they differ the payload's request
        # (perhaps of other sizes on other ranks: MPI refuses it, or it never completes) is abandoned with
        # the communicator, whose mismatch report goes over the control communicator.
        payload = self._comm.Iallreduce(_mpi_buffer(send), _mpi_buffer(result), self._mpi_op(op, send.dtype))
        self._confirm(pending)
        self._wait(payload, "all_reduce", name)

    def _ring_all_reduce(self, send: np.ndarray, result: np.ndarray, op: str, name: str, pending: Any) -> None:
        self._confirm(pending)
        flat_in, flat_out = send.reshape(-1), result.reshape(-1)
        n = flat_in.size
        starts = [r * n // self.size for r in range(self.size + 1)]
        counts = [starts[r + 1] - starts[r] for r in range(self.size)]
        mine = flat_out[starts[self.rank]: starts[self.rank + 1]]  # a view: reduce-scatter writes in place
        request = self._comm.Ireduce_scatter(flat_in, mine, counts, self._mpi_op(op, send.dtype))
        self._wait(request, "all_reduce (ring: reduce-scatter)", name)
        request = self._comm.Iallgatherv(self._MPI.IN_PLACE, [flat_out, (counts, starts[:-1])])
        self._wait(request, "all_reduce (ring: all-gather)", name)

    def _tree_all_reduce(self, send: np.ndarray, result: np.ndarray, op: str, name: str, pending: Any) -> None:
        self._confirm(pending)
        gathered = np.empty((self.size, *send.shape), send.dtype)
        self._wait(self._comm.Iallgather(_mpi_buffer(send), _mpi_buffer(gathered)), "all_reduce (tree: all-gather)",
                   name)
        combine = {"SUM": np.add, "MEAN": np.add, "MAX": np.maximum, "MIN": np.minimum}[op]
        level = list(gathered)
        while len(level) > 1:  # neighbours paired level by level: the local communicator's hierarchical_copy tree
            paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            level = paired + ([level[-1]] if len(level) % 2 else [])
        np.copyto(result, level[0])

    def all_gather(self, buffer: np.ndarray, axis: int = 0, name: str = "") -> np.ndarray:
        """Concatenates every rank's ``buffer`` (all of one shape) along ``axis`` in rank order."""
        send = _contiguous(buffer)
        if send.ndim == 0:
            raise InvalidArgumentError("all_gather: the buffer must have rank >= 1 (scalars cannot be concatenated)")
        axis = _axis(axis, send.ndim)
        self._begin("all_gather", name, f"axis={axis}", send)
        gathered = np.empty((self.size, *send.shape), send.dtype)
        if self.size == 1:
            gathered[0] = send
        else:
            self._wait(self._comm.Iallgather(_mpi_buffer(send), _mpi_buffer(gathered)), "all_gather", name)
        if axis == 0:
            return gathered.reshape((self.size * send.shape[0], *send.shape[1:]))
        return np.concatenate(list(gathered), axis=axis)

    def all_to_all(self, buffer: np.ndarray, split_axis: int = 0, concat_axis: int = 0, name: str = "") -> np.ndarray:
        """Rank ``r`` gets chunk ``r`` (along ``split_axis``) of every rank's ``buffer`` (all of one shape), joined
        along ``concat_axis`` in rank order (``MPI_Alltoall`` of the chunks).
        """
        send = _contiguous(buffer)
        if send.ndim == 0:
            raise InvalidArgumentError("all_to_all: the buffer must have rank >= 1 (scalars cannot be split)")
        if send.shape[_axis(split_axis, send.ndim, "all_to_all")] % self.size:
            raise InvalidArgumentError(f"all_to_all: split_axis {split_axis} of shape {send.shape} does not split "
                                       f"into {self.size} equal chunks (one per rank); pad it first")
        chunks = np.stack(np.split(send, self.size, axis=int(split_axis)))  # chunk r is contiguous, for rank r
        received = np.empty_like(chunks)
        self._begin("all_to_all", name, f"split_axis={split_axis} concat_axis={concat_axis}", send)
        if self.size == 1:
            np.copyto(received, chunks)
        else:
            self._wait(self._comm.Ialltoall(_mpi_buffer(chunks), _mpi_buffer(received)), "all_to_all", name)
        return np.concatenate(list(received), axis=_axis(concat_axis, send.ndim, "all_to_all"))

    def broadcast(self, buffer: np.ndarray, root: int = 0, name: str = "") -> np.ndarray:
        """Every rank gets root's ``buffer`` (written in place when it is writeable and contiguous)."""
        if not 0 <= int(root) < self.size:
            raise InvalidArgumentError(f"broadcast: root {root} is not a rank (0..{self.size - 1})")
        array = np.asarray(buffer)
        target = array if (array.flags.c_contiguous and array.flags.writeable) else np.array(array, order="C")
        self._begin("broadcast", name, f"root={root}", target)
        if self.size > 1:
            self._wait(self._comm.Ibcast(_mpi_buffer(target), root=int(root)), "broadcast", name)
        return target

    def reduce_scatter(self, buffer: np.ndarray, reduce_op: str = "SUM", name: str = "") -> np.ndarray:
        """Reduces the flat ``buffer`` over all ranks; rank ``r`` gets chunk ``r``
        (elements ``[r * n // size, (r + 1) * n // size)``), as a flat array.
        """
        op = str(reduce_op).upper()
        if op not in ("SUM", "MEAN", "MAX", "MIN"):
            raise InvalidArgumentError(f"reduce_scatter: reduce_op must be SUM, MEAN, MAX or MIN, got {reduce_op!r}")
        send = _contiguous(buffer).reshape(-1)
        _check_mean(op, send.dtype, "reduce_scatter")
        n = send.size
        counts = [(r + 1) * n // self.size - r * n // self.size for r in range(self.size)]
        result = np.empty(counts[self.rank], send.dtype)
        self._begin("reduce_scatter", name, op, send)
        if self.size == 1:
            np.copyto(result, send)
        else:
            request = self._comm.Ireduce_scatter(_mpi_buffer(send), _mpi_buffer(result), counts,
                                                 self._mpi_op(op, send.dtype))
            self._wait(request, "reduce_scatter", name)
        if op == "MEAN":
            if result.dtype.kind in "iu":
                np.floor_divide(result, self.size, out=result)
            else:
                np.divide(result, np.asarray(self.size, result.dtype), out=result)
        return result

    def barrier(self, name: str = "") -> None:
        """Waits until every rank arrives (with the timeout)."""
        self._begin("barrier", name, "", np.zeros(0, np.uint8))
        if self.size > 1:
            self._wait(self._comm.Ibarrier(), "barrier", name)

    def allgather_object(self, obj: Any, name: str = "") -> list[Any]:
        """Gathers a small JSON-able Python object from every rank (for setup, not per step)."""
        import json

        data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
        sizes = self.all_gather(np.array([data.size], np.int64), name=f"{name}/sizes")
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        gathered = self.all_gather(padded[None, :], name=f"{name}/data")
        return [json.loads(bytes(gathered[r, : int(sizes[r])]).decode()) for r in range(self.size)]

    @property
    def sequence(self) -> int:
        """Number of collectives issued so far."""
        return self._seq

    # ------------------------------------------------------------ internals
    def _mpi_op(self, op: str, dtype: np.dtype) -> Any:
        mpi = self._MPI
        if dtype == np.bool_:
            return {"SUM": mpi.LOR, "MAX": mpi.LOR, "MIN": mpi.LAND}[op]
        return {"SUM": mpi.SUM, "MEAN": mpi.SUM, "MAX": mpi.MAX, "MIN": mpi.MIN}[op]

    def _begin(self, kind: str, name: str, detail: str, buffer: np.ndarray) -> None:
        self._confirm(self._announce(kind, name, detail, buffer))

    def _announce(self, kind: str, name: str, detail: str, buffer: np.ndarray) -> tuple[Any, ...] | None:
        """Numbers the collective and starts the fingerprint all-reduce (``None`` when nothing is checked)."""
        if self._broken is not None:
            raise CommunicatorBrokenError(f"the MPI communicator is unusable after an earlier failure: {self._broken}")
        self._seq += 1
        description = f"#{self._seq} {kind} {name or '-'} {detail} {buffer.dtype}{list(buffer.shape)}"
        self._current = description
        if not self.check or self.size == 1:
            return None
        fingerprint = zlib.crc32(description.encode()) | (self._seq << 32)
        header = np.array([fingerprint, -fingerprint], np.int64)
        result = np.empty_like(header)
        return self._comm.Iallreduce(header, result, self._MPI.MAX), header, result, description, kind, name

    def _confirm(self, pending: tuple[Any, ...] | None) -> None:
        """Waits for the fingerprints; raises :class:`CollectiveMismatchError` when the ranks' calls differ."""
        if pending is None:
            return
        request, _, result, description, kind, name = pending
        self._wait(request, kind, name)
        if result[0] != -result[1]:
            self._raise_mismatch(description)

    def _raise_mismatch(self, description: str) -> None:
        encoded = description.encode()[:_DESCRIPTION_BYTES].ljust(_DESCRIPTION_BYTES, b" ")
        mine = np.frombuffer(encoded, np.uint8).copy()
        everyone = np.empty((self.size, _DESCRIPTION_BYTES), np.uint8)
        # On the control communicator: a payload that started with the fingerprints may hold this one.
        self._wait(self._control.Iallgather(mine, everyone), "mismatch report", "")
        listing = "; ".join(f"{self.rank_names[r]} called {bytes(everyone[r]).decode(errors='replace').strip()}"
                            for r in range(self.size))
        message = (f"ranks called different collectives at the same point ({listing}); every process must run "
                   "the same steps on inputs of the same shapes (same code, same batch sizes)")
        self._broken = message
        raise CollectiveMismatchError(message)

    def _wait(self, request: Any, kind: str, name: str) -> None:
        recorder = timeline.current()  # a recorded step (GRAPHDIST_TRACE): its timeline shows the wait
        began = recorder.now() if recorder is not None else 0.0
        self._poll(request, kind, name)
        if recorder is not None:
            recorder.add(_WAIT_EVENT, "wait", timeline.COMM_LANE, began, recorder.now(), kind=kind,
                         collective=name or "-")

    def _poll(self, request: Any, kind: str, name: str) -> None:
        mpi = self._MPI
        start = time.monotonic()
        deadline = start + self.timeout
        ask_ended = start + _ASK_ENDED_SECONDS
        polls = 0
        try:
            while not request.Test():
                polls += 1
                if polls % 64:
                    continue  # MPI progresses the collective only inside Test(): poll tightly
                self._serve_pings()
                lost = rendezvous.first_loss()
                if lost is not None:
                    self._fail_lost(f"{kind} {name or ''}".strip(), lost)
                now = time.monotonic()
                if self._ended is not None and now > ask_ended:
                    ask_ended = now + _ASK_ENDED_SECONDS
                    self._fail_if_a_peer_ended(f"{kind} {name or ''}".strip(), request)
                if now > deadline:
                    self._fail(f"{kind} {name or ''}".strip(), f"did not complete within {self.timeout:g} s")
                waited = now - start
                if waited > _SLEEP_AFTER_SECONDS:
                    time.sleep(1e-3)  # a peer is busy elsewhere: stop burning a core meanwhile
                elif waited > _SPIN_SECONDS:
                    os.sched_yield()  # let other processes and threads on this core run
        except mpi.Exception as err:
            self._fail(f"{kind} {name or ''}".strip(), f"failed in MPI ({err.Get_error_string().strip()})")

    def _serve_pings(self) -> None:
        mpi = self._MPI
        status = mpi.Status()
        while self._control.Iprobe(source=mpi.ANY_SOURCE, tag=_PING, status=status):
            source = status.Get_source()
            self._control.Recv(self._ping_buf, source=source, tag=_PING)
            reply = np.array([self._seq], np.int64)
            self._pongs.append((self._control.Isend(reply, dest=source, tag=_PONG), reply))
        self._pongs = [(r, b) for r, b in self._pongs if not r.Test()]

    def _probe_peers(self, grace: float) -> dict[int, int | None]:
        """Pings every other rank whose task is not known to have ended (a send to an ended task that joined
        through a port can block in MPICH); returns the collective number each is waiting at (None: no answer).
        """
        mpi = self._MPI
        ended = self._peers_ended()
        replies: dict[int, int | None] = {r: None for r in range(self.size) if r != self.rank and r not in ended}
        ping = np.array([self._seq], np.int64)
        sends, receives = [], {}
        try:
            for peer in replies:
                sends.append(self._control.Isend(ping, dest=peer, tag=_PING))
                buffer = np.zeros(1, np.int64)
                receives[peer] = (self._control.Irecv(buffer, source=peer, tag=_PONG), buffer)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(replies[p] is None for p in replies):
                self._serve_pings()
                for peer, (request, buffer) in receives.items():
                    if replies[peer] is None and request.Test():
                        replies[peer] = int(buffer[0])
                time.sleep(1e-3)
        except mpi.Exception:
            pass  # a peer that died makes sends fail; it is reported as not answering
        return replies

    def _peers_ended(self) -> dict[int, str]:
        """``{rank: how it ended}`` of the peers whose task ended (empty without ``ended``)."""
        if self._ended is None:
            return {}
        found = {peer: self._ended(peer) for peer in range(self.size) if peer != self.rank}
        return {peer: how for peer, how in found.items() if how is not None}

    def _fail_if_a_peer_ended(self, what: str, request: Any) -> None:
        ended = self._peers_ended()
        if not ended or request.Test():  # a peer that took part and then ended is no failure
            return
        peer, how = min(ended.items())
        message = (f"{self.rank_names[self.rank]}: collective {self._current} cannot complete: "
                   f"{self.rank_names[peer]} ended ({how}) without taking part in it. Every task must call the same "
                   "collectives in the same order; note that reading a variable sharded across workers "
                   "(variable.numpy(), a checkpoint's save) is such a collective: do it on every worker, not only "
                   "on the chief")
        self._raise_lost(what, message)

    def _fail_lost(self, what: str, lost: str) -> None:
        self._raise_lost(what, f"{self.rank_names[self.rank]}: collective {self._current} cannot complete: {lost}. "
                               "The job cannot go on without it; check that task's output and restart the job (from "
                               "the last checkpoint)")

    def _raise_lost(self, what: str, message: str) -> None:
        """Breaks the communicator and raises :class:`TaskLostError`: a task this collective needs has ended."""
        self._break(message)
        logger.debug("collective failed (%s): %s", what, message)
        raise TaskLostError(message)

    def _break(self, message: str) -> None:
        self._broken = message
        skip_finalize(message)

    def _fail(self, what: str, reason: str) -> None:
        grace = min(2.0, max(0.2, self.timeout / 4))
        replies = self._probe_peers(grace)
        silent = [self.rank_names[p] for p, seq in replies.items() if seq is None]
        elsewhere = [f"{self.rank_names[p]} is at collective #{seq}" for p, seq in replies.items()
                     if seq is not None and seq != self._seq]
        details = []
        if silent:
            details.append(f"no answer from {', '.join(silent)} (dead, unreachable, or stuck outside graphdist)")
        if elsewhere:
            details.append("; ".join(elsewhere))
        if not details:
            details.append("every other rank answered and is waiting in this collective")
        message = (f"{self.rank_names[self.rank]}: collective {self._current} {reason}: "
                   f"{'; '.join(details)}. Check the output of those processes; raise the limit with "
                   "GRAPHDIST_COLLECTIVE_TIMEOUT (or graphdist launch --timeout) if a step is just slow")
        self._break(message)
        logger.debug("collective failed (%s): %s", what, message)
        raise CollectiveTimeoutError(message)

    def __repr__(self) -> str:
        return f"MPICommunicator(rank={self.rank}, size={self.size}, timeout={self.timeout:g})"


def _contiguous(buffer: Any) -> np.ndarray:
    array = np.asarray(buffer)
    if array.dtype == object or array.dtype.kind in "USV":
        raise InvalidArgumentError(f"MPI collectives need numeric buffers, got dtype {array.dtype}")
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _output(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A result buffer: large ones come from the local communicator's pool of earlier outputs that nobody
    holds any more (a fresh large array costs a page fault per page, about as long as the reduction).
    """
    from graphdist.runtime.comm import local

    return local._empty(int(np.prod(shape, dtype=np.int64)), np.dtype(dtype)).reshape(shape)


def _check_mean(op: str, dtype: np.dtype, what: str) -> None:
    if op == "MEAN" and dtype == np.bool_:
        raise InvalidArgumentError(f"{what}: MEAN of booleans is undefined; cast to a number first")


def _mpi_buffer(array: np.ndarray) -> Any:
    # 0-d arrays have no buffer shape MPI accepts; a 1-element view of the same memory does.
    return array.reshape(1) if array.ndim == 0 else array


def _axis(axis: int, ndim: int, what: str = "all_gather") -> int:
    if not -ndim <= int(axis) < ndim:
        raise InvalidArgumentError(f"{what}: axis {axis} is out of range for a buffer of rank {ndim}")
    return int(axis) % ndim


# ------------------------------------------------------------ process default
_default: MPICommunicator | None = None


def default_communicator() -> MPICommunicator:
    """The communicator of the whole MPI job (created on first use)."""
    global _default
    if _default is None:
        _default = MPICommunicator()
    return _default


def set_default_communicator(communicator: MPICommunicator | None) -> None:
    """Makes ``communicator`` the one plan tasks use (the multi-worker strategy sets its workers' one)."""
    global _default
    _default = communicator


_task_communicators: dict[str, Callable[[], MPICommunicator]] = {}


def register_group(group: str, factory: Callable[[], MPICommunicator]) -> None:
    """Names the communicator that plan tasks with ``attrs["comm_group"] == group`` use."""
    _task_communicators[group] = factory


def run_comm_task(op: str, attrs: dict[str, Any], buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Executes a cross-worker plan task for the local participants ``buffers``.

    The local participants hold equal values (their local group was reduced
    first), so the first one goes over MPI and every participant gets the
    result; with ``attrs["per_participant"]`` (ZeRO-1's shards) each
    participant's buffer is its own and goes over MPI in turn, in
    participant order (the same on every worker).
    """
    group = attrs.get("comm_group")
    factory = _task_communicators.get(group) if group else None
    communicator = factory() if factory is not None else default_communicator()
    name = str(attrs.get("name", ""))
    if attrs.get("per_participant") and len(buffers) > 1:
        single = dict(attrs, per_participant=0)
        return [run_comm_task(op, single, [buffer])[0] for buffer in buffers]
    if op == "CrossWorkerAllReduce":
        result = communicator.all_reduce(buffers[0], attrs.get("reduce_op", "SUM"), name=name,
                                         algorithm=str(attrs.get("algorithm", "auto")))
    elif op == "CrossWorkerAllGather":
        result = communicator.all_gather(buffers[0], int(attrs.get("axis", 0)), name=name)
    elif op == "CrossWorkerReduceScatter":
        result = communicator.reduce_scatter(buffers[0], attrs.get("reduce_op", "SUM"), name=name)
    else:
        raise InvalidArgumentError(f"the MPI communicator does not run {op!r}")
    result.flags.writeable = False  # shared by the local participants, like the local communicator's results
    return [result] * len(buffers)
