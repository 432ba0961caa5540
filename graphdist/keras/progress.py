"""What ``fit``/``evaluate``/``predict`` show while they run.

``verbose=1`` (or ``"auto"``) on a terminal: a ``rich`` progress bar per
epoch with the running loss and metrics and the throughput in samples/s, and
a spinner while a step is being traced and compiled (the first step of each
batch shape). ``verbose=2``, or ``verbose=1``/``"auto"`` when the output is
not a terminal: one line per epoch (no bar, no control characters).
``verbose=0``: nothing.

Every value survives a narrow terminal (80 columns): on a terminal the bar row
(epoch, bar, steps, time, samples/s) is sized to the width and the logs go on
the lines below it, wrapped between whole ``name: value`` entries, as Keras'
progress bar lets its line wrap; the one-line form is printed whole (the
terminal or file wraps it). The test step that ``fit`` runs for
``validation_data`` announces its compilation through the epoch's display too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from typing import Any

from graphdist.compile import progress as compile_progress
from graphdist.errors import InvalidArgumentError

__all__ = ["Progress", "format_logs", "wrap_logs"]

logger = logging.getLogger(__name__)

#: A compile that takes longer than this is reported in the epoch lines.
SLOW_COMPILE_S = 1.0


def format_logs(logs: dict[str, float]) -> str:
    """``loss: 0.1234 - accuracy: 0.9612`` (Keras' style)."""
    return " - ".join(f"{name}: {value:.4f}" for name, value in logs.items())


def wrap_logs(logs: dict[str, float], width: int, indent: str = "  ") -> list[str]:
    """:func:`format_logs` cut into lines of at most ``width`` characters between whole ``name: value``
    entries (an entry longer than a line gets a line of its own).
    """
    lines: list[str] = []
    line = ""
    for entry in (f"{name}: {value:.4f}" for name, value in logs.items()):
        candidate = f"{line} - {entry}" if line else f"{indent}{entry}"
        if line and len(candidate) > width:
            lines.append(line)
            candidate = f"{indent}{entry}"
        line = candidate
    return [*lines, line] if line else lines


def _bar_width(console_width: int) -> int:
    """The bar's width: what is left of the row after the other columns (about 50 characters), 10 to 40."""
    return max(10, min(40, console_width - 50))


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
        self._parent: Progress | None = None

    # ----------------------------------------------------------------- epochs
    def begin(self, label: str, steps: int | None) -> None:
        """Starts an epoch (``label`` like ``"1/5"``) of ``steps`` batches (``None``: unknown)."""
        self._start = time.perf_counter()
        self._label = label
        self._compile_notes = []
        if self.mode != "bar":
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        if self._bar is None:
            self._bar = _bar_with_logs_class()(
                TextColumn("{task.description}"), BarColumn(_bar_width(self.console.width)), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.fields[rate]}"), console=self.console, transient=False)
            self._bar.start()
        self._task = self._bar.add_task(f"{self.title} {label}".strip(), total=steps, rate="", logs={})

    def update(self, step: int, samples: int, logs: dict[str, float]) -> None:
        """After ``step`` batches and ``samples`` examples of this epoch, with the running ``logs``."""
        if self._task is None:
            return
        seconds = max(time.perf_counter() - self._start, 1e-9)
        self._bar.update(self._task, completed=step, rate=f"{samples / seconds:,.0f} samples/s", logs=logs)

    def end(self, steps: int, samples: int, logs: dict[str, float]) -> float:
        """Finishes the epoch; returns its seconds."""
        seconds = time.perf_counter() - self._start
        rate = f"{samples / max(seconds, 1e-9):,.0f} samples/s"
        if self._task is not None:
            self._bar.update(self._task, completed=steps, total=steps, rate=rate, logs=logs)
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
        """Shows that ``what`` is being traced and compiled (on the bar's log line on a terminal; in the
        epoch's line when it took more than :data:`SLOW_COMPILE_S`).
        """
        if self._parent is not None:
            with self._parent.compiling(what):
                yield
            return
        start = time.perf_counter()
        if self.mode == "bar" and self._task is not None:
            self._bar.update(self._task, note=f"tracing and compiling {what}...")
        try:
            with compile_progress.announce_slow_compiles(lambda message: self._say_compiling(what, message),
                                                         after=compile_progress.SLOW_SECONDS):
                yield
        finally:
            if self.mode == "bar" and self._task is not None:
                self._bar.update(self._task, note="")
        seconds = time.perf_counter() - start
        logger.info("compiled %s in %.2f s", what, seconds)
        if seconds >= SLOW_COMPILE_S:
            self._compile_notes.append(f"compiled {what} in {seconds:.1f} s")

    def _say_compiling(self, what: str, message: str) -> None:
        """A long segment compile of ``what``: on the bar's note on a terminal, a line of its own otherwise."""
        if self.mode == "bar" and self._task is not None:
            self._bar.update(self._task, note=f"{what}: {message}")
        elif self.mode == "line":
            self.console.print(f"{what}: {message}", markup=False)

    def quiet_child(self) -> Progress:
        """A display that shows nothing of its own but announces its compiles through this one (``fit``'s
        validation pass inside the epoch's display).
        """
        child = Progress(0, self.title, console=self.console)
        child._parent = self
        return child


@functools.cache
def _bar_with_logs_class() -> type:
    """``rich.progress.Progress`` whose tasks show their logs wrapped on the lines under their bar row
    (rich is imported on first use).
    """
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    class BarWithLogs(RichProgress):
        def get_renderables(self) -> Iterator[Any]:
            for task in self.tasks:  # none yet while rich's __init__ renders once
                yield self.make_tasks_table([task])
                note = task.fields.get("note")
                lines = [f"  {note}"] if note else wrap_logs(task.fields.get("logs") or {}, self.console.width)
                for line in lines:
                    yield Text(line, overflow="fold")

    return BarWithLogs
