"""The kernels op determinism relies on give the same bits for 1, 2 and 4 ONNX Runtime intra-op threads.

``SplitBatchChunksPass`` computes every chunk of the global batch at one shape on whichever replica holds
it, so a kernel only has to give the same bits for the same inputs at the same shape: what could break
that is a kernel that splits its reduction between threads. Checked here for the reductions of the models'
training steps at their chunk shapes (4 rows: a global batch of 32 in 8 chunks) and at larger ones: the
forward ``MatMul``, the weight gradient (``Gemm`` with ``transA``), ``ReduceSum`` over the batch axis and
over everything, and ``Conv``. None splits its sums by thread count at these shapes (ONNX Runtime 1.2x's
MLAS partitions the output, not the reduction).

``ChunkBatchReductionsPass`` runs the row-wise ops on a replica's whole batch, so those also have to give a
chunk's rows the same bits whatever the number of rows around them: checked for ``MatMul`` over rows and
batched, ``Conv``, ``Softmax``, ``Exp`` and the chunk sums' batched ``MatMul`` of ones. (``ReduceSum`` does
not: summing axis 1 of ``(chunks, rows, n)`` is not bitwise the sum of each chunk's ``(rows, n)`` over axis 0
in ONNX Runtime 1.2x, which is why the pass sums chunks with the ``MatMul``.)
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], initializers: list | None = None) -> bytes:
    graph = helper.make_graph([node], "kernel", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape))
                                                 for n, a in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _run(model: bytes, feeds: dict[str, np.ndarray], threads: int) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _cases() -> list:
    cases = []
    for m, k, n in [(4, 64, 32), (4, 32, 10), (4, 784, 512), (64, 784, 512), (2048, 1024, 256)]:
        a, b, dy = _normal(m, k), _normal(k, n), _normal(m, n)
        cases.append(pytest.param(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": a, "b": b}, None,
                                  id=f"matmul-{m}x{k}x{n}"))
        cases.append(pytest.param(helper.make_node("Gemm", ["a", "dy"], ["y"], transA=1), {"a": a, "dy": dy}, None,
                                  id=f"weight-grad-{k}x{m}x{n}"))
    for shape, axes in [((4, 32), [0]), ((4, 8, 32), [0, 1]), ((4096, 256), [0]), ((4, 10), None),
                        ((1 << 20,), None)]:
        init = [] if axes is None else [helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)]
        node = helper.make_node("ReduceSum", ["x"] + (["axes"] if axes else []), ["y"], keepdims=0)
        cases.append(pytest.param(node, {"x": _normal(*shape)}, init, id=f"reducesum-{shape}-{axes}"))
    for batch, channels, filters in [(4, 1, 8), (4, 8, 16), (64, 8, 16)]:
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
        cases.append(pytest.param(node, {"x": _normal(batch, channels, 8, 8), "w": _normal(filters, channels, 3, 3)},
                                  None, id=f"conv-{batch}x{channels}->{filters}"))
    return cases


@pytest.mark.parametrize(("node", "feeds", "initializers"), _cases())
def test_same_bits_for_any_intra_op_thread_count(node, feeds, initializers) -> None:
    model = _model(node, feeds, initializers)
    one = _run(model, feeds, 1)
    for threads in (2, 4):
        assert _run(model, feeds, threads).tobytes() == one.tobytes(), f"{threads} threads"


def _rows_cases() -> list:
    """(node, feeds, the input whose examples lie along axis 0, initializers) for ``ChunkBatchReductionsPass``'s
    row-wise ops: each is run on 64 examples and on one chunk of 8."""
    ones = helper.make_tensor("ones", TensorProto.FLOAT, [1, 8], np.ones(8, np.float32))
    return [
        pytest.param(helper.make_node("MatMul", ["x", "w"], ["y"]), {"x": _normal(64, 784), "w": _normal(784, 512)},
                     [], id="matmul-rows"),
        pytest.param(helper.make_node("MatMul", ["x", "w"], ["y"]),
                     {"x": _normal(64, 2, 8, 16), "w": _normal(64, 2, 16, 8)}, [], id="batched-matmul"),
        pytest.param(helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
                     {"x": _normal(64, 8, 8, 8), "w": _normal(16, 8, 3, 3)}, [], id="conv-per-image"),
        pytest.param(helper.make_node("Softmax", ["x"], ["y"], axis=-1), {"x": _normal(64, 8, 33)}, [],
                     id="softmax"),
        pytest.param(helper.make_node("Exp", ["x"], ["y"]), {"x": _normal(64, 37)}, [], id="exp"),
        # the chunk sums over the batch: ones(1, 8) @ x.reshape(chunks, 8, rest), one GEMM per chunk
        pytest.param(helper.make_node("MatMul", ["ones", "x"], ["y"]), {"x": _normal(8, 8, 2048)}, [ones],
                     id="ones-matmul-chunk-sums"),
    ]


@pytest.mark.parametrize(("node", "feeds", "initializers"), _rows_cases())
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_are_the_same_bits_whatever_the_number_of_rows(node, feeds, initializers, threads) -> None:
    # ChunkBatchReductionsPass runs these on a replica's whole batch: one chunk's rows must come out as they
    # do when the chunk is computed alone (the chunks' rows, 8 of 64, on any replica count).
    model = _model(node, feeds, initializers)
    whole = _run(model, feeds, threads)
    chunk = {n: np.ascontiguousarray(a[8:16] if a.shape[0] == 64 else a[1:2]) if n == "x" or a.shape[0] == 64
             else a for n, a in feeds.items()}
    part = _run(_model(node, chunk, initializers), chunk, threads)
    expected = whole[8:16] if whole.shape[0] == 64 else whole[1:2]
    assert part.tobytes() == np.ascontiguousarray(expected).tobytes()


@pytest.mark.parametrize(("m", "k", "n"), [(784, 32, 512), (512, 4, 10), (33, 128, 7)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_with_c_is_the_product_then_the_addition(m, k, n, threads) -> None:
    # ChunkBatchReductionsPass fuses the chunks' first additions into the weight gradient's GEMM,
    # Gemm(a, b, left) for Add(left, a @ b): the same bits for contractions of up to FUSED_ROWS rows.
    from graphdist.passes.chunk_batch_reductions import FUSED_ROWS

    assert k <= FUSED_ROWS
    feeds = {"a": _normal(m, k), "b": _normal(k, n), "c": _normal(m, n)}
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)) for name, a in feeds.items()]
    output = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no MatMul + Add fusion

    def run(nodes: list) -> np.ndarray:
        model = helper.make_model(helper.make_graph(nodes, "fused", inputs, output),
                                  opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    fused = run([helper.make_node("Gemm", ["a", "b", "c"], ["y"])])
    apart = run([helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Add", ["c", "p"], ["y"])])
    assert fused.tobytes() == apart.tobytes()
