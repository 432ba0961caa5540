"""``gd.experimental``: the strategies tf.distribute lists under ``tf.distribute.experimental``.

``gd.experimental.TPUStrategy`` is ``gd.TPUStrategy``, and so on: the seeds use
both spellings (``tf.distribute.experimental.MultiWorkerMirroredStrategy``).
``gd.experimental.CommunicationOptions`` (``tf.distribute.experimental.CommunicationOptions``)
configures ``MultiWorkerMirroredStrategy``'s collectives. The same names are
also ``gd.distribute.experimental.*``.
"""

from graphdist.distribute.central_storage import CentralStorageStrategy
from graphdist.distribute.multi_worker import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
    MultiWorkerMirroredStrategy,
)
from graphdist.distribute.parameter_server import ParameterServerStrategy
from graphdist.distribute.tpu import TPUStrategy

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "TPUStrategy",
]
