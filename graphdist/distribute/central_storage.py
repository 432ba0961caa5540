"""``CentralStorageStrategy``: synchronous data parallelism with variables on one device.

Replicas run on the compute devices exactly as with ``MirroredStrategy`` (the
replica function is traced once and replicated by ``ReplicatePass``;
``all_reduce``, the optimizer's gradient sums and ``strategy.reduce`` become
``graphdist.AllReduce`` groups),
but every variable has a single copy on the parameter device:

* variables created in the scope are plain :class:`~graphdist.distribute.variables.Variable`
  objects whose ``device`` is the parameter device (TensorFlow wraps them in an
  ``AggregatingVariable``; here the aggregation is done by the optimizer's
  all-reduce, so no special variable class is needed);
* :class:`graphdist.passes.place_variables.PlaceVariablesPass` reads each variable on the
  parameter device (replicas receive it through transfers) and places the
  update computation (the optimizer math after the gradient all-reduce) there;
* gradients are summed with the reduce-to-one algorithm rooted on the
  parameter device when it is also a compute device (the sum is formed where
  the update consumes it, as TensorFlow's ``ReductionToOneDevice(reduce_to_device=
  parameter device)``), otherwise with a ring all-reduce whose result is
  transferred to the parameter device.

Assigning a variable in a replica context behaves as under ``MirroredStrategy``:
every replica computes the update, and the last replica's value is written
(equal for all replicas when the update is computed from all-reduced values).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from graphdist.compile.pipeline import PipelineConfig
from graphdist.distribute.cross_device_ops import CrossDeviceOps, NcclAllReduce, ReductionToOneDevice
from graphdist.distribute.strategy import Strategy
from graphdist.ir.placement import VariablePlacement, VariableSpec
from graphdist.runtime.devices import Device, num_gpus, parse_device, place_softly

__all__ = ["CentralStorageStrategy"]

logger = logging.getLogger(__name__)


class CentralStorageStrategy(Strategy):
    """Synchronous training: replicas on the compute devices, one copy of each
    variable on the parameter device.

    Args:
        compute_devices: Devices that run replicas (``"cpu:0"``, ``"cpu:1"``,
            ``"/gpu:0"``...); default: every GPU, else ``["cpu:0"]``.
        parameter_device: Device that holds the variables and applies their
            updates; default ``"cpu:0"``. It may be one of the compute devices
            or a separate one.

    Raises:
        InvalidArgumentError: A compute device is listed twice, or none is given.
        DeviceError: A device string is malformed or names an absent GPU.
    """

    def __init__(self, compute_devices: Sequence[Any] | None = None, parameter_device: Any = None) -> None:
        if compute_devices is None:
            compute_devices = [f"cuda:{i}" for i in range(num_gpus())] or ["cpu:0"]
        requested = parse_device("cpu:0" if parameter_device is None else parameter_device)
        self._parameter_device: Device = place_softly([requested])[0]
        super().__init__(compute_devices)
        logger.info("Using CentralStorageStrategy with compute devices %s and parameter device %s",
                    self.extended.worker_devices, self._parameter_device)

    @property
    def parameter_device(self) -> str:
        """The device holding the variables."""
        return str(self._parameter_device)

    @property
    def cross_device_ops(self) -> CrossDeviceOps:
        """The gradient all-reduce: reduce-to-one rooted on the parameter device
        when it runs a replica, else a ring.
        """
        if self._parameter_device in self._devices:
            return ReductionToOneDevice(reduce_to_device=self.parameter_device)
        return NcclAllReduce()

    def _parameter_devices(self) -> tuple[Device, ...]:
        return (self._parameter_device,)

    def pipeline_config(self) -> PipelineConfig:
        """The synchronous pipeline with variables placed on the parameter device."""
        return PipelineConfig(devices=self.extended.worker_devices, strategy=type(self).__name__,
                              collective_attrs=self.cross_device_ops.collective_attrs(),
                              bucketing=self.cross_device_ops.bucketing() or None,
                              lowerings=self.cross_device_ops.lowerings() or None,
                              parameter_device=self.parameter_device)

    def variable_placement(self, spec: VariableSpec, variable: Any = None) -> VariablePlacement:
        """Every variable has one copy, on the parameter device."""
        return VariablePlacement("central", (self.parameter_device,))

    def __repr__(self) -> str:
        devices = list(self.extended.worker_devices)
        return f"CentralStorageStrategy(compute_devices={devices}, parameter_device={self.parameter_device!r})"
