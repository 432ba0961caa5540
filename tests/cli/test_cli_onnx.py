"""``.onnx`` targets with ``--input-shape`` (graphdist inspect / export, run as a subprocess).

Oracle: ONNX Runtime on the same model for the exported plan's outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.cli.test_cli import assert_clean_failure, graphdist

MIRRORED = ("--strategy", "mirrored", "--devices", "cpu:0,cpu:1")


def symbolic_model(path: Path, external: bool = False) -> Path:
    """x[N, S, 4] -> MatMul(w[4, 3]) -> Relu: the batch N and the length S are unknown."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", 3])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data", size_threshold=0)
    else:
        onnx.save(model, str(path))
    return path


def test_input_shape_fixes_batch_and_unknown_dimensions(tmp_path: Path) -> None:
    path = symbolic_model(tmp_path / "seq.onnx")
    result = graphdist("inspect", str(path), *MIRRORED, "--input-shape", "x=6x5x4", "--stage", "rewritten")
    assert result.returncode == 0, result.stderr
    assert "float32[3,5,4]" in result.stdout and "float32[6,5,3]" in result.stdout  # per replica, gathered
    assert "graphdist.AllGather" in result.stdout


def test_export_with_input_shape_runs_like_onnxruntime(tmp_path: Path) -> None:
    path = symbolic_model(tmp_path / "seq.onnx", external=True)  # external data is read from next to the model
    plan, inputs, outputs = tmp_path / "plan", tmp_path / "x.npz", tmp_path / "y.npz"
    result = graphdist("export", str(path), *MIRRORED, "--input-shape", "x=4x7x4", "-o", str(plan))
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(1).standard_normal((4, 7, 4)).astype(np.float32)
    np.savez(inputs, arg0=x)
    run = graphdist("run", str(plan), "--inputs", str(inputs), "-o", str(outputs))
    assert run.returncode == 0, run.stderr
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    with np.load(outputs) as data:  # the outputs keep the model's own names
        assert data.files == [output.name for output in session.get_outputs()]
        np.testing.assert_allclose(data[session.get_outputs()[0].name], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("shape", "phrases"), [
    ("image=4x5x4", ("--input-shape names 'image'", "its inputs are: x [N,S,4]")),
    ("x=4x5", ("input 'x'", "rank 3 ([N,S,4])", "rank 2")),
    ("x=4x5x9", ("dimension 2 of input 'x' is fixed to 4",)),
    ("x:4x5x4", ("is not NAME=D0xD1x...",)),
])
def test_input_shape_errors_name_the_input(tmp_path: Path, shape: str, phrases: tuple[str, ...]) -> None:
    path = symbolic_model(tmp_path / "seq.onnx")
    assert_clean_failure(graphdist("inspect", str(path), "--input-shape", shape), *phrases)


def test_onnx_file_errors_name_the_file(tmp_path: Path) -> None:
    path = symbolic_model(tmp_path / "ext.onnx", external=True)
    os.remove(tmp_path / "ext.onnx.data")
    assert_clean_failure(graphdist("inspect", str(path)), "cannot read", "ext.onnx.data", "does not exist")
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes(symbolic_model(tmp_path / "whole.onnx").read_bytes()[:60])
    assert_clean_failure(graphdist("inspect", str(truncated)), "cannot read", "cut.onnx", "truncated")
    assert_clean_failure(graphdist("inspect", "graphdist.models.mlp:forward", "--input-shape", "x=1x64"),
                         "--input-shape applies to .onnx targets")


def test_zoo_model_with_fixed_batch_input(tmp_path: Path) -> None:
    """SqueezeNet (opset 9; Dropout-7 with an unused mask output) with its batch given on the command line."""
    from graphdist.models.onnx_zoo import input_name, zoo_model

    model = zoo_model("squeezenet")
    path = tmp_path / "squeezenet.onnx"
    onnx.save(model, str(path))
    result = graphdist("inspect", str(path), *MIRRORED, "--input-shape", f"{input_name(model)}=4x3x224x224",
                       "--stage", "plan")
    assert result.returncode == 0, result.stderr
    assert "2 segment(s) on cpu:0, cpu:1" in result.stdout
