"""Pass pipelines of the synchronous strategies (configuration, not branches in passes)."""

from __future__ import annotations

from typing import Any

__all__ = ["sync_pipeline"]


def sync_pipeline(cross_device_ops: Any = None, parameter_device: Any = None) -> list[Any]:
    """Autodiff, variable updates, replica ids, collectives (with the strategy's
    all-reduce algorithm), dead-code elimination and device placement.

    With ``parameter_device`` (central storage) variable reads and the update
    computation are placed on that device before the collectives are lowered.
    """
    from passes.assign_devices import AssignDevicesPass
    from passes.autodiff import AutodiffPass
    from passes.eliminate_dead_nodes import EliminateDeadNodesPass
    from passes.lower_collectives import LowerCollectivesPass
    from passes.lower_stop_gradients import LowerStopGradientsPass
    from passes.lower_variable_updates import LowerVariableUpdatesPass
    from passes.materialize_replica_ids import MaterializeReplicaIdsPass

    collective_attrs = cross_device_ops.collective_attrs() if cross_device_ops is not None else None
    placement = []
    if parameter_device is not None:
        from passes.place_variables import PlaceVariablesPass

        placement = [PlaceVariablesPass(parameter_device)]
    bucketing = []
    options = getattr(cross_device_ops, "bucketing", lambda: None)()
    if options:  # fuse small all-reduces into packs (after lowering: needs groups with algorithms)
        from passes.bucket_collectives import BucketCollectivesPass

        bucketing = [BucketCollectivesPass(**options)]
    return [AutodiffPass(), LowerStopGradientsPass(), LowerVariableUpdatesPass(), MaterializeReplicaIdsPass(),
            *placement, LowerCollectivesPass(collective_attrs), *bucketing, EliminateDeadNodesPass(),
            AssignDevicesPass()]
