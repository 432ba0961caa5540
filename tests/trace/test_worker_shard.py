"""A variable stored as this worker's shards (ZeRO-1 across workers), without MPI: the other worker's
shards come from a stand-in gather. Layout round trip, eager reads gather, writes keep the shards, and
the errors for a second layout, a wrong-shape update, a step that reads the variable whole and an export;
in one process (one worker) the parts are the whole value and any step may read it."""

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
    variable.store_in_parts(second)
    # Stored as one part per local replica (its shard), so a step feeds and adopts each part without copies.
    assert [p.tolist() for p in variable._value] == [[3, 4, 5], [9, 0, 0]]
    assert variable.shape == (2, 5) and variable.ndim == 2 and len(variable) == 2 and variable.dtype == np.float32
    np.testing.assert_array_equal(variable.numpy(), VALUE)
    np.testing.assert_array_equal(np.asarray(variable) + 0, VALUE)
    assert "sharded over 2 workers (this one keeps 6 elements)" in repr(variable)
    variable.assign(VALUE * 2)  # a whole value (a restored checkpoint): this worker keeps its shards
    assert [p.tolist() for p in variable._value] == [[6, 8, 10], [18, 0, 0]]
    variable.write_back(np.ones(6, np.float32))  # a write-back of the shards one after the other
    assert [p.tolist() for p in variable._value] == [[1, 1, 1], [1, 1, 1]]
    new = [np.full(3, 5, np.float32), np.full(3, 7, np.float32)]
    variable.write_back_parts(new)  # a step's write-back: one part per local replica, adopted as they are
    assert variable._value[0] is new[0] and variable._value[1] is new[1]


def test_in_one_process_the_parts_are_the_whole_value() -> None:
    """One worker (MirroredStrategy's ZeRO-1): no gather; the parts join to the value, whole writes split,
    and a layout for another replica count re-splits the value."""
    variable = gd.Variable(VALUE)
    variable.store_in_parts(WorkerShard(VALUE.shape, 1, 0, 5, local=2))
    assert [p.tolist() for p in variable._value] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    np.testing.assert_array_equal(variable.numpy(), VALUE)
    assert "stored in 2 parts" in repr(variable) and "numpy=" in repr(variable)
    variable.assign_add(np.ones_like(VALUE))
    np.testing.assert_array_equal(variable.numpy(), VALUE + 1)
    variable.store_in_parts(WorkerShard(VALUE.shape, 1, 0, 3, local=4))  # 4 replicas: 3 each, 2 of padding
    assert [p.tolist() for p in variable._value] == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 0, 0]]
    np.testing.assert_array_equal(variable.numpy(), VALUE + 1)
    with pytest.raises(gd.errors.InvalidArgumentError, match=r"wrote back 2 part\(s\), and it is stored in 4"):
        variable.write_back_parts([np.zeros(3, np.float32)] * 2)
    with pytest.raises(gd.errors.InvalidArgumentError, match=r"has shape \(2,\), expected \(3,\)"):
        variable.write_back_parts([np.zeros(2, np.float32)] * 4)
    # A step that reads it whole (compiled without ZeRO) is fed the joined value and its write-back split.
    double = gd.function(lambda: variable.assign(variable * 2))
    double()
    np.testing.assert_array_equal(variable.numpy(), (VALUE + 1) * 2)
    assert len(variable._value) == 4


def test_bad_layouts_and_updates_are_clear_errors() -> None:
    first, second = _layouts()
    variable = gd.Variable(VALUE)
    variable.store_in_parts(first)
    variable.store_in_parts(first)  # the same layout again: nothing changes
    with pytest.raises(gd.errors.InvalidArgumentError, match="must shard it the same way"):
        variable.store_in_parts(second)
    with pytest.raises(gd.errors.InvalidArgumentError, match=r"has shape \(3,\), expected \(2, 5\)"):
        variable.write_back(np.zeros(3, np.float32))


def test_a_step_reading_a_worker_sharded_variable_whole_is_refused() -> None:
    variable = gd.Variable(VALUE)
    variable.store_in_parts(_layouts()[0])
    step = gd.function(lambda x: x * variable)
    with pytest.raises(gd.errors.InvalidArgumentError, match="sharded across workers .* reads it whole"):
        step(np.ones((2, 5), np.float32))


def test_exporting_a_step_with_worker_sharded_state_is_not_implemented(tmp_path) -> None:
    variable = gd.Variable(VALUE)
    step = gd.function(lambda x: x * variable)
    concrete = step.get_concrete_function(np.ones((2, 5), np.float32))
    variable.store_in_parts(_layouts()[0])  # as a ZeRO-1 step of the same variable would leave it
    with pytest.raises(NotImplementedError, match="sharded across workers .* save a gd.Checkpoint on every worker"):
        concrete.export(tmp_path / "plan")


def test_blocks_layout_splits_and_joins_tensor_parallel_blocks() -> None:
    """Tensor parallelism (LowerLayoutsPass): part i is a block of the value in its own shape, not a flat chunk."""
    value = np.arange(24, dtype=np.float32).reshape(4, 6)
    shard = WorkerShard((4, 6), 1, 0, 12, local=2, blocks=(((0, 4), (0, 3)), ((0, 4), (3, 6))))
    parts = shard.parts(value)
    np.testing.assert_array_equal(parts[0], value[:, :3])
    np.testing.assert_array_equal(parts[1], value[:, 3:])
    assert shard.part_shape(1) == (4, 3) and not shard.same_layout(WorkerShard((4, 6), 1, 0, 12, local=2))
    np.testing.assert_array_equal(shard.whole(parts), value)
    variable = gd.Variable(value, name="dense/kernel")
    variable.store_in_parts(shard)
    variable.write_back_parts([parts[0] + 1, parts[1] * 2])
    np.testing.assert_array_equal(variable.numpy(), np.concatenate([value[:, :3] + 1, value[:, 3:] * 2], axis=1))
    with pytest.raises(gd.InvalidArgumentError, match=r"expected \(4, 3\)"):
        variable.write_back_parts([parts[0].reshape(-1), parts[1]])
