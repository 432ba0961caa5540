"""ChunkBatchReductionsPass: hand-built before vs hand-built expected (row-wise ops whole, what mixes examples
per chunk, sums over the leading batch axes as one batched MatMul of ones, the chunks' sums in a pairwise tree),
honest ``modified``, a second run changes nothing, the numerics are the chunks' tree bit for bit (reference
backend), one chunk per replica takes the same form, and the row layouts of the ops it keeps whole."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import GraphError
from graphdist.ir import GRAPHDIST_DOMAIN, Graph, Value, assert_structural_equal
from graphdist.ir.batch import BatchDim
from graphdist.passes.base import PassContext
from graphdist.passes.chunk_batch_reductions import ChunkBatchReductionsPass
from graphdist.passes.row_layout import row_layouts
from tests.passes.pass_checks import check_pass, run_reference

RNG = np.random.default_rng(5)
META = ("micro",)


def _op(graph: Graph, op_type: str, inputs: list[Value], attrs: dict | None = None, *, domain: str = "",
        micro: int | None = None) -> Value:
    node = graph.add_node(op_type, inputs, attrs, domain=domain)
    if micro is not None:
        node.meta["micro"] = micro
    return node.outputs[0]


def _ints(graph: Graph, *values: int) -> Value:
    return graph.add_initializer("ints", np.array(values, np.int64))


def _reduce(graph: Graph, value: Value, key: str) -> Value:
    return _op(graph, "ReplicaAllReduce", [value], {"reduce_op": "SUM", "group_key": key}, domain=GRAPHDIST_DOMAIN)


def _before(rows: int = 8) -> Graph:
    """A differentiated replica step in miniature: ``r = relu(x @ w)`` (row-wise), ``g = x^T @ r`` (a weight
    gradient: sums over the rows), ``s = sum(r, axis=0)`` (a bias gradient), both all-reduced."""
    graph = Graph("step")
    x = graph.add_input("x", np.float32, (BatchDim(rows), 3))
    w = graph.add_input("w", np.float32, (3, 2))
    r = _op(graph, "Relu", [_op(graph, "MatMul", [x, w])])
    g = _op(graph, "MatMul", [_op(graph, "Transpose", [x], {"perm": [1, 0]}), r])
    s = _op(graph, "ReduceSum", [r, _ints(graph, 0)], {"keepdims": 0})
    graph.outputs = [_reduce(graph, g, "g"), _reduce(graph, s, "s"), r]
    graph.meta.per_replica_inputs = {"x": None}
    graph.meta.per_replica_outputs = {2: None}
    graph.meta.batch = rows
    return graph


def _expected() -> Graph:
    """``_before`` for 8 chunks over 2 replicas: 4 chunks of 2 rows; ``relu(x @ w)`` and ``x^T`` stay whole; the
    weight gradient per chunk on Slices, an odd chunk's product and its addition one ``Gemm``; the bias gradient
    of every chunk at once, ``ones(1, 2) @ r.reshape(4, 2, 2)``; each summed ((0+1)+(2+3))."""
    graph = Graph("expected")
    x = graph.add_input("x", np.float32, (8, 3))
    w = graph.add_input("w", np.float32, (3, 2))
    r = _op(graph, "Relu", [_op(graph, "MatMul", [x, w])])
    xt = _op(graph, "Transpose", [x], {"perm": [1, 0]})
    gs, ss = [], []
    for m in range(4):
        rows = (_ints(graph, 2 * m), _ints(graph, 2 * m + 2))
        pair = (_op(graph, "Slice", [xt, *rows, _ints(graph, 1)]), _op(graph, "Slice", [r, *rows, _ints(graph, 0)]))
        if m % 2 == 0:
            gs.append(_op(graph, "MatMul", list(pair), micro=m))
        else:  # the tree's first additions take the odd chunk's product in the GEMM
            odd = pair
        if m == 0:
            stacked = _op(graph, "Reshape", [r, _ints(graph, 4, 2, 2)])
            sums = _op(graph, "MatMul", [graph.add_initializer("ones", np.ones((1, 2), np.float32)), stacked])
        part = _op(graph, "Slice", [sums, _ints(graph, m), _ints(graph, m + 1), _ints(graph, 0)])
        ss.append(_op(graph, "Reshape", [part, _ints(graph, 2)], micro=m))
        if m == 1:
            g01, s01 = _op(graph, "Gemm", [*odd, gs[0]]), _op(graph, "Add", [ss[0], ss[1]])
        if m == 3:
            g23 = _op(graph, "Gemm", [*odd, gs[1]])
            g = _op(graph, "Add", [g01, g23])
            s23 = _op(graph, "Add", [ss[2], ss[3]])
            s = _op(graph, "Add", [s01, s23])
    graph.outputs = [_reduce(graph, g, "g"), _reduce(graph, s, "s"), r]
    return graph


def _chunk(graph: Graph, chunks: int = 8, replicas: int = 2) -> Graph:
    # the chunks' tree sums in another order than the batch did: the bits are checked by the tests themselves
    return check_pass(ChunkBatchReductionsPass(chunks, replicas), graph, modified=True, numerics=False, meta_keys=META)


def test_only_what_mixes_examples_is_cut_into_chunks() -> None:
    graph = _chunk(_before())
    assert_structural_equal(graph, _expected(), meta_keys=META)
    assert graph.meta.deterministic_chunks == 8 and graph.meta.accumulate_steps == 4
    assert [v.name for v in graph.inputs] == ["x", "w"]


def test_the_sums_are_the_chunks_tree_bit_for_bit() -> None:
    feeds = {"x": RNG.standard_normal((8, 3)).astype(np.float32), "w": RNG.standard_normal((3, 2)).astype(np.float32)}
    g, s, r = run_reference(_chunk(_before()), feeds)
    whole = np.maximum(feeds["x"] @ feeds["w"], 0)
    np.testing.assert_array_equal(r, whole)
    gs = [feeds["x"][2 * m:2 * m + 2].T @ whole[2 * m:2 * m + 2] for m in range(4)]
    ss = [(np.ones((1, 2), np.float32) @ whole[2 * m:2 * m + 2])[0] for m in range(4)]
    assert g.tobytes() == ((gs[0] + gs[1]) + (gs[2] + gs[3])).tobytes()
    assert s.tobytes() == ((ss[0] + ss[1]) + (ss[2] + ss[3])).tobytes()


def test_one_chunk_per_replica_sums_in_the_same_form() -> None:
    # Mirrored(8) on 8 chunks: nothing to slice, but the bias gradient is still ones @ r.reshape(1, rows, 2),
    # the GEMM each chunk gets on more chunks per replica.
    graph = _chunk(_before(2), chunks=8, replicas=8)
    assert graph.meta.accumulate_steps == 1
    assert not any(n.op_type == "Slice" and n.inputs[0].name == "x" for n in graph.nodes)
    ones = [n for n in graph.nodes if n.op_type == "MatMul" and n.inputs[0].const_value is not None]
    assert len(ones) == 1 and ones[0].inputs[1].shape == (1, 2, 2)
    assert not any(n.op_type == "ReduceSum" for n in graph.nodes)


def test_an_op_not_known_to_be_row_wise_is_computed_per_chunk() -> None:
    graph = _before()
    cumsum = _op(graph, "CumSum", [graph.outputs[2], _ints(graph, 1)])  # along the features: row-wise in truth
    graph.outputs.append(cumsum)
    graph = _chunk(graph)
    assert sum(n.op_type == "CumSum" for n in graph.nodes) == 4
    assert graph.outputs[3].producer.op_type == "Concat"


def test_a_graph_without_batch_inputs_is_unchanged_and_the_batch_is_checked() -> None:
    graph = _before()
    graph.meta.batch = None
    assert not ChunkBatchReductionsPass(8, 2)(graph, PassContext()).modified
    with pytest.raises(GraphError, match="global batch of 6 rows does not cut into 8 equal chunks"):
        ChunkBatchReductionsPass(8, 2)(_before(3), PassContext())


@pytest.mark.parametrize(("op", "shape", "attrs", "axes", "out", "expected"), [
    ("Reshape", (8, 4, 6), {}, [0, None], (32, 6), 0),        # (B, T, D) -> (B*T, D): examples stay contiguous
    ("Reshape", (8, 4, 6), {}, [0, None], (4, 48), None),     # the examples spread over both axes
    ("Transpose", (8, 4, 6), {"perm": [1, 0, 2]}, [0], (4, 8, 6), 1),
    ("Softmax", (8, 4, 6), {"axis": -1}, [0], (8, 4, 6), 0),
    ("Softmax", (8, 6), {"axis": 0}, [0], (8, 6), None),      # normalizes over the batch
    ("ReduceSum", (8, 4, 6), {"keepdims": 0}, [0, None], (8, 6), 0),
    ("Pad", (8, 4, 6), {}, [0, None], (8, 6, 6), 0),           # pads axis 1 only
    ("Slice", (8, 4, 6), {}, [0, None, None, None], (8, 2, 6), 0),
    ("Slice", (4, 8, 6), {}, [1, None, None, None], (4, 2, 6), None),  # cuts the axis the examples lie on
])
def test_row_layouts(op, shape, attrs, axes, out, expected) -> None:
    graph = Graph("g")
    x = graph.add_input("x", np.float32, shape)
    inputs = [x]
    if op == "Reshape":
        inputs.append(graph.add_initializer("shape", np.array(out, np.int64)))
    if op == "ReduceSum":
        inputs.append(graph.add_initializer("axes", np.array([1], np.int64)))
    if op == "Pad":
        inputs.append(graph.add_initializer("pads", np.array([0, 1, 0, 0, 1, 0], np.int64)))
    if op == "Slice":
        inputs += [graph.add_initializer(n, np.array([v], np.int64)) for n, v in (("s", 1), ("e", 3), ("a", 1))]
    node = graph.add_node(op, inputs, attrs)
    assert node.outputs[0].shape == out
    layouts = row_layouts(node, {id(x): axes[0]}, 8)
    assert (layouts[0] if layouts else None) == expected


def test_numbers_made_from_the_batch_size_are_the_chunks() -> None:
    # The loss's divisor (a float batch size) reads the chunk's size, as the chunks count as replicas; an
    # arange over the batch is made per chunk, from the chunk's size.
    graph = _before()
    batch = graph.add_initializer("batch", np.float32(8))
    batch.meta["batch"] = [(1, 0)]
    rows = graph.add_initializer("rows", np.int64(8))
    rows.meta["batch"] = [(1, 0)]
    divisor = _op(graph, "Mul", [batch, graph.add_initializer("two", np.float32(2))])
    scaled = _op(graph, "Div", [graph.outputs[2], divisor])
    index = _op(graph, "Cast", [_op(graph, "Range", [graph.add_initializer("zero", np.int64(0)), rows,
                                                     graph.add_initializer("one", np.int64(1))])], {"to": 1})
    graph.outputs += [scaled, index]
    graph = _chunk(graph)
    assert graph.outputs[3].producer.op_type == "Div"  # whole
    assert graph.outputs[3].producer.inputs[1].producer.inputs[0].const_value == np.float32(2)
    assert sum(n.op_type == "Range" for n in graph.nodes) == 4
    assert [int(n.inputs[1].const_value) for n in graph.nodes if n.op_type == "Range"] == [2] * 4
