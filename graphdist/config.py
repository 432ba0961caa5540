"""Device configuration (``gd.config``)."""

from __future__ import annotations

import logging
from typing import Any

from graphdist.runtime.devices import host_cores, list_devices, num_gpus

__all__ = ["experimental_connect_to_cluster", "list_devices", "num_gpus", "host_cores"]

logger = logging.getLogger(__name__)


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
