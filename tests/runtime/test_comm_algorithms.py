"""The all-reduce algorithm registry: names, scopes, schedules and costs."""

from __future__ import annotations

import numpy as np
import pytest

from graphdist.errors import InvalidArgumentError
from graphdist.runtime.comm import algorithms, local
from graphdist.runtime.comm.algorithms import LOCAL_LINK, MPI_LINK, algorithm, algorithm_names, check_algorithm


def test_scopes_list_the_algorithms_that_run_there() -> None:
    assert algorithm_names("local") == ("ring", "hierarchical_copy", "reduce_to_one")
    assert algorithm_names("mpi") == ("ring", "tree", "auto")
    assert local.ALGORITHMS == algorithm_names("local")


def test_every_mpi_implementation_is_a_communicator_method() -> None:
    from graphdist.runtime.comm.mpi import MPICommunicator

    for name in algorithm_names("mpi"):
        assert callable(getattr(MPICommunicator, str(algorithm(name).mpi)))


@pytest.mark.parametrize(("name", "scope", "message"), [
    ("butterfly", "local", "unknown algorithm 'butterfly'; use one of ring, hierarchical_copy, reduce_to_one"),
    ("tree", "local", "algorithm 'tree' does not run between logical devices of one process; use one of ring, "
                      "hierarchical_copy, reduce_to_one"),
    ("reduce_to_one", "mpi", "does not run between worker processes \\(MPI\\); use one of ring, tree, auto"),
])
def test_unknown_or_out_of_scope_names_list_the_choices(name: str, scope: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        check_algorithm(name, scope)


@pytest.mark.parametrize("name", ["ring", "hierarchical_copy", "reduce_to_one"])
@pytest.mark.parametrize("count", [2, 3, 5])
def test_each_local_schedule_combines_every_contribution_once(name: str, count: int) -> None:
    size = 11
    covered = np.zeros((size, count), int)
    for lo, hi, (order, steps) in algorithm(name).local(count, 1, size):
        used = order if steps is None else sorted(op for _, a, b in steps for op in (a, b) if op >= 0)
        for index in used:
            covered[lo:hi, index] += 1
    assert (covered == 1).all()


def test_reduce_to_one_starts_at_the_root() -> None:
    ((_, _, (order, _)),) = algorithms.root_first_schedule(4, 2, 8)
    assert order == (2, 0, 1, 3)


def test_costs_follow_the_alpha_beta_model() -> None:
    big, tiny = 64 << 20, 8
    ring, tree = algorithm("ring").cost, algorithm("tree").cost
    # Between processes the ring moves about 2n bytes per rank, gathering moves (p-1)n: it wins for large buffers;
    # for tiny ones latency rules and the 2(p-1) ring steps lose to p-1 messages.
    assert ring(big, 4, MPI_LINK) < tree(big, 4, MPI_LINK)
    assert tree(tiny, 4, MPI_LINK) < ring(tiny, 4, MPI_LINK)
    assert algorithm("auto").cost(big, 4, MPI_LINK) <= ring(big, 4, MPI_LINK)
    # One participant costs nothing; more bytes never cost less.
    for name in algorithm_names():
        cost = algorithm(name).cost
        assert cost(big, 1, LOCAL_LINK) == 0.0
        assert cost(tiny, 3, LOCAL_LINK) <= cost(big, 3, LOCAL_LINK)


def test_collective_costs_are_latency_per_message_plus_bytes_sent_and_combined() -> None:
    """The alpha-beta-gamma prices the layout lowering ranks reshards by, from the table in the module docstring."""
    link = algorithms.Link(latency_s=1.0, seconds_per_byte=0.5, combine_seconds_per_byte=0.25)
    cost = algorithms.collective_cost
    assert cost("AllGather", 800, 4, link) == 3 * 1.0 + 3 * 800 * 0.5
    assert cost("AllToAll", 800, 4, link) == 3 * 1.0 + 600 * 0.5  # (p-1)/p of the block
    assert cost("ReduceScatter", 800, 4, link) == 3 * 1.0 + 600 * 0.5 + 600 * 0.25
    assert cost("AllReduce", 800, 4, link) == algorithm("ring").cost(800, 4, link)
    assert cost("AllToAll", 800, 1, link) == 0.0
    # Moving a split to another dimension: the all-to-all costs less than gathering on every registered link.
    for each in (LOCAL_LINK, MPI_LINK, algorithms.MESH_LINK):
        assert cost("AllToAll", 1 << 20, 2, each) <= cost("AllGather", 1 << 20, 2, each)
    assert cost("AllToAll", 1 << 20, 2, algorithms.MESH_LINK) < cost("AllGather", 1 << 20, 2, algorithms.MESH_LINK)
    with pytest.raises(InvalidArgumentError, match="no cost model for 'Broadcast'"):
        cost("Broadcast", 8, 2, link)
