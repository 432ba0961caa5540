"""GRAPHDIST_TRACE: a Chrome-trace / Perfetto timeline of one step; the scheduler's overlap of
collectives with ready segments."""

from __future__ import annotations

import json
import threading
import warnings
from types import SimpleNamespace

import numpy as np

import graphdist as gd
from graphdist.models.mlp import MLP
from graphdist.runtime import timeline
from graphdist.runtime.scheduler import Scheduler, register_comm_handler
from graphdist.runtime.tasks import CommTask

DEVICES = ["cpu:0", "cpu:1"]


def _mirrored_step():
    strategy = gd.MirroredStrategy(DEVICES, cross_device_ops=gd.NcclAllReduce(num_packs=2))
    with strategy.scope():
        model = MLP((8, 6, 4), seed=0, trainable=True)
        optimizer = gd.optimizers.SGD(0.1)
    replica_step = model.make_train_step(optimizer, 8)

    @gd.function
    def train(x, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, labels)), axis=None)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 8)
    batch = next(iter(strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensors((x, labels)))))
    train.get_concrete_function(*batch)  # compile before the trace is asked for
    return train, batch


def test_trace_file_has_the_events_perfetto_expects(tmp_path, monkeypatch) -> None:
    train, batch = _mirrored_step()
    path = tmp_path / "step.json"
    monkeypatch.setenv("GRAPHDIST_TRACE", str(path))
    train(*batch)
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all({"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys() for e in spans)
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and isinstance(e["tid"], int)
               and isinstance(e["pid"], int) for e in spans)
    plan = train.get_concrete_function(*batch).plan
    segments = {e["name"]: e["tid"] for e in spans if e["cat"] == "segment"}
    assert set(segments) == {s.name for s in plan.segments}
    lanes = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for segment in plan.segments:
        assert lanes[segments[segment.name]] == segment.device  # one lane (tid) per device
    collectives = {e["name"] for e in spans if e["cat"] == "collective"}
    assert collectives == {c.name for c in plan.comms if c.op != "AssertInRange"}
    assert {lanes[e["tid"]] for e in spans if e["cat"] in ("collective", "wait")} == {"communication"}
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
    # one step: the file is written once, later steps leave it alone
    path.unlink()
    train(*batch)
    assert not path.exists()


def test_every_nth_step(tmp_path, monkeypatch) -> None:
    train, batch = _mirrored_step()
    path = tmp_path / "every.json"
    monkeypatch.setenv("GRAPHDIST_TRACE", str(path))
    monkeypatch.setenv("GRAPHDIST_TRACE_EVERY", "2")
    train(*batch)
    assert not path.exists()
    train(*batch)
    assert path.exists()
    path.unlink()
    train(*batch)
    assert not path.exists()
    train(*batch)
    assert path.exists()


def test_one_device_step_is_traced(tmp_path, monkeypatch) -> None:
    strategy = gd.OneDeviceStrategy("cpu:0")
    path = tmp_path / "one.json"
    monkeypatch.setenv("GRAPHDIST_TRACE", str(path))
    step = gd.function(lambda x: np.tanh(x) * 2.0)
    strategy.run(step, args=(np.ones((2, 3), np.float32),))
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert [e["cat"] for e in spans] == ["segment"]


def test_unwritable_path_warns_and_training_goes_on(tmp_path, monkeypatch) -> None:
    train, batch = _mirrored_step()
    expected = [float(train(*batch)) for _ in range(2)]
    train, batch = _mirrored_step()
    bad = tmp_path / "missing" / "dir" / "step.json"
    monkeypatch.setenv("GRAPHDIST_TRACE", str(bad))
    monkeypatch.setenv("GRAPHDIST_TRACE_EVERY", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = [float(train(*batch)) for _ in range(2)]
    assert losses == expected
    found = [w for w in caught if issubclass(w.category, RuntimeWarning) and "GRAPHDIST_TRACE" in str(w.message)]
    assert len(found) == 1 and str(bad) in str(found[0].message)  # once per path, naming it and the fix
    assert not bad.exists()


def test_exposed_communication() -> None:
    events = [timeline.Event("s0", "segment", "cpu:0", 0.0, 2.0), timeline.Event("s1", "segment", "cpu:1", 3.0, 1.0),
              timeline.Event("c0", "collective", "communication", 1.0, 3.0),
              timeline.Event("c1", "collective", "communication", 5.0, 1.0)]
    assert timeline.exposed_communication(events) == [(2.0, 3.0), (5.0, 6.0)]


def test_record_collects_steps() -> None:
    train, batch = _mirrored_step()
    with timeline.record() as steps:
        train(*batch)
        train(*batch)
    train(*batch)
    assert len(steps) == 2 and all(any(e.cat == "collective" for e in step) for step in steps)


class _Exe:
    """A compiled segment that runs ``body(feeds)``."""

    def __init__(self, body):
        self.body = body

    def run(self, feeds):
        return self.body(feeds)


def test_collective_runs_while_a_ready_segment_computes() -> None:
    """A collective and a segment become ready together: the segment goes to a device thread and the
    collective runs meanwhile (each waits for the other to have started; run one after the other,
    the first would time out)."""
    segment_started, comm_started = threading.Event(), threading.Event()

    def first(feeds):
        return [feeds["x"] + 1, feeds["x"] * 2]

    def later(feeds):
        segment_started.set()
        assert comm_started.wait(10), "the collective did not run while the segment computed"
        return [feeds["a"] + 1]

    def handler(op, attrs, buffers):
        comm_started.set()
        assert segment_started.wait(10), "the segment did not start while the collective ran"
        return [b.copy() for b in buffers]

    register_comm_handler("TestOverlapOp", handler)
    segments = [SimpleNamespace(name="s0", device="cpu:0", inputs=["x"], outputs=["a", "b"]),
                SimpleNamespace(name="s1", device="cpu:0", inputs=["a"], outputs=["c"])]
    comms = [CommTask("c0", "TestOverlapOp", {}, ["b"], ["d"], ["cpu:0"])]
    plan = SimpleNamespace(segments=segments, comms=comms, constants={}, input_names=["x"],
                           output_names=["c", "d"], devices=["cpu:0"], graph=SimpleNamespace(name="fake"))
    scheduler = Scheduler(plan, [_Exe(first), _Exe(later)])
    c, d = scheduler.run({"x": np.ones(2)})
    np.testing.assert_array_equal(c, [3.0, 3.0])
    np.testing.assert_array_equal(d, [2.0, 2.0])


def test_a_device_gets_its_next_segment_while_another_device_computes() -> None:
    """Two devices, each a chain of segments: when cpu:0's first segment ends, its second starts while
    cpu:1's long segment still runs (the coordinating thread once ran cpu:1's segment itself and handed
    cpu:0 nothing until it ended: with the overlap cut, one device's chain ran while the other waited)."""
    second_started = threading.Event()

    def long_segment(feeds):
        assert second_started.wait(10), "cpu:0's next segment did not start while cpu:1 computed"
        return [feeds["x"] * 3]

    def second(feeds):
        second_started.set()
        return [feeds["a"] + 1]

    segments = [SimpleNamespace(name="a0", device="cpu:0", inputs=["x"], outputs=["a"]),
                SimpleNamespace(name="b0", device="cpu:1", inputs=["x"], outputs=["b"]),
                SimpleNamespace(name="a1", device="cpu:0", inputs=["a"], outputs=["c"])]
    plan = SimpleNamespace(segments=segments, comms=[], constants={}, input_names=["x"],
                           output_names=["b", "c"], devices=["cpu:0", "cpu:1"], graph=SimpleNamespace(name="fake"))
    scheduler = Scheduler(plan, [_Exe(lambda feeds: [feeds["x"] + 1]), _Exe(long_segment), _Exe(second)])
    b, c = scheduler.run({"x": np.ones(2)})
    np.testing.assert_array_equal(b, [3.0, 3.0])
    np.testing.assert_array_equal(c, [3.0, 3.0])


def test_the_calling_thread_runs_a_segment_every_later_task_waits_for() -> None:
    """Data parallel: each device's update reads both devices' gradients. Every later task waits for either
    first segment, so the calling thread runs one of them itself (no hand-off to a device thread and back),
    and one of the last two; the others run on the device threads, at the same time."""
    ran_on: dict[str, str] = {}
    both = threading.Barrier(2, timeout=10)

    def segment(name: str, out: str, reads: tuple[str, ...], meet: bool = False):
        def run(feeds):
            ran_on[name] = threading.current_thread().name
            if meet:
                both.wait()  # the two first segments run at the same time
            return [sum(feeds[r] for r in reads)]
        return _Exe(run)

    segments = [SimpleNamespace(name="g0", device="cpu:0", inputs=["x"], outputs=["a"]),
                SimpleNamespace(name="g1", device="cpu:1", inputs=["x"], outputs=["b"]),
                SimpleNamespace(name="u0", device="cpu:0", inputs=["a", "b_on0"], outputs=["c"]),
                SimpleNamespace(name="u1", device="cpu:1", inputs=["a_on1", "b"], outputs=["d"])]
    comms = [CommTask("t0", "Transfer", {}, ["b"], ["b_on0"], ["cpu:0"]),
             CommTask("t1", "Transfer", {}, ["a"], ["a_on1"], ["cpu:1"])]
    plan = SimpleNamespace(segments=segments, comms=comms, constants={}, input_names=["x"],
                           output_names=["c", "d"], devices=["cpu:0", "cpu:1"], graph=SimpleNamespace(name="fake"))
    executables = [segment("g0", "a", ("x",), meet=True), segment("g1", "b", ("x",), meet=True),
                   segment("u0", "c", ("a", "b_on0")), segment("u1", "d", ("a_on1", "b"))]
    c, d = Scheduler(plan, executables).run({"x": np.ones(2)})
    np.testing.assert_array_equal(c, [2.0, 2.0])
    np.testing.assert_array_equal(d, [2.0, 2.0])
    caller = threading.current_thread().name
    assert [ran_on[n] == caller for n in ("g0", "g1")].count(True) == 1
    assert [ran_on[n] == caller for n in ("u0", "u1")].count(True) == 1
