"""graphdist: the tf.distribute programming model for numpy-style Python,
compiled through ONNX (ONNX Runtime, Apache TVM, onnx.reference).

    import numpy as np
    import graphdist as gd

    strategy = gd.OneDeviceStrategy("cpu:0")
    result = strategy.run(lambda x: np.tanh(x) * 2, args=(np.ones(3, np.float32),))
"""

from graphdist import (
    cluster_resolver,
    config,
    data,
    debugging,
    experimental,
    keras,
    nest,
    onnx,
    optimizers,
    random,
    stats,
    tpu,
    train,
)
from graphdist.compile import ConcreteFunction, Function, LoadedPlan, Plan, function, load_plan
from graphdist.distribute import (
    CentralStorageStrategy,
    CrossDeviceOps,
    DistributedValues,
    HierarchicalCopyAllReduce,
    MirroredStrategy,
    NcclAllReduce,
    OneDeviceStrategy,
    PerReplica,
    ReduceOp,
    ReductionToOneDevice,
    ReplicaContext,
    Strategy,
    StrategyExtended,
    ValueContext,
    experimental_set_strategy,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from graphdist.distribute import experimental as _distribute_experimental  # noqa: F401  (gd.distribute.experimental)
from graphdist.distribute.input import InputContext
from graphdist.distribute.multi_worker import (
    CollectiveCommunication,
    CommunicationImplementation,
    MultiWorkerMirroredStrategy,
)
from graphdist.distribute.parameter_server import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    ParameterServerStrategy,
)
from graphdist.distribute.tpu import TPUStrategy
from graphdist.distribute.variables import MirroredVariable, Variable
from graphdist.errors import (
    AxisError,
    BackendError,
    CheckpointError,
    ClusterConfigError,
    CollectiveTimeoutError,
    DeviceError,
    GraphdistError,
    GraphError,
    InvalidArgumentError,
    NumericsError,
    PlanError,
    StorageError,
    TracingError,
)
from graphdist.ir import Graph, Node, Value, verify
from graphdist.runtime.ps_server import Server
from graphdist.trace import Tensor, TensorSpec, nn, trace
from graphdist.trace.tape import GradientTape, grad, stop_gradient, value_and_grad
from graphdist.version import __version__

__all__ = [
    "__version__",
    "config",
    "debugging",
    "random",
    "experimental",
    "tpu",
    "nest",
    "onnx",
    "stats",
    "function",
    "Function",
    "ConcreteFunction",
    "Plan",
    "LoadedPlan",
    "load_plan",
    "trace",
    "Variable",
    "MirroredVariable",
    "GradientTape",
    "grad",
    "value_and_grad",
    "stop_gradient",
    "optimizers",
    "keras",
    "nn",
    "train",
    "data",
    "InputContext",
    "Tensor",
    "TensorSpec",
    "Graph",
    "Node",
    "Value",
    "verify",
    "Strategy",
    "StrategyExtended",
    "OneDeviceStrategy",
    "MirroredStrategy",
    "TPUStrategy",
    "CentralStorageStrategy",
    "MultiWorkerMirroredStrategy",
    "CommunicationImplementation",
    "CollectiveCommunication",
    "cluster_resolver",
    "ParameterServerStrategy",
    "Server",
    "FixedShardsPartitioner",
    "MinSizePartitioner",
    "MaxSizePartitioner",
    "CrossDeviceOps",
    "NcclAllReduce",
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
    "GraphdistError",
    "TracingError",
    "AxisError",
    "GraphError",
    "InvalidArgumentError",
    "PlanError",
    "BackendError",
    "DeviceError",
    "CheckpointError",
    "ClusterConfigError",
    "CollectiveTimeoutError",
    "StorageError",
    "NumericsError",
]
