"""``gd.train``: checkpoints."""

from graphdist.checkpoint import Checkpoint

__all__ = ["Checkpoint"]
