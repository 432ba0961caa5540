"""``onnx.backend.base.Backend`` for graphdist: ONNX's own backend API and test suite.

The ONNX project defines a small interface every runtime can implement
(``onnxruntime.backend`` does) so that the same code, and ONNX's own backend
test suite (``onnx.backend.test.BackendTest``), runs on any of them::

    import graphdist.onnx.backend as backend

    rep = backend.prepare(model, "CPU", backend="tvm")   # or "ort" (default), "reference"
    outputs = rep.run([x, y])                          # or rep.run({"x": x, "y": y})
    outputs = backend.run_model(model, [x, y])
    outputs = backend.run_node(node, [x, y])           # one op, at its newest opset

A prepared model is a :class:`~graphdist.compile.graph_runner.GraphRunner`:
the model is imported at its own opset and compiled as a ``gd.function`` by
the chosen graphdist backend, once per input shape (and once per value of
the inputs that decide shapes, such as a Reshape's ``shape`` fed as an input).

Devices: ``"CPU"`` always; ``"CUDA"`` (``"CUDA:N"``) only where the CUDA
driver reports a GPU (:func:`supports_device`), on the ``ort`` and ``tvm``
backends (``reference`` runs on the host only).

Errors are graphdist errors: :class:`~graphdist.errors.GraphError` for a
model graphdist cannot import (naming the op or value), a malformed model
or an unreadable file; :class:`~graphdist.errors.InvalidArgumentError` for
bad arguments (unknown backend, missing or extra inputs, wrong dtype or
shape, naming the input); :class:`~graphdist.errors.DeviceError` for a device
this machine lacks; :class:`~graphdist.errors.BackendError` when compiling or
running fails for another reason (naming the model and its ops).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from graphdist.backends import available_backends
from graphdist.compile.graph_runner import GraphRunner
from graphdist.distribute import OneDeviceStrategy
from graphdist.errors import BackendError, DeviceError, GraphdistError, GraphError, InvalidArgumentError
from graphdist.onnx.files import read_model
from graphdist.runtime.devices import num_gpus

__all__ = [
    "GraphdistBackend",
    "GraphdistBackendRep",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
    "is_compatible",
]


#: Keyword arguments ``onnx.backend.test.BackendTest`` may pass along with a test's own settings
#: (``test_kwargs``); the comparison uses them, graphdist does not.
_IGNORED_KWARGS = frozenset({"rtol", "atol"})


def _parse_device(device: str | None) -> Device:
    """ONNX's device string (``"CPU"``, ``"CUDA"``, ``"CUDA:1"``) as an ``onnx.backend.base.Device``."""
    text = "CPU" if device is None else str(device)
    try:
        return Device(text.upper())
    except (AttributeError, ValueError) as err:
        raise InvalidArgumentError(f"device {text!r} is not an ONNX device: use 'CPU', 'CUDA' or 'CUDA:N'") from err


def _graphdist_device(device: Device) -> str:
    """The graphdist device (``"cpu:N"``, ``"cuda:N"``) of an ONNX device."""
    return f"{'cuda' if device.type == DeviceType.CUDA else 'cpu'}:{device.device_id}"


def _model_label(model: onnx.ModelProto) -> str:
    """``model 'name' (ops: A, B)``: how errors name a model."""
    ops = sorted({node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
                  for node in model.graph.node})
    shown = ", ".join(ops[:8]) + (f", ... ({len(ops)} in all)" if len(ops) > 8 else "")
    return f"model {model.graph.name or 'model'!r} (ops: {shown or 'none'})"


def _check(model: onnx.ModelProto) -> None:
    """ONNX's checker, its complaint as a GraphError naming the model."""
    try:
        onnx.checker.check_model(model.SerializeToString())
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GraphError(f"{_model_label(model)} is not a valid ONNX model: {first}") from err


def _expected_dtype(value_info: onnx.ValueInfoProto) -> np.dtype | None:
    """The numpy dtype a tensor input declares (``None``: not a tensor or no element type)."""
    if not value_info.type.HasField("tensor_type") or not value_info.type.tensor_type.elem_type:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _check_input(name: str, array: np.ndarray, value_info: onnx.ValueInfoProto | None, label: str) -> None:
    """Checks an input's dtype and the dimensions its model declares."""
    if value_info is None:
        return
    expected = _expected_dtype(value_info)
    if expected is not None:
        if expected == np.dtype(object):
            ok = array.dtype.kind in "OUS"
        else:
            ok = array.dtype == expected
        if not ok:
            raise InvalidArgumentError(f"input {name!r} of {label}: expected {expected} values, got {array.dtype}")
    tensor_type = value_info.type.tensor_type
    if value_info.type.HasField("tensor_type") and tensor_type.HasField("shape"):
        # A negative size (exporters write -1 for "any") is unknown, as gd.onnx.load reads it.
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tensor_type.shape.dim]
        declared = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
        if array.ndim != len(dims) or any(d is not None and d != s for d, s in zip(dims, array.shape)):
            raise InvalidArgumentError(f"input {name!r} of {label}: expected shape {declared}, "
                                       f"got {list(array.shape)}")



def _check_backend(backend: str) -> None:
    """Raises unless ``backend`` is a registered graphdist backend (``graphdist.backends``)."""
    choices = tuple(available_backends())
    if backend not in choices:
        raise InvalidArgumentError(f"backend {backend!r} is not a graphdist backend; use one of {choices}")

class GraphdistBackendRep(BackendRep):
    """A model prepared by :meth:`GraphdistBackend.prepare`: ``rep.run(inputs) -> outputs``.

    Args:
        model: The model (checked by ONNX's checker).
        backend: The graphdist backend that compiles it (``"ort"``, ``"tvm"``, ``"reference"``).
        device: The graphdist device that runs it (``"cpu:0"``, ``"cuda:0"``).

    Attributes:
        model: The ONNX model.
        backend: The graphdist backend.
        device: The graphdist device.
        input_names: The inputs :meth:`run` takes, in order (initializers are constants, not inputs).
        output_names: The outputs :meth:`run` returns, in order.

    Raises:
        GraphError: graphdist cannot import the model (names the op or value).
    """

    def __init__(self, model: onnx.ModelProto, backend: str, device: str) -> None:
        self.model = model
        self.backend = backend
        self.device = device
        self._label = _model_label(model)
        self._runner = GraphRunner(model, backend=backend, strategy=OneDeviceStrategy(device))
        self.input_names: list[str] = list(self._runner.input_names)
        self.output_names: list[str] = [vi.name for vi in model.graph.output]
        self._outputs_type = namedtupledict("Outputs", self.output_names)
        self._value_infos = {vi.name: vi for vi in model.graph.input}
        initializers = {t.name for t in model.graph.initializer}
        self._initializer_inputs = [vi.name for vi in model.graph.input if vi.name in initializers]

    def __repr__(self) -> str:
        return f"GraphdistBackendRep({self._label}, backend={self.backend!r}, device={self.device!r})"

    def _arrays(self, inputs: Any) -> list[np.ndarray]:
        """The inputs in :attr:`input_names` order, checked."""
        if isinstance(inputs, Mapping):
            unknown = [name for name in inputs if name not in self.input_names]
            if unknown:
                constant = [name for name in unknown if name in self._initializer_inputs]
                hint = (f" ({', '.join(map(repr, constant))}: initializers, constants of the model)"
                        if constant else "")
                raise InvalidArgumentError(f"{self._label} has no input(s) {', '.join(map(repr, unknown))}{hint}; "
                                           f"its inputs are {self.input_names}")
            missing = [name for name in self.input_names if name not in inputs]
            if missing:
                raise InvalidArgumentError(f"{self._label}: input(s) {', '.join(map(repr, missing))} missing; "
                                           f"its inputs are {self.input_names}")
            values = [inputs[name] for name in self.input_names]
        elif isinstance(inputs, (list, tuple)):
            values = list(inputs)
        elif len(self.input_names) == 1:
            values = [inputs]
        else:
            raise InvalidArgumentError(f"{self._label} takes {len(self.input_names)} inputs "
                                       f"({', '.join(self.input_names)}): pass a list or a dict of arrays, "
                                       f"got {type(inputs).__name__}")
        if len(values) != len(self.input_names):
            raise InvalidArgumentError(f"{self._label} takes {len(self.input_names)} input(s) "
                                       f"({', '.join(self.input_names) or 'none'}); got {len(values)}")
        arrays = []
        for name, value in zip(self.input_names, values):
            if isinstance(value, onnx.TensorProto):
                value = onnx.numpy_helper.to_array(value)
            if isinstance(value, (list, tuple, dict)) and not isinstance(value, np.ndarray):
                vi = self._value_infos.get(name)
                if vi is not None and not vi.type.HasField("tensor_type"):
                    raise GraphError(f"input {name!r} of {self._label} is a {vi.type.WhichOneof('value')}: "
                                     "graphdist runs tensors only")
            array = np.asarray(value)
            _check_input(name, array, self._value_infos.get(name), self._label)
            arrays.append(array)
        return arrays

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Runs the model.

        Args:
            inputs: One array per input: a list or tuple in :attr:`input_names` order, a dict by
                name, or a single array when the model has one input.
            **kwargs: None are accepted (ONNX's API allows backend-specific run options; graphdist
                has none).

        Returns:
            The outputs in :attr:`output_names` order, as a tuple of numpy arrays that can also be
            indexed by output name (``outputs["Y"]``).

        Raises:
            InvalidArgumentError: Missing, extra or unknown inputs, or an input whose dtype or
                shape is not the one the model declares (names the input); an unknown option.
            GraphError: graphdist cannot import or trace the model (names the op or value).
            BackendError: Compiling or running it failed (names the model and its ops).
        """
        if kwargs:
            raise InvalidArgumentError(f"run() of the graphdist ONNX backend takes no options; got "
                                       f"{', '.join(sorted(kwargs))}")
        arrays = self._arrays(inputs)
        try:
            outputs = self._runner(*arrays)
        except GraphdistError:
            raise
        except Exception as err:  # noqa: BLE001 - a library error, reported as graphdist's
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise BackendError(f"running {self._label} on {self.backend} ({self.device}) failed: "
                               f"{type(err).__name__}: {first}") from err
        results = [np.asarray(o) for o in outputs]
        if len(results) != len(self.output_names):
            raise BackendError(f"{self._label} declares {len(self.output_names)} output(s); graphdist returned "
                               f"{len(results)}")
        return self._outputs_type(*results)


class GraphdistBackend(Backend):
    """graphdist as an ONNX backend (``onnx.backend.base.Backend``).

    ``backend=`` (keyword of :meth:`prepare`, :meth:`run_model`, :meth:`run_node`) picks the
    graphdist backend that compiles the model: ``"ort"`` (default), ``"tvm"`` or ``"reference"``.
    ONNX's test suite takes a backend class and passes no such keyword: :meth:`using` makes a
    class whose default is another backend (``BackendTest(GraphdistBackend.using("tvm"), __name__)``).

    Attributes:
        default_backend: The graphdist backend used when ``backend=`` is not given.
    """

    default_backend: str = "ort"

    @classmethod
    def using(cls, backend: str) -> type[GraphdistBackend]:
        """A subclass whose models compile with ``backend`` unless ``backend=`` says otherwise.

        Raises:
            InvalidArgumentError: ``backend`` is not a graphdist backend.
        """
        _check_backend(backend)
        return type(f"GraphdistBackend_{backend}", (cls,), {"default_backend": backend, "__module__": __name__})

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether graphdist can run on ``device`` here: ``"CPU"`` always; ``"CUDA"`` / ``"CUDA:N"``
        only when the CUDA driver reports that GPU (ONNX Runtime's provider list is not asked:
        ``onnxruntime-gpu`` lists CUDA on machines without one).
        """
        try:
            parsed = Device(str(device).upper())
        except (AttributeError, ValueError):
            return False
        if parsed.type == DeviceType.CUDA:
            return parsed.device_id < num_gpus()
        return parsed.type == DeviceType.CPU

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether ``device`` is available (the model itself is only examined by :meth:`prepare`)."""
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto | bytes | str | os.PathLike[str], device: str = "CPU",
                **kwargs: Any) -> GraphdistBackendRep:
        """Checks and imports a model for repeated runs.

        Args:
            model: An ``onnx.ModelProto``, its serialized bytes, or a path to an ``.onnx`` file.
            device: ``"CPU"``, ``"CUDA"`` or ``"CUDA:N"``.
            **kwargs: ``backend`` (``"ort"``, ``"tvm"`` or ``"reference"``; default
                :attr:`default_backend`, ``"ort"``). ``base_dir``: for a ``ModelProto``
                or bytes whose tensors are stored as external data, the directory
                holding those files (a path's external data is read from the file's
                own directory; nothing is ever read relative to the current directory).
                ``rtol``/``atol`` (passed along by ``BackendTest``) are ignored.

        Returns:
            A :class:`GraphdistBackendRep`; the model is compiled on its first run (per input shape).

        Raises:
            GraphError: The file is missing or unreadable, its external data has no directory to
                be read from, a value is defined twice, a tensor's data does not match its dims,
                the model fails ONNX's checker, or graphdist cannot import it (names the op or
                value). (Models are read as :func:`graphdist.onnx.load` reads them:
                :func:`graphdist.onnx.files.read_model`.)
            InvalidArgumentError: Unknown backend, device string or keyword.
            DeviceError: ``device`` is a GPU this machine does not have.
        """
        backend = kwargs.pop("backend", None) or cls.default_backend
        base_dir = kwargs.pop("base_dir", None)
        unknown = sorted(set(kwargs) - _IGNORED_KWARGS)
        if unknown:
            raise InvalidArgumentError(f"prepare() got unknown keyword(s) {', '.join(unknown)}; "
                                       f"it takes backend= ({', '.join(available_backends())}) and base_dir=")
        _check_backend(backend)
        parsed = _parse_device(device)
        if parsed.type == DeviceType.CUDA:
            gpu_backends = tuple(available_backends("cuda"))
            if backend not in gpu_backends:
                raise InvalidArgumentError(f"backend {backend!r} runs on the host only; use 'CPU' or one of "
                                           f"{gpu_backends} for {device!r}")
            if not cls.supports_device(device):
                count = num_gpus()
                raise DeviceError(f"device {device!r} is not available: this machine has {count} GPU(s); "
                                  "use 'CPU'" + (f" or 'CUDA:0' to 'CUDA:{count - 1}'" if count else ""))
        proto, _ = read_model(model, base_dir=base_dir, caller="prepare")
        _check(proto)
        return GraphdistBackendRep(proto, backend, _graphdist_device(parsed))

    @classmethod
    def run_model(cls, model: onnx.ModelProto | bytes | str | os.PathLike[str], inputs: Any,
                  device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Prepares and runs a model once (see :meth:`prepare` and :meth:`GraphdistBackendRep.run`)."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Runs one node (onnx 1.23's base class only checks it; this builds a model and runs it).

        Args:
            node: The node. Its non-empty inputs are the model's inputs.
            inputs: One array per non-empty input of the node: a list in order or a dict by name.
            device: ``"CPU"``, ``"CUDA"`` or ``"CUDA:N"``.
            outputs_info: ``(dtype, shape)`` per non-empty output; without it ONNX's shape
                inference decides the output types.
            **kwargs: ``opset_version`` (default: the op's newest version in ``onnx``), and
                ``backend`` as for :meth:`prepare`.

        Returns:
            The node's outputs (non-empty ones, in order).

        Raises:
            GraphError: The node is invalid at that opset, or an output's type cannot be inferred
                (pass ``outputs_info``), or graphdist cannot run the op.
            InvalidArgumentError: Wrong number of inputs.
        """
        opset = kwargs.pop("opset_version", None)
        present_inputs = [name for name in node.input if name]
        present_outputs = [name for name in node.output if name]
        if isinstance(inputs, Mapping):
            missing = [name for name in present_inputs if name not in inputs]
            if missing:
                raise InvalidArgumentError(f"node {node.op_type}: input(s) {', '.join(map(repr, missing))} missing")
            values = [inputs[name] for name in present_inputs]
        else:
            values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if len(values) != len(present_inputs):
            raise InvalidArgumentError(f"node {node.op_type} has {len(present_inputs)} input(s) "
                                       f"({', '.join(present_inputs) or 'none'}); got {len(values)} value(s)")
        arrays = [onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)
                  for v in values]
        try:
            if opset is None:
                opset = onnx.defs.get_schema(node.op_type, domain=node.domain).since_version
        except onnx.defs.SchemaError as err:
            raise GraphError(f"node {node.op_type}: no ONNX domain {node.domain or 'ai.onnx'!r} defines it") \
                from err
        opsets = [onnx.helper.make_operatorsetid(node.domain, int(opset))]
        if node.domain not in ("", "ai.onnx"):
            opsets.append(onnx.helper.make_operatorsetid("", onnx.defs.onnx_opset_version()))
        graph_inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype),
                                                           a.shape) for name, a in zip(present_inputs, arrays)]
        if outputs_info is not None:
            if len(outputs_info) != len(present_outputs):
                raise InvalidArgumentError(f"node {node.op_type} has {len(present_outputs)} output(s); "
                                           f"outputs_info describes {len(outputs_info)}")
            graph_outputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(
                np.dtype(dtype)), shape) for name, (dtype, shape) in zip(present_outputs, outputs_info)]
        else:
            graph_outputs = cls._inferred_outputs(node, graph_inputs, present_outputs, opsets)
        graph = onnx.helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        model = onnx.helper.make_model_gen_version(graph, opset_imports=opsets, producer_name="graphdist")
        return cls.prepare(model, device, **kwargs).run(arrays)

    @staticmethod
    def _inferred_outputs(node: onnx.NodeProto, graph_inputs: list[onnx.ValueInfoProto], names: list[str],
                          opsets: list[onnx.OperatorSetIdProto]) -> list[onnx.ValueInfoProto]:
        """The node's output types by ONNX's shape inference (only the element type is required)."""
        probe = onnx.helper.make_model_gen_version(
            onnx.helper.make_graph([node], "probe", graph_inputs, [onnx.helper.make_empty_tensor_value_info(n)
                                                                   for n in names]),
            opset_imports=opsets)
        try:
            inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=True)
        except Exception as err:  # noqa: BLE001 - ONNX raises InferenceError and checker errors
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise GraphError(f"node {node.op_type}: ONNX's shape inference rejects it ({first})") from err
        found = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]
                 if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
        unknown = [n for n in names if n not in found]
        if unknown:
            raise GraphError(f"node {node.op_type}: the type of output(s) {', '.join(map(repr, unknown))} cannot "
                             "be inferred; pass outputs_info=[(dtype, shape), ...]")
        return [found[n] for n in names]


prepare = GraphdistBackend.prepare
run_model = GraphdistBackend.run_model
run_node = GraphdistBackend.run_node
supports_device = GraphdistBackend.supports_device
is_compatible = GraphdistBackend.is_compatible
