"""Devices: parsing device strings, finding what this machine can run.

graphdist names devices ``"cpu:N"``, ``"cuda:N"`` and ``"tpu:N"``:

* ``cpu:N`` are *logical* CPU devices. Any ``N >= 0`` is allowed; the host's
  cores are split between the logical devices a plan uses
  (:func:`thread_budget`), so running them side by side does not oversubscribe
  the machine.
* ``cuda:N`` is the N-th visible NVIDIA GPU. It exists only when the CUDA
  driver reports at least ``N + 1`` devices (:func:`num_gpus`).
* ``tpu:N`` is a core of a TPU-like mesh. On a machine without such hardware
  the cores are simulated on the host, so they are always accepted here.

TensorFlow spellings are accepted and normalised, case-insensitively:
``"GPU:1"``, ``"/gpu:1"``, ``"/device:CPU:0"`` and full names such as
``"/job:localhost/replica:0/task:0/device:CPU:0"`` (the job, replica and task
parts are checked and dropped).

Soft placement (``gd.config.set_soft_device_placement``, on by default as in
TensorFlow): a strategy that names a GPU this machine does not have runs that
replica on a logical ``cpu:N`` device instead (:func:`place_softly`) and logs
one warning per mapping; with soft placement off it raises :class:`DeviceError`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from graphdist.errors import DeviceError

__all__ = [
    "KINDS",
    "Device",
    "check_available",
    "get_soft_device_placement",
    "host_cores",
    "list_devices",
    "num_gpus",
    "parse_device",
    "place_softly",
    "set_soft_device_placement",
    "soft_device_placement",
    "thread_budget",
]

logger = logging.getLogger(__name__)

#: Device kinds graphdist knows, in their canonical spelling.
KINDS = ("cpu", "cuda", "tpu")

_KIND_ALIASES = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "tpu": "tpu"}
_TF_KIND = {"cpu": "CPU", "cuda": "GPU", "tpu": "TPU"}
_DEVICE_RE = re.compile(r"^(cpu|gpu|cuda|tpu)(?::(\d+))?$")
_JOB_PART_RE = re.compile(r"^(job:[^/:]+|replica:\d+|task:\d+)$")

_ACCEPTED_FORMS = (
    "'cpu:N', 'cuda:N' (also 'gpu:N', 'GPU:N', '/gpu:N'), 'tpu:N', "
    "a bare 'cpu', 'cuda', 'gpu' or 'tpu' (index 0), '/device:CPU:N', or a "
    "TensorFlow name such as '/job:localhost/replica:0/task:0/device:CPU:0'; "
    "N is a non-negative integer"
)


@dataclass(frozen=True, order=True)
class Device:
    """A device graphdist can place computation on.

    Attributes:
        kind: ``"cpu"``, ``"cuda"`` or ``"tpu"``.
        index: Non-negative device index.
    """

    kind: str
    index: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DeviceError(
                f"device kind {self.kind!r} is not one of {', '.join(map(repr, KINDS))}"
            )
        if (
            not isinstance(self.index, int)
            or isinstance(self.index, bool)
            or self.index < 0
        ):
            raise DeviceError(
                f"device index {self.index!r} for kind {self.kind!r} must be a "
                "non-negative int"
            )

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    @property
    def tf_name(self) -> str:
        """The fully qualified TensorFlow name, e.g.
        ``"/job:localhost/replica:0/task:0/device:CPU:0"``.
        """
        return (
            f"/job:localhost/replica:0/task:0/device:{_TF_KIND[self.kind]}:{self.index}"
        )


def _invalid(spec: str) -> DeviceError:
    return DeviceError(
        f"invalid device string {spec!r}; accepted forms: {_ACCEPTED_FORMS}"
    )


def _strip_tf_prefix(spec: str, text: str) -> str:
    """Removes ``/job:../replica:../task:..`` parts and a ``device:`` prefix."""
    if text.startswith("/"):
        parts = text[1:].split("/")
        device_parts = [p for p in parts if not _JOB_PART_RE.match(p)]
        if len(device_parts) != 1:
            raise _invalid(spec)
        text = device_parts[0]
    text = text.removeprefix("device:")
    return text


def parse_device(spec: str | Device) -> Device:
    """Parses a device string into a :class:`Device`.

    Args:
        spec: A device string in any accepted spelling (see the module
            docstring), or a :class:`Device`, which is returned unchanged.

    Returns:
        The normalised device; ``"gpu"`` becomes kind ``"cuda"``.

    Raises:
        DeviceError: ``spec`` is not a string or is not a device string. The
            message quotes it and lists the accepted forms.
    """
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise DeviceError(
            f"a device must be given as a string such as 'cpu:0', got "
            f"{type(spec).__name__} {spec!r}; accepted forms: {_ACCEPTED_FORMS}"
        )
    text = _strip_tf_prefix(spec, spec.strip().lower())
    match = _DEVICE_RE.match(text)
    if match is None:
        raise _invalid(spec)
    kind, index = match.groups()
    return Device(_KIND_ALIASES[kind], int(index) if index is not None else 0)


@functools.cache
def num_gpus() -> int:
    """Returns how many CUDA GPUs the driver reports (0 without a driver).

    Asks the CUDA driver API directly (``libcuda.so.1``: ``cuInit`` and
    ``cuDeviceGetCount``), so ``CUDA_VISIBLE_DEVICES`` is honoured. Any failure
    (no driver library, no device, driver error) counts as no GPU. ONNX
    Runtime's provider list is not consulted: ``onnxruntime-gpu`` lists CUDA
    even on machines without a GPU. The result is cached for the process.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        logger.debug("libcuda.so.1 not found: no GPU")
        return 0
    try:
        status = lib.cuInit(0)
        if status != 0:
            logger.debug("cuInit failed with CUDA error %d: no GPU", status)
            return 0
        count = ctypes.c_int(0)
        status = lib.cuDeviceGetCount(ctypes.byref(count))
    except (AttributeError, OSError) as err:
        logger.debug("CUDA driver query failed (%s): no GPU", err)
        return 0
    if status != 0:
        logger.debug("cuDeviceGetCount failed with CUDA error %d: no GPU", status)
        return 0
    return max(int(count.value), 0)


def host_cores() -> int:
    """Returns the number of CPU cores this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def list_devices() -> list[str]:
    """Returns the devices that can run now: ``"cpu:0"`` then every GPU.

    Logical CPU devices beyond ``cpu:0`` and simulated TPU cores are always
    usable too but are not listed.
    """
    return ["cpu:0"] + [f"cuda:{i}" for i in range(num_gpus())]


def check_available(device: Device | str) -> None:
    """Checks that ``device`` can be used on this machine.

    Args:
        device: The device (or device string) to check.

    Raises:
        DeviceError: ``device`` is a GPU this machine does not have, or is
            not a valid device string.
    """
    device = parse_device(device)
    if device.kind != "cuda":
        return
    count = num_gpus()
    if device.index < count:
        return
    soft = "" if get_soft_device_placement() else (
        ", or call gd.config.set_soft_device_placement(True) so strategies run it on a logical CPU device")
    if count == 0:
        raise DeviceError(
            f"device {str(device)!r} is not available: no GPU is visible on this "
            f"machine; use 'cpu:{device.index}' (a logical CPU device) instead{soft}"
        )
    raise DeviceError(
        f"device {str(device)!r} is not available: this machine has {count} GPU(s) "
        f"('cuda:0' to 'cuda:{count - 1}'); use one of those or 'cpu:{device.index}'{soft}"
    )


def thread_budget(num_logical_devices: int) -> int:
    """Returns the intra-op threads each of ``num_logical_devices`` may use.

    Logical CPU devices split the host's cores without oversubscription; each
    gets at least one thread.

    Raises:
        DeviceError: ``num_logical_devices`` is smaller than 1.
    """
    if num_logical_devices < 1:
        raise DeviceError(
            f"num_logical_devices must be at least 1, got {num_logical_devices!r}"
        )
    return max(host_cores() // num_logical_devices, 1)


# ------------------------------------------------------------- soft placement
_soft_placement = True
_soft_lock = threading.Lock()
_warned_mappings: set[str] = set()


def set_soft_device_placement(enabled: bool) -> None:
    """Turns soft device placement on or off for the process (``tf.config.set_soft_device_placement``).

    Args:
        enabled: ``True`` (the default state): a strategy naming a GPU that
            this machine lacks runs on a logical CPU device and warns.
            ``False``: it raises :class:`DeviceError`.

    Raises:
        DeviceError: ``enabled`` is not a bool.
    """
    global _soft_placement
    if not isinstance(enabled, bool):
        raise DeviceError(f"set_soft_device_placement(enabled): enabled must be True or False, "
                          f"got {type(enabled).__name__} {enabled!r}")
    with _soft_lock:
        _soft_placement = enabled


def get_soft_device_placement() -> bool:
    """Whether soft device placement is on (``tf.config.get_soft_device_placement``)."""
    return _soft_placement


@contextlib.contextmanager
def soft_device_placement(enabled: bool) -> Iterator[None]:
    """Sets soft placement to ``enabled`` inside the block and restores the earlier state after it."""
    before = get_soft_device_placement()
    set_soft_device_placement(enabled)
    try:
        yield
    finally:
        set_soft_device_placement(before)


def _is_missing(device: Device) -> bool:
    return device.kind == "cuda" and device.index >= num_gpus()


def place_softly(devices: Sequence[Device]) -> tuple[Device, ...]:
    """Replaces the GPUs this machine lacks by logical CPU devices when soft placement is on.

    A missing ``cuda:N`` becomes ``cpu:N`` unless another listed device is
    already ``cpu:N``, then the lowest free ``cpu`` index, so replicas keep
    distinct devices. The first time a given mapping is made it is logged as a
    warning (TensorFlow's "Some requested devices are not visible").

    Args:
        devices: Parsed devices, in replica order.

    Returns:
        The devices to run on, in the same order.

    Raises:
        DeviceError: A device is unavailable and soft placement is off (the
            message says how to fix it).
    """
    devices = tuple(devices)
    if not any(_is_missing(d) for d in devices) or not get_soft_device_placement():
        for device in devices:
            check_available(device)
        return devices
    taken = {d.index for d in devices if d.kind == "cpu"}
    placed = []
    for device in devices:
        if not _is_missing(device):
            placed.append(device)
            continue
        index = device.index if device.index not in taken else min(set(range(len(taken) + 1)) - taken)
        taken.add(index)
        placed.append(Device("cpu", index))
    _warn_mapping(devices, tuple(placed))
    return tuple(placed)


def _warn_mapping(requested: tuple[Device, ...], placed: tuple[Device, ...]) -> None:
    pairs = [f"{a} -> {b}" for a, b in zip(requested, placed) if a != b]
    mapping = ", ".join(pairs)
    with _soft_lock:
        if mapping in _warned_mappings:
            return
        _warned_mappings.add(mapping)
    visible = num_gpus()
    logger.warning(
        "soft device placement: %s not visible on this machine (%d GPU%s); running on logical CPU devices "
        "instead: %s. Call gd.config.set_soft_device_placement(False) to make this an error.",
        ", ".join(str(a) for a, b in zip(requested, placed) if a != b), visible, "" if visible == 1 else "s",
        mapping)
