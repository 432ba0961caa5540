"""The strategies by name: the one list the command line (``--strategy``) and re-planning take choices from.

Each :class:`StrategyEntry` makes its strategy from an optional device list
(``None``: the strategy's default devices). Single-process strategies can be
made anywhere; multi-process ones only inside ``graphdist launch`` (their
cluster comes from the launcher's environment). Adding a strategy to the
command line is one :func:`register_strategy` call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graphdist.errors import InvalidArgumentError

__all__ = ["StrategyEntry", "make_strategy", "normalise_strategy_name", "register_strategy", "strategy_entry",
           "strategy_names"]


@dataclass(frozen=True)
class StrategyEntry:
    """One strategy the command line can name.

    Attributes:
        name: The ``--strategy`` name (snake case).
        make: ``devices -> strategy`` (``devices`` is ``None`` for the strategy's default).
        multi_process: Made only inside ``graphdist launch`` (a cluster of processes).
    """

    name: str
    make: Callable[[Sequence[str] | None], Any]
    multi_process: bool = False


_STRATEGIES: dict[str, StrategyEntry] = {}


def register_strategy(entry: StrategyEntry) -> StrategyEntry:
    """Adds ``entry`` (replacing one of the same name)."""
    _STRATEGIES[entry.name] = entry
    return entry


def strategy_names(multi_process: bool | None = None) -> tuple[str, ...]:
    """The registered names, in registration order (``multi_process``: only those, or only the others)."""
    return tuple(name for name, entry in _STRATEGIES.items()
                 if multi_process is None or entry.multi_process == multi_process)


def normalise_strategy_name(name: str) -> str:
    """A spelling such as ``"MirroredStrategy"`` or ``"one-device"`` -> the registered name (``"mirrored"``)."""
    key = name.strip().lower().replace("-", "_")
    key = key[: -len("strategy")] if key.endswith("strategy") else key
    key = key.rstrip("_")
    return {"onedevice": "one_device", "centralstorage": "central_storage",
            "multiworkermirrored": "multi_worker_mirrored", "parameterserver": "parameter_server",
            "modelparallel": "model_parallel"}.get(key, key)


def strategy_entry(name: str) -> StrategyEntry:
    """The entry for ``name`` (any spelling :func:`normalise_strategy_name` accepts).

    Raises:
        InvalidArgumentError: No strategy has that name (the message lists them).
    """
    entry = _STRATEGIES.get(normalise_strategy_name(name))
    if entry is None:
        raise InvalidArgumentError(f"unknown strategy {name!r}; choose one of {', '.join(_STRATEGIES)}")
    return entry


def make_strategy(name: str, devices: Sequence[str] | None = None) -> Any:
    """The strategy ``name`` on ``devices`` (``None``: its default devices)."""
    return strategy_entry(name).make(devices)


# ------------------------------------------------------------------ factories
def _one_device(devices: Sequence[str] | None) -> Any:
    from graphdist.distribute.one_device import OneDeviceStrategy

    if devices is not None and len(devices) > 1:
        raise InvalidArgumentError(f"one_device runs on one device, got {len(devices)} ({', '.join(devices)}); "
                                   "give one device or use mirrored")
    return OneDeviceStrategy((list(devices or []) or ["cpu:0"])[0])


def _mirrored(devices: Sequence[str] | None) -> Any:
    from graphdist.distribute.mirrored import MirroredStrategy

    return MirroredStrategy(None if devices is None else list(devices))


def _central_storage(devices: Sequence[str] | None) -> Any:
    from graphdist.distribute.central_storage import CentralStorageStrategy

    return CentralStorageStrategy(compute_devices=None if devices is None else list(devices))


def _tpu(devices: Sequence[str] | None) -> Any:
    """TPUStrategy on simulated cores ``tpu:0..N-1`` (one replica per core); ``devices`` must name them in order."""
    from graphdist.distribute.tpu import TPUClusterResolver, TPUStrategy

    if devices is None:
        return TPUStrategy(TPUClusterResolver("local[2]"))
    expected = [f"tpu:{i}" for i in range(len(devices))]
    if [d.strip().lower() for d in devices] != expected:
        raise InvalidArgumentError(f"tpu runs one replica per TPU-like core: the devices must be {','.join(expected)}, "
                                   f"got {','.join(devices)}")
    return TPUStrategy(TPUClusterResolver(f"local[{len(devices)}]"))


def _default(devices: Sequence[str] | None) -> Any:
    from graphdist.distribute.strategy import get_strategy

    if devices is not None:
        raise InvalidArgumentError("default runs on the default device; give no devices")
    return get_strategy()


def _multi_worker_mirrored(devices: Sequence[str] | None) -> Any:
    from graphdist.distribute.multi_worker import MultiWorkerMirroredStrategy

    return MultiWorkerMirroredStrategy(devices=None if devices is None else list(devices))


def _parameter_server(devices: Sequence[str] | None) -> Any:
    from graphdist.distribute.parameter_server import ParameterServerStrategy

    return ParameterServerStrategy(devices=None if devices is None else list(devices))


for _entry in (StrategyEntry("one_device", _one_device), StrategyEntry("mirrored", _mirrored),
               StrategyEntry("central_storage", _central_storage), StrategyEntry("tpu", _tpu),
               StrategyEntry("default", _default),
               StrategyEntry("multi_worker_mirrored", _multi_worker_mirrored, multi_process=True),
               StrategyEntry("parameter_server", _parameter_server, multi_process=True)):
    register_strategy(_entry)
