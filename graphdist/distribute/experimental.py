"""``gd.distribute.experimental``: the same names as ``gd.experimental``.

``tf.distribute.experimental.X`` is ``gd.experimental.X`` (the spelling of
API.md) and also ``gd.distribute.experimental.X``, e.g.
``gd.distribute.experimental.CommunicationOptions(bytes_per_pack=...)``.
"""

from graphdist.experimental import (
    CentralStorageStrategy,
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
    MultiWorkerMirroredStrategy,
    ParameterServerStrategy,
    TPUStrategy,
)

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "TPUStrategy",
]
