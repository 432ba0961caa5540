"""Test-wide settings: a private compile cache and a clean strategy stack."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep the tests' on-disk compile cache out of the user's ~/.cache.
    import os

    os.environ.setdefault("GRAPHDIST_CACHE_DIR", str(tmp_path_factory.mktemp("graphdist-cache")))


@pytest.fixture(autouse=True)
def _no_leaked_strategy() -> None:
    import graphdist as gd

    yield
    gd.experimental_set_strategy(None)
