"""gd.function under threads: no lost variable update, one trace per signature, a bounded plan cache.

Each test fails without the locks / the LRU bound of ``graphdist.compile.function``
(checked by disabling them): unlocked, two threads interleave a step's read and write-back
and lose increments; concurrent first calls trace the step once per thread.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import graphdist as gd
from graphdist import stats
from graphdist.compile.function import DEFAULT_MAX_SIGNATURES

TIMEOUT = 120  # seconds a test's threads may take before the test calls it a deadlock
SIZE = 200_000  # elements of the shared variables (see the first test)


def _run_threads(targets: list) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "threads did not finish: deadlock"


def test_two_steps_on_one_variable_from_two_threads_lose_no_update() -> None:
    # A vector counter: each step spends a while in the backend (outside the GIL) between read and write.
    counter = gd.Variable(np.zeros(SIZE, np.float32))
    first = gd.function(lambda: counter.assign_add(1.0))
    second = gd.function(lambda: counter.assign_add(1.0))
    first(), second()  # warm: both compiled
    counter.assign(np.zeros(SIZE, np.float32))

    def work(step) -> None:
        for _ in range(500):
            step()

    _run_threads([lambda: work(first), lambda: work(second)])
    assert np.all(counter.numpy() == 1000.0)


def test_concurrent_first_calls_trace_once_and_keep_every_update() -> None:
    counter = gd.Variable(0.0)
    step = gd.function(lambda: counter.assign_add(1.0))
    start = threading.Barrier(4)
    before = stats.snapshot()["traces"]

    def work() -> None:
        start.wait(TIMEOUT)
        for _ in range(50):
            step()

    _run_threads([work] * 4)
    assert stats.snapshot()["traces"] - before == 1
    assert step.experimental_get_tracing_count() == 1
    assert counter.numpy() == 200.0


def test_steps_taking_shared_variables_in_opposite_orders_do_not_deadlock() -> None:
    # Vectors, so that each step spends a while in the backend (outside the GIL) between read and write.
    a, b = gd.Variable(np.zeros(SIZE, np.float32)), gd.Variable(np.zeros(SIZE, np.float32))
    a_then_b = gd.function(lambda: (a.assign_add(1.0), b.assign_add(1.0)))
    b_then_a = gd.function(lambda: (b.assign_add(2.0), a.assign_add(2.0)))
    difference = gd.function(lambda: np.max(np.abs(a.read_value() - b.read_value())))
    a_then_b(), b_then_a(), difference()
    a.assign(np.zeros(SIZE, np.float32)), b.assign(np.zeros(SIZE, np.float32))
    seen: list[float] = []

    def work(step) -> None:
        for _ in range(300):
            step()

    def watch() -> None:
        for _ in range(300):
            seen.append(float(difference()))

    _run_threads([lambda: work(a_then_b), lambda: work(b_then_a), watch])
    assert np.all(a.numpy() == 900.0) and np.all(b.numpy() == 900.0)
    # a step's reads are atomic too: a == b between whole steps, never a half-applied one (1 or 2 apart)
    assert set(seen) == {0.0}, sorted(set(seen))


def test_eager_assign_add_and_steps_share_the_variable_lock() -> None:
    counter = gd.Variable(np.zeros(SIZE, np.int64))
    step = gd.function(lambda: counter.assign_add(np.int64(1)))
    step()
    counter.assign(np.zeros(SIZE, np.int64))

    def eager() -> None:
        for _ in range(300):
            counter.assign_add(1)

    def traced() -> None:
        for _ in range(300):
            step()

    _run_threads([eager, traced])
    assert np.all(counter.numpy() == 600)


def test_plan_cache_keeps_max_signatures_least_recently_used() -> None:
    double = gd.function(lambda x: x * 2, max_signatures=3)
    for n in range(1, 9):
        np.testing.assert_array_equal(double(np.ones(n)), np.full(n, 2.0))
    assert double.cached_signatures() == 3 and double.experimental_get_tracing_count() == 8
    double(np.ones(6))  # still cached: no new trace; 6 is now the most recent
    assert double.experimental_get_tracing_count() == 8
    double(np.ones(1))  # dropped long ago: traced again, and 7 (least recently used) goes
    assert double.experimental_get_tracing_count() == 9 and double.cached_signatures() == 3
    double(np.ones(8)), double(np.ones(6))
    assert double.experimental_get_tracing_count() == 9
    double(np.ones(7))
    assert double.experimental_get_tracing_count() == 10


def test_default_bound_holds_over_many_distinct_shapes(caplog: pytest.LogCaptureFixture) -> None:
    negate = gd.function(lambda x: -x)
    assert negate.max_signatures == DEFAULT_MAX_SIGNATURES == 64
    with caplog.at_level("WARNING", logger="graphdist.compile.function"):
        for n in range(1, DEFAULT_MAX_SIGNATURES + 11):
            negate(np.ones(n, np.float32))
    assert negate.cached_signatures() == DEFAULT_MAX_SIGNATURES
    assert negate.experimental_get_tracing_count() == DEFAULT_MAX_SIGNATURES + 10
    warnings = [r.getMessage() for r in caplog.records if "max_signatures" in r.getMessage()]
    assert len(warnings) == 1 and "more than 64 input signatures" in warnings[0]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "64", True])
def test_max_signatures_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(gd.InvalidArgumentError, match="max_signatures must be a positive int"):
        gd.function(lambda x: x, max_signatures=bad)


def test_compile_cache_memory_keeps_max_entries_least_recently_used(tmp_path) -> None:
    from graphdist.backends import get_backend
    from graphdist.backends.base import MEMORY_CACHE_ENTRIES, CompileCache
    from graphdist.runtime.devices import parse_device

    cache = CompileCache(tmp_path, max_entries=3)
    assert CompileCache(tmp_path).max_entries == MEMORY_CACHE_ENTRIES == 256
    models = [gd.ir.to_onnx(gd.trace(lambda x: x * 2, np.ones(n, np.float32))) for n in range(1, 6)]
    backend, device = get_backend("ort"), parse_device("cpu:0")
    compiled = [cache.get_or_compile(backend, m, device) for m in models[:3]]
    assert cache.get_or_compile(backend, models[0], device) is compiled[0]  # a hit: now the most recent
    for model in models[3:]:
        cache.get_or_compile(backend, model, device)
    assert len(cache) == 3
    assert cache.get_or_compile(backend, models[0], device) is compiled[0]  # kept (recently used)
    assert cache.get_or_compile(backend, models[1], device) is not compiled[1]  # dropped: loaded again
    np.testing.assert_array_equal(compiled[1].run({"arg0": np.ones(2, np.float32)})[0], [2.0, 2.0])  # still runs
