"""Device configuration (``gd.config``), with TensorFlow's names where ``tf.config`` has them.

``list_physical_devices(device_type=None)`` lists the hardware (one ``CPU``, each
``GPU``); ``list_devices()`` lists graphdist's device strings that can run now;
``set_soft_device_placement(enabled)`` decides what a strategy naming an absent
GPU does (on by default: it runs on a logical CPU device and warns once).
``experimental.enable_op_determinism()`` makes steps compiled from then on
give the same bits under any supported strategy and replica count.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, NamedTuple

from graphdist.errors import InvalidArgumentError
from graphdist.runtime import determinism as _determinism
from graphdist.runtime import devices as _devices
from graphdist.runtime.devices import (
    get_soft_device_placement,
    host_cores,
    list_devices,
    num_gpus,
    set_soft_device_placement,
)

__all__ = [
    "PhysicalDevice",
    "enable_op_determinism",
    "disable_op_determinism",
    "experimental",
    "experimental_connect_to_cluster",
    "is_op_determinism_enabled",
    "get_soft_device_placement",
    "host_cores",
    "list_devices",
    "list_physical_devices",
    "num_gpus",
    "set_soft_device_placement",
]

logger = logging.getLogger(__name__)

_DEVICE_TYPES = ("CPU", "GPU", "TPU")


class PhysicalDevice(NamedTuple):
    """A piece of hardware (``tf.config.PhysicalDevice``).

    Attributes:
        name: ``"/physical_device:CPU:0"``, ``"/physical_device:GPU:1"``...
        device_type: ``"CPU"``, ``"GPU"`` or ``"TPU"``.
    """

    name: str
    device_type: str


def list_physical_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    """The hardware devices of this machine (``tf.config.list_physical_devices``).

    The host is one ``CPU`` device whatever its core count (graphdist splits
    the cores between logical ``cpu:N`` devices); each GPU the CUDA driver
    reports is a ``GPU``. TPU-like cores are simulated on the host, so no
    ``TPU`` is listed.

    Args:
        device_type: ``"CPU"``, ``"GPU"`` or ``"TPU"`` (case-insensitive, so the
            seeds' ``'gpu'`` works); ``None`` lists every device.

    Returns:
        The devices of that type, an empty list when there are none (the usual
        ``if gd.config.list_physical_devices("GPU"):`` test).

    Raises:
        InvalidArgumentError: ``device_type`` is not one of those names.
    """
    devices = [PhysicalDevice("/physical_device:CPU:0", "CPU")]
    devices += [PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(_devices.num_gpus())]
    if device_type is None:
        return devices
    if not isinstance(device_type, str) or device_type.strip().upper() not in _DEVICE_TYPES:
        raise InvalidArgumentError(
            f"list_physical_devices(device_type={device_type!r}): device_type must be one of "
            f"{', '.join(map(repr, _DEVICE_TYPES))} (any case) or None for every device")
    wanted = device_type.strip().upper()
    return [d for d in devices if d.device_type == wanted]


def experimental_connect_to_cluster(cluster_spec_or_resolver: Any, job_name: str = "localhost",
                                    task_index: int = 0, protocol: str | None = None) -> None:
    """Makes a cluster's devices usable from this program (``tf.config.experimental_connect_to_cluster``).

    graphdist's devices are always local to the process that runs them: TPU-like cores are
    simulated in this process, and multi-process jobs connect through MPI when their strategy
    is created. So this only checks its argument and logs what it would connect to.

    Raises:
        ValueError: The argument is neither a cluster resolver nor a cluster spec.
    """
    from graphdist.errors import InvalidArgumentError

    if not (hasattr(cluster_spec_or_resolver, "cluster_spec") or isinstance(cluster_spec_or_resolver, dict)
            or hasattr(cluster_spec_or_resolver, "as_dict")):
        raise InvalidArgumentError(
            f"experimental_connect_to_cluster: expected a cluster resolver (e.g. "
            "gd.cluster_resolver.TPUClusterResolver()) or a cluster spec, got "
            f"{type(cluster_spec_or_resolver).__name__}")
    logger.info("experimental_connect_to_cluster(%r): devices are local to this process; nothing to connect",
                cluster_spec_or_resolver)


def enable_op_determinism(chunks: int = _determinism.DEFAULT_CHUNKS) -> None:
    """Bitwise identical steps on any replica count (``tf.config.experimental.enable_op_determinism``).

    Every step compiled from now on cuts its global batch into ``chunks``
    equal chunks whatever the strategy: each replica computes its chunks one
    after the other at chunk-sized shapes, and every sum over the batch
    (gradients, the loss, metrics summed with ``strategy.reduce("SUM")``) adds
    the chunks' partial sums in one fixed pairwise tree, across replicas and
    processes too. So one global batch gives the same bits under
    ``OneDeviceStrategy``, ``MirroredStrategy``, ``CentralStorageStrategy`` and
    ``MultiWorkerMirroredStrategy`` with 1, 2, 4 ... ``chunks`` replicas in
    sync, from run to run, for any intra-op thread count, with
    ``accumulate_steps`` and after ``replan``. Unlike TensorFlow, which only
    promises the same bits from run to run on one configuration.

    The rule: ``chunks`` a power of two, the replicas in sync a power of two
    dividing it, the global batch divisible by it (else compiling the step
    raises ``GraphError`` saying so). ``ParameterServerStrategy`` (its updates
    are asynchronous), ``TPUStrategy`` and a sharded optimizer state (ZeRO-1)
    refuse with ``NotImplementedError``. Steps traced before the switch keep
    what they were compiled with: turn it on before building the steps. A
    step that uses no strategy is not cut (nothing is distributed).

    Args:
        chunks: Chunks of the global batch (graphdist's addition to TF's
            signature; default 8).

    Raises:
        InvalidArgumentError: ``chunks`` is not a power of two.
    """
    _determinism.enable(chunks)
    logger.info("op determinism on: global batches are cut into %d chunks summed in a fixed tree", chunks)


def disable_op_determinism() -> None:
    """Steps compiled from now on sum as fast as they can again (``tf.config.experimental.disable_op_determinism``)."""
    _determinism.disable()


def is_op_determinism_enabled() -> bool:
    """Whether :func:`enable_op_determinism` is in effect."""
    return _determinism.chunks() is not None


#: ``gd.config.experimental`` (TF's ``tf.config.experimental`` names).
experimental = SimpleNamespace(enable_op_determinism=enable_op_determinism,
                               disable_op_determinism=disable_op_determinism,
                               is_op_determinism_enabled=is_op_determinism_enabled)
