"""Tests for graphdist.runtime.devices: parsing, detection, budgets."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import pytest

from graphdist.errors import DeviceError, GraphdistError
from graphdist.runtime import devices
from graphdist.runtime.devices import (
    Device,
    check_available,
    host_cores,
    list_devices,
    num_gpus,
    parse_device,
    thread_budget,
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("cpu:0", Device("cpu", 0)),
        ("CPU:0", Device("cpu", 0)),
        ("cpu:7", Device("cpu", 7)),
        ("/cpu:0", Device("cpu", 0)),
        ("/device:CPU:0", Device("cpu", 0)),
        ("device:CPU:2", Device("cpu", 2)),
        ("/job:localhost/replica:0/task:0/device:CPU:0", Device("cpu", 0)),
        ("/job:worker/task:1/device:GPU:0", Device("cuda", 0)),
        ("/job:worker/replica:0/task:3/device:TPU:5", Device("tpu", 5)),
        ("gpu:1", Device("cuda", 1)),
        ("GPU:1", Device("cuda", 1)),
        ("/gpu:1", Device("cuda", 1)),
        ("cuda:0", Device("cuda", 0)),
        ("CUDA:3", Device("cuda", 3)),
        ("tpu:3", Device("tpu", 3)),
        ("cpu", Device("cpu", 0)),
        ("gpu", Device("cuda", 0)),
        ("cuda", Device("cuda", 0)),
        ("TPU", Device("tpu", 0)),
        ("  cpu:1 ", Device("cpu", 1)),
    ],
)
def test_parse_device_accepts_every_spelling(spec: str, expected: Device) -> None:
    assert parse_device(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "xpu:0",
        "cpu:-1",
        "cpu:a",
        "cpu:0:1",
        "cpu0",
        "/job:worker/task:1",
        "/cpu:0/gpu:0",
        "/job:w/task:x/device:CPU:0",
    ],
)
def test_parse_device_rejects_bad_strings(spec: str) -> None:
    with pytest.raises(DeviceError) as info:
        parse_device(spec)
    message = str(info.value)
    assert repr(spec) in message
    assert "'cpu:N'" in message and "'cuda:N'" in message and "'tpu:N'" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, GraphdistError)


@pytest.mark.parametrize("spec", [3, None, b"cpu:0", ["cpu:0"]])
def test_parse_device_rejects_non_strings(spec: object) -> None:
    with pytest.raises(DeviceError, match="must be given as a string"):
        parse_device(spec)  # type: ignore[arg-type]


def test_parse_device_returns_devices_unchanged() -> None:
    device = Device("cuda", 2)
    assert parse_device(device) is device


def test_device_str_and_tf_name() -> None:
    assert str(Device("cpu", 0)) == "cpu:0"
    assert str(parse_device("GPU:1")) == "cuda:1"
    assert Device("cpu", 0).tf_name == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert Device("cuda", 1).tf_name == "/job:localhost/replica:0/task:0/device:GPU:1"
    assert Device("tpu", 3).tf_name == "/job:localhost/replica:0/task:0/device:TPU:3"
    assert parse_device(Device("cuda", 1).tf_name) == Device("cuda", 1)


def test_device_is_frozen_hashable_and_validated() -> None:
    assert len({Device("cpu", 0), parse_device("/cpu:0"), Device("cpu", 1)}) == 2
    with pytest.raises(AttributeError):
        Device("cpu", 0).index = 1  # type: ignore[misc]
    with pytest.raises(DeviceError):
        Device("gpu", 0)
    with pytest.raises(DeviceError):
        Device("cpu", -1)


def test_host_cores_matches_affinity() -> None:
    assert host_cores() == len(os.sched_getaffinity(0))
    assert host_cores() >= 1


def test_list_devices_on_this_machine() -> None:
    assert list_devices() == ["cpu:0"] + [f"cuda:{i}" for i in range(num_gpus())]
    assert list_devices()[0] == "cpu:0"


def test_list_devices_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "num_gpus", lambda: 0)
    assert list_devices() == ["cpu:0"]


def test_list_devices_with_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "num_gpus", lambda: 2)
    assert list_devices() == ["cpu:0", "cuda:0", "cuda:1"]


def test_check_available_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "num_gpus", lambda: 0)
    check_available(Device("cpu", 0))
    check_available(Device("cpu", 63))
    check_available(Device("tpu", 7))
    with pytest.raises(DeviceError) as info:
        check_available(Device("cuda", 0))
    message = str(info.value)
    assert (
        "'cuda:0'" in message
        and "no GPU is visible" in message
        and "'cpu:0'" in message
    )


def test_check_available_gpu_index_out_of_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(devices, "num_gpus", lambda: 2)
    check_available(parse_device("gpu:1"))
    with pytest.raises(DeviceError, match="has 2 GPU"):
        check_available(Device("cuda", 2))


@pytest.mark.skipif(num_gpus() > 0, reason="this machine has a GPU")
def test_cuda_is_unavailable_here() -> None:
    assert num_gpus() == 0
    with pytest.raises(DeviceError, match="no GPU is visible"):
        check_available("cuda:0")


class _FakeCuda:
    """Stands in for libcuda.so.1."""

    def __init__(self, init_status: int, count: int) -> None:
        self.init_status = init_status
        self.count = count

    def cuInit(self, flags: int) -> int:  # noqa: N802 - CUDA driver API name
        return self.init_status

    def cuDeviceGetCount(self, ref: Any) -> int:  # noqa: N802 - CUDA driver API name
        ref._obj.value = self.count
        return 0


def test_num_gpus_reads_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeCuda(0, 3))
    assert num_gpus.__wrapped__() == 3


def test_num_gpus_is_zero_when_the_driver_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeCuda(100, 3))  # NO_DEVICE
    assert num_gpus.__wrapped__() == 0


def test_num_gpus_is_zero_without_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert num_gpus.__wrapped__() == 0


def test_thread_budget_splits_host_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "host_cores", lambda: 8)
    assert thread_budget(1) == 8
    assert thread_budget(2) == 4
    assert thread_budget(3) == 2
    assert thread_budget(16) == 1
    with pytest.raises(DeviceError, match="at least 1"):
        thread_budget(0)


def test_thread_budget_never_oversubscribes() -> None:
    for n in range(1, 9):
        budget = thread_budget(n)
        assert budget >= 1
        assert budget * n <= max(host_cores(), n)
