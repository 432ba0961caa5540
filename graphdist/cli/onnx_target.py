"""``.onnx`` targets of ``graphdist inspect | export | bench``: a model as a data-parallel inference step.

The model is read with :func:`graphdist.onnx.files.read_model` (external
data next to it; a missing, truncated or too-new file is a usage error
naming it) and imported at its own opset. ``--input-shape NAME=D0xD1x...``
(repeatable) fixes the shape of an input whose dimensions are unknown or
symbolic (a batch ``N``, a sequence length): ``D0`` is the global batch,
split across the replicas. Other inputs keep their declared shapes (unknown
dimensions after the first become 1, with a warning naming the input).

Under ``--strategy model_parallel`` (``--mesh``, ``--layout``) the model is
loaded with ``gd.onnx.load`` in the strategy's scope, so its floating-point
initializers are variables named as in the file, which ``--layout`` patterns
split; under the other strategies they stay constants.
"""

from __future__ import annotations

import argparse
import logging
import re
from typing import Any

from graphdist.cli.main import UsageError

__all__ = ["add_input_shape_option", "parse_input_shapes", "load_onnx_graph", "load_onnx_model", "build_onnx_target"]

logger = logging.getLogger(__name__)

_SHAPE = re.compile(r"^(?P<name>.+)=(?P<dims>\d+(?:[xX]\d+)*)$")


def add_input_shape_option(command: argparse.ArgumentParser) -> None:
    """Adds ``--input-shape NAME=D0xD1x...`` (repeatable) to a subcommand."""
    command.add_argument("--input-shape", action="append", metavar="NAME=D0xD1x...", default=None,
                         help=".onnx targets: the shape of input NAME, batch first (e.g. data=8x3x224x224), "
                              "for inputs with unknown or batch dimensions; repeat for several inputs")


def parse_input_shapes(texts: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``{input name: shape}`` from the ``--input-shape`` values.

    Raises:
        UsageError: A value is not ``NAME=D0xD1x...`` with positive integers, or names an input twice.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts or ():
        match = _SHAPE.match(text.strip())
        if match is None:
            raise UsageError(f"--input-shape {text!r} is not NAME=D0xD1x... (e.g. --input-shape data=8x3x224x224)")
        name = match["name"]
        dims = tuple(int(d) for d in re.split(r"[xX]", match["dims"]))
        if any(d <= 0 for d in dims):
            raise UsageError(f"--input-shape {text!r}: every dimension must be positive")
        if name in shapes:
            raise UsageError(f"--input-shape names input {name!r} twice")
        shapes[name] = dims
    return shapes


def load_onnx_graph(path: str, shapes: dict[str, tuple[int, ...]]) -> Any:
    """The model at ``path`` as a graph, its inputs in ``shapes`` fixed to those shapes.

    Raises:
        UsageError: The file cannot be read or imported, ``shapes`` names an
            input the model does not have (the message lists its inputs), or
            a shape's rank differs from the input's declared rank.
    """
    from graphdist.errors import GraphError
    from graphdist.ir import from_onnx
    from graphdist.onnx.prepare import clean_model

    model = load_onnx_model(path, shapes)
    try:
        return from_onnx(clean_model(model))  # less Dropout-7's unused mask outputs, which ONNX cannot type
    except GraphError as err:
        raise UsageError(f"cannot import {path!r}: {err}") from err


def load_onnx_model(path: str, shapes: dict[str, tuple[int, ...]]) -> Any:
    """The ``onnx.ModelProto`` at ``path`` (external data read), its inputs in ``shapes`` fixed to those shapes.

    Raises:
        UsageError: As :func:`load_onnx_graph`, but for the import.
    """
    from graphdist.errors import GraphError
    from graphdist.onnx.files import read_model

    try:
        model, _ = read_model(path)
    except GraphError as err:
        raise UsageError(f"cannot read the ONNX model: {err}") from err
    initializers = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in initializers}
    for name, shape in shapes.items():
        if name not in inputs:
            listed = ", ".join(f"{n} {_declared(vi)}" for n, vi in inputs.items()) or "none"
            raise UsageError(f"--input-shape names {name!r}, which is not an input of {path!r}; its inputs are: "
                             f"{listed}")
        _fix_shape(inputs[name], shape, path)
    for name, vi in inputs.items():
        dims = vi.type.tensor_type.shape.dim
        if name not in shapes and any(not d.HasField("dim_value") for d in list(dims)[1:]):
            logger.warning("input %s of %s has unknown dimensions %s: the example inputs use 1 for them; give "
                           "--input-shape %s=D0x... to choose", name, path, _declared(vi), name)
    return model


def _declared(vi: Any) -> str:
    tensor = vi.type.tensor_type
    if not tensor.HasField("shape"):
        return "[?]"
    return "[" + ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                          for d in tensor.shape.dim) + "]"


def _fix_shape(vi: Any, shape: tuple[int, ...], path: str) -> None:
    tensor = vi.type.tensor_type
    if tensor.HasField("shape") and len(tensor.shape.dim) != len(shape):
        raise UsageError(f"--input-shape {vi.name}={'x'.join(map(str, shape))}: input {vi.name!r} of {path!r} "
                         f"has rank {len(tensor.shape.dim)} ({_declared(vi)}), the shape given has rank {len(shape)}")
    for axis, (dim, size) in enumerate(zip(tensor.shape.dim, shape)):
        if dim.HasField("dim_value") and dim.dim_value != size and axis > 0:
            raise UsageError(f"--input-shape {vi.name}={'x'.join(map(str, shape))}: dimension {axis} of input "
                             f"{vi.name!r} is fixed to {dim.dim_value} in {path!r}")
    batch = tensor.shape.dim[0].dim_param if tensor.HasField("shape") and tensor.shape.dim else ""
    tensor.ClearField("shape")
    # The first dimension stays a symbol: it is the global batch, and each replica's graph gets its share of
    # it (a model that computes shapes from it must not see the global batch baked in).
    tensor.shape.dim.add().dim_param = batch or "batch"
    for size in shape[1:]:
        tensor.shape.dim.add().dim_value = size


def build_onnx_target(args: argparse.Namespace, strategy: Any) -> tuple[Any, tuple[Any, ...], Any]:
    """The inference step of the ``.onnx`` TARGET under ``strategy`` (default: one device on cpu:0).

    Returns:
        ``(step, example_args, strategy)``.

    Raises:
        UsageError: Bad ``--input-shape`` values, an unreadable model, or a
            batch that does not fit the replicas or the shapes given.
    """
    import graphdist as gd
    from graphdist.compile.inference import make_inference_step

    shapes = parse_input_shapes(getattr(args, "input_shape", None))
    strategy = strategy or gd.OneDeviceStrategy("cpu:0")
    model = None
    if isinstance(strategy, gd.experimental.ModelParallelStrategy):
        model = _load_as_variables(args.target, shapes, strategy)
        graph = model.graph
    else:
        graph = load_onnx_graph(args.target, shapes)
    batch = args.batch
    batches = {shape[0] for shape in shapes.values()}
    if len(batches) > 1:
        raise UsageError(f"--input-shape gives the inputs different batch sizes ({sorted(batches)}); the first "
                         "dimension of every input is the global batch")
    if batches and batch is not None and batch not in batches:
        raise UsageError(f"--batch {batch} differs from the batch of --input-shape ({batches.pop()}); give one")
    if batches and batch is None:
        batch = batches.pop()
    try:
        step, example = make_inference_step(graph, strategy, batch, backend=args.backend, model=model)
    except gd.InvalidArgumentError as err:
        raise UsageError(str(err)) from err
    return step, example, strategy


def _load_as_variables(path: str, shapes: dict[str, tuple[int, ...]], strategy: Any) -> Any:
    """The model loaded in ``strategy``'s scope (``gd.onnx.load``): its floating-point initializers (and
    ``Constant`` weights) become the strategy's variables, named as in the file, which ``--layout`` patterns
    split; under the other strategies an inference step keeps them constants.

    Raises:
        UsageError: The model cannot be imported, or a ``--layout`` does not fit a variable (rank, a dimension
            its axis does not divide).
    """
    import graphdist as gd

    model = load_onnx_model(path, shapes)
    try:
        with strategy.scope():
            return gd.onnx.load(model)
    except gd.GraphError as err:
        raise UsageError(f"cannot import {path!r}: {err}") from err
    except gd.InvalidArgumentError as err:
        raise UsageError(f"--layout does not fit a variable of {path!r} (its initializers): {err}") from err
