"""Device configuration (``gd.config``)."""

from __future__ import annotations

from graphdist.runtime.devices import host_cores, list_devices, num_gpus

__all__ = ["list_devices", "num_gpus", "host_cores"]
