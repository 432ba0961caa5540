"""The local reduce-scatter (``graphdist.ReduceScatter`` between the devices of one process): participant
``i`` gets shard ``i`` of the flat reduction, of rank-1 and of higher-rank buffers (read flat, not copied),
and the op's shape rule agrees; a count that does not split is a clear error."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import GraphError, InvalidArgumentError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph
from graphdist.runtime.comm.reduce_scatter import reduce_scatter


@pytest.mark.parametrize("shape", [(6,), (3, 2), (1, 2, 3)])
def test_each_participant_gets_its_shard_of_the_flat_sum(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    buffers = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    shards = reduce_scatter(buffers)
    total = (buffers[0] + buffers[1] + buffers[2]).reshape(-1)
    assert [s.shape for s in shards] == [(2,)] * 3
    for i, shard in enumerate(shards):
        np.testing.assert_allclose(shard, total[2 * i:2 * i + 2], rtol=1e-6)


def test_a_count_that_does_not_split_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="multiple of the 2 participants"):
        reduce_scatter([np.ones((3, 1), np.float32)] * 2)


def test_the_shape_rule_reads_a_static_value_flat() -> None:
    graph = Graph("scatter")
    x = graph.add_input("x", np.float32, (4, 3))
    node = graph.add_node("ReduceScatter", [x], {"group_size": 2, "shard": 1}, domain=GRAPHDIST_DOMAIN)
    assert node.outputs[0].shape == (6,) and node.outputs[0].dtype == np.float32
    with pytest.raises(GraphError, match="9 elements do not split into 2"):
        graph.add_node("ReduceScatter", [graph.add_input("y", np.float32, (3, 3))], {"group_size": 2},
                       domain=GRAPHDIST_DOMAIN)
    with pytest.raises(GraphError, match="takes a rank-1 value"):
        graph.add_node("CrossWorkerReduceScatter", [x], {"num_workers": 2}, domain=GRAPHDIST_DOMAIN)
