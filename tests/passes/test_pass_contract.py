"""The pass contract (graphdist/passes/base.py): requires/ensures around every call, verification naming the pass,
ordering constraints checked when a pipeline is built."""

from __future__ import annotations

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.pipeline import PipelineConfig, build_pipeline
from graphdist.ir.graph import Graph
from graphdist.passes.autodiff import AutodiffPass
from graphdist.passes.base import PassBase, PassContext, PassManager, PassResult
from graphdist.passes.replicate import ReplicatePass


def _graph() -> Graph:
    graph = Graph("g")
    x = graph.add_input("x", np.float32, (2, 3))
    graph.outputs = [graph.add_node("Relu", [x]).outputs[0]]
    return graph


class _BreaksTheGraph(PassBase):
    """Deliberately broken: points the output at a value no node of the graph makes."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        orphan = Graph("other").add_input("orphan", np.float32, (2, 3))
        graph.outputs = [orphan]
        return PassResult(graph, True)


class _PromisesNoRelu(PassBase):
    """Promises a graph without Relu, and does nothing."""

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        return PassResult(graph, False)

    def ensures(self, graph: Graph, ctx: PassContext) -> None:
        if any(n.op_type == "Relu" for n in graph.nodes):
            raise gd.PostconditionError("a Relu is left")


class _NeedsTwoDevices(PassBase):
    def requires(self, graph: Graph, ctx: PassContext) -> None:
        if len(ctx.devices) < 2:
            raise gd.PreconditionError(f"needs two devices, has {list(ctx.devices)}")

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        return PassResult(graph, False)


def test_a_broken_pass_raises_postcondition_error_naming_it() -> None:
    with pytest.raises(gd.PostconditionError, match="_BreaksTheGraph broke graph 'g'"):
        _BreaksTheGraph()(_graph(), PassContext(check=True))
    with pytest.raises(gd.PostconditionError, match="_BreaksTheGraph broke graph 'g'"):
        PassManager([_BreaksTheGraph()]).run(_graph(), PassContext(check=True))


def test_ensures_and_requires_name_the_pass() -> None:
    with pytest.raises(gd.PostconditionError, match="_PromisesNoRelu broke graph 'g': a Relu is left"):
        _PromisesNoRelu()(_graph())
    with pytest.raises(gd.PreconditionError, match=r"_NeedsTwoDevices cannot run on graph 'g': needs two devices"):
        _NeedsTwoDevices()(_graph(), PassContext(devices=("cpu:0",)))
    assert _NeedsTwoDevices()(_graph(), PassContext(devices=("cpu:0", "cpu:1"))).modified is False


def test_a_pipeline_with_a_violated_order_fails_when_built() -> None:
    with pytest.raises(gd.PipelineOrderError, match="runs ReplicatePass .* before AutodiffPass"):
        PassManager([ReplicatePass(2), AutodiffPass()])
    pipeline = build_pipeline(PipelineConfig(devices=("cpu:0", "cpu:1")))
    with pytest.raises(gd.PipelineOrderError, match="before AutodiffPass"):
        pipeline.with_slot("accumulate", ReplicatePass(2))


def test_every_strategy_pipeline_is_in_order() -> None:
    configs = [PipelineConfig(), PipelineConfig(devices=("cpu:0", "cpu:1"), bucketing={"num_packs": 2}),
               PipelineConfig(devices=("cpu:0", "cpu:1"), parameter_device="cpu:0"),
               PipelineConfig(devices=("cpu:0",), parameter_servers=True),
               PipelineConfig(devices=("cpu:0", "cpu:1"), shard_optimizer_state=True, accumulate_steps=2,
                              multi_worker={"num_workers": 2, "comm_group": "g"}, replicas_in_sync=4)]
    for config in configs:
        assert len(build_pipeline(config)) > 0  # built without PipelineOrderError
