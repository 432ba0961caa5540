"""``gd.cluster_resolver``: where a process learns the cluster and its role.

``TFConfigClusterResolver`` (``GRAPHDIST_CONFIG`` / ``TF_CONFIG``),
``SimpleClusterResolver``, ``MPIClusterResolver``, ``SlurmClusterResolver`` (a Slurm job step)
and ``ClusterSpec`` (see
:mod:`graphdist.distribute.cluster`); ``TPUClusterResolver`` (TPU-like cores,
see :mod:`graphdist.distribute.tpu`).
"""

from graphdist.distribute.cluster import (
    ClusterResolver,
    ClusterSpec,
    MPIClusterResolver,
    SimpleClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
)
from graphdist.distribute.tpu import TPUClusterResolver

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "TFConfigClusterResolver",
    "SimpleClusterResolver",
    "MPIClusterResolver",
    "SlurmClusterResolver",
    "TPUClusterResolver",
]
