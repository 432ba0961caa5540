"""benchmarks.onnx_node_coverage on a few ONNX node cases: counts, grouped reasons, JSON and markdown."""

from __future__ import annotations

import json
import logging

from benchmarks import onnx_node_coverage as coverage

# test_abs: both pass; test_identity_sequence: ORT passes, graphdist refuses sequences (a GraphError);
# test_bitcast_bool_to_uint8: ONNX Runtime 1.31 has no BitCast kernel, so both fail.
ONLY = ["test_abs", "test_identity_sequence", "test_bitcast_bool_to_uint8"]


def test_coverage_smoke(tmp_path) -> None:
    levels = {name: logging.getLogger(name).level for name in ("graphdist", "tvm")}
    results = coverage.run(backends=("ort", "function:ort"), only=ONLY)
    # quiet while it runs, then graphdist's warnings reach the rest of the process again
    assert {name: logging.getLogger(name).level for name in levels} == levels
    names = [c.name for c in coverage.node_cases(ONLY)]
    assert names == ["test_abs", "test_bitcast_bool_to_uint8", "test_identity_sequence"]
    assert results["cases"] == 3
    ort, gd = results["ort"], results["backends"]["ort"]
    assert (ort["passes"], gd["passes"]) == (2, 1)
    assert sum(ort["failures"].values()) == 1 and sum(gd["failures"].values()) == 2
    assert gd["failing_ort_passes"] == {"test_identity_sequence": gd["failing_ort_passes"]["test_identity_sequence"]}
    assert "is a sequence value" in gd["failing_ort_passes"]["test_identity_sequence"]
    assert "'…'" in gd["failing_ort_passes"]["test_identity_sequence"]  # the value's name taken out
    assert (gd["passes_among_ort"], gd["share_of_ort"], gd["only_graphdist"]) == (1, 0.5, [])
    assert gd["goal"] == 0.97 and gd["goal_met"] is False and results["goal_met"] is False
    assert any("BitCast" in reason for reason in ort["failures"])
    through_function = results["backends"]["function:ort"]  # the path that distributes a model
    assert through_function["passes"] == 1 and through_function["goal"] == 0.97
    assert list(through_function["failing_ort_passes"]) == ["test_identity_sequence"]
    text = coverage.markdown(results)
    assert text.startswith("## ONNX node tests") and "| `graphdist.onnx.backend` on `ort` | " in text
    assert "| `gd.function(gd.onnx.load(m))` on `ort` | " in text
    assert "`test_identity_sequence`" in text
    assert "`graphdist.onnx.backend` on `ort`: passes" in coverage.table(results)
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# title\n\n<!-- begin other -->\nkeep\n<!-- end other -->\n")
    for _ in range(2):  # replaces its section, does not append twice
        coverage.write_section(text, path)
    written = path.read_text()
    assert written.count(f"<!-- begin {coverage.NAME} -->") == 1 and "keep" in written
    assert "Machine for these numbers: CPU: " in text


def test_main_saves_json(tmp_path) -> None:
    out = tmp_path / "coverage.json"
    status = coverage.main(["--backends", "ort", "--only", "test_abs", "--output", str(out)])
    saved = json.loads(out.read_text())
    assert status == 0 and saved["cases"] == 1
    assert saved["ort"]["passes"] == 1 and saved["backends"]["ort"]["passes_among_ort"] == 1
    assert coverage.main(["--from-json", str(out)]) == 0


def test_reasons_group_equal_failures() -> None:
    a = coverage.reason_of(ValueError("graph input 'x0' is a sequence value (opset 17)"))
    b = coverage.reason_of(ValueError("graph input 'seq' is a sequence value (opset 18)"))
    assert a == b == "ValueError: graph input '…' is a sequence value (opset N)"
    assert coverage.reason_of(AssertionError("\nNot equal to tolerance rtol=0.001")).startswith("wrong values")
    assert coverage.reason_of(AssertionError("Output 0 has incorrect shape")) == "wrong output shape"
    assert coverage.reason_of(AssertionError("Items are not equal:\n ACTUAL: dtype('uint8')")) == "wrong output dtype"
