"""The multi-host benchmark runs end to end on one unshaped link with few steps (root: network namespaces), and
the bytes it measures on the wire agree with the plan's (no timing checks)."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_multi_host
from benchmarks.netns import unavailable_reason

_REASON = unavailable_reason()


@pytest.mark.slow
@pytest.mark.skipif(bool(_REASON), reason=f"multi-host test bed unavailable: {_REASON}")
def test_multi_host_benchmark_smoke() -> None:
    results = bench_multi_host.run(quick=True, links=["unshaped veth"])
    link = results["links"]["unshaped veth"]
    assert set(link["allreduce"]) == set(bench_multi_host.SIZES)
    assert all(math.isfinite(t) and t > 0 for times in link["allreduce"].values() for t in times.values())
    for kind in bench_multi_host.MODELS:
        setups = link["training"][kind]
        assert set(setups) == set(bench_multi_host.SETUPS)
        assert setups["1 host"]["efficiency"] == 1.0 and setups["1 host"]["collectives"] == 0
        for setup in ("2 hosts", "2 hosts, packs + overlap"):
            result = setups[setup]
            assert math.isfinite(result["predicted_ms"]) and result["predicted_ms"] > setups["1 host"]["step_ms"]
            assert result["collectives"] >= 1
    # The MLP's 2.7 MB of gradients: what host 0 sent per step is the plan's payload plus TCP/MPI overhead.
    mlp = link["training"]["mlp"]["2 hosts"]
    assert mlp["payload_bytes"] <= mlp["sent_bytes"] <= 1.2 * mlp["payload_bytes"]
    assert link["training"]["mlp"]["2 hosts, packs + overlap"]["collectives"] < mlp["collectives"]
    assert "| unshaped veth | mlp | 2 hosts |" in bench_multi_host.markdown(results)
