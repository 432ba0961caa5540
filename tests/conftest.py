"""Test-wide settings: a private compile cache and signing key, verify() after every pass, a clean strategy stack."""

from __future__ import annotations

import os

import pytest

# Every pass of every pipeline the tests run is followed by verify() (outside the tests, only the
# pipeline's result is verified): a broken invariant is reported with the pass that broke it.
os.environ.setdefault("GRAPHDIST_VERIFY", "passes")


@pytest.fixture(autouse=True, scope="session")
def _private_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep the tests' on-disk compile cache and the key that signs their plans out of the user's ~/.cache
    # and ~/.config.
    os.environ.setdefault("GRAPHDIST_CACHE_DIR", str(tmp_path_factory.mktemp("graphdist-cache")))
    os.environ.setdefault("GRAPHDIST_SIGNING_KEY", str(tmp_path_factory.mktemp("graphdist-config") / "signing-key"))


@pytest.fixture(autouse=True)
def _no_reexecution(monkeypatch: pytest.MonkeyPatch) -> None:
    # A strategy given a multi-task cluster in a process no MPI launcher started re-executes that process
    # under mpiexec (graphdist.runtime.comm.mpi_join): in an in-process test, that would be pytest itself.
    from graphdist.runtime.comm import mpi_join

    def refuse(spec: object, rank: int) -> None:
        raise AssertionError(f"an in-process test asked to re-execute this process under mpiexec (rank {rank} of "
                             f"{spec}); start the tasks as separate processes")

    monkeypatch.setattr(mpi_join, "_reexecute", refuse)


@pytest.fixture(autouse=True)
def _no_leaked_strategy() -> None:
    import graphdist as gd

    yield
    gd.experimental_set_strategy(None)
