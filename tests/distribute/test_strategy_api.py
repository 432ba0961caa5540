"""OneDeviceStrategy API details, retrace/recompile counting, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd


@pytest.fixture
def strategy() -> gd.OneDeviceStrategy:
    return gd.OneDeviceStrategy("cpu:0")


def _mlp(x: np.ndarray) -> np.ndarray:
    w = np.linspace(-1, 1, x.shape[-1] * 4, dtype=np.float32).reshape(x.shape[-1], 4)
    return np.maximum(x @ w, 0).sum(axis=-1)


@pytest.mark.parametrize("spec", ["cpu:0", "CPU:0", "/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:0", "cpu"])
def test_device_strings_normalise(spec: str) -> None:
    assert gd.OneDeviceStrategy(spec).extended.worker_devices == ("cpu:0",)


def test_extended_and_counts(strategy: gd.OneDeviceStrategy) -> None:
    assert strategy.num_replicas_in_sync == 1
    assert strategy.extended.worker_devices == ("cpu:0",)
    assert strategy.extended.parameter_devices == ("cpu:0",)
    assert strategy.cluster_resolver is None
    assert gd.config.list_devices()[0] == "cpu:0"


def test_reduce_to_and_batch_reduce_to(strategy: gd.OneDeviceStrategy) -> None:
    value = np.array([1.0, 2.0])
    np.testing.assert_array_equal(strategy.extended.reduce_to("SUM", value, "cpu:0"), value)
    out = strategy.extended.batch_reduce_to("MEAN", [(value, "cpu:0"), (value * 2, "cpu:0")])
    np.testing.assert_array_equal(out[1], value * 2)
    with pytest.raises(gd.DeviceError):
        strategy.extended.reduce_to("SUM", value, "nowhere:0")


def test_run_results_match_numpy_and_structure(strategy: gd.OneDeviceStrategy) -> None:
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)

    def fn(x, scale=1.0):
        return {"y": _mlp(x) * scale, "pair": (x.T, np.tanh(x))}

    out = strategy.run(fn, args=(x,), kwargs={"scale": 2.0})
    np.testing.assert_allclose(out["y"], _mlp(x) * 2.0, rtol=1e-5)
    np.testing.assert_allclose(out["pair"][0], x.T)
    np.testing.assert_allclose(out["pair"][1], np.tanh(x), rtol=1e-5)


def test_second_run_with_same_signature_neither_retraces_nor_recompiles(strategy: gd.OneDeviceStrategy) -> None:
    def fn(x):
        return _mlp(x) + 1.0

    x = np.ones((7, 3), np.float32)
    strategy.run(fn, args=(x,))
    before = gd.stats.snapshot()
    for _ in range(3):
        strategy.run(fn, args=(x * 2,))
    delta = gd.stats.delta(before)
    assert delta["traces"] == 0
    assert delta["compiles"] + delta["memory_cache_hits"] + delta["disk_cache_hits"] == 0
    assert delta["plan_runs"] == 3

    before = gd.stats.snapshot()
    strategy.run(fn, args=(np.ones((9, 3), np.float32),))  # new shape: new trace and compile
    delta = gd.stats.delta(before)
    assert delta["traces"] == 1
    assert delta["compiles"] + delta["memory_cache_hits"] + delta["disk_cache_hits"] == 1

    before = gd.stats.snapshot()
    strategy.run(fn, args=(np.ones((9, 3), np.float64),))  # new dtype: new trace too
    assert gd.stats.delta(before)["traces"] == 1


def test_python_scalars_are_constants_in_the_signature(strategy: gd.OneDeviceStrategy) -> None:
    def fn(x, k):
        return x * k

    x = np.ones(3, np.float32)
    assert strategy.run(fn, args=(x, 2.0))[0] == 2.0
    assert strategy.run(fn, args=(x, 3.0))[0] == 3.0


def test_run_enters_scope_and_replica_context(strategy: gd.OneDeviceStrategy) -> None:
    seen = {}

    def fn(x):
        seen["strategy"] = gd.get_strategy()
        seen["replica"] = gd.get_replica_context()
        seen["cross"] = gd.in_cross_replica_context()
        return x

    strategy.run(fn, args=(np.ones(2, np.float32),))
    assert seen["strategy"] is strategy
    assert isinstance(seen["replica"], gd.ReplicaContext)
    assert seen["replica"].num_replicas_in_sync == 1
    assert seen["cross"] is False


def test_merge_call_runs_in_cross_replica_context(strategy: gd.OneDeviceStrategy) -> None:
    def fn(x):
        return gd.get_replica_context().merge_call(lambda s, v: (s is strategy, gd.in_cross_replica_context(), v),
                                                   args=(x,))

    is_strategy, cross, value = strategy.run(fn, args=(np.ones(2, np.float32),))
    assert is_strategy and cross
    np.testing.assert_array_equal(value, [1, 1])


def test_per_replica_repr_and_local_results() -> None:
    pr = gd.PerReplica((np.float32(1.0), np.float32(2.0)))
    assert repr(pr).startswith("PerReplica:{\n  0: ")
    assert "1: " in repr(pr)
    assert gd.get_strategy().experimental_local_results(np.float32(5)) == (np.float32(5),)


def test_reduce_op_strings() -> None:
    assert gd.ReduceOp.from_any("sum") is gd.ReduceOp.SUM
    assert gd.ReduceOp.from_any("Mean") is gd.ReduceOp.MEAN
    assert gd.ReduceOp.from_any(gd.ReduceOp.MAX) is gd.ReduceOp.MAX


# ------------------------------------------------------------------ bad input
def test_unknown_device_string() -> None:
    with pytest.raises(gd.DeviceError, match="'xpu:0'"):
        gd.OneDeviceStrategy("xpu:0")


def test_gpu_absent_is_a_clear_error() -> None:
    if gd.config.num_gpus():
        pytest.skip("a GPU is present")
    gd.config.set_soft_device_placement(False)  # on (the default), it runs on cpu:0: tests/test_conventions.py
    try:
        with pytest.raises(gd.DeviceError, match="GPU"):
            gd.OneDeviceStrategy("/gpu:0")
    finally:
        gd.config.set_soft_device_placement(True)


def test_invalid_reduce_op(strategy: gd.OneDeviceStrategy) -> None:
    with pytest.raises(gd.InvalidArgumentError, match="'PRODUCT' is not a valid reduce op"):
        strategy.reduce("PRODUCT", np.ones(2), axis=None)
    with pytest.raises(ValueError):
        gd.get_replica_context().all_reduce("avg", np.ones(2))


def test_reduce_axis_out_of_range(strategy: gd.OneDeviceStrategy) -> None:
    with pytest.raises(gd.AxisError, match="axis 3 is out of range for a tensor of rank 2"):
        strategy.reduce("SUM", np.ones((2, 2)), axis=3)
    with pytest.raises(gd.AxisError, match="scalar"):
        strategy.reduce("SUM", np.float32(1.0), axis=0)


def test_gather_axis_out_of_range_and_scalar(strategy: gd.OneDeviceStrategy) -> None:
    with pytest.raises(gd.AxisError, match="out of range"):
        strategy.gather(np.ones((2, 2)), axis=2)
    with pytest.raises(gd.InvalidArgumentError, match="rank >= 1"):
        strategy.gather(np.float32(1.0), axis=0)


def test_wrong_arity(strategy: gd.OneDeviceStrategy) -> None:
    with pytest.raises(gd.TracingError, match=r"cannot be called with 1 positional argument"):
        strategy.run(lambda x, y: x + y, args=(np.ones(2),))


def test_args_must_be_a_tuple(strategy: gd.OneDeviceStrategy) -> None:
    with pytest.raises(gd.InvalidArgumentError, match=r"args=\(x,\)"):
        strategy.run(lambda x: x, args=np.ones(2))


def test_unsupported_numpy_call_in_run(strategy: gd.OneDeviceStrategy) -> None:
    with pytest.raises(gd.TracingError, match="np.linalg.norm is not supported"):
        strategy.run(lambda x: np.linalg.norm(x), args=(np.ones(2, np.float32),))


def test_data_dependent_if_in_run(strategy: gd.OneDeviceStrategy) -> None:
    def fn(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(gd.TracingError, match="np.where"):
        strategy.run(fn, args=(np.ones(2, np.float32),))


def test_eager_reduce_of_mismatched_shapes_needs_axis(strategy: gd.OneDeviceStrategy) -> None:
    values = gd.PerReplica((np.ones(4), np.ones(2)))
    with pytest.raises(gd.InvalidArgumentError, match="axis=0"):
        strategy.reduce("SUM", values, axis=None)
    # the seeds' partial batch: MEAN with axis=0 uses the real denominator (6)
    assert strategy.reduce("MEAN", gd.PerReplica((np.arange(4.0), np.arange(4.0, 6.0))), axis=0) == 2.5


def test_duplicate_devices() -> None:
    with pytest.raises(gd.InvalidArgumentError, match="more than once"):
        gd.Strategy(["cpu:0", "/cpu:0"])
