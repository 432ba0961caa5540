"""``gd.experimental``: the strategies tf.distribute lists under ``tf.distribute.experimental``.

``gd.experimental.TPUStrategy`` is ``gd.TPUStrategy``, and so on: the seeds use
both spellings (``tf.distribute.experimental.MultiWorkerMirroredStrategy``).
"""

from graphdist.distribute.central_storage import CentralStorageStrategy
from graphdist.distribute.multi_worker import (
    CollectiveCommunication,
    CommunicationImplementation,
    MultiWorkerMirroredStrategy,
)
from graphdist.distribute.parameter_server import ParameterServerStrategy
from graphdist.distribute.tpu import TPUStrategy

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "TPUStrategy",
]
