"""``MirroredStrategy``: synchronous data parallelism, one replica per device.

The replica function is traced once, as one replica; ``ReplicatePass``
makes one copy per device, and ``all_reduce`` calls, ``apply_gradients``'
gradient sums and ``strategy.reduce`` become ``graphdist.AllReduce`` groups
(``InsertCollectivesPass``), lowered to the algorithm of
``cross_device_ops`` and executed by the local communicator between the
devices' segments. Variables created in the scope are
:class:`MirroredVariable`s: one logical value with a copy per replica, kept in
sync because every replica applies the same (all-reduced) update.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from graphdist.compile.pipeline import PipelineConfig
from graphdist.distribute.cross_device_ops import CrossDeviceOps, NcclAllReduce
from graphdist.distribute.strategy import Strategy
from graphdist.distribute.variables import MirroredVariable
from graphdist.errors import InvalidArgumentError
from graphdist.runtime.devices import num_gpus

__all__ = ["MirroredStrategy"]

logger = logging.getLogger(__name__)


class MirroredStrategy(Strategy):
    """Synchronous training on several devices of one machine.

    Args:
        devices: Device strings (``"cpu:0"``, ``"cpu:1"``, ``"/gpu:0"``...);
            default: every GPU, else ``["cpu:0"]``.
        cross_device_ops: All-reduce algorithm: ``gd.NcclAllReduce()`` (a
            ring between CPU devices), ``gd.HierarchicalCopyAllReduce()`` or
            ``gd.ReductionToOneDevice()``; ``shard_optimizer_state=True`` on any
            of them shards the optimizer state (ZeRO-1). Default (``None``):
            graphdist picks, as TensorFlow does: a gradient that one replica
            reads (its balanced update) is summed on that replica, read from
            the others (``LowerSingleReaderAllReducesPass``); other values
            are all-reduced like ``gd.NcclAllReduce()``. Give one explicitly
            to all-reduce every gradient with it.
    """

    def __init__(self, devices: Sequence[Any] | None = None, cross_device_ops: CrossDeviceOps | None = None) -> None:
        if devices is None:
            devices = [f"cuda:{i}" for i in range(num_gpus())] or ["cpu:0"]
        super().__init__(devices)
        if cross_device_ops is not None and not isinstance(cross_device_ops, CrossDeviceOps):
            raise InvalidArgumentError(
                f"cross_device_ops must be a gd.CrossDeviceOps such as gd.NcclAllReduce(), got "
                f"{type(cross_device_ops).__name__}"
            )
        self._reduce_at_readers = cross_device_ops is None
        self._cross_device_ops = cross_device_ops or NcclAllReduce()
        logger.info("Using MirroredStrategy with devices %s", self.extended.worker_devices)

    @property
    def cross_device_ops(self) -> CrossDeviceOps:
        """The all-reduce algorithm."""
        return self._cross_device_ops

    def pipeline_config(self) -> PipelineConfig:
        """The synchronous pipeline with this strategy's all-reduce algorithm (and bucketing)."""
        return PipelineConfig(devices=self.extended.worker_devices, strategy=type(self).__name__,
                              collective_attrs=self._cross_device_ops.collective_attrs(),
                              bucketing=self._cross_device_ops.bucketing() or None,
                              lowerings=self._cross_device_ops.lowerings() or None,
                              reduce_at_readers=self._reduce_at_readers,
                              shard_optimizer_state=self._cross_device_ops.shard_optimizer_state)

    def _variable_class(self) -> type:
        return MirroredVariable

    def __repr__(self) -> str:
        devices = list(self.extended.worker_devices)
        chosen = "" if self._reduce_at_readers else f", cross_device_ops={self._cross_device_ops!r}"
        return f"MirroredStrategy(devices={devices}{chosen})"
