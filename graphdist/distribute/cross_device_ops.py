"""Cross-device reduction algorithms (``cross_device_ops`` of MirroredStrategy).

Each class names the algorithm that :class:`graphdist.passes.lower_collectives.LowerCollectivesPass`
writes into the collective nodes and the local communicator executes:

* :class:`NcclAllReduce`: NCCL on GPUs; on logical CPU devices a ring
  all-reduce (reduce-scatter + all-gather over chunks).
* :class:`HierarchicalCopyAllReduce`: pairwise tree reduction, then copies.
* :class:`ReductionToOneDevice`: reduce everything on one device, then broadcast.
* :class:`ReduceScatterAllGather`: each all-reduce lowered, in the graph, into a
  reduce-scatter and an all-gather (``LowerOpsPass`` with the registered
  ``AllReduce`` lowering ``"reduce_scatter_all_gather"``): two plan tasks, so
  the scheduler can run other work between the two phases.

``num_packs`` / ``bytes_per_pack`` ask for bucketing: the pipeline then runs
:class:`graphdist.passes.bucket_collectives.BucketCollectivesPass`, which fuses small
all-reduces into packs (see :meth:`CrossDeviceOps.bucketing`).
``shard_optimizer_state=True`` asks for ZeRO-1: the pipeline then runs
:class:`graphdist.passes.shard_optimizer_state.ShardOptimizerStatePass`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import InvalidArgumentError

__all__ = ["CrossDeviceOps", "NcclAllReduce", "HierarchicalCopyAllReduce", "ReductionToOneDevice",
           "ReduceScatterAllGather"]


class CrossDeviceOps:
    """Base class of cross-device reduction algorithms.

    Args:
        num_packs: Fuse the gradients' all-reduces into this many packs of
            roughly equal size (bucketing); ``0`` or ``None`` (the default):
            one all-reduce per gradient.
        bytes_per_pack: Fuse the all-reduces into packs of at most this many
            bytes each, like ``tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=...)``; ``0`` or ``None``: no bucketing. Give at most
            one of the two.
        shard_optimizer_state: ZeRO-1 (PyTorch's ``ZeroRedundancyOptimizer``):
            the gradients are reduce-scattered, each replica updates its 1/N
            slice of every variable and keeps only that slice of the optimizer
            slots, and the new weights are all-gathered
            (:mod:`graphdist.passes.shard_optimizer_state`). Default ``False``.

    Packs are filled in the order the gradients become ready in the backward
    pass (see :mod:`graphdist.passes.bucket_collectives`). Unlike tf.distribute, whose
    ``NcclAllReduce()`` packs everything into one pack by default, the
    default here is no bucketing.

    Attributes:
        algorithm: Name the communicator executes.
        num_packs: Requested number of packs (``None``: not set).
        bytes_per_pack: Requested pack size in bytes (``None``: not set).
        shard_optimizer_state: Whether optimizer state is sharded over the replicas.

    Raises:
        InvalidArgumentError: A setting is not a non-negative int, or both
            are positive; ``shard_optimizer_state`` is not a bool.
    """

    algorithm = "ring"

    def __init__(self, num_packs: int | None = None, bytes_per_pack: int | None = None, *,
                 shard_optimizer_state: bool = False) -> None:
        if not isinstance(shard_optimizer_state, (bool, np.bool_)):
            raise InvalidArgumentError(f"shard_optimizer_state must be True or False, got {shard_optimizer_state!r}")
        for label, setting in (("num_packs", num_packs), ("bytes_per_pack", bytes_per_pack)):
            if setting is not None and (isinstance(setting, bool) or not isinstance(setting, int) or setting < 0):
                raise InvalidArgumentError(f"{label} must be a non-negative int (0 turns bucketing off), "
                                           f"got {setting!r}")
        if num_packs and bytes_per_pack:
            raise InvalidArgumentError(f"give num_packs ({num_packs}) or bytes_per_pack ({bytes_per_pack}), not "
                                       "both: num_packs makes that many packs, bytes_per_pack caps each pack's size")
        self.num_packs = num_packs
        self.bytes_per_pack = bytes_per_pack
        self.shard_optimizer_state = bool(shard_optimizer_state)

    def collective_attrs(self) -> dict[str, Any]:
        """Attributes written into each lowered collective node."""
        return {"algorithm": self.algorithm}

    def lowerings(self) -> dict[str, str]:
        """Op type -> registered graph lowering (``graphdist.passes.lowerings``) the pipeline applies to the
        collectives (``LowerOpsPass``); none by default.
        """
        return {}

    def bucketing(self) -> dict[str, int] | None:
        """Arguments of :class:`graphdist.passes.bucket_collectives.BucketCollectivesPass` (``None``: no bucketing)."""
        if self.num_packs == 0 or self.bytes_per_pack == 0:
            return None
        if self.bytes_per_pack:
            return {"bytes_per_pack": self.bytes_per_pack}
        if self.num_packs:
            return {"num_packs": self.num_packs}
        return None

    def _settings(self) -> str:
        settings = [f"{name}={value}" for name, value in (("num_packs", self.num_packs),
                                                          ("bytes_per_pack", self.bytes_per_pack))
                    if value is not None]
        return ", ".join(settings + (["shard_optimizer_state=True"] if self.shard_optimizer_state else []))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._settings()})"


class NcclAllReduce(CrossDeviceOps):
    """NCCL all-reduce on GPUs; a ring all-reduce between logical CPU devices."""

    algorithm = "ring"


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """Pairwise (tree) reduction followed by copies to every device."""

    algorithm = "hierarchical_copy"


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce on one device (``reduce_to_device``, default the first replica's), then broadcast."""

    algorithm = "reduce_to_one"

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: Any = None, *,
                 shard_optimizer_state: bool = False) -> None:
        super().__init__(shard_optimizer_state=shard_optimizer_state)
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
        extra = ", shard_optimizer_state=True" if self.shard_optimizer_state else ""
        return f"ReductionToOneDevice(reduce_to_device={self.reduce_to_device!r}{extra})"


class ReduceScatterAllGather(CrossDeviceOps):
    """Each all-reduce as a reduce-scatter then an all-gather, two tasks of the plan.

    The ring all-reduce's two phases, made explicit in the graph by the registered ``AllReduce`` lowering
    ``"reduce_scatter_all_gather"`` (:mod:`graphdist.passes.lowerings`): the plan shows them, and the
    scheduler may run other work between them. A group whose element count does not split evenly into its
    participants stays one ring all-reduce.
    """

    algorithm = "ring"

    def lowerings(self) -> dict[str, str]:
        return {"AllReduce": "reduce_scatter_all_gather"}
