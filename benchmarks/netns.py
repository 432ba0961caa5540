"""Several hosts on one machine: Linux network namespaces joined by a switch, with shaped links.

The multi-host tests (``tests/multihost``) and ``bench_multi_host`` run each
task of a job in its own "host": a network namespace with one interface,
``eth0``, at ``198.18.0.<i+1>/24`` (198.18.0.0/15 is reserved for
benchmarking networks, RFC 2544: nothing outside reaches it). Each host's
interface is one end of a veth pair whose other end is a port of a Linux
bridge in a switch namespace, so the hosts reach each other only through
the switch and never the machine's own network. ``tc netem`` on a host's
interface shapes its link (rate, delay, loss); taking that interface down
cuts the host off (a network partition). Kernels without ``netem`` (this
project's CI VMs) shape the rate only, with a token bucket (``tbf``).

:meth:`HostBed.start_sshd` runs an ssh server in every host (a key made for
the bed only), for ``graphdist launch --hosts`` through mpiexec's ssh
launcher. A :class:`HostBed` creates the namespaces when entered and deletes them, and
every process left in them, when left (also at interpreter exit). Creating
namespaces needs root (``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN``) and
iproute2's ``ip`` and ``tc``; :func:`unavailable_reason` says why not, so
tests can skip with that reason.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HostBed", "Link", "unavailable_reason", "run_worker_tasks", "SUBNET"]


SUBNET = "198.18.0"
_BRIDGE = "br0"
_beds: list[HostBed] = []


def unavailable_reason() -> str:
    """Why namespaces cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"iproute2's {tool!r} is not installed (apt-get install iproute2)"
    probe = f"gdprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, check=False)
    return ""


@dataclass(frozen=True)
class Link:
    """A host's link shape for ``tc netem``: ``rate`` (e.g. ``"10gbit"``), one-way ``delay``
    (e.g. ``"50us"``), ``loss`` (e.g. ``"0.1%"``); ``None`` leaves that unshaped.
    """

    rate: str | None = None
    delay: str | None = None
    loss: str | None = None

    def netem(self) -> list[str]:
        """The ``tc qdisc ... netem`` arguments (empty: no shaping)."""
        args: list[str] = []
        if self.delay:
            args += ["delay", self.delay]
        if self.loss:
            args += ["loss", self.loss]
        if self.rate:
            args += ["rate", self.rate]
        return args


class HostBed:
    """``count`` hosts (network namespaces) on one switch (see the module docstring).

    Args:
        count: Number of hosts.
        link: Shape of every host's link (default: unshaped veth).
        cpus: One core (or core list) per host: processes started with
            :meth:`popen` / :meth:`run` are pinned to their host's (``None``: not pinned).

    Attributes:
        names: The hosts' namespace names.
        addresses: Their IPv4 addresses, ``198.18.0.1`` upwards.
    """

    def __init__(self, count: int, link: Link | None = None, cpus: Sequence[Any] | None = None) -> None:
        if count < 1 or count > 200:
            raise ValueError(f"count must be 1..200, got {count}")
        tag = f"gd{os.getpid() % 100000}x{len(_beds)}"
        self.switch = f"{tag}sw"
        self.names = [f"{tag}h{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self.link = link
        self.cpus = list(cpus) if cpus is not None else None
        self._processes: list[subprocess.Popen] = []
        self._made: list[str] = []
        self.shaping = "unshaped"
        self._folders: list[str] = []

    # ---------------------------------------------------------------- set-up
    def __enter__(self) -> HostBed:
        _beds.append(self)
        try:
            self._ip("netns", "add", self.switch)
            self._made.append(self.switch)
            self._in(self.switch, "ip", "link", "add", _BRIDGE, "type", "bridge")
            self._in(self.switch, "ip", "link", "set", _BRIDGE, "up")
            for index, name in enumerate(self.names):
                self._add_host(index, name)
            if self.link is not None:
                self.shape(self.link)
        except BaseException:
            self.close()
            raise
        return self

    def _add_host(self, index: int, name: str) -> None:
        self._ip("netns", "add", name)
        self._made.append(name)
        port = f"p{index}x{self.switch}"[:15]
        self._ip("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", self.switch)
        self._in(self.switch, "ip", "link", "set", port, "master", _BRIDGE)
        self._in(self.switch, "ip", "link", "set", port, "up")
        self._in(name, "ip", "addr", "add", f"{self.addresses[index]}/24", "dev", "eth0")
        self._in(name, "ip", "link", "set", "eth0", "up")
        self._in(name, "ip", "link", "set", "lo", "up")

    def shape(self, link: Link, hosts: Sequence[int] | None = None) -> str:
        """Shapes the links of ``hosts`` (default all), replacing an earlier shape; returns what was applied.

        ``tc netem`` applies rate, delay and loss. Kernels without netem (the VMs this project's CI runs
        on have only ``tbf``, ``htb`` and ``pfifo``) get the rate from a token bucket (``tbf``) and no
        delay or loss: the returned text says so, and :attr:`shaping` keeps it.
        """
        netem = _has_netem(self.names[0])
        for index in range(len(self.names)) if hosts is None else hosts:
            name = self.names[index]
            subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "del", "dev", "eth0", "root"],
                           capture_output=True, check=False)
            if netem and link.netem():
                self._in(name, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", *link.netem())
            elif link.rate:
                self._in(name, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", link.rate,
                         "burst", str(_burst_bytes(link.rate)), "latency", "50ms")
        applied = [f"rate {link.rate}"] if link.rate else []
        if netem:
            applied += [f"delay {link.delay}"] if link.delay else []
            applied += [f"loss {link.loss}"] if link.loss else []
        else:
            missing = [f"{what} {value}" for what, value in (("delay", link.delay), ("loss", link.loss)) if value]
            if missing:
                applied.append(f"({', '.join(missing)} not applied: this kernel has no netem qdisc)")
        self.shaping = " ".join(applied) if applied else "unshaped"
        return self.shaping

    def set_link(self, host: int, up: bool) -> None:
        """Takes host ``host``'s interface down (cut off: a network partition) or up again."""
        self._in(self.names[host], "ip", "link", "set", "eth0", "up" if up else "down")

    # ------------------------------------------------------------- processes
    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run in host ``host`` (pinned to its cores when the bed has ``cpus``)."""
        pinned: list[str] = []
        if self.cpus is not None:
            cores = self.cpus[host]
            cores = cores if isinstance(cores, (list, tuple)) else [cores]
            pinned = ["taskset", "-c", ",".join(str(c) for c in cores)]
        return ["ip", "netns", "exec", self.names[host], *pinned, *argv]

    def popen(self, host: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Starts ``argv`` in host ``host`` (``subprocess.Popen`` keyword arguments pass through)."""
        process = subprocess.Popen(self.command(host, argv), **kwargs)
        self._processes.append(process)
        return process

    def run(self, host: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Runs ``argv`` in host ``host`` to completion."""
        return subprocess.run(self.command(host, argv), **kwargs)

    def pids(self, host: int | None = None) -> list[int]:
        """Processes running in host ``host`` (default: in any host of the bed)."""
        found = []
        for name in self.names if host is None else [self.names[host]]:
            listing = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
            found += [int(p) for p in listing.stdout.split()]
        return found

    def counters(self, host: int) -> tuple[int, int]:
        """``(bytes received, bytes sent)`` on host ``host``'s interface."""
        values = []
        for kind in ("rx_bytes", "tx_bytes"):
            read = subprocess.run(["ip", "netns", "exec", self.names[host], "cat",
                                   f"/sys/class/net/eth0/statistics/{kind}"],
                                  capture_output=True, text=True, check=True)
            values.append(int(read.stdout))
        return values[0], values[1]

    # ------------------------------------------------------------------- ssh
    def start_sshd(self, private: Sequence[str] = ()) -> str:
        """Starts an ssh server in every host (root logins with a key made for the bed only); returns the path
        of an ``ssh`` client script that logs into them (for ``HYDRA_LAUNCHER_EXEC``, what mpiexec's ssh
        launcher runs).

        ``private``: directories that each host's logins see as an empty folder of their own (a tmpfs in
        the ssh server's mount namespace), as on another machine; the rest of the file system is shared.

        Raises:
            RuntimeError: Debian's ``openssh-server`` is not installed (``make test`` installs it as root).
        """
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not os.path.exists(sshd) or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
            raise RuntimeError("the ssh launcher tests need Debian's openssh-server and openssh-client "
                               "(apt-get install -y openssh-server)")
        folder = tempfile.mkdtemp(prefix="graphdist-ssh-")
        self._folders.append(folder)
        for key in ("host_key", "client_key"):
            _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{folder}/{key}"])
        shutil.copy(f"{folder}/client_key.pub", f"{folder}/authorized_keys")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for index, name in enumerate(self.names):
            config = f"{folder}/sshd_config{index}"
            with open(config, "w") as handle:
                handle.write(_SSHD_CONFIG.format(address=self.addresses[index], folder=folder, index=index))
            mounts = "".join(f"mount -t tmpfs tmpfs {shlex.quote(path)} && " for path in private)
            server = f"{mounts}exec {sshd} -D -e -f {shlex.quote(config)}"
            self._processes.append(subprocess.Popen(
                ["ip", "netns", "exec", name, "unshare", "--mount", "--propagation", "private", "sh", "-c", server],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with open(f"{folder}/ssh_config", "w") as handle:
            handle.write(_SSH_CONFIG.format(folder=folder))
        client = f"{folder}/ssh"
        with open(client, "w") as handle:
            handle.write(f'#!/bin/sh\nexec ssh -F {folder}/ssh_config "$@"\n')
        os.chmod(client, 0o700)
        self._wait_for_sshd(client)
        return client

    def _wait_for_sshd(self, client: str, limit_s: float = 20.0) -> None:
        deadline = time.monotonic() + limit_s
        for index, address in enumerate(self.addresses):
            while True:
                probe = subprocess.run(["ip", "netns", "exec", self.names[index], client, address, "true"],
                                       capture_output=True, text=True, check=False)
                if probe.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd in host {index} did not answer: {probe.stderr.strip()}")
                time.sleep(0.1)

    # --------------------------------------------------------------- tear-down
    def close(self) -> None:
        """Kills every process left in the hosts and deletes the namespaces."""
        for process in self._processes:
            if process.poll() is None:
                process.kill()
        for pid in self.pids() if self._made else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while self._made and self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        self._made.clear()
        for folder in self._folders:
            shutil.rmtree(folder, ignore_errors=True)
        self._folders.clear()
        if self in _beds:
            _beds.remove(self)

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------- helpers
    @staticmethod
    def _ip(*args: str) -> None:
        _check(["ip", *args])

    @staticmethod
    def _in(name: str, *argv: str) -> None:
        _check(["ip", "netns", "exec", name, *argv])


_SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {folder}/host_key
AuthorizedKeysFile {folder}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile {folder}/sshd{index}.pid
"""

_SSH_CONFIG = """\
Host *
  IdentityFile {folder}/client_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 10
"""


def _has_netem(namespace: str) -> bool:
    """Whether the kernel has the netem qdisc (tried on ``namespace``'s loopback, then removed)."""
    added = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                            "delay", "1us"], capture_output=True, check=False)
    if added.returncode == 0:
        subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", "lo", "root"],
                       capture_output=True, check=False)
    return added.returncode == 0


def _burst_bytes(rate: str) -> int:
    """A token bucket deep enough for ``rate`` at a 4 ms timer tick (at least 64 KiB)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    text = rate.strip().lower()
    for unit, scale in units.items():
        if text.endswith(unit):
            bits = float(text[: -len(unit)]) * scale
            return max(64 * 1024, int(bits / 8 * 0.004))
    raise ValueError(f"rate must end in bit, kbit, mbit or gbit, got {rate!r}")


def _check(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")


@atexit.register
def _close_all() -> None:
    for bed in list(_beds):
        bed.close()


def run_worker_tasks(bed: HostBed, hosts: int, module: str, worker_args: Sequence[str], env: dict[str, str],
                     timeout: float) -> dict[str, Any]:
    """Starts ``python -m module --worker *worker_args --out FILE`` in hosts ``0 .. hosts-1`` of ``bed``, each a
    plain process with its ``TF_CONFIG`` (one host: no cluster), as the seeds start a multi-worker job, and
    returns the JSON object the job wrote to ``FILE`` (its chief's).

    Raises:
        RuntimeError: A task failed (every task's output's tail in the message).
    """
    repo = Path(__file__).resolve().parents[1]
    cluster = {"worker": [f"{SUBNET}.{i + 1}:2222" for i in range(hosts)]}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        processes = []
        for index in range(hosts):
            environment = dict(os.environ, PYTHONPATH=str(repo), **env)
            environment.pop("GRAPHDIST_CONFIG", None)
            if hosts > 1:
                environment["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            else:
                environment.pop("TF_CONFIG", None)
            command = [sys.executable, "-m", module, "--worker", *worker_args, "--out", str(out)]
            processes.append(bed.popen(index, command, env=environment, cwd=repo, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=timeout)[0] for p in processes]
        if any(p.returncode for p in processes):
            raise RuntimeError("a benchmark task failed:\n" + "\n".join(log[-3000:] for log in logs))
        return json.loads(out.read_text())
