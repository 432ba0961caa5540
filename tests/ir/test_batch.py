"""The per-replica batch size as a symbol (graphdist.ir.batch) and how the tracer records it.

``BatchDim`` arithmetic is checked against ``scale * B + offset`` worked out by
hand; the tracer part traces replica functions over per-replica inputs under
a two-device ``MirroredStrategy`` and reads the provenance recorded in the
traced graph's initializers (``value.meta["batch"]``).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import graphdist as gd
from graphdist.ir import Graph
from graphdist.ir.batch import BatchDim, affine, elements, evaluate, record, with_batch

B = 4  # per-replica batch the steps are traced with (8 rows over 2 replicas)


def _trace(replica_fn, rows: int = B, tail: tuple[int, ...] = (3, 2)):
    """Traces ``strategy.run(replica_fn)`` over two replicas of ``rows`` rows; returns the traced graph."""
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])

    @gd.function
    def step(x):
        return strategy.run(replica_fn, args=(x,))

    data = np.arange(2 * rows * int(np.prod(tail)), dtype=np.float32).reshape(2 * rows, *tail)
    return step.get_concrete_function(gd.PerReplica((data[:rows], data[rows:]))).graph("traced")


def _capture(make):
    """Traces a replica step that records ``make(x, ctx)`` (a dict of values); returns (that dict, the graph)."""
    seen: dict = {}

    def replica_fn(x):
        seen.update(make(x, x.tracer))
        return np.sum(x)

    graph = _trace(replica_fn)
    return seen, graph


# ------------------------------------------------------------ BatchDim arithmetic
@pytest.mark.parametrize(("expr", "value", "provenance"), [
    (lambda b: b, 4, (1, 0)),
    (lambda b: b + 3, 7, (1, 3)),
    (lambda b: 3 + b, 7, (1, 3)),
    (lambda b: b - 1, 3, (1, -1)),
    (lambda b: 10 - b, 6, (-1, 10)),
    (lambda b: b * 2 + 1, 9, (2, 1)),
    (lambda b: 3 * (b - 2), 6, (3, -6)),
    (lambda b: -b, -4, (-1, 0)),
    (lambda b: b + b, 8, (2, 0)),
    (lambda b: (b + 1) - (b - 1), 2, (0, 2)),
    (lambda b: sum([b, b, 1]), 9, (2, 1)),
])
def test_affine_arithmetic_is_remembered(expr, value, provenance) -> None:
    result = expr(BatchDim(4))
    assert isinstance(result, BatchDim) and result == value and affine(result) == provenance
    scale, offset = provenance
    assert scale * 4 + offset == value  # the record agrees with the number


@pytest.mark.parametrize("expr", [
    lambda b: int(b), lambda b: b // 2, lambda b: b % 3, lambda b: b * True, lambda b: abs(b),
    lambda b: b ** 2, lambda b: b * np.int64(2), lambda b: b + np.int64(1),
])
def test_other_operations_lose_the_provenance(expr) -> None:
    result = expr(BatchDim(4))
    assert not isinstance(result, BatchDim) and affine(result) is None


def test_batchdim_is_an_int() -> None:
    b = BatchDim(5, 2, 3)
    assert b == 5 and hash(b) == hash(5) and {5: "x"}[b] == "x" and repr(b) == "5" and f"{b}" == "5"
    assert float(b * 1.5) == 7.5 and isinstance(b * 1.5, float)
    for twin in (pickle.loads(pickle.dumps(b)), copy.copy(b), copy.deepcopy(b)):
        assert isinstance(twin, BatchDim) and affine(twin) == (2, 3) and twin == 5


def test_product_of_two_batch_dims_is_not_affine() -> None:
    b = BatchDim(4)
    assert affine(b * b) is None  # 16 = B**2, not 4 * B: no (scale, offset) describes it


# ------------------------------------------------------------ record / elements / evaluate / with_batch
def test_record_and_elements() -> None:
    assert record(4) is None and record([3, 4]) is None and record(np.array([4])) is None
    assert record(BatchDim(4, 2, 1)) == [(2, 1)]
    assert record((BatchDim(4), -1)) == [(1, 0), None] and record([7, BatchDim(4, -1, 8)]) == [None, (-1, 8)]
    assert elements(None) is None and elements([]) is None
    assert elements([[2, 1], None]) == [(2, 1), None]  # as read back from JSON


def test_evaluate_recomputes_recorded_elements_only() -> None:
    shape = np.array([4, -1, 3], np.int64)
    new = evaluate(shape, [(1, 0), None, None], 6)
    np.testing.assert_array_equal(new, [6, -1, 3])
    np.testing.assert_array_equal(shape, [4, -1, 3])  # a copy
    assert new.dtype == np.int64
    scalar = evaluate(np.array(9.0, np.float32), [(2, 1)], 10)  # 2 * 10 + 1
    assert scalar.shape == () and scalar.dtype == np.float32 and scalar == 21.0


def test_with_batch() -> None:
    dims = with_batch([8, -1], [(2, 0), None])
    assert dims == [8, -1] and affine(dims[0]) == (2, 0) and affine(dims[1]) is None
    assert all(affine(d) is None for d in with_batch([8, -1], None))
    assert all(affine(d) is None for d in with_batch([8, -1], [(2, 0)]))  # length mismatch: plain ints


def test_shape_rules_keep_the_symbol() -> None:
    graph = Graph("rules")
    x = graph.add_input("x", np.float32, (BatchDim(4), 6))
    target = graph.add_initializer("shape", np.array([8, -1], np.int64))
    target.meta["batch"] = [(2, 0), None]
    (out,) = graph.add_node("Reshape", [x, target]).outputs
    assert out.shape == (8, 3) and affine(out.shape[0]) == (2, 0)
    row = graph.add_input("row", np.float32, (1, 3))
    wide = graph.add_initializer("wide", np.array([4, 3], np.int64))
    wide.meta["batch"] = [(1, 0), None]
    (expanded,) = graph.add_node("Expand", [row, wide]).outputs
    assert expanded.shape == (4, 3) and affine(expanded.shape[0]) == (1, 0)


# ------------------------------------------------------------ the tracer
def test_per_replica_input_has_a_batch_dim_first() -> None:
    seen, graph = _capture(lambda x, ctx: {"b": x.shape[0], "rest": x.shape[1]})
    assert isinstance(seen["b"], BatchDim) and seen["b"] == B and affine(seen["b"]) == (1, 0)
    assert not isinstance(seen["rest"], BatchDim)
    assert graph.meta.batch == B and isinstance(graph.inputs[0].shape[0], BatchDim)


def test_constants_made_from_the_batch_size_are_recorded() -> None:
    seen, _ = _capture(lambda x, ctx: {
        "dim": ctx.constant(x.shape[0]), "affine": ctx.constant(x.shape[0] * 2 + 1),
        "float": ctx.constant(x.shape[0], dtype=np.float32), "neg": ctx.constant(-x.shape[0]),
        "pair": ctx.int64s([x.shape[0], 3]),
    })
    assert seen["dim"].const_value == 4 and seen["dim"].meta["batch"] == [(1, 0)]
    assert seen["affine"].const_value == 9 and seen["affine"].meta["batch"] == [(2, 1)]
    assert seen["float"].dtype == np.float32 and seen["float"].meta["batch"] == [(1, 0)]
    assert seen["neg"].const_value == -4 and seen["neg"].meta["batch"] == [(-1, 0)]
    np.testing.assert_array_equal(seen["pair"].const_value, [4, 3])
    assert seen["pair"].meta["batch"] == [(1, 0), None]


def test_int_and_floor_division_lose_the_provenance() -> None:
    seen, _ = _capture(lambda x, ctx: {"int": ctx.constant(int(x.shape[0]) + 1), "half": ctx.constant(x.shape[0] // 2),
                                       "axes": ctx.int64s([int(x.shape[0]), 3])})
    assert seen["int"].const_value == 5 and "batch" not in seen["int"].meta
    assert seen["half"].const_value == 2 and "batch" not in seen["half"].meta
    assert "batch" not in seen["axes"].meta


def test_dedup_does_not_merge_a_literal_with_the_batch_size() -> None:
    seen, graph = _capture(lambda x, ctx: {
        "lit": ctx.constant(4), "lit_again": ctx.constant(4), "dim": ctx.constant(x.shape[0]),
        "dim_again": ctx.constant(x.shape[0]), "other": ctx.constant(BatchDim(4, 2, -4)),
        "axes": ctx.int64s([4, 3]), "batch_axes": ctx.int64s([x.shape[0], 3]),
    })
    assert seen["lit"] is seen["lit_again"] and seen["dim"] is seen["dim_again"]
    assert seen["lit"] is not seen["dim"] and "batch" not in seen["lit"].meta
    assert seen["other"] is not seen["dim"] and seen["other"].meta["batch"] == [(2, -4)]  # 2 * 4 - 4 == 4 too
    assert seen["axes"] is not seen["batch_axes"] and "batch" not in seen["axes"].meta
    assert {seen[k].name for k in ("lit", "dim", "other", "axes", "batch_axes")} <= set(graph.initializers)


@pytest.mark.parametrize(("dims", "target", "out_shape", "out_affine"), [
    (lambda x: (x.shape[0], -1), [4, -1], (4, 6), (1, 0)),
    (lambda x: (x.shape[0] * 2, -1), [8, -1], (8, 3), (2, 0)),
    (lambda x: (x.shape[0], 3, 2), [4, 3, 2], (4, 3, 2), (1, 0)),
])
def test_reshape_records_its_target_and_keeps_the_symbol(dims, target, out_shape, out_affine) -> None:
    graph = _trace(lambda x: x.reshape(*dims(x)))
    (node,) = graph.find_nodes("Reshape")
    shape = node.inputs[1]
    np.testing.assert_array_equal(shape.const_value, target)
    assert shape.meta["batch"] == [out_affine] + [None] * (len(target) - 1)
    assert node.outputs[0].shape == out_shape and affine(node.outputs[0].shape[0]) == out_affine


def test_reshape_with_a_frozen_batch_size_records_nothing() -> None:
    graph = _trace(lambda x: x.reshape(int(x.shape[0]), -1))
    (node,) = graph.find_nodes("Reshape")
    assert "batch" not in node.inputs[1].meta and affine(node.outputs[0].shape[0]) is None


def test_tensor_divided_by_the_batch_size_records_the_divisor() -> None:
    graph = _trace(lambda x: np.sum(x) / x.shape[0])
    divisors = [v for v in graph.initializers.values() if v.meta.get("batch")]
    assert [(float(v.const_value), v.meta["batch"]) for v in divisors] == [(4.0, [(1, 0)])]
