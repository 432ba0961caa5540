"""The one table of who runs each communication op of a plan.

The scheduler runs every communication task (``graphdist.ir.comm_ops``)
through :func:`comm_handler`. The runtime's own handlers are listed here, by
module and function, and imported on first dispatch, so the scheduler runs any
plan whatever else the process imported (a parameter-server plan does not need
``graphdist.distribute``), and importing the runtime does not import MPI:

* ``AllReduce`` / ``AllGather`` / ``AllToAll``: the in-process communicator (``local``);
* ``ReduceScatter``: ``reduce_scatter`` (a view per shard of the local all-reduce);
* ``CrossWorker*``: the MPI communicator (``mpi.run_comm_task``);
* ``PSPull`` / ``PSPush``: the parameter-server client (``ps_server.run_ps_task``).

:func:`register_comm_handler` adds or overrides one (an extension's own op, a
test's instrumented handler); nothing registers a handler as a side effect of
being imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from graphdist.ir.comm_ops import CROSS_WORKER_OPS

__all__ = ["BUILTIN_HANDLERS", "CommHandler", "comm_handler", "register_comm_handler"]

#: handler(op, attrs, buffers) -> one output per participant.
CommHandler = Callable[[str, dict[str, Any], list[np.ndarray]], list[np.ndarray]]

#: op -> "module:function" of the runtime's handler for it.
BUILTIN_HANDLERS: dict[str, str] = {
    "AllReduce": "graphdist.runtime.comm.local:run_all_reduce_task",
    "AllGather": "graphdist.runtime.comm.local:run_all_gather_task",
    "AllToAll": "graphdist.runtime.comm.local:run_all_to_all_task",
    "ReduceScatter": "graphdist.runtime.comm.reduce_scatter:run_reduce_scatter_task",
    **{op: "graphdist.runtime.comm.mpi:run_comm_task" for op in CROSS_WORKER_OPS},
    "PSPull": "graphdist.runtime.ps_server:run_ps_task",
    "PSPush": "graphdist.runtime.ps_server:run_ps_task",
}

_handlers: dict[str, CommHandler] = {}  # registered ones, and built-in ones once imported


def register_comm_handler(op: str, handler: CommHandler) -> None:
    """Makes plan communication tasks of ``op`` run through ``handler`` (replacing the built-in one)."""
    _handlers[op] = handler


def comm_handler(op: str) -> CommHandler | None:
    """The handler that runs ``op`` (``None`` when nothing runs it); imports a built-in one on first use."""
    handler = _handlers.get(op)
    if handler is None and op in BUILTIN_HANDLERS:
        module, function = BUILTIN_HANDLERS[op].split(":")
        handler = _handlers[op] = getattr(importlib.import_module(module), function)
    return handler
