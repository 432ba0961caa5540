"""Tasks started on their own meet at one task's TF_CONFIG address, and learn at once when one is lost.

The seeds start a multi-worker job by hand: every task is a separate
``python train.py`` with a ``TF_CONFIG`` that lists every task's
``host:port``. Before those processes can join one MPI communicator
(:mod:`graphdist.runtime.comm.mpi_join`) they must find each other and agree
that they are one job. This module does that, and nothing else: no tensor
ever goes through it.

* **Listen.** Every task listens on its own TF_CONFIG address (on that IP
  when it is this host's, else on every interface, as a Kubernetes service
  address is). A port already in use is a :class:`~graphdist.ClusterConfigError`.
* **Meet.** The other tasks connect to the hub (:func:`hub_rank`: ps 0 in
  a parameter-server job, else the chief, else worker 0), retrying until
  ``GRAPHDIST_CONNECT_TIMEOUT`` seconds (default 3600, TF's coordination
  service's wait for every task to register), in any start order. Each
  says who it is: its task, its cluster, its graphdist version and its host.
  When every task has arrived the hub compares them: another cluster,
  another version, or two processes claiming one task end the start-up on
  every task with the same message naming the difference. Otherwise it
  answers each with the MPI port to connect to and every task's host.
* **Watch.** The connections stay open for the whole job. A task that ends
  says goodbye first; a connection that closes without it (the process was
  killed, crashed, or its host went down with a reset) means the task was
  lost: the hub notes it and tells every other task at once. The MPI
  communicator asks :func:`first_loss` while it waits, so a synchronous job
  whose task dies on any host ends on every host within a second, naming the
  task and its host; the ps server drops a lost worker the same way. This
  does not depend on any host's ``/proc`` or on a shared folder. A network
  partition closes nothing: the collective timeout
  (``GRAPHDIST_COLLECTIVE_TIMEOUT``) ends those waits.

The connections are :mod:`multiprocessing.connection` ``Connection`` objects
(the standard library's authenticated message connection: an HMAC challenge with the key
``GRAPHDIST_JOB_KEY``, empty by default). Messages are small JSON objects sent
with ``send_bytes``; nothing is unpickled.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge, wait
from typing import Any

from graphdist.errors import ClusterConfigError
from graphdist.runtime.cluster_spec import ClusterSpec, rank_task, task_rank

__all__ = [
    "CONNECT_TIMEOUT_ENV",
    "Meeting",
    "Rendezvous",
    "connect_timeout",
    "hub_rank",
    "split_address",
    "first_loss",
    "set_current",
    "lost_tasks",
    "task_ended",
    "current",
]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_ENV = "GRAPHDIST_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 3600.0
_RETRY_S = 0.25
_GRACE_AFTER_PROBLEM_S = 10.0
_HELLO_WAIT_S = 30.0  # a connection that says nothing for this long is not a task
_CONNECT_TRY_S = 5.0  # one TCP connect attempt to the hub
_MESSAGE_LIMIT = 1 << 20


def connect_timeout() -> float:
    """Seconds the tasks of a job wait for each other at start-up: ``GRAPHDIST_CONNECT_TIMEOUT`` or 3600."""
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ClusterConfigError(f"{CONNECT_TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise ClusterConfigError(f"{CONNECT_TIMEOUT_ENV} must be > 0 seconds, got {text!r}")
    return value


def _job_key() -> bytes:
    return b"graphdist:" + os.environ.get("GRAPHDIST_JOB_KEY", "").encode()


def hub_rank(spec: ClusterSpec) -> int:
    """The task the others meet at and stay connected to: ps 0 when there are ps tasks (it outlives every
    worker, so it hears of each lost one), else rank 0 (the chief, else worker 0).
    """
    return task_rank(spec, "ps", spec.task_indices("ps")[0]) if "ps" in spec.jobs else 0


def split_address(address: str, label: str) -> tuple[str, int]:
    """``(host, port)`` of a TF_CONFIG address (``host:port``, ``[v6]:port``).

    Raises:
        ClusterConfigError: No port, or a port that is not a number in 1..65535.
    """
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterConfigError(f"{label}: the address {address!r} is not host:port (e.g. 'node1:2222'); every "
                                 "task of a job started by hand needs a port to listen on")
    return host, int(port)


def _task_name(spec: ClusterSpec, rank: int) -> str:
    job, index = rank_task(spec, rank)
    return f"{job} {index}"


def _sync_ranks(spec: ClusterSpec) -> list[int]:
    """Ranks of the tasks that meet (every task but evaluators, which run alone)."""
    return [task_rank(spec, job, i) for job in spec.jobs if job != "evaluator" for i in spec.task_indices(job)]


def _send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message).encode())


def _receive(conn: Connection, timeout: float | None) -> dict[str, Any] | None:
    """The next message, or ``None`` when none came within ``timeout`` s (EOFError when it closed)."""
    if timeout is not None and not conn.poll(max(0.0, timeout)):
        return None
    data = conn.recv_bytes(_MESSAGE_LIMIT)
    try:
        message = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return {"error": "a malformed message"}
    return message if isinstance(message, dict) else {"error": "a malformed message"}


@dataclass
class Meeting:
    """What the tasks agreed on: the MPI port to join, and every task's host (by rank)."""

    port: str
    hosts: dict[int, str]
    rank: int


@dataclass
class _Arrival:
    conn: Connection
    rank: int
    hello: dict[str, Any]
    peer: str


@dataclass
class _State:
    lost: dict[int, str] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)


class Rendezvous:
    """This task's side of the meeting and of the watch (see the module docstring).

    Args:
        spec: The cluster (every task's address).
        task_type: This task's job.
        task_id: This task's index.
        version: graphdist's version (tasks of one job must run the same).
        timeout: Seconds to wait for the others (default :func:`connect_timeout`).

    Raises:
        ClusterConfigError: This task's address has no port, does not resolve,
            or its port is in use.
    """

    def __init__(self, spec: ClusterSpec, task_type: str, task_id: int, version: str,
                 timeout: float | None = None) -> None:
        self.spec = spec
        self.rank = task_rank(spec, task_type, task_id)
        self.name = f"{task_type} {task_id}"
        self.version = version
        self.timeout = connect_timeout() if timeout is None else float(timeout)
        self.ranks = _sync_ranks(spec)
        self.hub = hub_rank(spec)
        self.hosts: dict[int, str] = {}
        self._state = _State()
        self._peers: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._closing = False
        address = spec.task_address(task_type, task_id)
        self.address = address
        self._listener = _listen(address, f"{self.name}'s TF_CONFIG address")
        self._arrivals: list[_Arrival] = []
        self._arrived = threading.Condition(self._lock)
        threading.Thread(target=self._serve_listener, name="graphdist-rendezvous", daemon=True).start()

    # ------------------------------------------------------------------ meeting
    def meet(self, open_port: Callable[[], str]) -> Meeting:
        """Meets the other tasks; the hub calls ``open_port()`` once all agree and hands its result out.

        Raises:
            ClusterConfigError: A task did not arrive in time (naming it and its address), the hub is
                unreachable, or the tasks disagree (cluster, version, two claims of one task).
        """
        if self.rank == self.hub:
            return self._meet_as_hub(open_port)
        return self._meet_as_task()

    def _hello(self) -> dict[str, Any]:
        return {"graphdist": self.version, "task": self.name, "rank": self.rank, "cluster": self.spec.as_dict(),
                "host": socket.gethostname(), "pid": os.getpid()}

    def _meet_as_task(self) -> Meeting:
        job, index = rank_task(self.spec, self.hub)
        hub = self.spec.task_address(job, index)
        conn = self._dial(hub, f"{job} {index}")
        _send(conn, self._hello())
        deadline = time.monotonic() + self.timeout
        try:
            reply = _receive(conn, deadline - time.monotonic())
        except (EOFError, OSError):
            reply = {"error": f"{job} {index} at {hub} closed the connection during the start-up"}
        if reply is None:
            raise ClusterConfigError(f"{self.name}: {job} {index} at {hub} did not start the job within "
                                     f"{self.timeout:g} s ({CONNECT_TIMEOUT_ENV}): not every task arrived")
        if "error" in reply:
            conn.close()
            raise ClusterConfigError(f"{self.name}: the job cannot start: {reply['error']}")
        self.hosts = {int(r): str(h) for r, h in reply["hosts"].items()}
        self._peers[self.hub] = conn
        return Meeting(str(reply["port"]), dict(self.hosts), self.rank)

    def _dial(self, address: str, name: str) -> Connection:
        """Connects to ``address`` (retrying until the timeout: it may start later than this task)."""
        host, port = split_address(address, name)
        deadline = time.monotonic() + self.timeout
        problem = "no answer"
        while True:
            try:
                ip = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
            except (OSError, UnicodeError) as err:
                problem = f"its host {host!r} does not resolve ({err})"
            else:
                try:
                    return _connect(ip, port, max(0.5, min(_CONNECT_TRY_S, deadline - time.monotonic())))
                except AuthenticationError:
                    raise ClusterConfigError(f"{self.name}: {name} at {address} refused this task's key: the tasks' "
                                             "GRAPHDIST_JOB_KEY differ (or another program listens there)") from None
                except (BlockingIOError, TimeoutError):
                    problem = "no answer"
                except (OSError, EOFError) as err:
                    problem = f"{err.strerror or err}" if isinstance(err, OSError) else "it closed the connection"
            if time.monotonic() > deadline:
                raise ClusterConfigError(
                    f"{self.name}: cannot reach {name} at {address} within {self.timeout:g} s "
                    f"({CONNECT_TIMEOUT_ENV}): {problem}. Start that task (with the same TF_CONFIG cluster), check "
                    "the address, and that this host reaches it")
            time.sleep(_RETRY_S)

    def _meet_as_hub(self, open_port: Callable[[], str]) -> Meeting:
        expected = {r for r in self.ranks if r != self.rank}
        deadline = time.monotonic() + self.timeout
        arrivals: dict[int, _Arrival] = {}
        refused: list[_Arrival] = []
        problems: list[str] = []
        with self._arrived:
            while expected - set(arrivals) - {a.rank for a in refused}:
                if not self._arrivals:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._arrived.wait(min(remaining, 1.0))
                    continue
                arrival = self._arrivals.pop(0)
                problem = self._check(arrival, arrivals)
                if problem:
                    problems.append(problem)
                    refused.append(arrival)
                    # Wait a little for the others, so that every task hears why the job cannot start.
                    deadline = min(deadline, time.monotonic() + _GRACE_AFTER_PROBLEM_S)
                else:
                    arrivals[arrival.rank] = arrival
        missing = sorted(expected - set(arrivals))
        if not problems and missing:
            listing = ", ".join(f"{_task_name(self.spec, r)} ({self._address(r)})" for r in missing)
            problems.append(f"{listing} did not arrive within {self.timeout:g} s ({CONNECT_TIMEOUT_ENV}); start "
                            "them with the same TF_CONFIG cluster, each with its own task index")
        if problems:
            message = "; ".join(problems)
            for arrival in [*arrivals.values(), *refused]:
                _try_send(arrival.conn, {"error": message})
                arrival.conn.close()
            raise ClusterConfigError(f"{self.name}: the job cannot start: {message}")
        self.hosts = {self.rank: socket.gethostname(),
                      **{r: str(a.hello.get("host", "?")) for r, a in arrivals.items()}}
        port = open_port()
        with self._lock:
            for rank, arrival in arrivals.items():
                _send(arrival.conn, {"port": port, "hosts": {str(r): h for r, h in self.hosts.items()}})
                self._peers[rank] = arrival.conn
        return Meeting(port, dict(self.hosts), self.rank)

    def _address(self, rank: int) -> str:
        job, index = rank_task(self.spec, rank)
        return self.spec.task_address(job, index)

    def _check(self, arrival: _Arrival, arrived: dict[int, _Arrival]) -> str:
        """Why ``arrival`` cannot join this job ('' when it can)."""
        hello, who = arrival.hello, f"{arrival.hello.get('task', '?')} (from {arrival.peer})"
        if "error" in hello:
            return f"{arrival.peer} sent {hello['error']}"
        if hello.get("graphdist") != self.version:
            return (f"{who} runs graphdist {hello.get('graphdist')!r} but {self.name} runs {self.version!r}; every "
                    "task of a job must run the same graphdist version")
        difference = _cluster_difference(self.spec.as_dict(), hello.get("cluster"))
        if difference:
            return (f"{who} has another cluster than {self.name}: {difference}; give every task the same "
                    "TF_CONFIG 'cluster' (only 'task' differs)")
        rank = arrival.rank
        if rank == self.rank or rank in arrived:
            first = f"{self.name} itself" if rank == self.rank else f"the process from {arrived[rank].peer}"
            return (f"{who} claims the same task as {first}; give each process its own TF_CONFIG task index")
        if rank not in self.ranks:
            return f"{who} is not a task that meets ({hello.get('task')!r})"
        return ""

    # --------------------------------------------------------------- listening
    def _serve_listener(self) -> None:
        while not self._closing:
            try:
                conn = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: Connection) -> None:
        peer = _peer(conn)
        try:
            # The HMAC challenge runs here, not in the accept loop: a client that connects and never answers
            # holds only its own thread.
            deliver_challenge(conn, _job_key())
            answer_challenge(conn, _job_key())
            hello = _receive(conn, min(self.timeout, _HELLO_WAIT_S))
        except (AuthenticationError, EOFError, OSError) as err:
            logger.debug("%s: refused a connection from %s: %s", self.name, peer, err)
            conn.close()
            return
        if hello is None:
            conn.close()
            return
        if self.rank != self.hub:
            _try_send(conn, {"error": (f"{self.address} is {self.name}, where tasks do not meet; "
                                       f"{hello.get('task', 'a task')} (from {peer}) meets there, so the two "
                                       "tasks' TF_CONFIG clusters differ")})
            conn.close()
            return
        rank = hello.get("rank")
        arrival = _Arrival(conn, rank if isinstance(rank, int) else -1, hello, peer)
        with self._arrived:
            if self._peers:  # the job started already: a latecomer
                taken = rank in self._peers or rank == self.rank
                _try_send(conn, {"error": (f"{hello.get('task')} (from {peer}) arrived after the job started; "
                                           + ("that task is already in the job: give each process its own "
                                              "TF_CONFIG task index" if taken else "restart every task"))})
                conn.close()
                return
            self._arrivals.append(arrival)
            self._arrived.notify_all()

    # ------------------------------------------------------------------ watch
    def watch(self) -> None:
        """Starts watching the job's connections for lost tasks (after the MPI join)."""
        threading.Thread(target=self._watch, name="graphdist-watch", daemon=True).start()

    def _watch(self) -> None:
        while not self._closing:
            with self._lock:
                conns = {conn: rank for rank, conn in self._peers.items()}
            if not conns:
                return
            for conn in wait(list(conns), timeout=1.0):
                self._read_from(conns[conn], conn)

    def _read_from(self, rank: int, conn: Connection) -> None:
        try:
            message = _receive(conn, 0.0) or {}
        except (EOFError, OSError):
            message = {"closed": True}
        if message.get("bye"):
            self._finish(rank)
        elif message.get("failed") is not None:
            self._note_loss(rank, f"it failed: {message['failed']}", relay=True)
        elif message.get("lost") is not None:
            self._note_loss(int(message["lost"]), str(message.get("how", "lost")), relay=False)
        elif message.get("closed"):
            with self._lock:
                self._peers.pop(rank, None)
            if rank not in self._state.finished and not self._closing:
                self._note_loss(rank, "its process ended without finishing (killed or crashed), or its host "
                                      "went down", relay=True)

    def _finish(self, rank: int) -> None:
        with self._lock:
            self._state.finished.add(rank)
            conn = self._peers.pop(rank, None)
        if conn is not None:
            conn.close()

    def _note_loss(self, rank: int, how: str, relay: bool) -> None:
        with self._lock:
            if rank in self._state.lost or rank in self._state.finished:
                return
            self._state.lost[rank] = how
            others = [c for r, c in self._peers.items() if r != rank]
        logger.warning("%s: lost %s: %s", self.name, self.describe(rank), how)
        if relay and self.rank == self.hub:
            for conn in others:
                _try_send(conn, {"lost": rank, "how": how})

    def describe(self, rank: int) -> str:
        """``"worker 1 at 198.18.0.2:2222 (rank 1, host node-b)"``: the task, its address and host name."""
        host = self.hosts.get(rank)
        return f"{_task_name(self.spec, rank)} at {self._address(rank)} (rank {rank}{f', host {host}' if host else ''})"

    def first_loss(self) -> str | None:
        """A sentence naming the first lost task, or ``None`` while every task is alive."""
        with self._lock:
            if not self._state.lost:
                return None
            rank, how = next(iter(self._state.lost.items()))
        return f"{self.describe(rank)} was lost: {how}"

    def lost(self) -> dict[int, str]:
        """``{rank: how}`` of the tasks lost so far."""
        with self._lock:
            return dict(self._state.lost)

    def finished(self, rank: int) -> bool:
        """Whether ``rank`` said goodbye (ended normally)."""
        with self._lock:
            return rank in self._state.finished

    def announce_failure(self, text: str) -> None:
        """Tells the job that this task fails (``text``: the error), before the process ends."""
        with self._lock:
            peers = list(self._peers.values())
        hub = self.rank == self.hub
        for conn in peers:
            _try_send(conn, {"lost": self.rank, "how": f"it failed: {text}"} if hub else {"failed": text})

    def close(self) -> None:
        """Says goodbye to every peer and stops listening (at a normal exit)."""
        if self._closing:
            return
        self._closing = True
        with self._lock:
            peers = list(self._peers.values())
            self._peers.clear()
        for conn in peers:
            _try_send(conn, {"bye": True})
            conn.close()
        try:
            self._listener.close()
        except OSError:
            pass


def _connect(ip: str, port: int, timeout: float) -> Connection:
    """An authenticated connection to ``ip:port`` (what ``multiprocessing.connection.Client`` makes), giving up
    after ``timeout`` s in the TCP connect and in each read of the handshake: an address behind a dead link
    would otherwise hold a try for the kernel's ~2 minutes, and a peer that accepts and never answers forever.
    """
    sock = socket.create_connection((ip, port), timeout=timeout)
    try:
        sock.settimeout(None)  # blocking, as Connection's reads expect; the kernel times them out meanwhile
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
        conn = Connection(os.dup(sock.fileno()))
        try:
            answer_challenge(conn, _job_key())
            deliver_challenge(conn, _job_key())
        except BaseException:
            conn.close()
            raise
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0))
    finally:
        sock.close()  # the connection holds its own descriptor of the same socket
    return conn


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))


def _try_send(conn: Connection, message: dict[str, Any]) -> None:
    try:
        _send(conn, message)
    except (OSError, ValueError):
        pass  # it is gone: nothing to tell


def _peer(conn: Connection) -> str:
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
    finally:
        sock.close()


def _listen(address: str, label: str) -> Listener:
    """A listener on ``address``: on its IP when that is this host's, else on every interface."""
    host, port = split_address(address, label)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise ClusterConfigError(f"{label} {address!r}: the host {host!r} does not resolve ({err}); give a host "
                                 "name or address of this machine") from None
    family, ip = infos[0][0], infos[0][4][0]
    for bind_ip in (ip, "::" if family == socket.AF_INET6 else "0.0.0.0"):
        try:
            return Listener((bind_ip, port), family="AF_INET6" if family == socket.AF_INET6 else "AF_INET",
                            backlog=64)  # authenticated per connection (Rendezvous._greet)
        except OSError as err:
            if err.errno == errno.EADDRNOTAVAIL:
                continue  # not this host's address (a service address): listen on every interface
            if err.errno == errno.EADDRINUSE:
                raise ClusterConfigError(
                    f"{label} {address}: port {port} is already in use on this host (another process, or another "
                    "task given the same address); give each task a free port in TF_CONFIG") from None
            raise ClusterConfigError(f"{label} {address}: cannot listen there ({err.strerror or err})") from None
    raise ClusterConfigError(f"{label} {address}: cannot listen on it or on every interface")


def _cluster_difference(mine: dict[str, Any], theirs: Any) -> str:
    """What differs between two clusters' dicts ('' when nothing)."""
    if not isinstance(theirs, dict):
        return f"it sent no cluster ({theirs!r})"
    parts = []
    for job in sorted(set(mine) | set(theirs), key=str):
        a, b = mine.get(job), theirs.get(job)
        if a != b:
            parts.append(f"job {job!r} is {b!r} there and {a!r} here")
    return "; ".join(parts)


# ------------------------------------------------------------ the process's job
_current: Rendezvous | None = None


def current() -> Rendezvous | None:
    """The rendezvous of the job this process joined by hand (``None`` otherwise)."""
    return _current


def set_current(rendezvous: Rendezvous | None) -> None:
    """Makes ``rendezvous`` the process's job (the MPI join does)."""
    global _current
    _current = rendezvous


def first_loss() -> str | None:
    """A sentence naming the first task this job lost, or ``None`` (also outside such a job)."""
    return _current.first_loss() if _current is not None else None


def lost_tasks() -> dict[int, str]:
    """``{rank: how}`` of the tasks this job lost (empty outside such a job)."""
    return _current.lost() if _current is not None else {}


def task_ended(rank: int) -> str | None:
    """How task ``rank`` ended: ``"finished"``, a sentence when it was lost, ``None`` while it runs."""
    if _current is None:
        return None
    if _current.finished(rank):
        return "finished"
    return _current.lost().get(rank)
