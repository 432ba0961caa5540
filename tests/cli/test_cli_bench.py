"""``graphdist bench``: timing a compiled step on one backend or several (run as a subprocess).

The numbers themselves are not checked (speed is measured in benchmarks/); the report's
consistency is: each backend really compiled its own plan, the throughput is the global
batch over the median, the ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import json
import statistics

from test_cli import MLP_FORWARD, MLP_STEP, assert_clean_failure, graphdist


def test_bench_one_backend_prints_a_table() -> None:
    result = graphdist("bench", MLP_FORWARD, "--steps", "3", "--rounds", "2", "--warmup", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("graphdist.models.mlp:forward: 2 rounds x 3 calls per backend")
    assert "global batch 8" in lines[0]
    assert lines[1].split() == ["backend", "compile", "s", "median", "ms", "p90", "ms", "examples/s"]
    assert lines[2].split()[0] == "ort"


def test_bench_compare_writes_consistent_json(tmp_path) -> None:
    out = tmp_path / "timings.json"
    result = graphdist("bench", MLP_STEP, "--strategy", "mirrored", "--devices", "cpu:0,cpu:1",
                       "--compare", "ort,reference", "--steps", "2", "--rounds", "3", "--format", "json",
                       "-o", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["global_batch"] == 16 and report["rounds"] == 3 and report["steps_per_round"] == 2
    ort, reference = report["results"]
    # --compare really compiled each backend (a factory's own gd.function is rebuilt with the backend asked for).
    assert (ort["backend"], reference["backend"]) == ("ort", "reference")
    assert ort["devices"] == reference["devices"] == ["cpu:0", "cpu:1"]
    for row in (ort, reference):
        assert len(row["rounds_ms"]) == 3 and row["compile_s"] > 0
        assert row["median_ms"] == statistics.median(row["rounds_ms"])
        assert row["p90_ms"] >= row["median_ms"]
        assert abs(row["examples_per_s"] - 16 / (row["median_ms"] / 1e3)) < 1e-6 * row["examples_per_s"]
    expected = statistics.median(r / o for r, o in zip(reference["rounds_ms"], ort["rounds_ms"]))
    assert abs(reference["vs_baseline"] - expected) < 1e-9 and ort["vs_baseline"] == 1.0


def test_backend_option_overrides_a_factorys_gd_function(tmp_path) -> None:
    out = tmp_path / "t.json"
    result = graphdist("bench", MLP_STEP, "--backend", "reference", "--steps", "1", "--rounds", "1",
                       "--format", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["results"][0]["backend"] == "reference"


def test_bench_argument_errors() -> None:
    assert_clean_failure(graphdist("bench", MLP_FORWARD, "--steps", "0"), "--steps must be at least 1")
    assert_clean_failure(graphdist("bench", MLP_FORWARD, "--compare", "ort,onnx"),
                         "--compare: unknown backend(s) ['onnx']")
    assert_clean_failure(graphdist("bench", MLP_FORWARD, "--compare", "ort,ort"), "names a backend twice")
    assert_clean_failure(graphdist("bench", MLP_FORWARD, "--compare", "ort,tvm", "--backend", "ort"),
                         "give --backend or --compare, not both")
    assert_clean_failure(graphdist("bench", "graphdist.models.mlp"), "neither 'module:function'")


def test_usage_errors_of_subcommands_in_other_modules_exit_2_under_python_m() -> None:
    """``python -m graphdist.cli.main`` runs main.py as ``__main__``: the UsageError that bench.py and
    launch.py raise must still be a usage error (exit 2, one line), not an "unexpected" failure."""
    assert_clean_failure(graphdist("launch", "--workers", "2"), "launch: give the command after --")
    assert_clean_failure(graphdist("bench", MLP_FORWARD, "--rounds", "0"), "--rounds must be at least 1")
    assert "unexpected" not in graphdist("bench", MLP_FORWARD, "--warmup", "-1").stderr
