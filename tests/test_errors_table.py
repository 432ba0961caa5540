"""Every row of the "What each mistake raises" table (docs/errors.md) raises what the row says.

The table is the test's data: each row's code runs here (API calls in a namespace of
fixtures the README names; ``graphdist ...`` commands through ``graphdist.cli.main``) and must
raise the graphdist error class of its row (or exit with its status) with the quoted text in
the message. So the README and the behaviour cannot drift apart, and the table keeps at least
``MIN_ROWS`` rows.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd

README = Path(__file__).resolve().parents[1] / "docs" / "errors.md"  # moved from the README (issue 26)
MIN_ROWS = 40
_ROW = re.compile(r"^\| (\d+) \| `(?P<code>[^`]+)` \| (?:`(?P<error>\w+)`|exit (?P<status>\d+)) "
                  r"\| `(?P<text>[^`]+)` \|$")


def _table_rows() -> list[tuple[int, str, str | None, int | None, str]]:
    """``(number, code, error class name, exit status, message text)`` of each row of the table."""
    text = README.read_text()
    section = text[text.index("### What each mistake raises"):]
    ends = [i for i in (section.find("\n## "), section.find("\n---\n")) if i > 0]
    section = section[: min(ends)] if ends else section
    rows, seen_header = [], False
    for line in section.splitlines():
        if line.startswith("| # |"):
            seen_header = True
            continue
        if not seen_header or not line.startswith("|") or line.startswith("|---"):
            continue
        match = _ROW.match(line)
        assert match, f"README errors table: malformed row {line!r}"
        status = match["status"]
        rows.append((int(match[1]), match["code"], match["error"], int(status) if status else None, match["text"]))
    return rows


ROWS = _table_rows()


def test_table_has_enough_numbered_rows() -> None:
    assert len(ROWS) >= MIN_ROWS
    assert [number for number, *_ in ROWS] == list(range(1, len(ROWS) + 1))


@pytest.fixture(scope="module")
def namespace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The names the README's table uses (see the paragraph above it)."""
    tmp = tmp_path_factory.mktemp("errors_table")
    (tmp / "empty.onnx").write_bytes(b"")
    (tmp / "garbage.onnx").write_bytes(b"\x00\x01 not a protobuf")
    (tmp / "notes.txt").write_text("not a plan\n")
    (tmp / "noplan").mkdir()
    s2 = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    model = gd.keras.Sequential([gd.keras.layers.Dense(3, input_shape=(4,))])
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd")
    return {
        "np": np, "gd": gd, "os": os, "tmp": tmp, "s2": s2, "model": model,
        "pr": s2.experimental_distribute_values_from_function(lambda ctx: np.ones((2, 3), np.float32)),
        "prs": s2.experimental_distribute_values_from_function(lambda ctx: np.float32(ctx.replica_id_in_sync_group)),
        "v": gd.Variable(np.zeros(3, np.float32)),
        "double": gd.function(lambda x: x * 2),
    }


def _run_command(line: str) -> tuple[int, str]:
    from graphdist.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(shlex.split(line))
    return status, err.getvalue()


@pytest.mark.parametrize("number, code, error, status, text", ROWS, ids=[f"row{r[0]}" for r in ROWS])
def test_row_raises_what_the_readme_says(namespace: dict[str, object], number: int, code: str, error: str | None,
                                         status: int | None, text: str) -> None:
    if code.startswith("graphdist "):
        got_status, stderr = _run_command(code[len("graphdist "):])
        assert got_status == status, f"row {number}: exit {got_status}, stderr: {stderr}"
        assert text in stderr, f"row {number}: {text!r} not in {stderr!r}"
        return
    environment = dict(os.environ)  # rows may set TF_CONFIG: put the environment back after the row
    expected = getattr(gd, error)
    try:
        with pytest.raises(gd.GraphdistError) as caught:
            exec(code, dict(namespace))  # the README's own example code
    finally:
        os.environ.clear()
        os.environ.update(environment)
    assert type(caught.value) is expected, f"row {number}: {type(caught.value).__name__}: {caught.value}"
    assert text in str(caught.value), f"row {number}: {text!r} not in {str(caught.value)!r}"
