"""A variable stored as this worker's shards (ZeRO-1 across workers), without MPI: the other worker's
shards come from a stand-in gather. Layout round trip, eager reads gather, writes keep the shards, and
the errors for a second layout, a wrong-shape update, a step that reads the variable whole and an export."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.trace.variables import WorkerShard

VALUE = np.arange(10, dtype=np.float32).reshape(2, 5)


def _layouts(workers: int = 2, local: int = 2) -> list[WorkerShard]:
    """Every worker's layout; each gathers the stored shards of all workers from the whole VALUE."""
    chunk = -(-VALUE.size // (workers * local))
    layouts: list[WorkerShard] = []

    def gather(_: np.ndarray) -> np.ndarray:
        return np.concatenate([layout.local_part(VALUE) for layout in layouts])

    layouts.extend(WorkerShard(VALUE.shape, workers, w, chunk, gather, local) for w in range(workers))
    return layouts


def test_each_worker_stores_its_replicas_shards_and_a_read_gathers_the_whole() -> None:
    first, second = _layouts()
    # 10 elements in 4 shards of 3 (2 of padding): worker 0 keeps shards 0 and 2, worker 1 shards 1 and 3.
    np.testing.assert_array_equal(first.local_part(VALUE), [0, 1, 2, 6, 7, 8])
    np.testing.assert_array_equal(second.local_part(VALUE), [3, 4, 5, 9, 0, 0])
    variable = gd.Variable(VALUE)
    variable._shard_storage(second)
    assert variable._value.shape == (6,) and variable.shape == (2, 5) and variable.ndim == 2 and len(variable) == 2
    np.testing.assert_array_equal(variable.numpy(), VALUE)
    np.testing.assert_array_equal(np.asarray(variable) + 0, VALUE)
    assert "sharded over 2 workers (this one keeps 6 elements)" in repr(variable)
    variable.assign(VALUE * 2)  # a whole value (a restored checkpoint): this worker keeps its shards
    np.testing.assert_array_equal(variable._value, [6, 8, 10, 18, 0, 0])
    variable._write(np.ones(6, np.float32))  # a step's write-back: the shards themselves
    np.testing.assert_array_equal(variable._value, np.ones(6))


def test_bad_layouts_and_updates_are_clear_errors() -> None:
    first, second = _layouts()
    variable = gd.Variable(VALUE)
    variable._shard_storage(first)
    variable._shard_storage(first)  # the same layout again: nothing changes
    with pytest.raises(gd.errors.InvalidArgumentError, match="must shard it the same way"):
        variable._shard_storage(second)
    with pytest.raises(gd.errors.InvalidArgumentError, match=r"has shape \(3,\), expected \(2, 5\)"):
        variable._write(np.zeros(3, np.float32))


def test_a_step_reading_a_worker_sharded_variable_whole_is_refused() -> None:
    variable = gd.Variable(VALUE)
    variable._shard_storage(_layouts()[0])
    step = gd.function(lambda x: x * variable)
    with pytest.raises(gd.errors.InvalidArgumentError, match="sharded across workers .* reads it whole"):
        step(np.ones((2, 5), np.float32))


def test_exporting_a_step_with_worker_sharded_state_is_not_implemented(tmp_path) -> None:
    variable = gd.Variable(VALUE)
    step = gd.function(lambda x: x * variable)
    concrete = step.get_concrete_function(np.ones((2, 5), np.float32))
    variable._shard_storage(_layouts()[0])  # as a ZeRO-1 step of the same variable would leave it
    with pytest.raises(NotImplementedError, match="sharded across workers .* save a gd.Checkpoint on every worker"):
        concrete.export(tmp_path / "plan")
