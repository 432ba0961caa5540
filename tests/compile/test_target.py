"""The boundary between strategies and compilation: the ``CompileTarget`` protocol, no private access across
packages from ``graphdist/compile``, and no thread-local carrying the strategy into compilation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import graphdist as gd
from graphdist.compile.function import Function
from graphdist.compile.pipeline import PipelineConfig, build_pipeline, pass_context
from graphdist.compile.target import CompileTarget
from graphdist.distribute.strategy import Strategy
from graphdist.trace.variables import Variable

REPO = Path(__file__).resolve().parents[2]
COMPILE = REPO / "graphdist" / "compile"
#: What compilation may use of a strategy (the protocol's members).
MEMBERS = sorted(name for name in vars(CompileTarget) if not name.startswith("_"))


# ------------------------------------------------------------ the AST scan
def _is_private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def _private_names_defined(paths: list[Path]) -> set[str]:
    """Private attribute names the classes of ``paths`` define (methods, class attributes, ``self._x = ...``)."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(item.name):
                        names.add(item.name)
                    targets = item.targets if isinstance(item, ast.Assign) else (
                        [item.target] if isinstance(item, ast.AnnAssign) else [])
                    names.update(t.id for t in targets if isinstance(t, ast.Name) and _is_private(t.id))
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id in ("self", "cls") and _is_private(target.attr)):
                        names.add(target.attr)
    return names


def private_accesses(source: str, own: set[str]) -> list[str]:
    """``obj._name`` accesses in ``source`` that reach into another package's objects.

    Allowed: ``self._x`` / ``cls._x``, ``Name._x`` where ``Name`` is a class or function of the module, and
    ``obj._x`` where ``_x`` is in ``own`` (a private name that classes of this package define and no class
    of another package does, so ``obj`` is one of this package's objects).
    """
    tree = ast.parse(source)
    module_names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        value = node.value
        if isinstance(value, ast.Name) and (value.id in ("self", "cls") or value.id in module_names):
            continue
        if node.attr not in own:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _own_private_names() -> set[str]:
    mine = _private_names_defined(sorted(COMPILE.glob("*.py")))
    others = [p for p in (REPO / "graphdist").rglob("*.py") if COMPILE not in p.parents]
    return mine - _private_names_defined(others)


def test_compile_reads_no_private_member_of_another_package() -> None:
    own = _own_private_names()
    found = {path.name: private_accesses(path.read_text(), own) for path in sorted(COMPILE.glob("*.py"))}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_the_scan_finds_what_compile_used_to_do() -> None:
    # What graphdist/compile did before the CompileTarget protocol: each one is found.
    before = ("def f(strategy, variable, v):\n"
              "    strategy._variable_placement(spec, variable)\n"
              "    variable._write_parts(parts)\n"
              "    return v._strategy if v._lives_remotely else None\n")
    found = private_accesses(before, _own_private_names())
    assert [hit.split(": ")[1] for hit in found] == ["strategy._variable_placement", "variable._write_parts",
                                                     "v._lives_remotely", "v._strategy"]
    assert private_accesses("class A:\n    def f(self):\n        return self._x, A._y\n", set()) == []


def _uses(name: str) -> list[str]:
    hits = []
    for path in sorted(COMPILE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == name) or (isinstance(node, ast.Name)
                                                                           and node.id == name):
                hits.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                hits.append(f"{path.name}:{node.lineno}")
    return hits


def test_compile_does_not_find_the_strategy_through_the_thread_local_scope() -> None:
    assert _uses("current_strategy") == []
    imports = [f"{path.name}:{node.lineno}" for path in sorted(COMPILE.glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and node.module == "graphdist.trace"
               and any(alias.name == "context" for alias in node.names)]
    assert imports == []


def test_compile_does_not_duck_type_strategies() -> None:
    assert _uses("hasattr") == []


# ------------------------------------------------------------ the protocol
def _strategy_classes() -> list[type]:
    import graphdist.distribute  # noqa: F401  (every strategy module)

    classes, todo = [], [Strategy]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in classes if c.__module__.startswith("graphdist.")]


def test_the_protocol_is_what_compile_needs() -> None:
    assert MEMBERS == ["communicator", "name", "pipeline_config", "scope", "value_placement", "variable_placement"]


@pytest.mark.parametrize("cls", _strategy_classes(), ids=lambda c: c.__name__)
def test_every_strategy_class_implements_the_protocol(cls: type) -> None:
    missing = [name for name in MEMBERS if not hasattr(cls, name)]
    assert missing == []
    inherited_privately = [name for name in ("_variable_placement", "_place_value") if hasattr(cls, name)]
    assert inherited_privately == []


@pytest.mark.parametrize("make", [
    lambda: gd.OneDeviceStrategy("cpu:0"),
    lambda: gd.MirroredStrategy(["cpu:0", "cpu:1"]),
    lambda: gd.distribute.experimental.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    lambda: gd.distribute.get_strategy(),
], ids=["one_device", "mirrored", "central_storage", "default"])
def test_strategies_are_compile_targets(make) -> None:
    strategy = make()
    assert isinstance(strategy, CompileTarget)
    assert strategy.name == type(strategy).__name__
    assert strategy.communicator is None  # one process: nothing between workers
    config = strategy.pipeline_config()
    assert config.strategy == strategy.name and config.devices == tuple(strategy.extended.worker_devices)


def test_something_else_is_not_a_compile_target() -> None:
    assert not isinstance(object(), CompileTarget)
    with pytest.raises(gd.errors.PlanError, match="must be a gd.Strategy"):
        from graphdist.compile.replan import replan

        replan(None, "MirroredStrategy")  # type: ignore[arg-type]


# ------------------------------------------------------------ one channel for devices
def test_the_pass_context_takes_its_devices_from_the_config() -> None:
    config = PipelineConfig(devices=("cpu:0", "cpu:1"), replicas_in_sync=4, replica_offset=2)
    ctx = pass_context(config, dump_dir=None)
    assert ctx.devices == ("cpu:0", "cpu:1") and ctx.dump_dir is None
    replicate = build_pipeline(config).slots["replicate"][0]
    assert (replicate.replicas, replicate.offset, replicate.replicas_in_sync) == (2, 2, 4)


# ------------------------------------------------------------ where the strategy comes from
def test_a_step_in_a_scope_compiles_under_the_scope_that_its_trace_recorded() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = gd.Variable(np.ones(3, np.float32))

        @gd.function
        def step(x):
            v.assign_add(x)
            return v.read_value()

        concrete = step.get_concrete_function(np.ones(3, np.float32))
    assert concrete.strategy is strategy and concrete.config.devices == ("cpu:0", "cpu:1")
    outside = Function(lambda x: x * 2, name="outside").get_concrete_function(np.ones(2, np.float32))
    assert outside.strategy is None


def test_variables_expose_their_storage_publicly() -> None:
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        v = gd.Variable(np.arange(3, dtype=np.float32))
    plain = Variable(np.zeros(2, np.float32))
    assert v.distribute_strategy is strategy and plain.distribute_strategy is None
    assert not v.lives_remotely and v.worker_shard is None
    np.testing.assert_array_equal(v.whole_value(), [0, 1, 2])
    assert v.stored_value() is v.whole_value()
    v.write_back(np.full(3, 7, np.float32))
    np.testing.assert_array_equal(v.numpy(), [7, 7, 7])
