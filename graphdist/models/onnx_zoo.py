"""The ONNX model zoo architectures shipped in the ``onnx`` wheel, with random weights.

``onnx/backend/test/data/light/*.onnx`` holds nine classic ImageNet
classifiers (opset 9): AlexNet, DenseNet-121, Inception v1 and v2, ResNet-50,
ShuffleNet, SqueezeNet, VGG-19 and ZFNet-512. Their weights are not stored:
each is a ``ConstantOfShape`` node filling the tensor with 0.02, so every
model gives a near-uniform answer. :func:`zoo_model` makes them useful test
and benchmark subjects with plain ``onnx``/numpy code (nothing of graphdist):

* each ``ConstantOfShape`` weight becomes a random initializer, seeded by the
  model and ``seed`` (He-normal kernels, small biases, BatchNormalization
  scales and variances in ``[0.5, 1.5]``);
* the batch dimension becomes symbolic (``N``): inputs and outputs say so and
  every Reshape target that fixes it to 1 uses ``-1`` instead;
* the layer before the final Softmax is scaled (through ONNX Runtime on a
  probe batch) so its outputs have a standard deviation of about 2, so
  probabilities are not saturated (one class at 1.0, the rest 0).

::

    model = zoo_model("resnet50")         # onnx.ModelProto, input (N, 3, 224, 224)
    gd.onnx.load(model)
"""

from __future__ import annotations

import glob
import os
import zlib
from functools import lru_cache

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["ZOO", "zoo_path", "zoo_model", "input_name"]

#: Short name -> file stem in onnx/backend/test/data/light/.
ZOO = {
    "alexnet": "light_bvlc_alexnet",
    "densenet121": "light_densenet121",
    "inception_v1": "light_inception_v1",
    "inception_v2": "light_inception_v2",
    "resnet50": "light_resnet50",
    "shufflenet": "light_shufflenet",
    "squeezenet": "light_squeezenet",
    "vgg19": "light_vgg19",
    "zfnet512": "light_zfnet512",
}


def zoo_path(name: str) -> str:
    """Path of the zoo model ``name`` (a key of :data:`ZOO`) in the installed onnx package.

    Raises:
        KeyError: Unknown name.
        FileNotFoundError: The onnx wheel does not ship it.
    """
    stem = ZOO[name]
    directory = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    matches = glob.glob(os.path.join(directory, f"{stem}.onnx"))
    if not matches:
        raise FileNotFoundError(f"{stem}.onnx is not in {directory}; install the onnx wheel with its test data")
    return matches[0]


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...], roles: list[tuple[str, int]]) -> np.ndarray:
    if any(op == "BatchNormalization" and index in (1, 4) or op == "Mul" for op, index in roles):
        return rng.uniform(0.5, 1.5, shape)  # scale, variance (a Mul: an unfused scale): positive, near 1
    if len(shape) >= 2:
        return rng.standard_normal(shape) * np.sqrt(2.0 / int(np.prod(shape[1:])))  # He-normal kernel
    return rng.standard_normal(shape) * 0.1


@lru_cache(maxsize=2)  # VGG-19 alone is 560 MB
def _zoo_model_bytes(name: str, seed: int) -> bytes:
    original = onnx.load(zoo_path(name))
    graph = original.graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    roles: dict[str, list[tuple[str, int]]] = {}
    for node in graph.node:
        for index, value in enumerate(node.input):
            roles.setdefault(value, []).append((node.op_type, index))
    for node in graph.node:  # a weight reshaped by Unsqueeze (DenseNet's scales) has its consumers' roles
        if node.op_type == "Unsqueeze":
            roles.setdefault(node.input[0], []).extend(roles.get(node.output[0], []))
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    nodes, weights = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            nodes.append(node)
            continue
        shape = tuple(int(d) for d in arrays[node.input[0]])
        array = _random_weight(rng, shape, roles.get(node.output[0], []))
        weights.append(numpy_helper.from_array(array.astype(np.float32), node.output[0]))
    used = {value for node in nodes for value in node.input}
    kept = []
    for tensor in graph.initializer:
        if tensor.name not in used:
            continue
        array = arrays[tensor.name]
        if any(op == "Reshape" and index == 1 for op, index in roles.get(tensor.name, [])) and array[0] == 1 \
                and -1 not in array:
            array = array.copy()
            array[0] = -1  # the batch: any size
            tensor = numpy_helper.from_array(array, tensor.name)
        kept.append(tensor)
    inputs = [vi for vi in graph.input if vi.name not in arrays]
    for vi in [*inputs, *graph.output]:
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    new_graph = helper.make_graph(nodes, name, inputs, list(graph.output), initializer=[*kept, *weights])
    model = helper.make_model(new_graph, opset_imports=list(original.opset_import),
                              producer_name="graphdist.models.onnx_zoo")
    model.ir_version = max(original.ir_version, 4)
    _scale_logits(model)
    onnx.checker.check_model(model)
    return model.SerializeToString()


#: Ops between the last Gemm/Conv and the Softmax that commute with a positive scale.
_HOMOGENEOUS = frozenset({"Relu", "GlobalAveragePool", "AveragePool", "MaxPool", "Reshape", "Flatten", "Dropout"})


def _scale_logits(model: onnx.ModelProto, target_std: float = 2.0) -> None:
    """Scales the weights of the layer feeding the final Softmax so its outputs' std is ``target_std``."""
    import onnxruntime as ort

    graph = model.graph
    softmax = [n for n in graph.node if n.op_type == "Softmax" and n.output[0] in {o.name for o in graph.output}]
    if not softmax:
        return
    logits = softmax[0].input[0]
    producers = {name: n for n in graph.node for name in n.output}
    producer = producers[logits]
    while producer.op_type in _HOMOGENEOUS:  # f(c * x) = c * f(x) for c > 0: scale the layer before
        producer = producers[producer.input[0]]
    if producer.op_type not in ("Gemm", "Conv"):
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_empty_tensor_value_info(logits))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    shape = [d.dim_value or 2 for d in graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    values = session.run([logits], {graph.input[0].name: x})[0]
    factor = target_std / max(float(np.std(values)), 1e-12)
    for position in (1, 2):
        if position < len(producer.input):
            name = producer.input[position]
            while name in producers and producers[name].op_type == "Reshape":  # Inception v1's reshaped weight
                name = producers[name].input[0]
            tensor = next(t for t in graph.initializer if t.name == name)
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * np.float32(factor), tensor.name))


def zoo_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The zoo model ``name`` with random weights (see the module docstring); a fresh copy each call."""
    return onnx.ModelProto.FromString(_zoo_model_bytes(name, seed))


def input_name(model: onnx.ModelProto) -> str:
    """The name of the model's (image) input."""
    initializers = {t.name for t in model.graph.initializer}
    return next(vi.name for vi in model.graph.input if vi.name not in initializers)
