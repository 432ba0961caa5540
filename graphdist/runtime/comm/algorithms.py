"""All-reduce algorithms: the one registry of their names, costs and implementations.

An algorithm is the order in which the participants' contributions are
combined; different orders agree to float tolerance, not bitwise, so the
algorithm is a property of the plan (``attrs["algorithm"]`` of an
``AllReduce`` / ``CrossWorkerAllReduce`` node), chosen by the strategy's
cross-device ops and validated when the compile pipeline is built
(:func:`check_algorithm`). Each :class:`AllReduceAlgorithm` has

* ``local``: its in-process implementation (the local communicator's
  schedule, :func:`ring_schedule` etc.), or ``None``;
* ``mpi``: the method of ``graphdist.runtime.comm.mpi.MPICommunicator`` that
  runs it between worker processes, or ``None`` (named, not imported: mpi4py
  is optional);
* ``cost(nbytes, participants, link)``: its estimated seconds in the
  alpha-beta-gamma model (:class:`Link`).

=====================  =====================  ==================================
name                   local                  MPI
=====================  =====================  ==================================
``ring``               chunked ring           reduce-scatter + all-gather
``hierarchical_copy``  pairwise tree          -
``reduce_to_one``      root first, in order   -
``tree``               -                      all-gather + pairwise tree
``auto``               -                      ``MPI_Allreduce`` (MPI picks)
=====================  =====================  ==================================

Adding one: write its schedule here or its method on ``MPICommunicator``, and
register it with :func:`register_algorithm`.

The other collectives have one algorithm each; :func:`collective_cost` prices
any of them on a :class:`Link` (each participant's messages, the bytes it
sends, the bytes it combines), which the layout lowering uses to choose how
to reshard a value (``graphdist.passes.lower_layouts``). With ``S`` the bytes
of one participant's input and ``p`` participants:

==================  ===============  ================  ===================
collective          messages         bytes sent        bytes combined
==================  ===============  ================  ===================
``AllReduce``       as its algorithm (``cost`` above)
``ReduceScatter``   ``p - 1``        ``(p-1)/p S``     ``(p-1)/p S``
``AllGather``       ``p - 1``        ``(p-1) S``       0
``AllToAll``        ``p - 1``        ``(p-1)/p S``     0
==================  ===============  ================  ===================

(ring reduce-scatter and all-gather; all-to-all pairwise, one message to
every other participant.) The links' constants are order-of-magnitude
figures, not measurements of a given machine: they rank the choices, and
the ranks do not change within a factor of a few.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphdist.errors import InvalidArgumentError

__all__ = ["AllReduceAlgorithm", "Link", "LOCAL_LINK", "MESH_LINK", "MPI_LINK", "algorithm", "collective_cost",
           "algorithm_names", "check_algorithm", "register_algorithm", "ring_schedule",
           "pairwise_schedule", "root_first_schedule"]

# A schedule says in which order one range of the flat buffer combines its contributions:
# (order, None) is the chain ((b[order[0]] + b[order[1]]) + b[order[2]]) + ...;
# (order, steps) is a tree: steps (dest, a, b) compute slot[dest] = combine(a, b), where an operand
# i >= 0 is input i and ~k (< 0) is slot k. Slot 0 is the output; slots 1.. are scratch blocks.
Step = tuple[int, int, int]
Schedule = tuple[tuple[int, ...], "tuple[Step, ...] | None"]
Piece = tuple[int, int, Schedule]  # (lo, hi, schedule) of the flat buffer
LocalSchedule = Callable[[int, int, int], tuple[Piece, ...]]  # (participants, root, size) -> pieces


@dataclass(frozen=True)
class Link:
    """The alpha-beta-gamma cost model of one kind of link.

    Attributes:
        latency_s: Fixed cost of one message (or, in process, of one combine call).
        seconds_per_byte: Cost of moving one byte between participants (0 in one address space).
        combine_seconds_per_byte: Cost of combining one byte of two operands.
    """

    latency_s: float
    seconds_per_byte: float
    combine_seconds_per_byte: float


#: Logical devices of one process: nothing moves, one thread combines every element.
LOCAL_LINK = Link(latency_s=2e-6, seconds_per_byte=0.0, combine_seconds_per_byte=1 / 4e9)
#: Worker processes through MPI (about a 10 Gb/s network).
MPI_LINK = Link(latency_s=20e-6, seconds_per_byte=1 / 1.25e9, combine_seconds_per_byte=1 / 4e9)
#: The devices of a layout mesh within one process, where moving a block is a memory copy: 2 us a message
#: (a communication task between segments), about 10 GB/s a copied byte (one core), 4 GB/s a combined one.
MESH_LINK = Link(latency_s=2e-6, seconds_per_byte=1 / 10e9, combine_seconds_per_byte=1 / 4e9)


@dataclass(frozen=True)
class AllReduceAlgorithm:
    """One all-reduce algorithm (see the module docstring).

    Attributes:
        name: The ``algorithm`` attribute value.
        summary: One line for error messages and docs.
        cost: ``(nbytes, participants, link) -> estimated seconds``.
        local: The in-process schedule, or ``None`` when it runs only between processes.
        mpi: The ``MPICommunicator`` method that runs it between processes, or ``None``.
        uses_root: Whether it accumulates into one participant (``attrs["root"]``).
    """

    name: str
    summary: str
    cost: Callable[[int, int, Link], float]
    local: LocalSchedule | None = None
    mpi: str | None = None
    uses_root: bool = False


_ALGORITHMS: dict[str, AllReduceAlgorithm] = {}


def register_algorithm(entry: AllReduceAlgorithm) -> AllReduceAlgorithm:
    """Adds ``entry`` to the registry (replacing one of the same name)."""
    _ALGORITHMS[entry.name] = entry
    return entry


def algorithm_names(scope: str = "any") -> tuple[str, ...]:
    """Names of the registered algorithms that run in ``scope``: ``"local"``, ``"mpi"`` or ``"any"``."""
    return tuple(name for name, entry in _ALGORITHMS.items()
                 if scope == "any" or (scope == "local" and entry.local) or (scope == "mpi" and entry.mpi))


def algorithm(name: str) -> AllReduceAlgorithm:
    """The registered algorithm ``name``.

    Raises:
        InvalidArgumentError: No algorithm has that name (the message lists them).
    """
    entry = _ALGORITHMS.get(name) if isinstance(name, str) else None
    if entry is None:
        raise InvalidArgumentError(f"unknown all-reduce algorithm {name!r}; use one of {', '.join(_ALGORITHMS)}")
    return entry


def check_algorithm(name: Any, scope: str, what: str = "all-reduce") -> AllReduceAlgorithm:
    """The algorithm ``name``, checked to run in ``scope`` (``"local"`` or ``"mpi"``).

    Raises:
        InvalidArgumentError: ``name`` is unknown, or has no implementation for ``scope``; the message
            names ``what`` and the algorithms that do run there.
    """
    entry = _ALGORITHMS.get(name) if isinstance(name, str) else None
    if entry is not None and getattr(entry, scope) is not None:
        return entry
    choices = ", ".join(algorithm_names(scope))
    if entry is None:
        raise InvalidArgumentError(f"{what}: unknown algorithm {name!r}; use one of {choices}")
    where = "between logical devices of one process" if scope == "local" else "between worker processes (MPI)"
    raise InvalidArgumentError(f"{what}: algorithm {name!r} does not run {where}; use one of {choices}")


# ------------------------------------------------------------- local schedules
def ring_schedule(count: int, root: int, size: int) -> tuple[Piece, ...]:
    """Chunk ``c`` of ``count`` is accumulated from replica ``c + 1`` round the ring to replica ``c``."""
    pieces = []
    for chunk in range(count):
        lo, hi = chunk * size // count, (chunk + 1) * size // count
        if hi > lo:
            pieces.append((lo, hi, (tuple((chunk + k) % count for k in range(1, count + 1)), None)))
    return tuple(pieces)


def pairwise_schedule(count: int, root: int, size: int) -> tuple[Piece, ...]:
    """The pairwise tree ``((b0 + b1) + (b2 + b3)) + ...`` over the whole buffer."""
    steps = _pairwise(count)
    return ((0, size, (tuple(range(count)), steps if max(d for d, _, _ in steps) else None)),)


def root_first_schedule(count: int, root: int, size: int) -> tuple[Piece, ...]:
    """``root`` first, then the other replicas in index order."""
    return ((0, size, ((root, *(i for i in range(count) if i != root)), None)),)


def _pairwise(count: int) -> tuple[Step, ...]:
    """Pairwise tree over inputs 0..count-1: ((b0 + b1) + (b2 + b3)) + ...; the total lands in slot 0.

    The tree pairs neighbours level by level (an odd one out moves up a
    level unchanged). It is evaluated depth first, so it needs one scratch
    slot per level (about log2(count)) rather than one per pair.
    """
    level: list[Any] = list(range(count))
    while len(level) > 1:
        nxt = [(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    steps: list[Step] = []

    def emit(node: Any, dest: int, free: int) -> int:
        """Computes ``node`` into slot ``dest``, using slots from ``free`` up as scratch."""
        left, right = node
        # The right subtree first (into the first free slot), so the left one is hot in cache for the
        # final combine; the left subtree must then keep off that slot.
        b = emit(right, free, free + 1) if isinstance(right, tuple) else right
        a = emit(left, dest, free + 1 if b < 0 else free) if isinstance(left, tuple) else left
        steps.append((dest, a, b))
        return ~dest

    emit(level[0], 0, 1)
    return tuple(steps)


# ----------------------------------------------------------------------- costs
def _ring_cost(nbytes: int, p: int, link: Link) -> float:
    """Reduce-scatter then all-gather: 2(p-1) steps of n/p bytes; each participant combines (p-1)/p of n.

    In one process one thread does every participant's share: (p-1) n bytes combined, p(p-1) calls.
    """
    if p < 2:
        return 0.0
    if link.seconds_per_byte == 0.0:
        return p * (p - 1) * link.latency_s + (p - 1) * nbytes * link.combine_seconds_per_byte
    return 2 * (p - 1) * (link.latency_s + nbytes / p * link.seconds_per_byte) \
        + (p - 1) / p * nbytes * link.combine_seconds_per_byte


def _gather_then_combine_cost(nbytes: int, p: int, link: Link) -> float:
    """Every participant's buffer reaches every other (p-1 messages of n), then p-1 combines of n."""
    if p < 2:
        return 0.0
    return (p - 1) * (link.latency_s + nbytes * link.seconds_per_byte + nbytes * link.combine_seconds_per_byte)


def _mpi_auto_cost(nbytes: int, p: int, link: Link) -> float:
    """MPI picks by size: recursive doubling (log2 p rounds of n) for small buffers, the ring for large."""
    if p < 2:
        return 0.0
    rounds = math.ceil(math.log2(p))
    doubling = rounds * (link.latency_s + nbytes * (link.seconds_per_byte + link.combine_seconds_per_byte))
    return min(doubling, _ring_cost(nbytes, p, link))


def collective_cost(op_type: str, nbytes: int, participants: int, link: Link, algorithm_name: str = "ring") -> float:
    """Estimated seconds of one collective over ``participants`` of ``nbytes`` each (see the module docstring).

    Args:
        op_type: ``"AllReduce"``, ``"ReduceScatter"``, ``"AllGather"`` or ``"AllToAll"``.
        nbytes: Bytes of one participant's input.
        participants: The group's size.
        link: The link's constants.
        algorithm_name: The all-reduce's algorithm (only for ``"AllReduce"``).

    Raises:
        InvalidArgumentError: Another op.
    """
    p = int(participants)
    if p < 2:
        return 0.0
    if op_type == "AllReduce":
        return algorithm(algorithm_name).cost(nbytes, p, link)
    shares = {"ReduceScatter": ((p - 1) / p, (p - 1) / p), "AllGather": (p - 1, 0.0), "AllToAll": ((p - 1) / p, 0.0)}
    if op_type not in shares:
        raise InvalidArgumentError(f"collective_cost: no cost model for {op_type!r}; use one of AllReduce, "
                                   f"{', '.join(shares)}")
    sent, combined = shares[op_type]
    return (p - 1) * link.latency_s + sent * nbytes * link.seconds_per_byte \
        + combined * nbytes * link.combine_seconds_per_byte


register_algorithm(AllReduceAlgorithm(
    "ring", "chunked ring: reduce-scatter then all-gather (bandwidth-optimal)", _ring_cost,
    local=ring_schedule, mpi="_ring_all_reduce"))
register_algorithm(AllReduceAlgorithm(
    "hierarchical_copy", "pairwise tree ((b0 + b1) + (b2 + b3)) + ... between logical devices",
    _gather_then_combine_cost, local=pairwise_schedule))
register_algorithm(AllReduceAlgorithm(
    "reduce_to_one", "accumulate on one device (root first), then share", _gather_then_combine_cost,
    local=root_first_schedule, uses_root=True))
register_algorithm(AllReduceAlgorithm(
    "tree", "all-gather, then the pairwise tree in rank order on every rank (deterministic)",
    _gather_then_combine_cost, mpi="_tree_all_reduce"))
register_algorithm(AllReduceAlgorithm(
    "auto", "MPI's own all-reduce (the MPI library picks the algorithm by size)", _mpi_auto_cost,
    mpi="_auto_all_reduce"))
