"""``graphdist launch``: start a multi-process job through ``mpiexec``.

::

    graphdist launch --workers 2 [--ps 1] [--chief] [--hosts h1,h2] [--devices-per-worker K]
                     [--timeout S] -- python train.py ...

Every task becomes one MPI rank, numbered chief, workers, ps (the order of
:func:`graphdist.distribute.cluster.task_rank`). Each rank gets its role in
``GRAPHDIST_CONFIG`` (``TF_CONFIG``'s JSON plus ``local_devices``); workers
and the chief run the command, ps tasks run the built-in parameter server
(``python -m graphdist.runtime.ps_server``). Tasks go to the hosts round-robin
(default: all on this host). In jobs without ps tasks, the chief and workers
on this host each get an equal share of its CPU cores (their CPU affinity,
which sizes graphdist's thread pools), so they do not oversubscribe it;
``--no-bind`` turns that off.

Each rank runs under a small wrapper (``python -m graphdist.cli.launch
--rank-wrapper``, not an MPI process itself) that forwards the task's output
line by line with a ``[worker 0]`` prefix and records how it ended the
moment it ends (:mod:`graphdist.runtime.launch_status`). ``mpiexec`` runs
with ``-disable-auto-cleanup``; ``graphdist launch`` supervises the ranks
itself (:mod:`graphdist.cli.launch_supervisor`): a rank the job cannot go on
without (any rank of a synchronous job; a ps task or the chief of a
parameter-server job) ends the whole job within a fraction of a second,
while a lost parameter-server worker lets the others finish. ``SIGINT`` /
``SIGTERM`` to ``graphdist launch`` end every process of the job.
``graphdist launch`` exits 0 when every rank succeeded; otherwise it prints
which ranks failed (the first failure first, with its last output line) and
exits 1 (``128 + N`` when stopped by signal N).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from graphdist.errors import InvalidArgumentError
from graphdist.runtime import launch_status
from graphdist.runtime.cluster_spec import environment_config
from graphdist.runtime.comm.mpi_join import IFACE_ENV, WATCH_ENV, find_mpiexec, interface_towards, network_settings

__all__ = ["add_launch_parser", "cmd_launch", "build_roles", "core_shares", "mpiexec_command", "find_mpiexec",
           "check_hosts", "rank_wrapper", "resolve_python"]

logger = logging.getLogger(__name__)

DEFAULT_BASE_PORT = 29400
"""First port of the tasks' addresses in a job across hosts (rank r listens on ``DEFAULT_BASE_PORT + r``)."""

_EPILOG = """\
examples:
  graphdist launch --workers 2 -- python examples/digits_multi_worker.py
  graphdist launch --workers 2 --devices-per-worker 2 -- python train.py
  graphdist launch --workers 2 --ps 1 -- python examples/digits_parameter_server.py
  graphdist launch --workers 2 --timeout 30 -- python train.py   # a hung collective fails after 30 s

Each process finds its role with gd.cluster_resolver.TFConfigClusterResolver()
(GRAPHDIST_CONFIG); the strategies use it by default. A rank that dies ends a synchronous
job at once; a parameter-server job goes on without a lost worker (not without a ps or the chief).
SIGINT/SIGTERM to graphdist launch end every process of the job."""


def add_launch_parser(commands: Any, formatter: Any) -> None:
    """Adds the ``launch`` subcommand to ``graphdist``'s subparsers."""
    launch = commands.add_parser(
        "launch", help="start a multi-process job (workers, ps tasks) through mpiexec",
        description="Start one process per task through mpiexec, give each its role in GRAPHDIST_CONFIG, run "
                    "ps tasks as the built-in server, prefix every output line with its task, and exit "
                    "non-zero naming the failing tasks if any fails.",
        epilog=_EPILOG, formatter_class=formatter)
    launch.add_argument("--workers", type=int, required=True, metavar="N", help="number of worker tasks")
    launch.add_argument("--ps", type=int, default=0, metavar="M", help="number of parameter server tasks")
    launch.add_argument("--chief", action="store_true", help="add a chief task (rank 0) besides the workers")
    launch.add_argument("--hosts", default=None, metavar="H1,H2",
                        help="hosts to place the tasks on, round-robin (default: this host)")
    launch.add_argument("--port", type=int, default=DEFAULT_BASE_PORT, metavar="P",
                        help="with --hosts: rank r listens on port P+r of its host, so that every task hears at "
                             f"once of one lost on any host (default {DEFAULT_BASE_PORT})")
    launch.add_argument("--devices-per-worker", type=int, default=1, metavar="K",
                        help="devices of each worker: cuda:0..K-1 with GPUs, else logical cpu:0..K-1 (default 1)")
    launch.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds a collective or ps request may wait before failing "
                             "(GRAPHDIST_COLLECTIVE_TIMEOUT; default 300); a rank that dies is noticed at once")
    launch.add_argument("--no-bind", action="store_true",
                        help="do not give each worker on this host its own share of the CPU cores (jobs without ps)")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every worker runs")
    launch.set_defaults(handler=cmd_launch)


def build_roles(workers: int, ps: int = 0, chief: bool = False, hosts: Sequence[str] | None = None,
                devices_per_worker: int = 1, base_port: int | None = None) -> list[dict[str, Any]]:
    """One entry per MPI rank: ``{"name", "type", "index", "host", "config"}``.

    A task's address is ``host:rank``, or with ``base_port`` (jobs across hosts) ``host:base_port+rank``,
    where the task listens so that the tasks hear at once of one lost on any host
    (:mod:`graphdist.runtime.rendezvous`).

    Raises:
        InvalidArgumentError: A count is out of range or a host name is empty.
    """
    for label, value, minimum in (("--workers", workers, 1), ("--ps", ps, 0),
                                  ("--devices-per-worker", devices_per_worker, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise InvalidArgumentError(f"{label} must be an int >= {minimum}, got {value!r}")
    hosts = [h.strip() for h in hosts] if hosts else ["localhost"]
    if not all(hosts):
        raise InvalidArgumentError(f"--hosts has an empty host name ({','.join(hosts)}); give host names like h1,h2")
    if len(set(hosts)) != len(hosts):
        raise InvalidArgumentError(f"--hosts lists a host twice ({','.join(hosts)}); list each host once: the tasks "
                                   "go to them round-robin, several per host when there are more tasks than hosts")
    tasks = [("chief", 0)] if chief else []
    tasks += [("worker", i) for i in range(workers)] + [("ps", i) for i in range(ps)]
    placed = [(job, index, hosts[rank % len(hosts)]) for rank, (job, index) in enumerate(tasks)]
    cluster: dict[str, list[str]] = {}
    if base_port is not None and not (0 < base_port and base_port + len(placed) <= 65536):
        raise InvalidArgumentError(f"--port must leave room for {len(placed)} ports below 65536, got {base_port}")
    for rank, (job, _, host) in enumerate(placed):
        cluster.setdefault(job, []).append(f"{host}:{rank if base_port is None else base_port + rank}")
    from graphdist.runtime.devices import num_gpus

    kind = "cuda" if num_gpus() >= devices_per_worker else "cpu"
    local = [f"{kind}:{i}" for i in range(devices_per_worker)]
    roles = []
    for job, index, host in placed:
        config: dict[str, Any] = {"cluster": cluster, "task": {"type": job, "index": index}}
        if job != "ps":
            config["local_devices"] = local
        roles.append({"name": f"{job} {index}", "type": job, "index": index, "host": host,
                      "config": json.dumps(config)})
    return roles


# ps tasks run the built-in server (not `-m graphdist.runtime.ps_server`: graphdist imports that module itself).
_PS_SERVER = (sys.executable, "-c", "import sys; from graphdist.runtime.ps_server import main; sys.exit(main())")


def core_shares(roles: Sequence[dict[str, Any]], cores: Sequence[int]) -> dict[int, list[int]]:
    """Splits ``cores`` among the chief and worker ranks of a job without ps tasks.

    Each worker's intra-op thread budget follows its share (graphdist sizes thread pools by the
    CPU affinity), so workers on one host do not oversubscribe it. With fewer cores than
    workers, workers share cores round-robin. Jobs with ps tasks are not bound: a ps serves
    requests all the time, and a worker pinned to the core the ps runs on could not move to
    a free one (measured: one worker fell far behind the other).
    """
    ranks = [rank for rank, role in enumerate(roles) if role["type"] != "ps"]
    cores = sorted(cores)
    if not ranks or not cores or len(ranks) < len(roles):
        return {}
    if len(cores) < len(ranks):
        return {rank: [cores[i % len(cores)]] for i, rank in enumerate(ranks)}
    per = len(cores) // len(ranks)
    return {rank: cores[i * per:(i + 1) * per] for i, rank in enumerate(ranks)}


def mpiexec_command(roles: Sequence[dict[str, Any]], command: Sequence[str], status_dir: str,
                    timeout: float | None = None, hosts: Sequence[str] | None = None,
                    cpus: dict[int, list[int]] | None = None) -> list[str]:
    """The ``mpiexec`` MPMD command line: one ``-n 1`` section per rank, joined by ``:``
    (``hosts``: the ``--hosts`` list, ranks placed on them round-robin through mpiexec's ssh launcher;
    ``cpus``: the cores each rank is bound to).
    """
    argv = [find_mpiexec(), "-disable-auto-cleanup"]
    across = []
    if hosts:
        # One slot per host, filled round-robin: rank r runs on hosts[r % len(hosts)], as build_roles placed
        # it. mpiexec starts the remote ranks through ssh; they connect back to it on the interface that
        # reaches them.
        argv += ["-launcher", "ssh", "-hosts", ",".join(f"{host}:1" for host in hosts)]
        iface = os.environ.get(IFACE_ENV, "").strip() or _interface_to_hosts(hosts)
        if iface:
            argv += ["-iface", iface]
        across = ["-env", WATCH_ENV, "1"]
    # A parameter-server job goes on without a lost worker; MPI_Finalize's barrier would wait for it forever.
    finalize = ["-env", "MPIR_CVAR_NO_COLLECTIVE_FINALIZE", "1"] if any(r["type"] == "ps" for r in roles) else []
    for rank, role in enumerate(roles):
        if rank:
            argv.append(":")
        argv += ["-n", "1"]
        argv += ["-env", "GRAPHDIST_CONFIG", role["config"], "-env", "GRAPHDIST_LAUNCH_DIR", status_dir,
                 "-env", "PYTHONUNBUFFERED", "1", *finalize, *across]
        if timeout is not None:
            argv += ["-env", "GRAPHDIST_COLLECTIVE_TIMEOUT", repr(float(timeout))]
        if cpus and rank in cpus:
            argv += ["-env", "GRAPHDIST_LAUNCH_CPUS", ",".join(str(c) for c in cpus[rank])]
        task = list(_PS_SERVER) if role["type"] == "ps" else list(command)
        argv += [sys.executable, "-m", "graphdist.cli.launch", "--rank-wrapper", str(rank), role["name"], "--", *task]
    return argv


def _interface_to_hosts(hosts: Sequence[str]) -> str:
    """This host's interface towards the first listed host that is not this one ('' if none resolves)."""
    for host in hosts:
        try:
            ip = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        except (OSError, UnicodeError):
            continue
        iface = interface_towards(ip)
        if iface and iface != "lo":
            return iface
    return ""


_BARE_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def resolve_python(command: Sequence[str]) -> list[str]:
    """The command with a bare ``python`` (``python3``, ``python3.11``) replaced by this interpreter.

    As torchrun does with ``sys.executable``: the ranks run the Python that
    graphdist launch runs in (the one graphdist is installed in), not whatever
    ``python`` comes first on ``PATH`` where the venv may not be active. A path
    (``/usr/bin/python3``, ``./venv/bin/python``) is kept as given.
    """
    command = list(command)
    if command and _BARE_PYTHON.fullmatch(command[0]) and command[0] != sys.executable:
        logger.info("running %r as %s (the interpreter graphdist launch runs in)", command[0], sys.executable)
        command[0] = sys.executable
    return command


def cmd_launch(args: argparse.Namespace) -> int:
    """Runs ``graphdist launch``; returns the exit status."""
    from graphdist.cli.main import UsageError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("launch: give the command after --, e.g. graphdist launch --workers 2 -- python train.py")
    command = resolve_python(command)
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"launch: --timeout must be > 0 seconds, got {args.timeout}")
    hosts = [h.strip() for h in args.hosts.split(",")] if args.hosts else None
    try:
        roles = build_roles(args.workers, args.ps, args.chief, hosts, args.devices_per_worker,
                            base_port=args.port if hosts else None)
    except InvalidArgumentError as err:  # bad counts or hosts on the command line: a usage error (status 2)
        raise UsageError(f"launch: {err}") from err
    if hosts:
        check_hosts([role["host"] for role in roles])
    from graphdist.cli.launch_supervisor import JobSupervisor

    with tempfile.TemporaryDirectory(prefix="graphdist-launch-") as status_dir:
        cpus = None if (hosts or args.no_bind) else core_shares(roles, sorted(os.sched_getaffinity(0)))
        argv = mpiexec_command(roles, command, status_dir, args.timeout, hosts=hosts, cpus=cpus)
        logger.info("launching %d process(es): %s", len(roles), " ".join(argv))
        sys.stdout.flush()
        return JobSupervisor(roles, status_dir).run(argv)


_RESOLVE_TIMEOUT_S = 10.0


def check_hosts(hosts: Sequence[str], timeout: float = _RESOLVE_TIMEOUT_S) -> None:
    """Checks that every host name resolves (mpiexec would fail later with a process-manager traceback).

    Raises:
        UsageError: A host does not resolve, or not within ``timeout`` seconds.
    """
    from graphdist.cli.main import UsageError

    for host in dict.fromkeys(hosts):
        problem = _resolution_problem(host, timeout)
        if problem:
            raise UsageError(f"launch: --hosts: cannot resolve host {host!r} ({problem}); give names of hosts this "
                             "machine reaches by ssh (mpiexec starts the tasks there), e.g. --hosts node1,node2")


def _resolution_problem(host: str, timeout: float) -> str:
    """Why ``host`` does not resolve ('' when it does); a resolver that hangs counts after ``timeout`` s."""
    outcome: list[str] = []

    def resolve() -> None:
        try:
            socket.getaddrinfo(host, None)
            outcome.append("")
        except (OSError, UnicodeError) as err:
            outcome.append(str(err) or type(err).__name__)

    thread = threading.Thread(target=resolve, daemon=True)  # getaddrinfo has no timeout of its own
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


# ------------------------------------------------------------------ rank wrapper
def _forward(stream: Any, sink: Any, prefix: str, last: list[str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if line.strip():
            last[0] = line.strip()
        sink.write(f"{prefix}{line}" if line.endswith("\n") else f"{prefix}{line}\n")
        sink.flush()


def rank_wrapper(argv: Sequence[str]) -> int:
    """Runs one task's command, forwarding its output with a prefix and recording its exit.

    ``argv``: ``RANK NAME -- COMMAND...``. ``SIGINT`` / ``SIGTERM`` / ``SIGHUP``
    to the wrapper are passed on to the task (the wrapper then reports how
    the task ended).
    """
    rank, name, separator, *command = argv
    if separator != "--" or not command or not rank.isdigit():
        print("graphdist launch --rank-wrapper: usage: RANK NAME -- COMMAND...", file=sys.stderr)
        return 2
    # The wrapper outlives a failed task to report it; it is not an MPI process, so MPI's
    # failure notification (SIGUSR1 from the process manager) must not end it.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    prefix = f"[{name}] "
    last = [""]
    cores = os.environ.get("GRAPHDIST_LAUNCH_CPUS")
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})  # inherited by the task
    environment = dict(os.environ, **{launch_status.LAUNCH_RANK_ENV: rank})
    if environment.get(WATCH_ENV):  # a job across hosts: MPI over TCP on the interface that reaches the others
        spec, _, _, _, _ = environment_config()
        for key, value in network_settings(spec, int(rank)).items():
            environment.setdefault(key, value)
    try:
        # close_fds=False: the task inherits the process manager's PMI socket.
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=False,
                                 stdin=subprocess.DEVNULL, env=environment)
    except OSError as err:
        last[0] = f"cannot start {command[0]!r}: {err}"
        print(prefix + last[0], file=sys.stderr)
        launch_status.record_exit(int(rank), 127, last[0])
        return 1
    launch_status.record_start(int(rank), os.getpid(), child.pid)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: _pass_on(child, number))
    threads = [threading.Thread(target=_forward, args=(child.stdout, sys.stdout, prefix, last), daemon=True),
               threading.Thread(target=_forward, args=(child.stderr, sys.stderr, prefix, last), daemon=True)]
    for thread in threads:
        thread.start()
    returncode = child.wait()
    ended = time.time()
    for thread in threads:
        thread.join(timeout=5)  # the last lines (a grandchild holding the pipes open is not waited for)
    launch_status.record_exit(int(rank), returncode, last[0], when=ended)
    return 0 if returncode == 0 else 1


def _pass_on(child: subprocess.Popen, signum: int) -> None:
    try:
        child.send_signal(signum)
    except OSError:
        pass  # it just ended


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-wrapper":
        sys.exit(rank_wrapper(sys.argv[2:]))
    from graphdist.cli.main import main

    sys.exit(main(["launch", *sys.argv[1:]]))
