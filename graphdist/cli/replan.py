"""``graphdist replan DIR --strategy S [--devices ...] -o OUT``: a plan directory for another strategy.

Loads the plan directory (its traced step, interface and variables), re-plans
it for the strategy named on the command line with that strategy's passes
(``gd.load_plan(DIR).replan(strategy)``), and writes the new plan to OUT. No
Python code of the step is needed. Multi-process strategies
(``multi_worker_mirrored``, ``parameter_server``) are made from the cluster
``graphdist launch`` sets up, so run ``graphdist replan`` under it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_replan_parser", "cmd_replan"]

_EPILOG = """\
The plan keeps its variables' values and its global batch: a plan exported for 2
replicas of 8 rows, re-planned for 4 replicas, runs 4 replicas of 4 rows. The replica
count must divide the global batch. Strategies: one_device, mirrored, central_storage,
tpu, model_parallel (one process), multi_worker_mirrored, parameter_server (run under
graphdist launch). model_parallel takes --mesh and --layout as export does; the
--layout patterns are matched against the plan's variables (a warning for a pattern
matching none: an .onnx model exported for inference under another strategy holds
its weights as constants, not variables).

examples:
  graphdist replan mlp_plan --strategy one_device -o mlp_one
  graphdist replan mlp_plan --strategy mirrored --devices cpu:0,cpu:1,cpu:2,cpu:3 -o mlp_four
  graphdist replan mlp_plan --strategy central_storage --devices cpu:0,cpu:1 -o mlp_central
  graphdist replan mlp_plan --strategy model_parallel --mesh batch=1,model=2 \\
      --layout 'dense_0/kernel=None,model' --layout 'dense_1/kernel=model,None' -o mlp_tp
  graphdist launch --workers 2 -- graphdist replan mlp_plan --strategy multi_worker_mirrored -o mlp_mw
"""


def add_replan_parser(commands: Any, formatter: type) -> None:
    """Adds ``graphdist replan`` to the command parsers."""
    from graphdist.cli.main import TRUST_HELP, backend_choices
    from graphdist.distribute.registry import strategy_names

    command = commands.add_parser(
        "replan", help="re-plan an exported plan directory for another strategy or device count",
        description="Re-plan the plan in DIR (written by 'graphdist export' or plan.export) for --strategy "
                    "with its passes, from the traced step stored in DIR, and write it to OUT.",
        epilog=_EPILOG, formatter_class=formatter)
    command.add_argument("plan", metavar="DIR", help="plan directory to re-plan")
    command.add_argument("--strategy", metavar="S",
                         help=", ".join((*(name for name in strategy_names() if name != "default"),
                                         "model_parallel (with --mesh and --layout)"))
                              + " (required unless --mesh is given)")
    command.add_argument("--devices", metavar="D0,D1,...", help="the strategy's devices (this worker's, under launch)")
    command.add_argument("-o", "--output", metavar="OUT", required=True, help="plan directory to write")
    command.add_argument("--overwrite", action="store_true", help="replace an existing plan directory at OUT")
    command.add_argument("--backend", choices=backend_choices(), default=None,
                         help="backend to compile with (default: the strategy's, tvm for tpu; else the plan's)")
    command.add_argument("--trust", action="store_true", help=TRUST_HELP)
    from graphdist.cli.mesh import add_mesh_options

    add_mesh_options(command)
    command.set_defaults(handler=cmd_replan)


def cmd_replan(args: argparse.Namespace) -> int:
    """Re-plans ``args.plan`` for ``args.strategy`` and writes it to ``args.output``."""
    import graphdist as gd
    from graphdist.cli.main import EXIT_OK, UsageError

    if not Path(args.plan).is_dir():
        raise UsageError(f"plan directory {args.plan!r} does not exist; write one with 'graphdist export TARGET "
                         "-o DIR'")
    strategy = _strategy(args)
    try:
        loaded = gd.load_plan(args.plan, backend=args.backend, trust=args.trust)
    except gd.PlanError as err:
        raise UsageError(f"cannot load plan {args.plan!r}: {err}") from err
    if isinstance(strategy, gd.experimental.ModelParallelStrategy):
        from graphdist.cli.mesh import check_layouts_against_variables

        check_layouts_against_variables(strategy, loaded.variables, f"plan {args.plan!r}")
    replanned = loaded.replan(strategy, backend=args.backend)
    if _is_chief(strategy):
        replanned.save(args.output, overwrite=args.overwrite)
        print(f"re-planned {loaded.name!r} from {args.plan} ({', '.join(loaded.devices)}) for {strategy!r}: "
              f"{len(replanned.plan.segments)} segment(s) on {', '.join(replanned.devices)}, "
              f"{replanned.plan.describe_tasks()}; wrote {args.output}")
    return EXIT_OK


def _strategy(args: argparse.Namespace) -> Any:
    import graphdist as gd
    from graphdist.cli.main import UsageError, _make_strategy, _mesh_flags, _parse_devices
    from graphdist.distribute.registry import normalise_strategy_name, strategy_entry, strategy_names

    name, devices_text = args.strategy, args.devices
    if name is None and not _mesh_flags(args):
        raise UsageError("the following arguments are required: --strategy (or --mesh for model_parallel)")
    key = normalise_strategy_name(name or "model_parallel")
    if key not in strategy_names(multi_process=True):
        if key == "default":
            raise UsageError("--strategy default is the no-op strategy of one process; name the strategy to re-plan "
                             "for (one_device, mirrored, central_storage, tpu, ...)")
        return _make_strategy(name, devices_text, args)
    devices = _parse_devices(devices_text)
    try:
        return strategy_entry(key).make(devices)
    except gd.GraphdistError as err:
        raise UsageError(f"cannot create {key} strategy: {err} (multi-process strategies are made inside "
                         "'graphdist launch --workers N [--ps M] -- graphdist replan ...')") from err


def _is_chief(strategy: Any) -> bool:
    """Only one process of a multi-worker job writes the re-planned directory."""
    extended = getattr(strategy, "extended", None)
    return bool(getattr(extended, "should_checkpoint", True))
