"""``gd.distribute.coordinator`` (also ``gd.distribute.experimental.coordinator``): TF2's ``ClusterCoordinator``.

TF2's parameter-server training has one coordinator process that schedules a step function (``schedule``) on
whichever worker is free, while the workers only serve (``server.join()``). graphdist does not implement
that form yet: its :class:`~graphdist.distribute.parameter_server.ParameterServerStrategy` is the seed's
``tf.compat.v1`` form, where every worker runs the training loop itself and the ps tasks hold the
variables. The TF2 names exist so that code written for them stops with a message that says how to
write it for graphdist, rather than with an ``AttributeError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ClusterCoordinator", "RemoteValue", "experimental"]

_INSTEAD = (
    "ClusterCoordinator (TF2's single-client parameter-server training: schedule/join/"
    "create_per_worker_dataset from one coordinator) is not implemented in graphdist. Run the training loop "
    "on every worker instead, as tf.compat.v1's ParameterServerStrategy does: in one script, create "
    "strategy = gd.distribute.experimental.ParameterServerStrategy() and variables under strategy.scope(), "
    "shard the input with dataset.shard(strategy.num_workers, strategy.worker_index), call "
    "step(next(iterator)) in a Python loop where you would have called coordinator.schedule(step, ...), and "
    "drop coordinator.join(); start it with graphdist launch --workers N --ps M -- python train.py "
    "(examples/digits_parameter_server.py does this)"
)


class ClusterCoordinator:
    """TF2's ``tf.distribute.coordinator.ClusterCoordinator`` (not implemented).

    Raises:
        NotImplementedError: Always, saying how to write the loop for graphdist's
            parameter-server strategy (every worker runs it; ``graphdist launch --workers N --ps M``).
    """

    def __init__(self, strategy: Any = None) -> None:
        raise NotImplementedError(_INSTEAD)


class RemoteValue:
    """TF2's ``tf.distribute.experimental.coordinator.RemoteValue`` (what ``schedule`` returns; not implemented).

    Raises:
        NotImplementedError: Always (see :class:`ClusterCoordinator`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(_INSTEAD)


class _Experimental:
    """``gd.distribute.coordinator.experimental`` (TF's spelling of the same names)."""

    ClusterCoordinator = ClusterCoordinator
    RemoteValue = RemoteValue


experimental = _Experimental
