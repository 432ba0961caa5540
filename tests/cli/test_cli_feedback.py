"""Compile feedback: Plan.compile reports each segment; the CLI announces slow ones; -v logs passes and segments."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import graphdist as gd
from graphdist.cli.feedback import announce_slow_compiles
from graphdist.compile.progress import SegmentCompile, notify, on_segment_compile

REPO = Path(__file__).resolve().parents[2]
#: The repository's MLP model, as a CLI target.
MLP_STEP, MLP_FORWARD = "graphdist.models.mlp:make_step", "graphdist.models.mlp:forward"


def test_plan_compile_reports_every_segment_before_and_after() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(x):
        return strategy.reduce("SUM", strategy.run(lambda v: (v * 2.0).sum(), args=(x,)), axis=None)

    events: list[SegmentCompile] = []
    data = strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors(np.ones((4, 3), np.float32)))
    with on_segment_compile(events.append):
        concrete = step.get_concrete_function(next(iter(data)))
    segments = concrete.plan.segments
    assert len(segments) >= 2
    starts, ends = events[0::2], events[1::2]
    assert [e.seconds for e in starts] == [None] * len(segments)
    assert all(e.seconds is not None and e.seconds >= 0 for e in ends)
    assert [(e.index, e.count, e.segment, e.device) for e in ends] == \
        [(i, len(segments), s.name, s.device) for i, s in enumerate(segments, start=1)]
    assert {e.backend for e in ends} == {"ort"}
    events.clear()
    step.get_concrete_function(next(iter(data)))  # cached plan: nothing compiles, nothing reported
    assert events == []


def test_slow_compile_is_announced_and_quick_one_is_not() -> None:
    stream = io.StringIO()
    slow = SegmentCompile(2, 3, "step.cpu1", "cpu:1", "tvm")
    quick = SegmentCompile(3, 3, "step.cpu0", "cpu:0", "tvm")
    with announce_slow_compiles("graphdist", stream, after=0.05):
        notify(slow)
        time.sleep(0.3)
        notify(SegmentCompile(**{**slow.__dict__, "seconds": 0.3}))
        notify(quick)
        notify(SegmentCompile(**{**quick.__dict__, "seconds": 0.001}))
    lines = stream.getvalue().splitlines()
    assert lines == ["graphdist: compiling segment 2 of 3 (step.cpu1) on cpu:1 with tvm...",
                     "graphdist: compiled segment 2 of 3 (step.cpu1) on cpu:1 with tvm in 0.3 s"]
    notify(slow)  # outside the block: no listener left
    time.sleep(0.1)
    assert stream.getvalue().splitlines() == lines


def test_failing_progress_callback_does_not_break_compiles(caplog) -> None:
    def broken(event: SegmentCompile) -> None:
        raise RuntimeError("display gone")

    with on_segment_compile(broken):
        assert gd.function(lambda x: x + 1.0)(np.float32(1.0)) == 2.0
    assert "compile progress callback" in caplog.text


def test_verbose_cli_logs_each_pass_and_segment_with_its_time() -> None:
    result = subprocess.run([sys.executable, "-m", "graphdist.cli.main", "-v", "inspect", MLP_STEP,
                             "--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--stage", "plan"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pass ReplicatePass on " in result.stderr and " ms, modified=True" in result.stderr
    assert "compiled segment 1 of " in result.stderr and " on cpu:0 with ort in " in result.stderr
