"""``gd.distribute.experimental``: the strategies tf.distribute lists under ``tf.distribute.experimental``.

``gd.distribute.experimental.TPUStrategy`` is ``gd.TPUStrategy``, and so on: the
seeds use both spellings (``tf.distribute.experimental.MultiWorkerMirroredStrategy``).
``CommunicationOptions`` (``tf.distribute.experimental.CommunicationOptions``)
configures ``MultiWorkerMirroredStrategy``'s collectives. ``DeviceMesh``, ``LayoutMap``,
``TensorLayout``, ``ModelParallelStrategy`` and ``with_sharding_constraint`` are tensor parallelism with
Keras 3's names (:mod:`graphdist.distribute.model_parallel`). ``gd.experimental``
(the spelling of API.md) holds the same names. ``coordinator`` is
:mod:`graphdist.distribute.coordinator` (TF2's ``ClusterCoordinator``, not implemented: it says what to
write instead).
"""

from graphdist.distribute import coordinator
from graphdist.distribute.central_storage import CentralStorageStrategy
from graphdist.distribute.model_parallel import (
    DeviceMesh,
    LayoutMap,
    ModelParallelStrategy,
    TensorLayout,
    with_sharding_constraint,
)
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
    "DeviceMesh",
    "LayoutMap",
    "ModelParallelStrategy",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "TPUStrategy",
    "TensorLayout",
    "coordinator",
    "with_sharding_constraint",
]
