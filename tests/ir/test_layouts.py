"""Layouts and meshes as data (graphdist/ir/layouts.py): the mesh's replicas and groups, local shapes, blocks,
normalisation and the JSON and attribute forms."""

from __future__ import annotations

import pytest

from graphdist.errors import GraphError
from graphdist.ir.layouts import Layout, MeshSpec, local_slices

MESH = MeshSpec.build(("batch", "model", "x"), (2, 2, 2), [f"cpu:{i}" for i in range(8)], "batch")


def test_replicas_are_the_batch_axis_and_devices_run_row_major_over_the_others() -> None:
    assert MESH.devices == (("cpu:0", "cpu:1", "cpu:2", "cpu:3"), ("cpu:4", "cpu:5", "cpu:6", "cpu:7"))
    assert MESH.model_axes == ("model", "x") and MESH.devices_per_replica == 4
    assert [MESH.coordinates(i) for i in range(4)] == [{"model": 0, "x": 0}, {"model": 0, "x": 1},
                                                       {"model": 1, "x": 0}, {"model": 1, "x": 1}]
    # The batch axis need not come first: its devices are taken along it.
    later = MeshSpec.build(("model", "batch"), (2, 2), ["a", "b", "c", "d"], "batch")
    assert later.devices == (("a", "c"), ("b", "d"))


def test_groups_differ_along_one_axis_only() -> None:
    assert [MESH.group(i, "model") for i in range(4)] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [MESH.group(i, "x") for i in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert MESH.group_name(0, "model") == MESH.group_name(2, "model") == "model@x0"
    assert MESH.group_name(1, "model") == "model@x1" != MESH.group_name(0, "model")


def test_local_shapes_blocks_and_normalisation() -> None:
    layout = Layout(("x", "model"))
    assert MESH.local_shape((8, 6), layout) == (4, 3)
    assert local_slices(MESH, (8, 6), layout, 3) == [(0, 4, 8), (1, 3, 6)]
    assert MESH.normalised(Layout(("batch", "model"), frozenset({"batch", "x"}))) == \
        Layout((None, "model"), frozenset({"x"}))
    flat = MeshSpec.build(("batch", "model"), (2, 1), ["cpu:0", "cpu:1"], "batch")
    assert flat.normalised(Layout(("model",))).is_replicated  # an axis of size one splits nothing
    with pytest.raises(GraphError, match="mesh axis 'y'; the mesh's axes are batch, model, x"):
        MESH.size("y")


def test_json_and_attribute_forms_round_trip() -> None:
    assert MeshSpec.from_json(MESH.to_json()) == MESH
    layout = Layout((None, "model"))
    assert layout.to_attr() == ["", "model"] and Layout.from_attr(layout.to_attr()) == layout
    assert Layout.from_attr([b"", b"model"]) == layout
    assert str(Layout((None, None), frozenset({"model"}))) == "[-, -] partial(model)"
