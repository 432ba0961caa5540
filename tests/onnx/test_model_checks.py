"""An ONNX file means one thing: what ONNX Runtime refuses, gd.onnx.load and graphdist.onnx.backend.prepare refuse.

Both entry points read a model through ``graphdist.onnx.files.read_model``; every test runs both. The oracle is
ONNX Runtime itself: a model it refuses is refused, a model it warns about (repeated initializers) is run the way
it runs it. External data is read only from the model's own directory (never the current one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper

import graphdist as gd
import graphdist.onnx.backend as backend

X = np.array([[1.0, -2.0]], np.float32)


def tensor(name: str, shape=(1, 2)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def make_model(nodes, inputs=("x",), initializers=(), outputs=("y",), name: str = "m") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [tensor(n) for n in inputs], [tensor(n) for n in outputs],
                              initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def weight(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.float32).reshape(1, 2), name)


def ort_session(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def run_load(model, **kwargs) -> np.ndarray:
    return np.asarray(gd.onnx.load(model, **kwargs)(X))


def run_prepare(model, **kwargs) -> np.ndarray:
    return np.asarray(backend.prepare(model, **kwargs).run([X])[0])


ENTRY_POINTS: dict[str, Callable[..., np.ndarray]] = {"gd.onnx.load": run_load, "prepare": run_prepare}
both = pytest.mark.parametrize("run", list(ENTRY_POINTS.values()), ids=list(ENTRY_POINTS))


# ---------------------------------------------------------------- single assignment
@both
def test_two_nodes_writing_one_value_are_refused_naming_both(run) -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="first"),
                        helper.make_node("Neg", ["x"], ["y"], name="second")])
    with pytest.raises(Exception, match=r"Duplicate definition of name \(y\)"):
        ort_session(model)
    with pytest.raises(gd.GraphError, match=r"value 'y' is defined twice, by node 'first' \(Relu\) and by node "
                                            r"'second' \(Neg\)"):
        run(model)
    with pytest.raises(gd.GraphError, match="value 'y' is defined twice"):
        run(model.SerializeToString())


@both
def test_repeated_graph_input_is_refused(run) -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], inputs=("x", "x"))
    with pytest.raises(Exception, match="Duplicate definition-site"):
        ort_session(model)
    with pytest.raises(gd.GraphError, match="graph input 'x' is declared twice"):
        run(model)


@both
def test_node_output_repeating_an_input_or_initializer_is_refused(run) -> None:
    overwrites_input = make_model([helper.make_node("Relu", ["x"], ["x"]), helper.make_node("Neg", ["x"], ["y"])])
    overwrites_weight = make_model([helper.make_node("Relu", ["x"], ["w"]), helper.make_node("Add", ["x", "w"], ["y"])],
                                   initializers=[weight("w", [1, 1])])
    for model, first in ((overwrites_input, "graph input 'x'"), (overwrites_weight, "initializer 'w'")):
        with pytest.raises(Exception, match="Duplicate definition of name"):
            ort_session(model)
        with pytest.raises(gd.GraphError, match=f"defined twice, by {first} and by node #0 \\(Relu\\)"):
            run(model)


@both
def test_subgraph_redefining_an_outer_value_is_refused(run) -> None:
    then_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["t"]), helper.make_node("Identity", ["t"], ["o"])],
                                    "then", [], [tensor("o")])
    else_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["o2"])], "else", [], [tensor("o2")])
    nodes = [helper.make_node("Abs", ["x"], ["t"], name="abs"),
             helper.make_node("If", ["c"], ["picked"], name="branch", then_branch=then_branch,
                              else_branch=else_branch),
             helper.make_node("Add", ["picked", "t"], ["y"])]
    graph = helper.make_graph(nodes, "m", [tensor("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [tensor("y")], initializer=[numpy_helper.from_array(np.array(True), "c")])
    graph.input.pop()  # c: a constant only
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    with pytest.raises(Exception, match="single static assignment"):
        ort_session(model)
    with pytest.raises(gd.GraphError, match=r"in the subgraph 'then' of node 'branch' \(If\): value 't' is defined "
                                            r"twice, by node 'abs' \(Abs\)"):
        run(model)


@both
def test_repeated_initializer_warns_and_the_last_one_is_used_as_onnxruntime_does(run) -> None:
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])],
                       initializers=[weight("w", [1, 1]), weight("w", [5, 7])])
    expected = ort_session(model).run(None, {"x": X})[0]
    np.testing.assert_array_equal(expected, X + [[5, 7]])
    with pytest.warns(UserWarning, match=r"initializer\(s\) 'w' are defined more than once; the last"):
        got = run(model)
    np.testing.assert_array_equal(got, expected)


def test_repeated_initializer_becomes_one_variable() -> None:
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])],
                       initializers=[weight("w", [1, 1]), weight("w", [5, 7])])
    with pytest.warns(UserWarning, match="defined more than once"):
        loaded = gd.onnx.load(model)
    assert [v.name for v in loaded.variables] == ["w:0"]
    np.testing.assert_array_equal(loaded.variables[0].numpy(), [[5, 7]])
    assert len(model.graph.initializer) == 2  # the caller's ModelProto is not changed


# ---------------------------------------------------------------- external data
def _external_model(location: str) -> onnx.ModelProto:
    """``y = x + w`` with ``w`` stored as external data at ``location``."""
    w = weight("w", [0, 0])
    external_data_helper.set_external_data(w, location)
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    return make_model([helper.make_node("Add", ["x", "w"], ["y"])], initializers=[w])


@both
def test_bytes_or_proto_with_external_data_never_read_from_the_current_directory(
        run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "secret.txt").write_bytes(np.array([7, 7], np.float32).tobytes())
    monkeypatch.chdir(tmp_path)
    model = _external_model("secret.txt")
    for source in (model.SerializeToString(), model):
        with pytest.raises(gd.GraphError, match=r"tensor\(s\) w are stored as external data \('secret.txt'\).*"
                                                r"never read from the current directory.*base_dir="):
            run(source)


@both
def test_base_dir_names_where_external_data_is(run, tmp_path: Path) -> None:
    data_dir = tmp_path / "weights"
    data_dir.mkdir()
    (data_dir / "w.bin").write_bytes(np.array([3, 4], np.float32).tobytes())
    model = _external_model("w.bin")
    np.testing.assert_array_equal(run(model.SerializeToString(), base_dir=data_dir), X + [[3, 4]])
    np.testing.assert_array_equal(run(model, base_dir=str(data_dir)), X + [[3, 4]])
    (tmp_path / "outside.bin").write_bytes(np.array([9, 9], np.float32).tobytes())
    with pytest.raises(gd.GraphError, match="cannot be read"):
        run(_external_model("../outside.bin").SerializeToString(), base_dir=data_dir)
    with pytest.raises(gd.GraphError, match="cannot be read"):
        run(_external_model(str(tmp_path / "outside.bin")), base_dir=data_dir)


@both
def test_a_paths_external_data_is_read_from_its_own_directory(run, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "w.bin").write_bytes(np.array([3, 4], np.float32).tobytes())
    (tmp_path / "w.bin").write_bytes(np.array([100, 100], np.float32).tobytes())  # a decoy in the current dir
    onnx.save(_external_model("w.bin"), str(model_dir / "m.onnx"))
    monkeypatch.chdir(tmp_path)
    np.testing.assert_array_equal(run(str(model_dir / "m.onnx")), X + [[3, 4]])
    with pytest.raises(gd.InvalidArgumentError, match="base_dir=.*is for a ModelProto or bytes"):
        run(str(model_dir / "m.onnx"), base_dir=tmp_path)


# ---------------------------------------------------------------- malformed tensors
def _malformed(kind: str) -> onnx.TensorProto:
    w = weight("w", [1, 2])
    if kind == "short raw_data":
        w.raw_data = w.raw_data[:4]
    elif kind == "long raw_data":
        w.raw_data = w.raw_data + b"\0" * 4
    elif kind == "float_data count":
        w.ClearField("raw_data")
        w.float_data.extend([1.0, 2.0, 3.0])
    elif kind == "dims":
        del w.dims[:]
        w.dims.extend([2, 2])
    return w


@both
@pytest.mark.parametrize("kind", ["short raw_data", "long raw_data", "float_data count", "dims"])
def test_initializer_whose_data_does_not_match_its_dims_is_a_graph_error_naming_it(run, kind: str) -> None:
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], initializers=[_malformed(kind)])
    with pytest.raises(Exception, match="'w'|w:"):
        ort_session(model)
    with pytest.raises(gd.GraphError, match=r"tensor 'w' \(float, dims \[\d(, \d)*\]\) holds \d+ .*but its dims "
                                            r"need \d+"):
        run(model)


@both
def test_malformed_constant_value_is_a_graph_error_naming_it(run) -> None:
    value = _malformed("short raw_data")
    value.name = "k"
    model = make_model([helper.make_node("Constant", [], ["c"], value=value),
                        helper.make_node("Add", ["x", "c"], ["y"])])
    with pytest.raises(gd.GraphError, match="tensor 'k'"):
        run(model)


def test_onnx_load_and_prepare_read_models_alike(tmp_path: Path) -> None:
    # The one reader both use: the same model, from each source, gives ONNX Runtime's result through both.
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], initializers=[weight("w", [2, 3])])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    expected = ort_session(model).run(None, {"x": X})[0]
    for source in (model, model.SerializeToString(), str(path), path):
        for run in ENTRY_POINTS.values():
            np.testing.assert_array_equal(run(source), expected)
    assert os.path.exists(path)
