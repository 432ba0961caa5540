"""``OneDeviceStrategy``: all variables and computation on one device."""

from __future__ import annotations

from typing import Any

from graphdist.distribute.strategy import Strategy
from graphdist.runtime.devices import parse_device

__all__ = ["OneDeviceStrategy"]


class OneDeviceStrategy(Strategy):
    """Places variables and computation on one device.

    Args:
        device: Device string, e.g. ``"cpu:0"``, ``"/gpu:0"`` (needs a GPU),
            ``"/job:localhost/replica:0/task:0/device:CPU:0"``.

    Raises:
        DeviceError: The string is malformed or names a device that is absent.
    """

    def __init__(self, device: Any) -> None:
        super().__init__([parse_device(device)])

    @property
    def device(self) -> str:
        """The strategy's device."""
        return str(self._devices[0])

    def __repr__(self) -> str:
        return f"OneDeviceStrategy(device={self.device!r})"
