"""Resharding by all-to-all end to end: a split moved from one dimension to another trains as OneDevice does,
and the step's collectives move what the plan predicts."""

from __future__ import annotations

import numpy as np

import graphdist as gd
from tests.distribute.test_model_parallel import _assert_same_training, _digits, _mesh
from tests.distribute.test_model_parallel import _train as _train_mlp

SIZES = [64, 32, 32, 10]
BATCH = 16


def _train(strategy: gd.Strategy, x: np.ndarray, y: np.ndarray, steps: int = 3
           ) -> tuple[list[float], list[np.ndarray], object]:
    """Adam steps of an MLP whose first hidden activation is pinned split by rows (examples) over ``model``;
    the first layer's columns are split over ``model`` by the layout map, so the pin moves the split."""
    return _train_mlp(strategy, SIZES, x, y, steps=steps, batch=BATCH, pins={0: ("model", None)})


def _strategy() -> gd.Strategy:
    layout_map = gd.experimental.LayoutMap(_mesh())
    layout_map["dense_0/kernel"] = (None, "model")
    layout_map["dense_0/bias"] = ("model",)
    return gd.experimental.ModelParallelStrategy(layout_map=layout_map)


def test_split_moved_from_columns_to_rows_by_all_to_all_equals_one_device() -> None:
    x, y = _digits()
    one = _train(gd.OneDeviceStrategy("cpu:0"), x, y)
    tp = _train(_strategy(), x, y)
    _assert_same_training(one, tp)
    exchanges = [n for n in tp[2].graph("rewritten").nodes if n.op_type == "AllToAll"]
    # Forward: the pinned (16, 32) activation, a (16, 16) column block per device, becomes an (8, 32) row block.
    forward = [n for n in exchanges if not n.inputs[0].name.startswith("grad_")]
    assert [(tuple(n.inputs[0].shape), tuple(n.outputs[0].shape), n.attrs["split_axis"], n.attrs["concat_axis"])
            for n in forward] == [((16, 16), (8, 32), 0, 1)] * 2
    assert [n.meta["bytes_per_device"] for n in forward] == [16 * 16 * 4 // 2] * 2  # half the block, not all of it
    # The pinned activation is never gathered whole: every all-gather left gathers something else.
    pinned = {n.inputs[0].name for n in forward}
    assert not any(n.op_type == "AllGather" and n.inputs[0].name in pinned for n in tp[2].graph("rewritten").nodes)


def test_all_to_all_bytes_measured_in_a_step_equal_the_plans() -> None:
    from graphdist.runtime import timeline

    x, y = _digits()
    concrete = _train(_strategy(), x, y, steps=1)[2]
    predicted = {n.attrs["group_key"]: n.inputs[0].nbytes for n in concrete.graph("rewritten").nodes
                 if n.op_type == "AllToAll"}
    assert predicted
    with timeline.record() as steps:
        concrete(x[:BATCH], y[:BATCH])
    measured = {e.name: e.args["bytes"] for e in steps[0] if e.cat == "collective" and e.args["op"] == "AllToAll"}
    assert measured == predicted
