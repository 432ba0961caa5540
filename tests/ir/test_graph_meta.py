"""``Graph.meta`` is a typed :class:`GraphMeta`: every field documented, copied as the former dict was."""

from __future__ import annotations

import dataclasses

import numpy as np

import graphdist as gd
from graphdist.ir import Graph, GraphMeta, Replication
from graphdist.ir.placement import PlacementSpec


def test_every_field_is_documented() -> None:
    doc = GraphMeta.__doc__ or ""
    missing = [f.name for f in dataclasses.fields(GraphMeta) if f"        {f.name}: " not in doc]
    assert missing == []


def test_a_new_graph_has_nothing_recorded() -> None:
    meta = Graph("g").meta
    assert isinstance(meta, GraphMeta)
    assert meta.batch is None and meta.placement is None and meta.replication is None
    assert meta.accumulate_steps is None and meta.deterministic_chunks is None
    assert meta.variables == [] and meta.variable_updates == [] and meta.sharded_state == {}


def test_copy_shares_recorded_containers_and_owns_empty_ones() -> None:
    graph = Graph("g")
    graph.meta.variable_updates = [("out", "w1")]
    graph.meta.placement = PlacementSpec()
    graph.meta.replication = Replication(2, 0, 2, {}, {}, {})
    graph.meta.extra["note"] = 1
    twin = graph.copy()
    assert twin.meta == graph.meta and twin.meta is not graph.meta
    # recorded values are shared (dict(meta) was a shallow copy): a pass that edits one assigns a new one
    assert twin.meta.variable_updates is graph.meta.variable_updates
    assert twin.meta.placement is graph.meta.placement
    # an empty container was an absent key: filling it in the copy leaves the original empty
    twin.meta.reads_num_replicas.append("model.py:3")
    twin.meta.per_replica_inputs["x"] = None
    assert graph.meta.reads_num_replicas == [] and graph.meta.per_replica_inputs == {}
    twin.meta.extra["other"] = 2
    assert graph.meta.extra == {"note": 1}


def test_a_traced_graph_records_its_output_tree() -> None:
    graph = gd.trace(lambda x: {"y": x * 2.0}, np.ones(2, np.float32))
    assert gd.nest.unflatten(graph.meta.output_tree, [v.name for v in graph.outputs]) == {"y": graph.outputs[0].name}
