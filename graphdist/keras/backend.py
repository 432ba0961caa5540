"""``gd.keras.backend``: session state."""

from __future__ import annotations

from graphdist.keras import layers

__all__ = ["clear_session"]


def clear_session() -> None:
    """Restarts automatic layer names (``dense``, ``dense_1``...), as Keras' ``clear_session`` does.

    A model rebuilt after ``clear_session()`` gets the same layer and variable
    names as the first one, so checkpoints keyed by variable names (optimizer
    slots) match again in the same process.
    """
    layers._name_counters.clear()
