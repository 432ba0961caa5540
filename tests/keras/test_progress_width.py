"""fit's progress display at 80 columns keeps every metric value (the bar's logs wrap under it; the one-line
form is printed whole), and the validation step's compile is announced like the train step's.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import rich.console

import graphdist as gd
from graphdist.compile import progress as compile_progress
from graphdist.keras import progress as progress_lib

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

LOGS = {"loss": 0.123456, "accuracy": 0.98765, "sparse_categorical_accuracy": 0.98765, "val_loss": 0.234567,
        "val_accuracy": 0.912345, "val_sparse_categorical_accuracy": 0.912345}


def _lines(text: str) -> list[str]:
    return [line for line in re.split(r"[\r\n]", _ANSI.sub("", text)) if line.strip()]


def _terminal(width: int = 80) -> tuple[rich.console.Console, io.StringIO]:
    buffer = io.StringIO()
    return rich.console.Console(file=buffer, width=width, force_terminal=True, highlight=False), buffer


def test_bar_at_80_columns_keeps_every_value() -> None:
    console, buffer = _terminal()
    display = progress_lib.Progress(1, "Epoch", console=console)
    display.begin("12/20", 1875)
    display.update(900, 28800, LOGS)
    display.end(1875, 60000, LOGS)
    display.close()
    lines = _lines(buffer.getvalue())
    final = "\n".join(lines[-4:])
    for name, value in LOGS.items():
        assert f"{name}: {value:.4f}" in final, final
    assert "Epoch 12/20" in final and "1875/1875" in final and "samples/s" in final and "…" not in final
    assert max(len(line) for line in lines) <= 80


def test_wrap_logs_breaks_between_entries_only() -> None:
    lines = progress_lib.wrap_logs(LOGS, 80)
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines)
    assert " - ".join(line.strip() for line in lines) == progress_lib.format_logs(LOGS)
    assert progress_lib.wrap_logs({"a_very_long_metric_name": 1.0}, 10) == ["  a_very_long_metric_name: 1.0000"]
    assert progress_lib.wrap_logs({}, 80) == []


def _model(strategy: gd.Strategy) -> gd.keras.Model:
    with strategy.scope():
        model = gd.keras.Sequential([gd.keras.layers.Dense(3, input_shape=(4,))])
    model.compile(loss=gd.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer="sgd",
                  metrics=["accuracy", "sparse_categorical_accuracy"])
    return model


def _data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 4)).astype(np.float32), rng.integers(0, 3, rows)


def test_fit_line_form_at_80_columns_keeps_values_and_names_both_compiles(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_lib, "SLOW_COMPILE_S", 0.0)  # every compile is noted, however fast
    model = _model(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    history = model.fit(*_data(24, 0), batch_size=8, epochs=1, validation_data=_data(10, 1), verbose=2)
    *announcements, line = capsys.readouterr().out.strip().splitlines()
    # one line per epoch, not cut at the console's 80 columns; before it, only the names of segments that
    # took more than a second to compile (on a loaded machine)
    assert all(re.match(r"the (train|test) step: compil", text) for text in announcements), announcements
    for name, values in history.history.items():
        assert f"{name}: {values[0]:.4f}" in line, (name, line)
    assert "compiled the train step in" in line and "compiled the test step in" in line


def test_fit_bar_at_80_columns_keeps_values_and_announces_the_validation_compile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    console, buffer = _terminal()
    monkeypatch.setattr(rich.console, "Console", lambda **_: console)
    announced: list[str] = []
    original = progress_lib.Progress.compiling

    def recording(self: progress_lib.Progress, what: str):  # the note the bar shows while compiling
        announced.append(f"{self.mode}:{what}")
        return original(self, what)

    monkeypatch.setattr(progress_lib.Progress, "compiling", recording)
    model = _model(gd.OneDeviceStrategy("cpu:0"))
    history = model.fit(*_data(24, 2), batch_size=8, epochs=2, validation_data=_data(10, 3), verbose=1)
    text = "\n".join(_lines(buffer.getvalue()))
    for name, values in history.history.items():
        for value in values:
            assert f"{name}: {value:.4f}" in text, (name, text)
    assert "…" not in text and max(len(line) for line in _lines(buffer.getvalue())) <= 80
    # The validation pass's display is silent but hands its compile notice to the epoch's bar.
    assert "bar:the train step" in announced and "bar:the test step" in announced


@pytest.mark.parametrize("verbose", [2, 1])
def test_evaluate_names_each_slow_segment_compile(verbose: int, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment compiling past SLOW_SECONDS is named (k of n, device, backend): its own line off a terminal,
    the bar's note on one."""
    monkeypatch.setattr(compile_progress, "SLOW_SECONDS", 0.0)  # every segment counts as slow
    console, buffer = _terminal()
    notes: list[str] = []
    if verbose == 1:
        monkeypatch.setattr(rich.console, "Console", lambda **_: console)
        original = progress_lib.Progress._say_compiling
        monkeypatch.setattr(progress_lib.Progress, "_say_compiling",
                            lambda self, what, message: (notes.append(f"{what}: {message}"),
                                                         original(self, what, message)))
    model = _model(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    model.evaluate(*_data(16, 4), batch_size=8, verbose=verbose)
    said = capsys.readouterr().out.splitlines() if verbose == 2 else notes
    compiling = [line for line in said if "compiling segment" in line]
    assert compiling and all(re.fullmatch(r"the test step: compiling segment \d+ of \d+ \(\S+\) on cpu:[01] "
                                          r"with ort\.\.\.", line) for line in compiling), said
    assert any(re.fullmatch(r"the test step: compiled segment \d+ of \d+ \(\S+\) on cpu:[01] with ort in "
                            r"[0-9.]+ s", line) for line in said), said
