"""Distribution strategies, distributed values and replica contexts."""

from graphdist.distribute import coordinator
from graphdist.distribute.central_storage import CentralStorageStrategy
from graphdist.distribute.cross_device_ops import (
    CrossDeviceOps,
    HierarchicalCopyAllReduce,
    NcclAllReduce,
    ReduceScatterAllGather,
    ReductionToOneDevice,
)
from graphdist.distribute.mirrored import MirroredStrategy
from graphdist.distribute.one_device import OneDeviceStrategy
from graphdist.distribute.reduce_op import ReduceOp
from graphdist.distribute.replica_context import ReplicaContext, get_replica_context, in_cross_replica_context
from graphdist.distribute.strategy import (
    Strategy,
    StrategyExtended,
    experimental_set_strategy,
    get_strategy,
    has_strategy,
)
from graphdist.trace.values import DistributedValues, PerReplica, ValueContext

__all__ = [
    "Strategy",
    "StrategyExtended",
    "OneDeviceStrategy",
    "MirroredStrategy",
    "CentralStorageStrategy",
    "CrossDeviceOps",
    "NcclAllReduce",
    "ReduceScatterAllGather",
    "HierarchicalCopyAllReduce",
    "ReductionToOneDevice",
    "ReduceOp",
    "ReplicaContext",
    "PerReplica",
    "DistributedValues",
    "ValueContext",
    "get_strategy",
    "has_strategy",
    "experimental_set_strategy",
    "get_replica_context",
    "in_cross_replica_context",
    "coordinator",
]
