r"""``--mesh``, ``--layout`` and ``--batch-dim-name``: ``ModelParallelStrategy`` from the command line.

Keras 3's ``keras.distribution`` names, written as flags::

    graphdist export model.onnx --strategy model_parallel --devices cpu:0,cpu:1,cpu:2,cpu:3 \
        --mesh batch=2,model=2 --layout '^coefficient$=None,model' --layout '^coefficient1$=model,None' \
        --batch-dim-name batch -o plan

is ``DeviceMesh(shape=(2, 2), axis_names=("batch", "model"), devices=[...])``, a ``LayoutMap`` with
``layout_map["^coefficient$"] = (None, "model")`` and ``layout_map["^coefficient1$"] = ("model", None)``,
and ``ModelParallelStrategy(layout_map=..., batch_dim_name="batch")``. ``--mesh`` (or ``--layout``) without
``--strategy`` means ``model_parallel``. Every mistake is a :class:`~graphdist.cli.main.UsageError` naming
the flag and the fix; a pattern that matches no variable is the strategy's warning, as in Python (for
``graphdist replan``, this module's check against the plan's variables).
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from graphdist.cli.main import UsageError

__all__ = ["MESH_FLAGS", "add_mesh_options", "mesh_flags_given", "parse_mesh", "parse_layout",
           "make_model_parallel_strategy", "check_layouts_against_variables"]

logger = logging.getLogger(__name__)

#: The ``args`` attributes of the mesh flags, and how the command line spells them.
MESH_FLAGS = {"mesh": "--mesh", "layout": "--layout", "batch_dim_name": "--batch-dim-name"}

_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NONE = ("none", "null", "-")
_EXAMPLE_MESH = "--mesh batch=1,model=2"
_EXAMPLE_LAYOUT = "--layout 'dense.*kernel=None,model'"


def add_mesh_options(command: argparse.ArgumentParser) -> None:
    """Adds ``--mesh``, ``--layout`` (repeatable) and ``--batch-dim-name`` to a subcommand."""
    group = command.add_argument_group(
        "model_parallel (tensor parallelism and FSDP; Keras 3's DeviceMesh, LayoutMap, ModelParallel)")
    group.add_argument("--mesh", metavar="AXIS=SIZE,...", default=None,
                       help="the device mesh: axis names and sizes, row-major over --devices (default: cpu:0 ... "
                            "cpu:N-1), e.g. batch=2,model=2; implies --strategy model_parallel")
    group.add_argument("--layout", metavar="PATTERN=AXES", action="append", default=None,
                       help="variables whose name the regular expression PATTERN matches (re.search) are split: "
                            "one mesh axis or None per dimension, e.g. 'dense.*kernel=None,model'; repeat per "
                            "pattern; variables matching none are replicated")
    group.add_argument("--batch-dim-name", "--batch-dim", dest="batch_dim_name", metavar="AXIS", default=None,
                       help="the mesh axis the batch is split over (default: the first axis of --mesh)")


def mesh_flags_given(args: argparse.Namespace) -> list[str]:
    """The mesh flags given on the command line, as spelled there."""
    return [flag for attr, flag in MESH_FLAGS.items() if getattr(args, attr, None)]


def parse_mesh(text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``(axis_names, shape)`` from ``--mesh AXIS=SIZE,...``.

    Raises:
        UsageError: An entry that is not ``AXIS=SIZE`` with a name and a positive integer, or an axis named twice.
    """
    names: list[str] = []
    sizes: list[int] = []
    entries = [entry.strip() for entry in text.split(",")]
    if not any(entries):
        raise UsageError(f"--mesh {text!r} names no axis; give AXIS=SIZE pairs, e.g. {_EXAMPLE_MESH}")
    for entry in entries:
        name, equals, size = (part.strip() for part in entry.partition("="))
        if not equals or not _AXIS_NAME.match(name) or not size:
            raise UsageError(f"--mesh {text!r}: {entry!r} is not AXIS=SIZE (an axis name, '=', its size); "
                             f"e.g. {_EXAMPLE_MESH}")
        if not size.isdigit() or int(size) < 1:
            raise UsageError(f"--mesh {text!r}: the size of axis {name!r} must be a positive integer, got {size!r}")
        if name in names:
            raise UsageError(f"--mesh {text!r} names axis {name!r} twice; give each axis once")
        names.append(name)
        sizes.append(int(size))
    return tuple(names), tuple(sizes)


def parse_layout(text: str, axis_names: Sequence[str]) -> tuple[str, tuple[str | None, ...]]:
    """``(pattern, axes)`` from ``--layout PATTERN=AXES`` (AXES: mesh axis names or ``None``, comma-separated).

    The pattern is what precedes the last ``=`` (a regular expression may hold ``=``; axis names cannot).

    Raises:
        UsageError: No ``=``, an empty pattern or entry, a pattern that is not a regular expression, or an
            axis that is not one of ``axis_names`` (the message lists them).
    """
    pattern, equals, axes_text = text.rpartition("=")
    example = f"e.g. {_EXAMPLE_LAYOUT} or --layout 'dense.*bias=model'"
    if not equals or not pattern:
        raise UsageError(f"--layout {text!r} is not PATTERN=AXES (a regular expression on variable names, '=', "
                         f"one mesh axis or None per dimension); {example}")
    try:
        re.compile(pattern)
    except re.error as err:
        raise UsageError(f"--layout {text!r}: {pattern!r} is not a regular expression ({err}); quote the flag "
                         "in the shell and escape special characters") from None
    axes: list[str | None] = []
    for entry in (part.strip() for part in axes_text.split(",")):
        if not entry:
            raise UsageError(f"--layout {text!r}: an empty entry in {axes_text!r}; give one mesh axis or None per "
                             f"dimension, separated by commas; {example}")
        if entry.lower() in _NONE:
            axes.append(None)
        elif entry in axis_names:
            axes.append(entry)
        else:
            raise UsageError(f"--layout {text!r} names {entry!r}, which is not an axis of --mesh (its axes: "
                             f"{', '.join(axis_names)}); use one of them or None")
    named = [axis for axis in axes if axis is not None]
    if len(set(named)) != len(named):
        raise UsageError(f"--layout {text!r} uses a mesh axis on two dimensions; each axis may split one dimension")
    return pattern, tuple(axes)


def make_model_parallel_strategy(args: argparse.Namespace, devices: list[str] | None) -> Any:
    """``ModelParallelStrategy`` from ``--mesh``, ``--layout``, ``--batch-dim-name`` and ``--devices``.

    Raises:
        UsageError: No ``--mesh``, a bad flag value, a device count other than the mesh's, or a mesh or
            layout the library refuses (its message, under the flag's name).
    """
    import graphdist as gd

    if not args.mesh:
        raise UsageError(f"--strategy model_parallel needs --mesh AXIS=SIZE,... and a --layout PATTERN=AXES per "
                         f"split variable, e.g. {_EXAMPLE_MESH} {_EXAMPLE_LAYOUT}")
    names, shape = parse_mesh(args.mesh)
    count = 1
    for size in shape:
        count *= size
    if devices is not None and len(devices) != count:
        more = "more devices than" if count > len(devices) else "fewer devices than"
        raise UsageError(f"--mesh {args.mesh} needs {count} devices ({' x '.join(map(str, shape))}), {more} --devices "
                         f"lists ({len(devices)}: {', '.join(devices)}); list {count} devices or give a mesh whose "
                         f"sizes multiply to {len(devices)}")
    batch = args.batch_dim_name
    if batch is not None and batch not in names:
        raise UsageError(f"--batch-dim-name {batch!r} is not an axis of --mesh {args.mesh} (its axes: "
                         f"{', '.join(names)}); name one of them")
    layouts = _parse_layouts(args.layout or [], names)
    from graphdist.runtime.devices import soft_device_placement

    # Strict placement, as for the other strategies: a plan made for the devices named here is for those devices.
    with soft_device_placement(False):
        try:
            mesh = gd.experimental.DeviceMesh(shape, names, devices)
        except gd.GraphdistError as err:
            raise UsageError(f"--mesh {args.mesh}: {err}") from err
        layout_map = gd.experimental.LayoutMap(mesh)
        for pattern, axes in layouts.items():
            layout_map[pattern] = axes
        try:
            return gd.experimental.ModelParallelStrategy(layout_map=layout_map, batch_dim_name=batch)
        except gd.GraphdistError as err:
            raise UsageError(f"cannot create the model_parallel strategy on --mesh {args.mesh}: {err}") from err


def _parse_layouts(texts: Sequence[str], names: Sequence[str]) -> dict[str, tuple[str | None, ...]]:
    layouts: dict[str, tuple[str | None, ...]] = {}
    for text in texts:
        pattern, axes = parse_layout(text, names)
        if pattern in layouts:
            raise UsageError(f"--layout gives pattern {pattern!r} twice; give each pattern once")
        layouts[pattern] = axes
    return layouts


def check_layouts_against_variables(strategy: Any, variables: Mapping[str, Any], where: str) -> None:
    """Checks the strategy's layouts against stored variables (``{name: array}``) before a re-plan.

    A re-planned step has no live variables for the strategy to check as it makes them, so this does the
    checks ``ModelParallelStrategy`` does there: each pattern matches some variable (else a warning, as the
    strategy's), each matched variable's rank equals its layout's and each split dimension divides by its axis.

    Raises:
        UsageError: A rank or divisibility mismatch (naming the variable, the dimension and the --layout); a
            layout over the batch axis (FSDP) is not checked (FSDP pads a weight into equal shards).
    """
    layout_map = strategy.layout_map
    mesh = strategy.device_mesh
    batch = strategy.batch_dim_name
    for pattern in layout_map:
        axes = layout_map._layouts[pattern]
        matched = {name: value for name, value in variables.items() if pattern in layout_map.matching(name)}
        if not matched:
            why = (" (it holds no variables: an .onnx model exported for inference under another strategy keeps "
                   "its weights as constants; export it with --strategy model_parallel to make them variables)"
                   if not variables else "")
            logger.warning("--layout pattern %r matches none of the %d variable(s) of %s%s; names: %s", pattern,
                           len(variables), where, why, ", ".join(sorted(variables)[:8]) or "none")
            continue
        if batch in axes and mesh.axis_size(batch) > 1:
            continue  # FSDP: the weight is padded into equal shards, any shape fits
        for name, value in matched.items():
            _check_fits(name, tuple(getattr(value, "shape", ())), pattern, axes, mesh)


def _check_fits(name: str, shape: tuple[int, ...], pattern: str, axes: tuple[str | None, ...], mesh: Any) -> None:
    flag = f"--layout {pattern}={_spell(axes)}"
    if len(shape) != len(axes):
        raise UsageError(f"{flag}: variable {name!r} has rank {len(shape)} (shape {shape}), the layout has "
                         f"{len(axes)} entries; give one mesh axis or None per dimension of it")
    for dim, (size, axis) in enumerate(zip(shape, axes)):
        if axis is not None and size % mesh.axis_size(axis):
            raise UsageError(f"{flag}: dimension {dim} of variable {name!r} (size {size}) is not divisible by mesh "
                             f"axis {axis!r} (size {mesh.axis_size(axis)}); leave it None or change the mesh")


def _spell(axes: Sequence[str | None]) -> str:
    return ",".join("None" if axis is None else axis for axis in axes)
