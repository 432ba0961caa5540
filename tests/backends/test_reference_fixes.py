"""The reference backend's corrected kernels agree with ONNX Runtime (and with math.erf).

onnx 1.23's own reference is wrong for LRN when the batch size differs from
the channel count, for GlobalMaxPool on inputs that are not 4-D and for Erf
in float64; graphdist's reference backend registers corrected kernels.
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphdist.backends import get_backend

RNG = np.random.default_rng(5)


def one_node_model(node, x: np.ndarray, elem: int = TensorProto.FLOAT):
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", elem, list(x.shape))],
                              [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def reference_run(model, x: np.ndarray) -> np.ndarray:
    return get_backend("reference").compile(model, "cpu:0").run({"x": x})[0]


def ort_run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("shape,size", [((3, 4, 2, 2), 3), ((2, 5, 3, 3), 5), ((4, 2, 3, 1), 1)])
def test_lrn_matches_ort_when_batch_and_channels_differ(shape, size) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    model = one_node_model(helper.make_node("LRN", ["x"], ["y"], size=size, alpha=0.01, beta=0.6, bias=1.5), x)
    np.testing.assert_allclose(reference_run(model, x), ort_run(model, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (2, 3, 2, 2, 2)])
def test_global_max_pool_matches_ort_at_every_rank(shape) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    model = one_node_model(helper.make_node("GlobalMaxPool", ["x"], ["y"]), x)
    np.testing.assert_array_equal(reference_run(model, x), ort_run(model, x))


def test_erf_keeps_float64_precision() -> None:
    x = RNG.standard_normal(7) * 2.0
    model = one_node_model(helper.make_node("Erf", ["x"], ["y"]), x, TensorProto.DOUBLE)
    got = reference_run(model, x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, [math.erf(v) for v in x], rtol=1e-15, atol=1e-15)
