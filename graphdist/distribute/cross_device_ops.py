"""Cross-device reduction algorithms (``cross_device_ops`` of MirroredStrategy).

Each class names the algorithm that :class:`passes.lower_collectives.LowerCollectivesPass`
writes into the collective nodes and the local communicator executes:

* :class:`NcclAllReduce`: NCCL on GPUs; on logical CPU devices a ring
  all-reduce (reduce-scatter + all-gather over chunks).
* :class:`HierarchicalCopyAllReduce`: pairwise tree reduction, then copies.
* :class:`ReductionToOneDevice`: reduce everything on one device, then broadcast.
"""

from __future__ import annotations

from typing import Any

from graphdist.errors import InvalidArgumentError

__all__ = ["CrossDeviceOps", "NcclAllReduce", "HierarchicalCopyAllReduce", "ReductionToOneDevice"]


class CrossDeviceOps:
    """Base class of cross-device reduction algorithms.

    Attributes:
        algorithm: Name the communicator executes.
        num_packs: How many packs gradients are fused into (bucketing).
    """

    algorithm = "ring"

    def __init__(self, num_packs: int = 1) -> None:
        if not isinstance(num_packs, int) or num_packs < 0:
            raise InvalidArgumentError(f"num_packs must be a non-negative int, got {num_packs!r}")
        self.num_packs = num_packs

    def collective_attrs(self) -> dict[str, Any]:
        """Attributes written into each lowered collective node."""
        return {"algorithm": self.algorithm}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_packs={self.num_packs})"


class NcclAllReduce(CrossDeviceOps):
    """NCCL all-reduce on GPUs; a ring all-reduce between logical CPU devices."""

    algorithm = "ring"


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """Pairwise (tree) reduction followed by copies to every device."""

    algorithm = "hierarchical_copy"


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce on one device (``reduce_to_device``, default the first replica's), then broadcast."""

    algorithm = "reduce_to_one"

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: Any = None) -> None:
        super().__init__(num_packs=1)
        if reduce_to_device is not None:
            from graphdist.runtime.devices import parse_device

            reduce_to_device = str(parse_device(reduce_to_device))
        self.reduce_to_device = reduce_to_device
        self.accumulation_fn = accumulation_fn

    def collective_attrs(self) -> dict[str, Any]:
        attrs = super().collective_attrs()
        if self.reduce_to_device is not None:
            attrs["reduce_to_device"] = self.reduce_to_device
        return attrs

    def __repr__(self) -> str:
        return f"ReductionToOneDevice(reduce_to_device={self.reduce_to_device!r})"
