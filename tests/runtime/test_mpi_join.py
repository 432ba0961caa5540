"""Joining tasks started on their own (graphdist.runtime.comm.mpi_join), the parts that need no MPI job: the
network settings MPI gets, the interface towards another host, the command a task re-executes itself as."""

from __future__ import annotations

import sys

import pytest

import graphdist as gd
from graphdist.runtime.cluster_spec import ClusterSpec
from graphdist.runtime.comm import mpi_join


def test_the_interface_towards_an_address_is_the_one_routing_to_it() -> None:
    assert mpi_join.interface_towards("127.0.0.1") == "lo"
    assert mpi_join.interface_towards("127.5.6.7") == "lo"  # all of 127/8 is loopback
    assert mpi_join.interface_towards("not an address") is None


def test_network_settings_pick_tcp_on_the_interface_towards_the_other_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mpi_join.IFACE_ENV, raising=False)
    spec = ClusterSpec({"worker": ["localhost:2222", "127.0.0.1:2223"], "ps": ["no-such-host.invalid:1"]})
    settings = mpi_join.network_settings(spec, 0)
    assert settings == {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "MPIR_CVAR_NO_COLLECTIVE_FINALIZE": "1",
                        "FI_TCP_IFACE": "lo"}  # an address that does not resolve is skipped
    monkeypatch.setenv(mpi_join.IFACE_ENV, "eth3")
    assert mpi_join.network_settings(spec, 0)["FI_TCP_IFACE"] == "eth3"


def test_an_interactive_session_cannot_re_execute_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mpi_join.reexec_command("/x/mpiexec")[:4] == ["/x/mpiexec", "-n", "1", sys.executable]
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    with pytest.raises(gd.ClusterConfigError, match="interactive session, which cannot join the job"):
        mpi_join.reexec_command("/x/mpiexec")


def test_the_tasks_that_meet_are_all_but_evaluators() -> None:
    spec = ClusterSpec({"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"], "evaluator": ["e:1"]})
    assert mpi_join.meeting_ranks(spec) == [0, 1, 2, 3]
