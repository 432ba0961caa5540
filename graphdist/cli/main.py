"""The ``graphdist`` command line.

Subcommands:

* ``graphdist devices``: devices that can run now, host cores, backends.
* ``graphdist inspect TARGET``: trace and compile ``module:function`` (on
  the module's example inputs), a ``make_step(strategy)`` factory, or an
  ``.onnx`` file (as a data-parallel inference step), under ``--strategy``
  and ``--devices`` (``--mesh``, ``--layout``: ``model_parallel``), and show
  a stage: a graph (``traced``, ``rewritten``, ``partitioned``) as tables,
  DOT, SVG/PNG or ONNX, the ``plan`` (segments per device, communication),
  or the ``diff`` of each pass; TARGET may also be an exported plan
  directory (its plan, or one of the graphs it holds).
* ``graphdist export TARGET -o DIR``: write the compiled plan directory
  (``ConcreteFunction.export``).
* ``graphdist run DIR --inputs FILE.npz [--steps N]``: load a plan directory
  (``gd.load_plan``) and run it (arrays named ``arg0, ...`` or by an ONNX
  model's input names; other names are refused).
* ``graphdist replan``, ``graphdist launch``, ``graphdist bench``: see
  ``graphdist --synopsis`` (one usage line per command) and ``--help``.

Run ``graphdist --help`` or ``graphdist COMMAND --help`` for details. Also
runnable as ``python -m graphdist.cli.main``.

Exit status: 0 on success, 2 for a usage mistake (bad arguments, a target
that cannot be found or read), 1 when graphdist fails on a valid request
(tracing or compile errors). Errors are one line on stderr starting with
``graphdist: error:``; ``-v`` adds the log and, on failure, the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["main", "build_parser", "synopsis", "UsageError"]

logger = logging.getLogger(__name__)

PROG = "graphdist"
STAGES = ("traced", "rewritten", "partitioned", "plan", "diff")
FORMATS = ("text", "dot", "svg", "png", "onnx")

#: ``--trust`` of the commands that load plan directories (``gd.load_plan(..., trust=True)``).
TRUST_HELP = ("load the plan even from a folder other users can write, or signed by someone else (its checksums "
              "are still checked): only for plans from people you trust")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake in the command line or its target; exits with status 2."""


class _TargetError(Exception):
    """The user's function raised while being traced; exits with status 1."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line naming the fix."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


# ---------------------------------------------------------------- devices
def cmd_devices(args: argparse.Namespace) -> int:
    """Prints devices, host cores and backends."""
    import graphdist as gd
    from graphdist.backends import available_backends, get_backend
    from graphdist.backends.base import DEFAULT_BACKEND

    print("devices:")
    for device in gd.config.list_devices():
        print(f"  {device}")
    print(f"host cores: {gd.config.host_cores()} (logical cpu:N devices split them)")
    print(f"gpus: {gd.config.num_gpus()}")
    env = os.environ.get("GRAPHDIST_BACKEND", "").strip()
    default = f"{env} (from GRAPHDIST_BACKEND)" if env else DEFAULT_BACKEND
    print("backends:")
    for name in available_backends():
        try:
            version = get_backend(name).version
        except Exception as err:  # noqa: BLE001 - a broken backend is reported, not fatal
            logger.debug("backend %s version lookup failed", name, exc_info=True)
            version = f"unavailable: {err}"
        print(f"  {name:<10} {version}")
    print(f"default backend: {default}")
    return EXIT_OK


# ---------------------------------------------------------------- choices
def backend_choices() -> list[str]:
    """The --backend choices: the registered backends (``graphdist.backends``)."""
    from graphdist.backends import available_backends

    return available_backends()


def _strategy_choices() -> tuple[str, ...]:
    """The --strategy choices of one process (``graphdist.distribute.registry``)."""
    from graphdist.distribute.registry import strategy_names

    return strategy_names(multi_process=False)


# ------------------------------------------------------------- strategies
def _parse_devices(text: str | None) -> list[str] | None:
    if text is None:
        return None
    devices = [d.strip() for d in text.split(",") if d.strip()]
    if not devices:
        raise UsageError(f"--devices {text!r} names no device; give a comma-separated list such as cpu:0,cpu:1")
    return devices


def _make_strategy(name: str | None, devices_text: str | None, args: argparse.Namespace | None = None) -> Any:
    """The strategy named on the command line (``None`` when neither --strategy nor --devices is given).

    ``args``: the parsed command line, whose ``--mesh``, ``--layout`` and ``--batch-dim-name`` make a
    ``model_parallel`` strategy (``--mesh`` or ``--layout`` without ``--strategy`` means ``model_parallel``).
    """
    import graphdist as gd
    from graphdist.distribute.registry import normalise_strategy_name, strategy_entry, strategy_names

    devices = _parse_devices(devices_text)
    mesh_flags = _mesh_flags(args)
    if name is None:
        if mesh_flags:
            name = "model_parallel"
        elif devices is None:
            return None
        else:
            name = "one_device" if len(devices) == 1 else "mirrored"
    key = normalise_strategy_name(name)
    if key == "model_parallel":
        if args is None:
            raise UsageError(f"--strategy {name} needs --mesh and --layout, which this command does not take")
        from graphdist.cli.mesh import make_model_parallel_strategy

        return make_model_parallel_strategy(args, devices)
    if mesh_flags:
        several = len(mesh_flags) > 1
        raise UsageError(f"{', '.join(mesh_flags)} appl{'y' if several else 'ies'} to --strategy model_parallel only "
                         f"(not {name}); drop {'them' if several else 'it'} or use --strategy model_parallel")
    if key not in strategy_names(multi_process=False):
        later = set(strategy_names(multi_process=True))
        why = " (a multi-process strategy: run the script with `graphdist launch`)" if key in later else ""
        raise UsageError(f"unknown strategy {name!r}{why}; choose one of "
                         f"{', '.join((*strategy_names(False), 'model_parallel'))}")
    from graphdist.runtime.devices import soft_device_placement

    # Strict placement: a plan exported or inspected for the devices named here must be for those devices.
    with soft_device_placement(False):
        try:
            return strategy_entry(key).make(devices)
        except gd.GraphdistError as err:
            raise UsageError(f"cannot create {key} strategy on {devices_text or 'its default devices'}: {err}") \
                from err


def _mesh_flags(args: argparse.Namespace | None) -> list[str]:
    if args is None:
        return []
    from graphdist.cli.mesh import mesh_flags_given

    return mesh_flags_given(args)


# ----------------------------------------------------------------- targets
def _is_onnx_path(target: str) -> bool:
    return target.lower().endswith(".onnx")


def _write(path: str, writer: Callable[[str], Any]) -> None:
    try:
        writer(path)
    except OSError as err:
        raise UsageError(f"cannot write {path!r}: {err.strerror or err}; check that the directory exists "
                         "and is writable") from err


class _Built:
    """What a TARGET compiled to: its concrete function and a description."""

    def __init__(self, concrete: Any, strategy: Any, example_args: tuple[Any, ...], what: str) -> None:
        self.concrete, self.strategy, self.example_args, self.what = concrete, strategy, example_args, what


def _build_target(args: argparse.Namespace) -> _Built:
    """Traces and compiles TARGET (module:function, a make_step factory, or an .onnx file)."""
    import graphdist as gd

    target = args.target
    strategy = _make_strategy(args.strategy, args.devices, args)
    if _is_onnx_path(target):
        from graphdist.cli.onnx_target import build_onnx_target

        step, example, strategy = build_onnx_target(args, strategy)
        kind = "model-parallel" if isinstance(strategy, gd.experimental.ModelParallelStrategy) else "data-parallel"
        return _Built(_concrete(step, example, target), strategy, example,
                      f"{kind} inference of {target} under {strategy!r}")
    if getattr(args, "input_shape", None):
        raise UsageError("--input-shape applies to .onnx targets only; a module:function target's example inputs "
                         "decide its shapes (see --batch)")
    if ":" not in target:
        raise UsageError(
            f"TARGET {target!r} is neither 'module:function' (e.g. graphdist.models.mlp:forward) nor a path "
            "to an .onnx file; add ':function' after the module name"
        )
    module_name, _, attr_path = target.rpartition(":")
    if not module_name or not attr_path:
        raise UsageError(f"TARGET {target!r} must be 'module:function', e.g. graphdist.models.mlp:forward")
    module = _import_module(module_name)
    fn = _get_attribute(module, module_name, attr_path)
    if _is_factory(fn, attr_path):
        strategy = strategy or gd.OneDeviceStrategy("cpu:0")
        step, example = _call_factory(fn, target, strategy, args.batch)
        if not isinstance(step, gd.Function):
            step = gd.function(step, backend=args.backend, name=attr_path)
        elif args.backend is not None:
            step = step._with_backend(args.backend)  # --backend wins over the factory's choice
        from graphdist.distribute.run_args import quiet_global_array_warning

        # The factory's plain arrays were pointed out above (_warn_whole_batch_examples): once is enough.
        with quiet_global_array_warning(_plain_examples(example, strategy) != []):
            concrete = _concrete(step, example, target)
        return _Built(concrete, strategy, example, f"{target} under {strategy!r}")
    inputs = _example_inputs(module, module_name, fn, attr_path, args.batch)
    if strategy is None:
        if isinstance(fn, gd.Function):
            function = fn._with_backend(args.backend) if args.backend is not None else fn
        else:
            function = gd.function(fn, backend=args.backend, name=attr_path)
        return _Built(_concrete(function, inputs, target), gd.get_strategy(), inputs, target)
    step, example = _data_parallel_step(fn, strategy, inputs, args.backend, attr_path)
    return _Built(_concrete(step, example, target), strategy, example, f"{target} in strategy.run under {strategy!r}")


def _concrete(function: Any, example: tuple[Any, ...], target: str) -> Any:
    import graphdist as gd

    logger.info("tracing %s on %d example argument(s)", target, len(example))
    try:
        return function.get_concrete_function(*example)
    except gd.GraphdistError:
        raise
    except Exception as err:
        raise _TargetError(f"{target} failed while tracing: {type(err).__name__}: {err}") from err


def _is_factory(fn: Any, attr_path: str) -> bool:
    """``make_step*`` functions, or functions whose first parameter is ``strategy``."""
    if attr_path.rpartition(".")[2].startswith("make_step"):
        return True
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "strategy"


def _call_factory(fn: Any, target: str, strategy: Any, batch: int | None) -> tuple[Any, tuple[Any, ...]]:
    kwargs = {}
    if batch is not None:
        try:
            accepts = "batch" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            accepts = False
        if not accepts:
            raise UsageError(f"--batch: {target} takes no 'batch' argument; drop --batch")
        kwargs["batch"] = batch
    try:
        result = fn(strategy, **kwargs)
    except Exception as err:
        if _raised_by_layouts(err):
            raise UsageError(f"--layout does not fit a variable {target}(strategy) makes: {err}") from err
        raise _TargetError(f"{target}(strategy) failed: {type(err).__name__}: {err}") from err
    if not (isinstance(result, tuple) and len(result) == 2 and callable(result[0])):
        raise UsageError(f"{target}(strategy) must return (step_fn, example_args), got {type(result).__name__}; "
                         "see 'graphdist inspect --help'")
    step, example = result
    if isinstance(example, list):
        example = tuple(example)
    if not isinstance(example, tuple):
        example = (example,)
    _warn_whole_batch_examples(example, target, strategy)
    return step, example


def _raised_by_layouts(err: Exception) -> bool:
    """Whether ``err`` is ``ModelParallelStrategy`` refusing a variable's layout (rank, divisibility), raised
    where the variable is made.
    """
    import graphdist as gd

    frame = err.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    module = frame.tb_frame.f_globals.get("__name__") if frame is not None else None
    return isinstance(err, gd.InvalidArgumentError) and module == "graphdist.distribute.model_parallel"


def _plain_examples(example: tuple[Any, ...], strategy: Any) -> list[int]:
    """Indices of the plain (undistributed) array arguments given to a multi-replica strategy."""
    import numpy as np

    if strategy.num_replicas_in_sync < 2:
        return []
    return [i for i, value in enumerate(example) if isinstance(value, np.ndarray) and value.ndim >= 1]


def _warn_whole_batch_examples(example: tuple[Any, ...], target: str, strategy: Any) -> None:
    """Warns when a factory hands plain arrays to a multi-replica strategy.

    ``strategy.run`` gives every replica the whole of a plain array (as
    tf.distribute does), so a factory that meant a global batch would train
    each replica on all of it (a summed loss N times too large); the factory
    should return distributed values instead.
    """
    replicas = strategy.num_replicas_in_sync
    plain = _plain_examples(example, strategy)
    if plain:
        logger.warning(
            "%s(strategy) returned plain array(s) as example argument(s) %s: strategy.run gives each of the %d "
            "replicas the whole array (as tf.distribute does), not a share of the batch; to split a global batch "
            "return next(iter(strategy.experimental_distribute_dataset(dataset))) (see graphdist/models/common.py: "
            "distributed_step)", target, ", ".join(map(str, plain)), replicas)


def _data_parallel_step(fn: Any, strategy: Any, inputs: tuple[Any, ...], backend: str | None,
                        name: str) -> tuple[Any, tuple[Any, ...]]:
    """``gd.function(lambda *a: strategy.run(fn, args=a))`` with the batch split across replicas.

    Array inputs whose first dimension divides by the replica count are split
    (per-replica values); other inputs are broadcast. The step returns
    ``fn``'s per-replica results.
    """
    import numpy as np

    import graphdist as gd

    replicas = strategy.num_replicas_in_sync

    def split(value: Any) -> Any:
        if replicas > 1 and isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] >= replicas \
                and value.shape[0] % replicas == 0:
            share = value.shape[0] // replicas
            return gd.PerReplica([value[r * share:(r + 1) * share] for r in range(replicas)])
        return value

    def step(*step_args: Any) -> Any:
        return strategy.run(fn, args=step_args)

    return gd.function(step, backend=backend, name=name.replace(".", "_")), tuple(split(v) for v in inputs)


def _import_module(name: str) -> Any:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"module file {name!r} does not exist; check the path")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"cannot load {name!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        _run_module_code(name, lambda: spec.loader.exec_module(module))
        return module
    # Like ``python -m``: modules in the working directory are importable.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return _run_module_code(name, lambda: importlib.import_module(name))
    except ModuleNotFoundError as err:
        if err.name and (name == err.name or name.startswith(err.name + ".")):
            raise UsageError(
                f"cannot import module {name!r} (no module named {err.name!r}); check the spelling and run "
                "from the directory that contains it or add it to PYTHONPATH"
            ) from err
        raise UsageError(f"importing module {name!r} failed: {err}; install the missing package") from err


def _run_module_code(name: str, load: Callable[[], Any]) -> Any:
    try:
        return load()
    except ModuleNotFoundError:
        raise
    except SyntaxError as err:
        raise UsageError(f"module {name!r} has a syntax error: {err.msg} ({err.filename}, line {err.lineno})") \
            from err
    except Exception as err:
        raise UsageError(f"importing module {name!r} failed: {type(err).__name__}: {err}; fix the module's "
                         "top-level code") from err


def _get_attribute(module: Any, module_name: str, attr_path: str) -> Any:
    obj = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                           and getattr(v, "__module__", None) == module.__name__)
            hint = f"; callables in it: {', '.join(names[:12])}" if names else ""
            raise UsageError(f"module {module_name!r} has no attribute {attr_path!r}{hint}")
        obj = getattr(obj, part)
    if inspect.isclass(obj):
        raise UsageError(f"{module_name}:{attr_path} is a class; name a function, e.g. a module-level forward(x)")
    if not callable(obj):
        raise UsageError(f"{module_name}:{attr_path} is a {type(obj).__name__}, not a function")
    return obj


def _example_inputs(module: Any, module_name: str, fn: Any, attr_path: str,
                    batch: int | None = None) -> tuple[Any, ...]:
    """Example inputs from ``fn.example_inputs`` else the module's ``example_inputs()``."""
    candidates = [(f"{attr_path}.example_inputs", getattr(fn, "example_inputs", None)),
                  (f"{module_name}.example_inputs", getattr(module, "example_inputs", None))]
    for where, source in candidates:
        if source is None:
            continue
        if callable(source):
            kwargs = {}
            if batch is not None:
                try:
                    accepts = "batch" in inspect.signature(source).parameters
                except (TypeError, ValueError):
                    accepts = False
                if not accepts:
                    raise UsageError(f"--batch: {where}() takes no 'batch' argument; drop --batch")
                kwargs["batch"] = batch
            try:
                source = source(**kwargs)
            except Exception as err:
                raise UsageError(f"{where}() failed: {type(err).__name__}: {err}") from err
        elif batch is not None:
            raise UsageError(f"--batch: {where} is a fixed value, not a function of the batch; drop --batch")
        if isinstance(source, list):
            source = tuple(source)
        if not isinstance(source, tuple):
            source = (source,)
        logger.debug("example inputs from %s", where)
        return source
    raise UsageError(
        f"no example inputs for {module_name}:{attr_path}: define example_inputs() in module {module_name!r} "
        f"returning a tuple of arrays (e.g. `return (np.zeros((8, 64), np.float32),)`), or set "
        f"{attr_path}.example_inputs, or give a factory make_step(strategy) -> (step, example_args)"
    )


# ---------------------------------------------------------------- inspect
_SUFFIX_FORMATS = {".svg": "svg", ".png": "png", ".dot": "dot", ".gv": "dot", ".onnx": "onnx", ".txt": "text"}


def _output_format(args: argparse.Namespace) -> str:
    if args.format is not None:
        return args.format
    if args.output:
        return _SUFFIX_FORMATS.get(Path(args.output).suffix.lower(), "text")
    return "text"


def cmd_inspect(args: argparse.Namespace) -> int:
    """Prints (or writes) a stage of a target's compilation (or of an exported plan directory)."""
    fmt = _output_format(args)
    plan_dir = Path(args.target).is_dir()
    stage = args.stage or ("plan" if plan_dir else "traced")
    if fmt in ("onnx", "svg", "png") and not args.output:
        example = {"onnx": "graph.onnx", "svg": "graph.svg", "png": "graph.png"}[fmt]
        raise UsageError(f"--format {fmt} writes a file: give its path with -o PATH, e.g. -o {example}")
    if stage == "diff" and fmt != "text":
        raise UsageError(f"--stage diff is a text report; drop --format {fmt}")
    if stage == "plan" and fmt == "onnx":
        raise UsageError("a plan is several ONNX models plus communication: write it with "
                         "'graphdist export TARGET -o DIR' (or inspect --stage partitioned --format onnx)")
    if fmt in ("svg", "png"):
        from graphdist.ir.render import dot_executable

        if dot_executable() is None:
            from graphdist.ir.render import DOT_INSTALL_HINT

            raise UsageError(f"--format {fmt} needs Graphviz's 'dot' program, which was not found: "
                             f"{DOT_INSTALL_HINT} (or use --format dot)")
    if plan_dir:
        subject, strategy_name = _inspect_plan_directory(args, stage)
    else:
        built = _build_target(args)
        concrete = built.concrete
        if stage == "diff":
            from graphdist.compile.diff import strategy_pass_diffs

            return _emit_text(args.output, strategy_pass_diffs(concrete).format())
        subject = concrete.plan if stage == "plan" else concrete.graph(stage)
        strategy_name = type(built.strategy).__name__
    views = _views(subject)
    if fmt == "text":
        return _emit_text(args.output, views.summary())
    if fmt == "dot":
        return _emit_text(args.output, views.to_dot().rstrip("\n"))
    if fmt in ("svg", "png"):
        views.render(args.output)
        print(f"wrote {args.output} ({fmt}, {_describe_subject(subject)})")
        return EXIT_OK
    import onnx

    model = views.to_onnx()
    for key, value in (("graphdist.stage", stage), ("graphdist.target", args.target),
                       ("graphdist.strategy", strategy_name)):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    _write(args.output, lambda path: onnx.save(model, path))
    domains = ", ".join(o.domain or "ai.onnx" for o in model.opset_import)
    print(f"wrote {args.output} ({len(subject.nodes)} nodes, stage {stage}, ONNX IR version {model.ir_version}, "
          f"opsets {domains})")
    return EXIT_OK


def _inspect_plan_directory(args: argparse.Namespace, stage: str) -> tuple[Any, str]:
    """The plan (or a stage's graph) of the exported plan directory TARGET, and its strategy's name."""
    import graphdist as gd

    options = [f"--{name}" for name in ("strategy", "devices", "batch", "backend") if getattr(args, name, None)]
    options += _mesh_flags(args)
    if options or getattr(args, "input_shape", None):
        raise UsageError(f"{args.target!r} is an exported plan directory, already planned: drop "
                         f"{', '.join(options) or '--input-shape'} (re-plan it with 'graphdist replan "
                         f"{args.target} --strategy NAME -o DIR')")
    if stage == "diff":
        raise UsageError("--stage diff compares the passes of a step being compiled; a plan directory holds the "
                         "traced, rewritten and partitioned graphs: inspect one with --stage")
    try:
        loaded = gd.load_plan(args.target)
    except gd.PlanError as err:
        raise UsageError(f"cannot load plan {args.target!r}: {err}") from err
    try:
        subject = loaded.plan if stage == "plan" else loaded.graph(stage)
    except gd.PlanError as err:
        raise UsageError(str(err)) from err
    return subject, str(loaded.metadata.get("strategy") or "")


def _views(subject: Any) -> Any:
    """``summary``, ``to_dot``, ``render`` and ``to_onnx`` of a plan (its methods) or of a stage graph (the IR's
    free functions: a graph is data).
    """
    from types import SimpleNamespace

    from graphdist.ir.graph import Graph

    if not isinstance(subject, Graph):
        return subject
    from graphdist.ir.onnx_io import to_onnx
    from graphdist.ir.render import graph_summary, graph_to_dot, render_graph

    return SimpleNamespace(summary=lambda: graph_summary(subject), to_dot=lambda: graph_to_dot(subject),
                           render=lambda path: render_graph(subject, path), to_onnx=lambda: to_onnx(subject))


def _describe_subject(subject: Any) -> str:
    if hasattr(subject, "segments"):
        return f"plan with {len(subject.segments)} segment(s), {subject.describe_tasks()}"
    return f"{len(subject.nodes)} nodes, stage {subject.stage}"


def _emit_text(output: str | None, text: str) -> int:
    if output:
        _write(output, lambda path: Path(path).write_text(text + "\n"))
        print(f"wrote {output}")
    else:
        print(text)
    return EXIT_OK


# ----------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    """Compiles TARGET and writes its plan directory (``ConcreteFunction.export``)."""
    import graphdist as gd

    destination = Path(args.output)
    if destination.exists() and not destination.is_dir():
        raise UsageError(f"-o {args.output!r} is a file; give a directory path for the plan")
    if destination.exists() and any(destination.iterdir()) and not args.overwrite:
        raise UsageError(f"-o {args.output!r} already exists and is not empty; add --overwrite to replace it")
    if not destination.parent.exists():
        raise UsageError(f"cannot write {args.output!r}: directory {str(destination.parent)!r} does not exist")
    built = _build_target(args)
    concrete = built.concrete
    try:
        path = concrete.export(str(destination), overwrite=args.overwrite)
    except gd.PlanError as err:
        if destination.exists() and not args.overwrite:
            raise UsageError(f"{err}; add --overwrite to replace it") from err
        raise
    plan = concrete.plan
    print(f"exported {concrete.name} ({built.what}) to {args.output}")
    logger.info("plan directory: %s", path)
    print(f"  {len(plan.segments)} segment(s) on {', '.join(plan.devices)}, {plan.describe_tasks()}, "
          f"{len(concrete.variables)} variable(s), backend {plan.backend_name}")
    if args.save_inputs:
        arrays = _global_arrays(built.example_args)
        import numpy as np

        _write(args.save_inputs, lambda p: _save_npz(np, p, arrays))
        print(f"  example inputs: {args.save_inputs} ({', '.join(f'{k}: {_type_of(a)}' for k, a in arrays.items())})")
        print(f"run it with: graphdist run {args.output} --inputs {args.save_inputs}")
    else:
        print(f"run it with: graphdist run {args.output} --inputs FILE.npz (arrays arg0, arg1, ...; "
              "--save-inputs writes an example)")
    return EXIT_OK


def _save_npz(np: Any, path: str, arrays: dict[str, Any]) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def _type_of(array: Any) -> str:
    return f"{array.dtype.name}[{','.join(str(d) for d in array.shape)}]"


def _global_arrays(example_args: tuple[Any, ...]) -> dict[str, Any]:
    """The example arguments as ``arg0, arg1, ...`` arrays (per-replica values joined into the global batch)."""
    import numpy as np

    import graphdist as gd
    from graphdist import nest

    leaves, _ = nest.flatten((tuple(example_args), {}), is_leaf=lambda v: isinstance(v, gd.DistributedValues))
    arrays = {}
    for leaf in leaves:
        if isinstance(leaf, gd.DistributedValues):
            arrays[f"arg{len(arrays)}"] = np.concatenate([np.asarray(v) for v in leaf.values], axis=0)
        elif isinstance(leaf, (np.ndarray, np.generic)):
            arrays[f"arg{len(arrays)}"] = np.asarray(leaf)
    return arrays


# -------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    """Loads a plan directory and runs it on the arrays of an ``.npz`` file."""
    import numpy as np

    import graphdist as gd
    from graphdist import nest

    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    directory = Path(args.plan)
    if not directory.is_dir():
        raise UsageError(f"plan directory {args.plan!r} does not exist; write one with 'graphdist export TARGET "
                         "-o DIR'")
    arrays = _read_inputs(args.inputs)
    try:
        loaded = gd.load_plan(str(directory), backend=args.backend, trust=args.trust)
    except gd.PlanError as err:
        raise UsageError(f"cannot load plan {args.plan!r}: {err}") from err
    call_args, call_kwargs = _plan_arguments(loaded, arrays, args.inputs)
    print(f"plan {loaded.name!r} from {directory}: {len(loaded.plan.segments)} segment(s) on "
          f"{', '.join(loaded.devices)}, backend {loaded.backend_name}")
    result = None
    for step in range(1, args.steps + 1):
        try:
            result = loaded(*call_args, **call_kwargs)
        except gd.PlanError as err:
            if step == 1:
                raise UsageError(f"the inputs in {args.inputs!r} do not fit the plan: {err}") from err
            raise
        leaves, _ = nest.flatten(result, is_leaf=lambda v: isinstance(v, gd.DistributedValues))
        flat = list(zip(_output_names(loaded, len(leaves)), leaves))
        print(f"step {step}: " + "; ".join(f"{name} = {_describe_value(value)}" for name, value in flat))
    if args.output:
        leaves, _ = nest.flatten(result, is_leaf=lambda v: isinstance(v, gd.DistributedValues))
        out = {}
        for name, leaf in zip(_output_names(loaded, len(leaves)), leaves):
            if isinstance(leaf, gd.DistributedValues):
                for replica, value in enumerate(leaf.values):
                    out[f"{name}_r{replica}"] = np.asarray(value)
            else:
                out[name] = np.asarray(leaf)
        _write(args.output, lambda p: _save_npz(np, p, out))
        print(f"wrote the last step's outputs to {args.output} ({', '.join(out)})")
    if args.save:
        loaded.save()
        print(f"saved the updated variables into {directory}")
    return EXIT_OK


def _output_names(loaded: Any, count: int) -> list[str]:
    """The names of a plan's results: an ONNX model's own output names, else ``out0, out1, ...``."""
    names = list((loaded.metadata.get("io_names") or {}).get("outputs") or [])
    return names if len(names) == count and len(set(names)) == count else [f"out{i}" for i in range(count)]


def _describe_value(value: Any) -> str:
    import numpy as np

    import graphdist as gd

    if isinstance(value, gd.DistributedValues):
        return "PerReplica(" + ", ".join(_describe_value(v) for v in value.values) + ")"
    array = np.asarray(value)
    if array.ndim == 0:
        return f"{array.item():.6g}" if array.dtype.kind == "f" else str(array.item())
    if array.size and array.dtype.kind in "fiu":
        return (f"{_type_of(array)} (min {array.min():.4g}, mean {array.mean(dtype=np.float64):.4g}, "
                f"max {array.max():.4g})")
    return _type_of(array)


def _read_inputs(path: str) -> dict[str, Any]:
    import zipfile

    import numpy as np

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"inputs file {path!r} does not exist; write one with numpy.savez(path, arg0=..., "
                         "arg1=...) or 'graphdist export ... --save-inputs FILE.npz'")
    try:
        with np.load(str(file), allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError("it holds a single array, not an .npz archive")
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise UsageError(f"cannot read {path!r} as an .npz file ({' '.join(str(err).split())}); write it with "
                         "numpy.savez(path, arg0=..., arg1=...)") from err


def _ordered_arrays(arrays: dict[str, Any], input_names: list[str | None], path: str,
                   listing: str) -> list[tuple[str, Any]]:
    """The arrays in argument order: named ``arg0, arg1, ...`` (or numpy's ``arr_0, arr_1``), or by the
    plan's input names (``input_names``, one per array argument); any other key is refused.
    """
    import re

    numbered: dict[int, str] = {}
    for name in arrays:
        match = re.fullmatch(r"(?:arg|arr_)(\d+)", name)
        if match is not None:
            numbered[int(match.group(1))] = name
    if len(numbered) == len(arrays):
        return [(numbered[i], arrays[numbered[i]]) for i in sorted(numbered)]
    by_name = {name: index for index, name in enumerate(input_names) if name}
    unknown = [name for name in arrays if name not in by_name]
    if unknown:
        accepted = ", ".join(f"arg{i}" + (f" or {n}" if n else "") for i, n in enumerate(input_names)) or "none"
        raise UsageError(f"{path!r} holds array(s) named {', '.join(repr(n) for n in unknown)}, which match no input "
                         f"of the plan (it takes {listing}); name the arrays {accepted} "
                         "(numpy.savez(path, arg0=x, ...))")
    return sorted(arrays.items(), key=lambda item: by_name[item[0]])


def _plan_arguments(loaded: Any, arrays: dict[str, Any], path: str) -> tuple[tuple, dict]:
    """The call arguments of a loaded plan: its array arguments from ``arrays``, constants as recorded."""
    from graphdist import nest
    from graphdist.compile.plan_files import decode_treedef

    arguments = loaded.metadata["arguments"]
    leaves_spec = arguments["leaves"]
    expected = []
    for spec in leaves_spec:
        if spec["kind"] == "tensor":
            info = loaded._inputs[spec["input"]]
            expected.append(f"{info['dtype'].name}{list(info['shape'])}")
        elif spec["kind"] == "per_replica":
            shapes = [loaded._inputs[n]["shape"] for n in spec["inputs"]]
            dtype = loaded._inputs[spec["inputs"][0]]["dtype"]
            total = sum(int(s[0]) for s in shapes) if all(len(s) for s in shapes) else "?"
            expected.append(f"{dtype.name}[{total}{''.join(f',{d}' for d in shapes[0][1:])}] (global batch, split "
                            f"across {len(shapes)} replicas)")
    listing = "; ".join(f"arg{i}: {e}" for i, e in enumerate(expected)) or "none"
    input_names = list((loaded.metadata.get("io_names") or {}).get("inputs") or [])
    if len(input_names) != len(expected):
        input_names = [spec.get("input") for spec in leaves_spec if spec["kind"] in ("tensor", "per_replica")]
    given = _ordered_arrays(arrays, input_names, path, listing)
    if len(given) != len(expected):
        raise UsageError(f"{path!r} holds {len(given)} array(s) ({', '.join(n for n, _ in given) or 'none'}) but the "
                         f"plan takes {len(expected)}: {listing}")
    feed = iter(value for _, value in given)
    values = []
    for index, spec in enumerate(leaves_spec):
        kind = spec["kind"]
        if kind in ("tensor", "per_replica"):
            values.append(next(feed))
        elif kind == "const":
            values.append(spec["value"])
        else:
            raise UsageError(f"argument leaf {index} of plan {loaded.name!r} is a {kind} argument; 'graphdist run' "
                             "feeds arrays only: call the plan from Python (gd.load_plan(directory)(...))")
    args, kwargs = nest.unflatten(decode_treedef(arguments["structure"], "arguments.structure"), values)
    return tuple(args), dict(kwargs)


# ----------------------------------------------------------------- parser
_MAIN_EPILOG = """\
examples:
  graphdist devices
  graphdist inspect graphdist.models.mlp:forward
  graphdist inspect graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 --stage rewritten
  graphdist inspect graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 --stage plan -o plan.svg
  graphdist inspect graphdist.models.mlp:forward --format onnx -o mlp.onnx   # open in Netron
  graphdist inspect mlp.onnx --strategy mirrored --devices cpu:0,cpu:1 --stage plan
  graphdist export graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 -o mlp_plan \\
      --save-inputs mlp_inputs.npz
  graphdist run mlp_plan --inputs mlp_inputs.npz --steps 3
  graphdist replan mlp_plan --strategy mirrored --devices cpu:0,cpu:1,cpu:2,cpu:3 -o mlp_four
  graphdist launch --workers 2 -- python examples/digits_multi_worker.py
  graphdist bench graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 --compare ort,tvm

exit status: 0 ok, 1 graphdist failed, 2 usage error
"""

_DEVICES_EPILOG = """\
example:
  graphdist devices
"""

_TARGET_HELP = """\
TARGET is one of:
  module:function   a function and example inputs (function.example_inputs or the
                    module's example_inputs(), a callable returning a tuple of arrays).
                    Without --strategy it is traced as is; with --strategy it runs in
                    strategy.run, its batch split across the replicas.
  module:make_step  a factory make_step(strategy) -> (step, example_args) (any function
                    named make_step* or whose first parameter is 'strategy'): step is a
                    gd.function (e.g. strategy.run of a train step + strategy.reduce)
                    and example_args its arguments (distributed values, e.g. a batch of
                    strategy.experimental_distribute_dataset: a plain array reaches every
                    replica whole, and a warning says so); graphdist.models.mlp/convnet/transformer
                    have one.
  path/model.onnx   a data-parallel inference step for the model: every input split
                    along axis 0 across the replicas, outputs gathered back;
                    --input-shape NAME=D0xD1x... sets an input's shape (D0: the global
                    batch) where the model leaves dimensions unknown.

--strategy: one_device (first of --devices, default cpu:0), mirrored, central_storage,
default, model_parallel; factories and .onnx targets default to one_device on cpu:0.
--devices: a comma-separated list (cpu:0,cpu:1).

model_parallel (gd.experimental.ModelParallelStrategy, Keras 3's names): --mesh
batch=2,model=2 is the DeviceMesh over --devices (row-major; default cpu:0...);
--layout 'PATTERN=AXES' (repeatable) a LayoutMap entry: variables whose name the
regular expression matches get one mesh axis or None per dimension; --batch-dim-name
the axis the batch is split over. --mesh alone implies model_parallel. An .onnx
target's variables are its initializers, by their names in the file.
"""

_INSPECT_EPILOG = _TARGET_HELP + """
stages: traced, rewritten, partitioned (graphs), plan (segments per device and
communication), diff (what each pass of the strategy's pipeline added, removed or changed).
formats: text (tables), dot (Graphviz text), svg and png (need Graphviz's 'dot'), onnx
(a graph stage; graphdist-domain nodes for collectives/placement). Without --format, the
suffix of -o picks it (.svg, .png, .dot, .onnx).

examples:
  graphdist inspect graphdist.models.mlp:forward
  graphdist inspect graphdist.models.mlp:forward --stage rewritten
  graphdist inspect graphdist.models.mlp:forward --format onnx -o mlp.onnx
  graphdist inspect graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 --stage plan
  graphdist inspect graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 --stage diff
  graphdist inspect graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 \\
      --stage partitioned -o mlp.svg
  graphdist inspect mlp.onnx --strategy mirrored --devices cpu:0,cpu:1 --batch 16
  graphdist inspect resnet.onnx --input-shape data=8x3x224x224 --strategy mirrored --devices cpu:0,cpu:1
"""

_EXPORT_EPILOG = _TARGET_HELP + """
The plan directory (plan.json, one ONNX model per segment, variables, the traced,
rewritten and partitioned graphs) runs without the Python code: gd.load_plan(DIR)
or 'graphdist run DIR --inputs FILE.npz'.

examples:
  graphdist export graphdist.models.mlp:make_step --strategy mirrored --devices cpu:0,cpu:1 -o mlp_plan \\
      --save-inputs mlp_inputs.npz
  graphdist export mlp.onnx --strategy mirrored --devices cpu:0,cpu:1 -o mlp_inference
  graphdist export graphdist.models.mlp:make_step --mesh batch=1,model=2 \\
      --layout 'dense_0/kernel=None,model' --layout 'dense_1/kernel=model,None' -o mlp_tp
  graphdist export digits_mlp.onnx --mesh batch=2,model=2 --devices cpu:0,cpu:1,cpu:2,cpu:3 \\
      --layout '^coefficient$=None,model' --layout '^coefficient1$=model,None' -o digits_tp
"""

_RUN_EPILOG = """\
FILE.npz holds one array per array argument of the exported step, named arg0, arg1,
... (numpy.savez(path, arg0=x, arg1=labels)); where the step took per-replica values,
give the global batch: it is split across the replicas. Every step updates the plan's
variables (--save writes them back into DIR). A plan not signed with your key
loads only from a folder no other user can write, unless you pass --trust.

examples:
  graphdist run mlp_plan --inputs mlp_inputs.npz
  graphdist run mlp_plan --inputs mlp_inputs.npz --steps 5 --save
  graphdist run mlp_plan --inputs mlp_inputs.npz -o outputs.npz
"""


def _add_target_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("target", metavar="TARGET",
                         help="module:function, module:make_step, path/to/model.onnx (inspect: or a plan "
                              "directory)")
    command.add_argument("--strategy", metavar="NAME", default=None,
                         help=f"distribution strategy: {', '.join(_strategy_choices())}, model_parallel (with "
                              "--mesh and --layout) (default: none for plain functions, one_device otherwise)")
    command.add_argument("--devices", metavar="LIST", default=None,
                         help="comma-separated devices, e.g. cpu:0,cpu:1 (default: the strategy's default)")
    command.add_argument("--batch", type=int, metavar="N", default=None,
                         help="global batch size of the example inputs (.onnx targets, factories and "
                              "example_inputs() taking 'batch')")
    command.add_argument("--backend", choices=backend_choices(), default=None,
                         help="backend that compiles the plan (default: $GRAPHDIST_BACKEND or ort)")
    from graphdist.cli.onnx_target import add_input_shape_option

    add_input_shape_option(command)
    from graphdist.cli.mesh import add_mesh_options

    add_mesh_options(command)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``graphdist`` (``devices``, ``inspect``, ``export``, ``run``, ``replan``, ``launch``,
    ``bench``).
    """
    from graphdist import __version__

    formatter = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=PROG,
        description="graphdist: the tf.distribute programming model for numpy code, compiled through ONNX.",
        epilog=_MAIN_EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--synopsis", action="store_true",
                        help="print one usage line per command (the synopsis in the docs) and exit")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log progress (-vv: debug log and tracebacks on errors)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    devices = commands.add_parser(
        "devices", help="list the devices that can run now, host cores and backends",
        description="List the devices that can run now (gd.config.list_devices()), the host's cores and "
                    "the available compile backends.",
        epilog=_DEVICES_EPILOG, formatter_class=formatter)
    devices.set_defaults(handler=cmd_devices)

    inspect_cmd = commands.add_parser(
        "inspect", help="print a traced function's graph at a stage, its plan or its passes' diffs",
        description=textwrap.dedent("""\
            Trace and compile TARGET (under --strategy) and show a stage: the graph (traced,
            rewritten, partitioned) as tables, DOT, a picture (SVG/PNG) or ONNX (opens in
            Netron), the plan (segments per device, collectives, bytes per step), or what
            each pass changed (diff)."""),
        epilog=_INSPECT_EPILOG, formatter_class=formatter)
    _add_target_options(inspect_cmd)
    inspect_cmd.add_argument("--stage", choices=STAGES, default=None,
                             help="what to show (default: traced)")
    inspect_cmd.add_argument("--format", choices=FORMATS, default=None,
                             help="text (default), dot, svg, png or onnx; default: from the suffix of -o")
    inspect_cmd.add_argument("-o", "--output", metavar="PATH", help="write to PATH instead of stdout")
    inspect_cmd.set_defaults(handler=cmd_inspect)

    export_cmd = commands.add_parser(
        "export", help="compile a target and write its plan directory (runs without the Python code)",
        description="Trace and compile TARGET (under --strategy) and write its plan to DIR "
                    "(ConcreteFunction.export): load it with gd.load_plan(DIR) or 'graphdist run'.",
        epilog=_EXPORT_EPILOG, formatter_class=formatter)
    _add_target_options(export_cmd)
    export_cmd.add_argument("-o", "--output", metavar="DIR", required=True, help="plan directory to write")
    export_cmd.add_argument("--overwrite", action="store_true", help="replace an existing plan directory")
    export_cmd.add_argument("--save-inputs", metavar="FILE.npz",
                            help="also write the example inputs (global batch) for 'graphdist run'")
    export_cmd.set_defaults(handler=cmd_export)

    run_cmd = commands.add_parser(
        "run", help="run an exported plan directory on inputs from an .npz file",
        description="Load a plan directory written by 'graphdist export' (gd.load_plan) and run it on the "
                    "arrays of FILE.npz, --steps times; prints each step's outputs.",
        epilog=_RUN_EPILOG, formatter_class=formatter)
    run_cmd.add_argument("plan", metavar="DIR", help="plan directory (from 'graphdist export')")
    run_cmd.add_argument("--inputs", metavar="FILE.npz", required=True,
                         help="arrays arg0, arg1, ... (the step's array arguments)")
    run_cmd.add_argument("--steps", type=int, default=1, metavar="N", help="number of steps to run (default 1)")
    run_cmd.add_argument("-o", "--output", metavar="OUT.npz", help="write the last step's outputs to OUT.npz")
    run_cmd.add_argument("--save", action="store_true", help="write the updated variables back into DIR")
    run_cmd.add_argument("--backend", choices=backend_choices(), default=None,
                         help="backend to compile with (default: the one recorded at export)")
    run_cmd.add_argument("--trust", action="store_true", help=TRUST_HELP)
    run_cmd.set_defaults(handler=cmd_run)

    from graphdist.cli.launch import add_launch_parser

    add_launch_parser(commands, formatter)
    from graphdist.cli.bench import add_bench_parser

    add_bench_parser(commands, formatter)
    from graphdist.cli.replan import add_replan_parser

    add_replan_parser(commands, formatter)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format=f"{PROG}: %(levelname)s: %(name)s: %(message)s", stream=sys.stderr)


def _fail(message: str, status: int, verbose: bool) -> int:
    if verbose:
        logger.debug("traceback:", exc_info=True)
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return status


#: Width of the synopsis lines (fixed, so the text does not depend on the terminal).
SYNOPSIS_WIDTH = 110


def subcommands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, by name, in the order ``graphdist --help`` lists them."""
    parser = parser or build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def synopsis() -> str:
    """One usage line (wrapped) per subcommand, generated from the parser (the docs show this text;
    ``graphdist --synopsis`` prints it).
    """
    blocks = []
    for command in subcommands().values():
        formatter = argparse.HelpFormatter(command.prog, width=SYNOPSIS_WIDTH)
        usable = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
        formatter.add_usage(command.usage, usable, command._mutually_exclusive_groups, prefix="")
        blocks.append(formatter.format_help().strip())
    return "\n".join(blocks) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``graphdist`` command line.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 ok, 1 graphdist failed, 2 usage error.
    """
    parser = build_parser()
    if list(argv if argv is not None else sys.argv[1:]) == ["--synopsis"]:
        sys.stdout.write(synopsis())
        return EXIT_OK
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and argument errors
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    _configure_logging(args.verbose)
    if args.command is None:
        parser.print_help(sys.stderr)
        return _fail("no command given; choose one of: devices, inspect, export, run, replan, launch, bench",
                     EXIT_USAGE, False)
    verbose = args.verbose >= 2
    from graphdist.cli.feedback import announce_slow_compiles
    from graphdist.errors import GraphdistError

    try:
        with announce_slow_compiles(PROG):
            status = args.handler(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader (e.g. ``| head``) went away: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE
    except UsageError as err:
        return _fail(str(err), EXIT_USAGE, verbose)
    except GraphdistError as err:
        return _fail(f"{type(err).__name__}: {err}", EXIT_FAILURE, verbose)
    except NotImplementedError as err:  # graphdist's "not built yet": a valid request it cannot do
        return _fail(f"not supported yet: {err}", EXIT_FAILURE, verbose)
    except _TargetError as err:
        return _fail(str(err), EXIT_FAILURE, verbose)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the CLI never shows a raw traceback
        return _fail(f"unexpected {type(err).__name__}: {err} (rerun with -vv for the traceback and report it)",
                     EXIT_FAILURE, verbose)


if __name__ == "__main__":
    # Run the package's copy of this module: under ``python -m`` this file is also ``__main__``, and the
    # subcommands in other modules (launch, bench) raise graphdist.cli.main.UsageError, which this copy's
    # ``except UsageError`` would not catch.
    from graphdist.cli.main import main as package_main

    sys.exit(package_main())
