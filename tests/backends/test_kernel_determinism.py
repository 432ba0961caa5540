"""The kernels op determinism relies on give the same bits for 1, 2 and 4 ONNX Runtime intra-op threads.

``SplitBatchChunksPass`` computes every chunk of the global batch at one shape on whichever replica holds
it, so a kernel only has to give the same bits for the same inputs at the same shape: what could break
that is a kernel that splits its reduction between threads. Checked here for the reductions of the models'
training steps at their chunk shapes (4 rows: a global batch of 32 in 8 chunks) and at larger ones: the
forward ``MatMul``, the weight gradient (``Gemm`` with ``transA``), ``ReduceSum`` over the batch axis and
over everything, and ``Conv``. None splits its sums by thread count at these shapes (ONNX Runtime 1.2x's
MLAS partitions the output, not the reduction).
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
