"""Strategies and backends by name: the registries the command line takes its choices from."""

from __future__ import annotations

import pytest

import graphdist as gd
from graphdist.backends import available_backends
from graphdist.backends import base as backends_base
from graphdist.cli.main import build_parser
from graphdist.distribute.registry import make_strategy, normalise_strategy_name, strategy_entry, strategy_names
from graphdist.errors import InvalidArgumentError


def test_names_split_into_single_and_multi_process() -> None:
    assert strategy_names(multi_process=False) == ("one_device", "mirrored", "central_storage", "tpu", "default")
    assert strategy_names(multi_process=True) == ("multi_worker_mirrored", "parameter_server")


@pytest.mark.parametrize(("spelling", "name"), [("MirroredStrategy", "mirrored"), ("one-device", "one_device"),
                                                ("OneDeviceStrategy", "one_device"),
                                                ("MultiWorkerMirroredStrategy", "multi_worker_mirrored")])
def test_spellings_normalise_to_the_registered_name(spelling: str, name: str) -> None:
    assert normalise_strategy_name(spelling) == name
    assert strategy_entry(spelling).name == name


def test_entries_make_their_strategies() -> None:
    assert isinstance(make_strategy("mirrored", ["cpu:0", "cpu:1"]), gd.MirroredStrategy)
    assert make_strategy("one_device").extended.worker_devices == ("cpu:0",)
    with pytest.raises(InvalidArgumentError, match="one_device runs on one device, got 2"):
        make_strategy("one_device", ["cpu:0", "cpu:1"])
    with pytest.raises(InvalidArgumentError, match="unknown strategy 'ring'; choose one of one_device, mirrored"):
        make_strategy("ring")


def test_the_cli_takes_its_backend_choices_from_the_backend_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    class Extra:
        name, version, device_kinds = "extra", "0", ("cpu",)

    monkeypatch.setitem(backends_base._registry, "extra", Extra())
    assert "extra" in available_backends() and "extra" not in available_backends("cuda")
    assert available_backends("cuda") == ["ort", "tvm"]
    args = build_parser().parse_args(["inspect", "m:f", "--backend", "extra"])
    assert args.backend == "extra"
