"""A ``--serve`` benchmark script running in TensorFlow's own environment, driven by JSON lines.

The TensorFlow side of a comparison (``tf_*.py --serve``) prints one JSON line
when it is ready, then answers each request line (``run 50``, ``fit 2 4096``)
with one JSON line, until ``quit``. Every read has a timeout, so a TensorFlow
process that hangs or dies fails the benchmark with the tail of its stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["ServeProcess"]


class ServeProcess:
    """The TensorFlow side of a benchmark as a subprocess.

    Args:
        argv: The command (the TF environment's python, the script, its arguments, ``--serve``).
        timeout: Seconds to wait for the ready line (import, trace, warm-up).
        wait: Wait for the ready line now; otherwise call :meth:`ready` later (start several at once).
    """

    def __init__(self, argv: Sequence[str], timeout: float = 300.0, wait: bool = True) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1,
                                     env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        self.pid = self.proc.pid
        self.info: dict[str, Any] = {}
        if wait:
            self.ready(timeout)

    def ready(self, timeout: float = 300.0) -> dict[str, Any]:
        """Waits for the process's ready line; returns its information."""
        if not self.info:
            self.info = self._read(timeout)
            if not self.info.get("ready"):
                raise RuntimeError(f"TensorFlow process did not start: {self.info}")
        return self.info

    def request(self, line: str, timeout: float = 600.0) -> dict[str, Any]:
        """Sends one request line; returns the answer."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def us_per_call(self, line: str) -> float:
        """Sends a timing request; returns the microseconds per call it answers."""
        answer = self.request(line)
        if "us_per_call" not in answer:
            raise RuntimeError(f"TensorFlow process: {answer}")
        return float(answer["us_per_call"])

    def _read(self, timeout: float) -> dict[str, Any]:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            self.close()
            self._stderr.seek(0)
            tail = " ".join(self._stderr.read().strip().splitlines()[-3:])
            raise RuntimeError(f"TensorFlow process gave no answer (exit code {self.proc.poll()}): {tail}")
        return json.loads(result[0])

    def close(self) -> None:
        """Asks the process to quit (kills it after 10 s)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
