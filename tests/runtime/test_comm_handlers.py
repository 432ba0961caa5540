"""The runtime finds its own communication handlers, whatever else the process imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from graphdist.errors import ClusterConfigError
from graphdist.ir.comm_ops import COMMUNICATION_OPS, RUNTIME_CHECK_OPS
from graphdist.runtime.comm import handlers
from graphdist.runtime.comm.handlers import BUILTIN_HANDLERS, comm_handler, register_comm_handler


def test_every_executable_communication_op_has_a_builtin_handler() -> None:
    # Ops reserved for later (Broadcast, Send, Recv) and the ones the scheduler runs itself are the exceptions.
    reserved = {"Broadcast", "Send", "Recv", "Transfer"} | set(RUNTIME_CHECK_OPS)
    assert set(BUILTIN_HANDLERS) == set(COMMUNICATION_OPS) - reserved


def test_local_all_reduce_runs_through_its_handler() -> None:
    buffers = [np.array([1.0, 2.0]), np.array([3.0, 5.0])]
    out = comm_handler("AllReduce")("AllReduce", {"reduce_op": "SUM", "algorithm": "ring"}, buffers)
    np.testing.assert_array_equal(out[1], [4.0, 7.0])


def test_unknown_op_has_no_handler() -> None:
    assert comm_handler("NoSuchCollective") is None


def test_registered_handler_overrides_the_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "_handlers", {})
    calls = []
    register_comm_handler("AllGather", lambda op, attrs, buffers: calls.append(op) or buffers)
    comm_handler("AllGather")("AllGather", {}, [np.zeros(1)])
    assert calls == ["AllGather"]


def test_ps_tasks_without_a_client_name_the_missing_strategy() -> None:
    with pytest.raises(ClusterConfigError, match="no ParameterServerStrategy was created"):
        comm_handler("PSPull")("PSPull", {"ps": 0, "key": "v"}, [np.zeros(2)])


def test_ps_handler_is_found_without_importing_distribute() -> None:
    # A fresh interpreter where graphdist.distribute cannot be imported at all: the facade
    # (graphdist/__init__.py) is bypassed by loading the runtime package alone.
    script = textwrap.dedent("""
        import importlib.util, sys, types

        class NoDistribute:
            def find_spec(self, name, path=None, target=None):
                if name == "graphdist.distribute" or name.startswith("graphdist.distribute."):
                    raise ImportError("graphdist.distribute must not be imported")
                return None

        sys.meta_path.insert(0, NoDistribute())
        spec = importlib.util.find_spec("graphdist")
        package = types.ModuleType("graphdist")  # the package without running its facade __init__
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["graphdist"] = package
        from graphdist.runtime.scheduler import Scheduler  # noqa: F401
        from graphdist.runtime.comm.handlers import comm_handler
        import numpy as np
        handler = comm_handler("PSPush")
        assert handler.__module__ == "graphdist.runtime.ps_server", handler.__module__
        try:
            handler("PSPush", {"ps": 0, "key": "v"}, [np.zeros(2)])
        except Exception as err:
            print(type(err).__name__, err)
        assert not any(m.startswith("graphdist.distribute") for m in sys.modules)
    """)
    root = str(Path(__file__).resolve().parents[2])  # this checkout, not whichever one is installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ClusterConfigError "), done.stdout
    assert "no ParameterServerStrategy was created" in done.stdout
