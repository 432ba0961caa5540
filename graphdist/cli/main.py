"""The ``graphdist`` command line.

Subcommands:

* ``graphdist devices``: devices that can run now, host cores, backends.
* ``graphdist inspect TARGET``: trace ``module:function`` (on the module's
  example inputs) and print its graph at a stage, or print an ``.onnx`` file
  as a graphdist graph; ``--format onnx -o PATH`` writes the graph as ONNX.

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

__all__ = ["main", "build_parser", "UsageError"]

logger = logging.getLogger(__name__)

PROG = "graphdist"
STAGES = ("traced", "rewritten", "partitioned")
FORMATS = ("text", "onnx")
BACKENDS = ("ort", "reference")

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


# ---------------------------------------------------------------- inspect
def cmd_inspect(args: argparse.Namespace) -> int:
    """Prints (or writes) the graph of a ``module:function`` or ``.onnx`` target."""
    if args.format == "onnx" and not args.output:
        raise UsageError("--format onnx writes a binary file: give its path with -o PATH, e.g. -o graph.onnx")
    if _is_onnx_path(args.target):
        if args.stage not in (None, "traced"):
            raise UsageError(
                f"--stage {args.stage} needs a module:function target; an .onnx file is imported as "
                "stage 'traced' (drop --stage)"
            )
        graph = _load_onnx_graph(args.target)
    elif ":" in args.target:
        graph = _trace_target(args.target, args.stage or "traced", args.backend)
    else:
        raise UsageError(
            f"TARGET {args.target!r} is neither 'module:function' (e.g. models.mlp:forward) nor a path "
            "to an .onnx file; add ':function' after the module name"
        )

    if args.format == "onnx":
        import onnx

        model = graph.to_onnx()
        _write(args.output, lambda path: onnx.save(model, path))
        print(f"wrote {args.output} ({len(graph.nodes)} nodes, ONNX IR version {model.ir_version})")
        return EXIT_OK
    text = graph.summary()
    if args.output:
        _write(args.output, lambda path: Path(path).write_text(text + "\n"))
        print(f"wrote {args.output}")
    else:
        print(text)
    return EXIT_OK


def _is_onnx_path(target: str) -> bool:
    return target.lower().endswith(".onnx")


def _write(path: str, writer: Callable[[str], Any]) -> None:
    try:
        writer(path)
    except OSError as err:
        raise UsageError(f"cannot write {path!r}: {err.strerror or err}; check that the directory exists "
                         "and is writable") from err


def _load_onnx_graph(path: str) -> Any:
    import onnx

    from graphdist.ir import from_onnx

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"ONNX file {path!r} does not exist; check the path")
    try:
        model = onnx.load(str(file))
        onnx.checker.check_model(model)
    except Exception as err:  # noqa: BLE001 - protobuf and checker raise many types
        reason = " ".join(str(err).split()) or type(err).__name__
        raise UsageError(
            f"cannot read {path!r} as an ONNX model ({reason}); give a valid .onnx file "
            "(one that onnx.checker.check_model accepts)"
        ) from err
    return from_onnx(model)


def _trace_target(target: str, stage: str, backend: str | None) -> Any:
    import graphdist as gd

    module_name, _, attr_path = target.rpartition(":")
    if not module_name or not attr_path:
        raise UsageError(f"TARGET {target!r} must be 'module:function', e.g. models.mlp:forward")
    module = _import_module(module_name)
    fn = _get_attribute(module, module_name, attr_path)
    inputs = _example_inputs(module, module_name, fn, attr_path)
    function = fn if isinstance(fn, gd.Function) else gd.function(fn, backend=backend, name=attr_path)
    if backend is not None and isinstance(fn, gd.Function):
        logger.warning("%s is already a gd.function; --backend %s is ignored", attr_path, backend)
    logger.info("tracing %s on %d example input(s)", target, len(inputs))
    try:
        concrete = function.get_concrete_function(*inputs)
    except gd.GraphdistError:
        raise
    except Exception as err:
        raise _TargetError(f"{attr_path} failed while tracing: {type(err).__name__}: {err}") from err
    return concrete.graph(stage)


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


def _example_inputs(module: Any, module_name: str, fn: Any, attr_path: str) -> tuple[Any, ...]:
    """Example inputs from ``fn.example_inputs`` else the module's ``example_inputs()``."""
    candidates = [(f"{attr_path}.example_inputs", getattr(fn, "example_inputs", None)),
                  (f"{module_name}.example_inputs", getattr(module, "example_inputs", None))]
    for where, source in candidates:
        if source is None:
            continue
        if callable(source):
            try:
                source = source()
            except Exception as err:
                raise UsageError(f"{where}() failed: {type(err).__name__}: {err}") from err
        if isinstance(source, list):
            source = tuple(source)
        if not isinstance(source, tuple):
            source = (source,)
        logger.debug("example inputs from %s", where)
        return source
    raise UsageError(
        f"no example inputs for {module_name}:{attr_path}: define example_inputs() in module {module_name!r} "
        f"returning a tuple of arrays (e.g. `return (np.zeros((8, 64), np.float32),)`), or set "
        f"{attr_path}.example_inputs"
    )


# ----------------------------------------------------------------- parser
_MAIN_EPILOG = """\
examples:
  graphdist devices
  graphdist inspect models.mlp:forward
  graphdist inspect models.mlp:forward --stage partitioned
  graphdist inspect models.mlp:forward --format onnx -o mlp.onnx   # open in Netron
  graphdist inspect mlp.onnx

exit status: 0 ok, 1 graphdist failed, 2 usage error
"""

_DEVICES_EPILOG = """\
example:
  graphdist devices
"""

_INSPECT_EPILOG = """\
TARGET is module:function (example inputs come from function.example_inputs or
the module's example_inputs(), a callable returning a tuple of arrays) or a
path to an .onnx file (imported as stage 'traced').

examples:
  graphdist inspect models.mlp:forward
  graphdist inspect models.mlp:forward --stage rewritten
  graphdist inspect models.mlp:forward --format onnx -o mlp.onnx
  graphdist inspect mlp.onnx
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``graphdist`` (subcommands ``devices``, ``inspect``)."""
    from graphdist import __version__

    formatter = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=PROG,
        description="graphdist: the tf.distribute programming model for numpy code, compiled through ONNX.",
        epilog=_MAIN_EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
        "inspect", help="print a traced function's graph at a stage, or an .onnx file",
        description=textwrap.dedent("""\
            Trace and compile a function on its example inputs and print its graph at a stage
            (traced, rewritten, partitioned), or import an .onnx file and print it.
            --format onnx -o PATH writes the graph as ONNX (opens in Netron)."""),
        epilog=_INSPECT_EPILOG, formatter_class=formatter)
    inspect_cmd.add_argument("target", metavar="TARGET", help="module:function or path/to/model.onnx")
    inspect_cmd.add_argument("--stage", choices=STAGES, default=None,
                         help="graph stage to show (default: traced)")
    inspect_cmd.add_argument("--format", choices=FORMATS, default="text",
                         help="text: summary table (default); onnx: write an ONNX model to -o")
    inspect_cmd.add_argument("-o", "--output", metavar="PATH", help="write to PATH instead of stdout")
    inspect_cmd.add_argument("--backend", choices=BACKENDS, default=None,
                         help="backend that compiles the plan (default: $GRAPHDIST_BACKEND or ort)")
    inspect_cmd.set_defaults(handler=cmd_inspect)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format=f"{PROG}: %(levelname)s: %(name)s: %(message)s", stream=sys.stderr)


def _fail(message: str, status: int, verbose: bool) -> int:
    if verbose:
        logger.debug("traceback:", exc_info=True)
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``graphdist`` command line.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 ok, 1 graphdist failed, 2 usage error.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and argument errors
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    _configure_logging(args.verbose)
    if args.command is None:
        parser.print_help(sys.stderr)
        return _fail("no command given; choose one of: devices, inspect", EXIT_USAGE, False)
    verbose = args.verbose >= 2
    from graphdist.errors import GraphdistError

    try:
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
    except _TargetError as err:
        return _fail(str(err), EXIT_FAILURE, verbose)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the CLI never shows a raw traceback
        return _fail(f"unexpected {type(err).__name__}: {err} (rerun with -vv for the traceback and report it)",
                     EXIT_FAILURE, verbose)


if __name__ == "__main__":
    sys.exit(main())
