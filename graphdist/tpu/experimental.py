"""``gd.tpu.experimental``: ``initialize_tpu_system``, ``shutdown_tpu_system``, ``DeviceAssignment``, ``Topology``."""

from __future__ import annotations

from graphdist.distribute.tpu import DeviceAssignment, Topology, TPUClusterResolver, initialize_tpu_system

__all__ = ["DeviceAssignment", "Topology", "initialize_tpu_system", "shutdown_tpu_system"]


def shutdown_tpu_system(cluster_resolver: TPUClusterResolver | None = None) -> None:
    """Shuts the TPU-like system down: simulated cores hold no state outside the process, so nothing to do."""
    del cluster_resolver
