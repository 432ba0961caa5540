"""Pass pipelines of the synchronous strategies (configuration, not branches in passes)."""

from __future__ import annotations

from typing import Any

__all__ = ["sync_pipeline"]


def sync_pipeline(cross_device_ops: Any = None) -> list[Any]:
    """Autodiff, variable updates, replica ids, collectives (with the strategy's
    all-reduce algorithm), dead-code elimination and device placement.
    """
    from passes.assign_devices import AssignDevicesPass
    from passes.autodiff import AutodiffPass
    from passes.eliminate_dead_nodes import EliminateDeadNodesPass
    from passes.lower_collectives import LowerCollectivesPass
    from passes.lower_variable_updates import LowerVariableUpdatesPass
    from passes.materialize_replica_ids import MaterializeReplicaIdsPass

    collective_attrs = cross_device_ops.collective_attrs() if cross_device_ops is not None else None
    return [AutodiffPass(), LowerVariableUpdatesPass(), MaterializeReplicaIdsPass(),
            LowerCollectivesPass(collective_attrs), EliminateDeadNodesPass(), AssignDevicesPass()]
