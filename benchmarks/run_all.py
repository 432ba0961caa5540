"""Runs every benchmark (``benchmarks/bench_*.py``) and writes BENCHMARKS.md.

    python -m benchmarks.run_all [--quick] [--only run_overhead] [--no-write]

Each module's ``run()`` is called, its table printed, and BENCHMARKS.md is
rewritten with the machine description and one section per benchmark (in
module name order).

``train_step`` (``bench_train_step``) also times TensorFlow when its own
environment exists (``python -m benchmarks.bench_train_step --setup-tf``
creates ``.bench-venvs/tf``); without it that part is skipped and the
section says so. ``mirrored_train`` and ``keras_fit`` (``bench_keras_fit``:
``gd.keras`` ``fit`` against TensorFlow Keras' ``fit``, both under
MirroredStrategy on 2 logical CPUs) use the same environment.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import time
from collections.abc import Sequence
from types import ModuleType

import benchmarks
from benchmarks import BENCHMARKS_MD, machine_info, update_section, write_document

__all__ = ["discover", "main"]

logger = logging.getLogger(__name__)


def discover() -> list[ModuleType]:
    """The benchmark modules (``benchmarks.bench_*``), sorted by name."""
    names = sorted(info.name for info in pkgutil.iter_modules(benchmarks.__path__) if info.name.startswith("bench_"))
    return [importlib.import_module(f"benchmarks.{name}") for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmarks (a module's results may say ``goal_met``).

    Returns:
        0 when every benchmark met its goal, 1 otherwise.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_all", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few calls and rounds (noisy)")
    parser.add_argument("--only", metavar="NAME", action="append",
                        help="run only this benchmark (its NAME, e.g. run_overhead); repeatable")
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    modules = [m for m in discover() if not args.only or m.NAME in args.only]
    if not modules:
        parser.error(f"no benchmark named {args.only}; choose from {[m.NAME for m in discover()]}")
    info = machine_info()  # before measuring: the load average says how busy the machine was
    sections: dict[str, str] = {}
    status = 0
    for module in modules:
        start = time.perf_counter()
        results = module.run(quick=args.quick)
        print(module.table(results))
        print(f"({module.NAME}: {time.perf_counter() - start:.1f} s)\n")
        sections[module.NAME] = module.markdown(results)
        if not results.get("goal_met", True):
            logger.warning("%s missed its goal", module.NAME)
            status = 1
    if not args.no_write:
        if args.only:
            for name, text in sections.items():
                update_section(name, text, info=info)
        else:
            write_document(sections, info=info)
        print(f"wrote {BENCHMARKS_MD}")
    return status


if __name__ == "__main__":
    sys.exit(main())
