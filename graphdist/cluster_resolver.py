"""``gd.cluster_resolver``: where a process learns the cluster and its role.

``TFConfigClusterResolver`` (``GRAPHDIST_CONFIG`` / ``TF_CONFIG``),
``SimpleClusterResolver``, ``MPIClusterResolver`` and ``ClusterSpec`` (see
:mod:`graphdist.distribute.cluster`).
"""

from graphdist.distribute.cluster import (
    ClusterResolver,
    ClusterSpec,
    MPIClusterResolver,
    SimpleClusterResolver,
    TFConfigClusterResolver,
)

# TPUClusterResolver (graphdist/distribute/tpu.py) joins this namespace with TPUStrategy.

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "TFConfigClusterResolver",
    "SimpleClusterResolver",
    "MPIClusterResolver",
]
