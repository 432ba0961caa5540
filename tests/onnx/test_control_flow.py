"""Control flow in imported ONNX models: If, Loop and Scan, eagerly, in gd.function and under MirroredStrategy.

Oracles: plain ONNX Runtime on the same model and inputs (on each replica's slice for Mirrored runs), and
for the structural cases the graph traced from the same ops written in numpy.

Real model: silero-vad 6.2.3 (``silero_vad.onnx``, MIT, https://github.com/snakers4/silero-vad, shipped in
the ``silero_vad`` wheel, exported by torch.onnx; fetched by :mod:`tests.real_models`). Its whole graph is
an ``If`` on ``sr == 16000`` whose branches hold the 16 kHz and 8 kHz networks, each with nested ``If`` s
on the batch size (torch's ``squeeze`` and unbatched-LSTMCell checks).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphdist as gd
from graphdist.ir import assert_structural_equal, from_onnx
from graphdist.trace.control_flow import MAX_UNROLLED_ITERATIONS
from graphdist.trace.inline import inline_graph
from tests.real_models import model_path

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 18, name: str = "m") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def run_ort(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def traced_ops(fn, *args) -> list[str]:
    return [n.op_type for n in fn.get_concrete_function(*args).graph("traced").nodes]


# ---------------------------------------------------------------- silero-vad (a real model with If subgraphs)
def silero_inputs(batch: int, samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    audio = (0.3 * rng.standard_normal((batch, samples))).astype(np.float32)
    state = (0.1 * rng.standard_normal((2, batch, 128))).astype(np.float32)
    return audio, state


SILERO_CASES = [(16000, 512), (8000, 256)]


@pytest.mark.parametrize(("sr", "samples"), SILERO_CASES)
def test_silero_vad_eager_equals_onnxruntime(sr: int, samples: int) -> None:
    path = str(model_path("silero_vad"))
    model = gd.onnx.load(path, trainable=False)
    audio, state = silero_inputs(4, samples)
    rate = np.array(sr, np.int64)
    want = run_ort(path, {"input": audio, "state": state, "sr": rate})
    got = model(audio, state, rate)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert np.ptp(want[0]) > 0  # the outputs depend on the audio: not a constant answer


@pytest.mark.parametrize(("sr", "samples"), SILERO_CASES)
def test_silero_vad_mirrored_each_replica_equals_onnxruntime_on_its_slice(sr: int, samples: int) -> None:
    path = str(model_path("silero_vad"))
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.onnx.load(path, trainable=False)
    audio, state = silero_inputs(4, samples, seed=1)
    rate = np.array(sr, np.int64)
    slices = [(audio[2 * r:2 * r + 2], np.ascontiguousarray(state[:, 2 * r:2 * r + 2])) for r in range(2)]

    @gd.function
    def step(x, h):
        return strategy.run(lambda a, s: model(a, s, rate), args=(x, h))

    probs, new_state = step(gd.PerReplica([a for a, _ in slices]), gd.PerReplica([s for _, s in slices]))
    for replica, (a, s) in enumerate(slices):
        want = run_ort(path, {"input": a, "state": s, "sr": rate})
        np.testing.assert_allclose(probs.values[replica], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new_state.values[replica], want[1], rtol=1e-5, atol=1e-6)
    traced = step.get_concrete_function(gd.PerReplica([a for a, _ in slices]),
                                        gd.PerReplica([s for _, s in slices])).graph("traced")
    ops = {n.op_type for n in traced.nodes}
    assert "If" not in ops and "LSTM" in ops  # the 16k or 8k network inlined, its nested Ifs folded


def test_silero_vad_16k_op15_loads_and_equals_onnxruntime() -> None:
    path = str(model_path("silero_vad_16k_op15"))
    model = gd.onnx.load(path, trainable=False)
    audio, state = silero_inputs(2, 512)
    rate = np.array(16000, np.int64)
    for g, w in zip(model(audio, state, rate), run_ort(path, {"input": audio, "state": state, "sr": rate})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- If
def if_model(opset: int = 18) -> onnx.ModelProto:
    """y = if flag: mean(x * 2, axis 1) else mean(x - 1, axis 1) (keepdims); the branches read x from outside."""
    def reduce_mean(inp: str, out: str) -> list[onnx.NodeProto]:
        if opset >= 18:
            return [helper.make_node("Constant", [], [f"{out}_axes"], value_ints=[1]),
                    helper.make_node("ReduceMean", [inp, f"{out}_axes"], [out], keepdims=1)]
        return [helper.make_node("ReduceMean", [inp], [out], axes=[1], keepdims=1)]

    two = numpy_helper.from_array(np.float32(2), "two")
    one = numpy_helper.from_array(np.float32(1), "one")
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["doubled"]), *reduce_mean("doubled", "t")],
                             "then", [], [vi("t", FLOAT, ["N", 1])], initializer=[two])
    other = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["less"]), *reduce_mean("less", "e")],
                              "else", [], [vi("e", FLOAT, ["N", 1])], initializer=[one])
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    return make_model(nodes, [vi("x", FLOAT, ["N", 3]), vi("flag", BOOL, [])], [vi("y", FLOAT, ["N", 1])],
                      opset=opset, name="if_model")


def test_if_on_a_known_condition_inlines_the_taken_branch() -> None:
    graph = from_onnx(if_model())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for flag, numpy_form in ((True, lambda a: np.mean(a * np.float32(2), axis=1, keepdims=True)),
                             (False, lambda a: np.mean(a - np.float32(1), axis=1, keepdims=True))):
        traced = gd.trace(lambda a, f=flag: inline_graph(graph, [a, np.array(f)])[0], x)
        assert_structural_equal(traced, gd.trace(numpy_form, x))
        np.testing.assert_allclose(gd.function(lambda a, f=flag: inline_graph(graph, [a, np.array(f)])[0])(x),
                                   numpy_form(x), rtol=1e-6)


@pytest.mark.parametrize("opset", [16, 18])
def test_if_on_a_traced_condition_runs_on_ort_at_the_trace_opset(opset: int) -> None:
    """The kept If's branches are converted with the rest: an opset-16 ReduceMean(axes=...) in a branch
    would be rejected by ORT in an opset-18 segment ("Unrecognized attribute: axes")."""
    model_proto = if_model(opset)
    model = gd.onnx.load(model_proto, trainable=False)
    # A flag computed in the step stays traced (a flag passed as a numpy array is specialised on its value).
    step = gd.function(lambda a, f: model(a, np.logical_not(np.logical_not(f))))
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    for flag in (np.array(True), np.array(False)):
        want = run_ort(model_proto, {"x": x, "flag": flag})[0]
        np.testing.assert_allclose(step(x, flag), want, rtol=1e-6)
    assert "If" in traced_ops(step, x, np.array(True))  # decided at run time: one compiled step for both
    specialised = gd.function(lambda a, f: model(a, f))
    assert "If" not in traced_ops(specialised, x, np.array(True))  # the taken branch, inlined
    np.testing.assert_allclose(model(x, np.array(False)), run_ort(model_proto, {"x": x, "flag": np.array(False)})[0],
                               rtol=1e-6)  # eager: specialised on the flag


def test_if_under_mirrored_each_replica_takes_its_own_branch() -> None:
    model_proto = if_model()
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = gd.onnx.load(model_proto, trainable=False)
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    flags = [np.array(True), np.array(False)]
    result = gd.function(lambda a, f: strategy.run(lambda b, g: model(b, g), args=(a, f)))(
        gd.PerReplica([x[:2], x[2:]]), gd.PerReplica(flags))
    for replica, (part, flag) in enumerate(zip((x[:2], x[2:]), flags)):
        np.testing.assert_allclose(result.values[replica], run_ort(model_proto, {"x": part, "flag": flag})[0],
                                   rtol=1e-6)


# ---------------------------------------------------------------- Loop
def for_loop_model(trips: int | None) -> onnx.ModelProto:
    """for i in range(M): x = x + w * i, scanning x; M an initializer (``trips``) or the input ``M``."""
    body = helper.make_graph([
        helper.make_node("Cast", ["i"], ["fi"], to=FLOAT),
        helper.make_node("Mul", ["w", "fi"], ["wi"]),
        helper.make_node("Add", ["x_in", "wi"], ["x_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Identity", ["x_out"], ["scan"]),
    ], "body", [vi("i", INT64, []), vi("cond_in", BOOL, []), vi("x_in", FLOAT, ["N", 3])],
        [vi("cond_out", BOOL, []), vi("x_out", FLOAT, ["N", 3]), vi("scan", FLOAT, ["N", 3])])
    inputs = [vi("x", FLOAT, ["N", 3]), vi("w", FLOAT, [3])]
    initializers = []
    if trips is None:
        inputs.append(vi("M", INT64, []))
    else:
        initializers.append(numpy_helper.from_array(np.int64(trips), "M"))
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], body=body)]
    return make_model(nodes, inputs, [vi("y", FLOAT, ["N", 3]), vi("ys", FLOAT, [None, "N", 3])], initializers,
                      name="for_loop")


def for_loop_numpy(x: np.ndarray, w: np.ndarray, trips: int) -> tuple[np.ndarray, np.ndarray]:
    steps = []
    for i in range(trips):
        x = x + w * np.float32(i)
        steps.append(x)
    return x, np.stack(steps)


def test_loop_with_a_known_trip_count_is_unrolled() -> None:
    graph = from_onnx(for_loop_model(3))
    x, w = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    traced = gd.trace(lambda a, b: tuple(inline_graph(graph, [a, b])), x, w)

    def unrolled(a, b):
        steps = []
        for i in range(3):
            a = a + b * np.float32(i)
            steps.append(np.expand_dims(a, 0))
        return a, np.concatenate(steps, axis=0)

    ops = [n.op_type for n in traced.nodes]
    assert "Loop" not in ops and ops.count("Add") == 3 and ops.count("Concat") == 1
    got = gd.function(lambda a, b: tuple(inline_graph(graph, [a, b])))(x, w)
    for g, want, expected in zip(got, for_loop_numpy(x, w, 3), gd.function(unrolled)(x, w)):
        np.testing.assert_allclose(g, want, rtol=1e-6)
        np.testing.assert_allclose(expected, want, rtol=1e-6)


@pytest.mark.parametrize("trips", [1, 5, MAX_UNROLLED_ITERATIONS + 6])
def test_loop_runs_unrolled_or_as_a_node_equal_to_onnxruntime(trips: int) -> None:
    model_proto = for_loop_model(trips)
    model = gd.onnx.load(model_proto, trainable=False)
    x, w = np.full((2, 3), 0.5, np.float32), np.arange(3, dtype=np.float32)
    step = gd.function(lambda a, b: model(a, b))
    for got, want in zip(step(x, w), run_ort(model_proto, {"x": x, "w": w})):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert ("Loop" in traced_ops(step, x, w)) == (trips > MAX_UNROLLED_ITERATIONS)


def test_loop_of_an_opset_11_model_unrolls_eagerly_and_traced() -> None:
    model_proto = for_loop_model(3)
    model_proto.opset_import[0].version = 11  # eager calls trace at the model's own opset: Unsqueeze-11
    model = gd.onnx.load(model_proto, trainable=False)
    x, w = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    want = run_ort(model_proto, {"x": x, "w": w})
    for got in (model(x, w), gd.function(lambda a, b: model(a, b))(x, w)):
        for g, expected in zip(got, want):
            np.testing.assert_allclose(g, expected, rtol=1e-6)


def test_loop_with_a_traced_trip_count_runs_with_a_dynamic_scan_length() -> None:
    model_proto = for_loop_model(None)
    model = gd.onnx.load(model_proto, trainable=False)
    x, w = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    step = gd.function(lambda a, b, m: model(a, b, m + 0))  # computed in the step: traced, not specialised
    for trips in (2, 7):
        got = step(x, w, np.array(trips, np.int64))
        for g, want in zip(got, for_loop_numpy(x, w, trips)):
            np.testing.assert_allclose(g, want, rtol=1e-6)
    assert "Loop" in traced_ops(step, x, w, np.array(2, np.int64))
    eager = model(x, w, np.array(4, np.int64))  # eager: specialised on the trip count, unrolled
    np.testing.assert_allclose(eager[1], for_loop_numpy(x, w, 4)[1], rtol=1e-6)


def while_loop_model() -> onnx.ModelProto:
    """x doubles while sum(x) < limit: no trip count; the condition is computed from the data."""
    body = helper.make_graph([
        helper.make_node("Mul", ["x_in", "two"], ["x_out"]),
        helper.make_node("ReduceSum", ["x_out"], ["s"], keepdims=0),
        helper.make_node("Less", ["s", "limit"], ["cond_out"]),
    ], "body", [vi("i", INT64, []), vi("cond_in", BOOL, []), vi("x_in", FLOAT, [2, 3])],
        [vi("cond_out", BOOL, []), vi("x_out", FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.float32(2), "two")])
    nodes = [helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(np.array(True), "go")),
             helper.make_node("Loop", ["", "go", "x"], ["y"], body=body)]
    return make_model(nodes, [vi("x", FLOAT, [2, 3]), vi("limit", FLOAT, [])], [vi("y", FLOAT, [2, 3])],
                      name="while_loop")


@pytest.mark.parametrize("backend", ["ort", "tvm"])
def test_loop_of_unknown_trip_count_runs_on_cpu_backends(backend: str) -> None:
    if backend == "tvm":
        pytest.importorskip("tvm")
    model_proto = while_loop_model()
    model = gd.onnx.load(model_proto, trainable=False)
    x, limit = np.ones((2, 3), np.float32), np.array(100, np.float32)
    got = gd.function(lambda a, b: model(a, b), backend=backend)(x, limit)  # tvm: through its ORT fallback
    np.testing.assert_array_equal(got, run_ort(model_proto, {"x": x, "limit": limit})[0])
    np.testing.assert_array_equal(got, np.full((2, 3), 32, np.float32))


def test_loop_of_unknown_trip_count_on_tpu_cores_is_a_clear_error() -> None:
    pytest.importorskip("tvm")
    resolver = gd.cluster_resolver.TPUClusterResolver(tpu="local[2]")
    gd.tpu.experimental.initialize_tpu_system(resolver)
    strategy = gd.TPUStrategy(resolver)
    with strategy.scope():
        model = gd.onnx.load(while_loop_model(), trainable=False)

    @gd.function
    def step(a, b):
        return strategy.run(lambda c, d: model(c, d), args=(a, b))

    with pytest.raises(gd.BackendError, match=r"uses 'Loop', which TVM cannot run.*trip count"):
        step(np.ones((2, 3), np.float32), np.array(100, np.float32))


# ---------------------------------------------------------------- ONNX's node tests through gd.function
def _node_cases(names: list[str]) -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ONNX's generators overflow casts on purpose
        cases = {c.name: c for c in load_model_tests(kind="node")}
    return [cases[n] for n in names]


#: The If/Loop/Scan node tests of tensors that ORT passes; sequences and optionals are refused (README).
NODE_CASES = ["test_if", "test_loop11", "test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar"]


@pytest.mark.parametrize("case", _node_cases(NODE_CASES), ids=lambda c: c.name)
def test_onnx_node_case_through_gd_function_of_the_loaded_model(case) -> None:
    from onnx.backend.test.runner import Runner, _normalize_tensor

    model = gd.onnx.load(case.model, trainable=False)
    step = gd.function(lambda *a: model(*a))
    session = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for inputs, expected in case.data_sets:
        arrays = [np.asarray(_normalize_tensor(x)) for x in inputs]
        expected = [_normalize_tensor(y) for y in expected]
        got = step(*arrays)
        got = list(got) if isinstance(got, tuple) else [got]
        Runner.assert_similar_outputs(expected, got, rtol=case.rtol, atol=case.atol, model_dir=case.name)
        Runner.assert_similar_outputs(session.run(None, dict(zip([i.name for i in session.get_inputs()], arrays))),
                                      got, rtol=case.rtol, atol=case.atol, model_dir=case.name)


@pytest.mark.parametrize("name", ["test_if_seq", "test_sequence_insert_at_back", "test_loop13_seq"])
def test_sequence_values_are_a_clear_refusal(name: str) -> None:
    (case,) = _node_cases([name])
    with pytest.raises(gd.GraphError, match="sequence value; graphdist supports tensor values only"):
        gd.onnx.load(case.model, trainable=False)


def test_silero_vad_with_a_traced_sample_rate_keeps_the_if_and_says_why_ort_may_refuse_it(caplog) -> None:
    """A traced sr (computed in the step; a numpy sr passed to the step is specialised) keeps the top If; ORT
    types both branches with the replica's static shapes, and the
    untaken 8 kHz network cannot be typed on 16 kHz-sized input (its LSTM would get a rank-5 input)."""
    path = str(model_path("silero_vad"))
    model = gd.onnx.load(path, trainable=False)
    audio, state = silero_inputs(2, 512)
    step = gd.function(lambda a, s, r: model(a, s, r + 0))  # computed in the step: traced, not specialised
    with caplog.at_level("WARNING", logger="graphdist.trace.control_flow"), pytest.raises(gd.BackendError):
        step(audio, state, np.array(16000, np.int64))
    assert "Give the inputs deciding the condition as numpy values" in caplog.text
    rate = np.array(8000, np.int64)  # the other way round both branches type, and the node runs
    audio, state = silero_inputs(2, 256)
    for got, want in zip(step(audio, state, rate), run_ort(path, {"input": audio, "state": state, "sr": rate})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- training through an inlined branch
def gated_model(w0: np.ndarray) -> onnx.ModelProto:
    """y = if mode == 1: x @ w * 2 else x @ w - 1, with the weight w an initializer read by both branches."""
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["xw_t"]),
                              helper.make_node("Mul", ["xw_t", "two"], ["t"])], "then", [],
                             [vi("t", FLOAT, ["N", 2])], initializer=[numpy_helper.from_array(np.float32(2), "two")])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["xw_e"]),
                               helper.make_node("Sub", ["xw_e", "one"], ["e"])], "else", [],
                              [vi("e", FLOAT, ["N", 2])], initializer=[numpy_helper.from_array(np.float32(1), "one")])
    nodes = [helper.make_node("Constant", [], ["one_i"], value=numpy_helper.from_array(np.int64(1), "one_i")),
             helper.make_node("Equal", ["mode", "one_i"], ["flag"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    return make_model(nodes, [vi("x", FLOAT, ["N", 3]), vi("mode", INT64, [])], [vi("y", FLOAT, ["N", 2])],
                      [numpy_helper.from_array(w0, "w")], name="gated")


@pytest.mark.parametrize("mode", [1, 0])
def test_training_through_the_taken_branch_mirrored_equals_one_device_and_numpy(mode: int) -> None:
    w0 = np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32)
    x = np.random.default_rng(5).standard_normal((8, 3)).astype(np.float32)
    target = np.random.default_rng(6).standard_normal((8, 2)).astype(np.float32)
    rate = np.array(mode, np.int64)

    def train(strategy: gd.Strategy) -> np.ndarray:
        with strategy.scope():
            model = gd.onnx.load(gated_model(w0))
            optimizer = gd.optimizers.SGD(0.1)

        @gd.function
        def step(x, target):
            def replica_step(x, target):
                with gd.GradientTape() as tape:
                    loss = gd.nn.compute_average_loss(((model(x, rate) - target) ** 2).sum(axis=1),
                                                      global_batch_size=8)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss
            return strategy.reduce("SUM", strategy.run(replica_step, args=(x, target)), axis=None)

        if strategy.num_replicas_in_sync > 1:
            dist = strategy.experimental_distribute_dataset(gd.data.Dataset.from_tensor_slices((x, target)).batch(8))
            step(*next(iter(dist)))
        else:
            step(x, target)
        return model.variables[0].numpy()

    one = train(gd.OneDeviceStrategy("cpu:0"))
    two = train(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    scale, shift = (2.0, 0.0) if mode == 1 else (1.0, -1.0)
    residual = scale * (x @ w0) + shift - target
    want = w0 - 0.1 * (2 * scale * x.T @ residual / 8)
    np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- Scan
def scan_model(length: int) -> onnx.ModelProto:
    """A running sum over axis 1 of x read backwards, plus a running product of a forward scan over axis 0
    of y; scan outputs stacked along axis 1 (the first one in reverse) and axis 0; w read from outside."""
    body = helper.make_graph([
        helper.make_node("Add", ["sum_in", "x_t"], ["sum_out"]),
        helper.make_node("Mul", ["prod_in", "y_t"], ["prod_out"]),
        helper.make_node("Mul", ["sum_out", "w"], ["scan_a"]),
        helper.make_node("Identity", ["prod_out"], ["scan_b"]),
    ], "body", [vi("sum_in", FLOAT, [2]), vi("prod_in", FLOAT, [3]), vi("x_t", FLOAT, [2]), vi("y_t", FLOAT, [3])],
        [vi("sum_out", FLOAT, [2]), vi("prod_out", FLOAT, [3]), vi("scan_a", FLOAT, [2]), vi("scan_b", FLOAT, [3])])
    nodes = [helper.make_node("Scan", ["s0", "p0", "x", "y"], ["s", "p", "a", "b"], body=body, num_scan_inputs=2,
                              scan_input_axes=[1, 0], scan_input_directions=[1, 0], scan_output_axes=[-1, 0],
                              scan_output_directions=[1, 0])]
    inputs = [vi("s0", FLOAT, [2]), vi("p0", FLOAT, [3]), vi("x", FLOAT, [2, length]), vi("y", FLOAT, [length, 3]),
              vi("w", FLOAT, [2])]
    outputs = [vi("s", FLOAT, [2]), vi("p", FLOAT, [3]), vi("a", FLOAT, [2, length]), vi("b", FLOAT, [length, 3])]
    return make_model(nodes, inputs, outputs, name="scan_model")


@pytest.mark.parametrize("length", [1, 4, MAX_UNROLLED_ITERATIONS + 1])
def test_scan_runs_unrolled_or_as_a_node_equal_to_onnxruntime(length: int) -> None:
    model_proto = scan_model(length)
    model = gd.onnx.load(model_proto, trainable=False)
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ([2], [3], [2, length], [length, 3], [2])]
    want = run_ort(model_proto, dict(zip(["s0", "p0", "x", "y", "w"], arrays)))
    step = gd.function(lambda *a: model(*a))
    for got in (step(*arrays), model(*arrays)):
        for g, expected in zip(got, want):
            np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)
    assert ("Scan" in traced_ops(step, *arrays)) == (length > MAX_UNROLLED_ITERATIONS)
