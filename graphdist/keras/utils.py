"""``gd.keras.utils``: reproducibility helpers."""

from __future__ import annotations

from graphdist.keras import initializers

__all__ = ["set_random_seed"]


def set_random_seed(seed: int) -> None:
    """Seeds the generator of initial weights and of ``fit``'s shuffling seeds.

    Two models built after the same ``set_random_seed(s)`` start from the same
    weights and shuffle their data in the same orders, under any strategy.
    (Dropout masks come from the backend's own generator; see ``gd.nn.dropout``.)
    """
    initializers.set_seed(int(seed))
