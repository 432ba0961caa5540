"""What ``fit``/``evaluate``/``predict`` show while they run.

``verbose=1`` (or ``"auto"``) on a terminal: a ``rich`` progress bar per
epoch with the running loss and metrics and the throughput in samples/s, and
a spinner while a step is being traced and compiled (the first step of each
batch shape). ``verbose=2``, or ``verbose=1``/``"auto"`` when the output is
not a terminal: one line per epoch (no bar, no control characters).
``verbose=0``: nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from graphdist.errors import InvalidArgumentError

__all__ = ["Progress", "format_logs"]

logger = logging.getLogger(__name__)

#: A compile that takes longer than this is reported in the epoch lines.
SLOW_COMPILE_S = 1.0


def format_logs(logs: dict[str, float]) -> str:
    """``loss: 0.1234 - accuracy: 0.9612`` (Keras' style)."""
    return " - ".join(f"{name}: {value:.4f}" for name, value in logs.items())


def _mode(verbose: Any, is_terminal: bool) -> str:
    if verbose == "auto":
        verbose = 1
    if verbose not in (0, 1, 2) or isinstance(verbose, bool):
        raise InvalidArgumentError(f"verbose must be 0, 1, 2 or 'auto', got {verbose!r}")
    if verbose == 0:
        return "off"
    return "bar" if verbose == 1 and is_terminal else "line"


class Progress:
    """Progress display of one ``fit``/``evaluate``/``predict`` call.

    Args:
        verbose: ``0``, ``1``, ``2`` or ``"auto"``.
        title: ``"Epoch"`` for fit; ``"Evaluate"``/``"Predict"`` otherwise.
        console: A ``rich.console.Console`` (default: one on stdout).
    """

    def __init__(self, verbose: Any, title: str = "Epoch", console: Any = None) -> None:
        from rich.console import Console

        self.console = console or Console(highlight=False, soft_wrap=True)
        self.mode = _mode(verbose, self.console.is_terminal)
        self.title = title
        self._bar: Any = None
        self._task: Any = None
        self._start = 0.0
        self._compile_notes: list[str] = []

    # ----------------------------------------------------------------- epochs
    def begin(self, label: str, steps: int | None) -> None:
        """Starts an epoch (``label`` like ``"1/5"``) of ``steps`` batches (``None``: unknown)."""
        self._start = time.perf_counter()
        self._label = label
        self._compile_notes = []
        if self.mode != "bar":
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        if self._bar is None:
            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("{task.fields[rate]}"),
                                     TextColumn("{task.fields[logs]}"), console=self.console, transient=False)
            self._bar.start()
        self._task = self._bar.add_task(f"{self.title} {label}".strip(), total=steps, rate="", logs="")

    def update(self, step: int, samples: int, logs: dict[str, float]) -> None:
        """After ``step`` batches and ``samples`` examples of this epoch, with the running ``logs``."""
        if self._task is None:
            return
        seconds = max(time.perf_counter() - self._start, 1e-9)
        self._bar.update(self._task, completed=step, rate=f"{samples / seconds:,.0f} samples/s",
                         logs=format_logs(logs))

    def end(self, steps: int, samples: int, logs: dict[str, float]) -> float:
        """Finishes the epoch; returns its seconds."""
        seconds = time.perf_counter() - self._start
        rate = f"{samples / max(seconds, 1e-9):,.0f} samples/s"
        if self._task is not None:
            self._bar.update(self._task, completed=steps, total=steps, rate=rate, logs=format_logs(logs))
            self._task = None
        elif self.mode == "line":
            notes = "".join(f" - {note}" for note in self._compile_notes)
            title = f"{self.title} {self._label}" if self._label else self.title
            text = f"{title} - {steps} steps - {seconds:.2f} s - {rate}"
            self.console.print(f"{text} - {format_logs(logs)}{notes}" if logs else text + notes, markup=False)
        return seconds

    def close(self) -> None:
        """Stops the bar (call once at the end)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    # ---------------------------------------------------------------- compile
    @contextlib.contextmanager
    def compiling(self, what: str) -> Iterator[None]:
        """Shows that ``what`` is being traced and compiled (a spinner on a terminal)."""
        start = time.perf_counter()
        if self.mode == "bar" and self._task is not None:
            self._bar.update(self._task, logs=f"tracing and compiling {what}...")
        yield
        seconds = time.perf_counter() - start
        logger.info("compiled %s in %.2f s", what, seconds)
        if seconds >= SLOW_COMPILE_S:
            self._compile_notes.append(f"compiled {what} in {seconds:.1f} s")
