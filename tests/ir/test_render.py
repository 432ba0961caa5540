"""Inspection views: overview tables in ``Graph.summary``/``Plan.summary``,
ONNX exports of every stage, DOT text and pictures rendered by Graphviz.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphdist as gd
from graphdist.compile.render import plan_to_dot
from graphdist.ir import graph_summary, render_graph, to_onnx
from graphdist.ir.render import graph_to_dot, moved_bytes, render_dot
from graphdist.models.mlp import make_step

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (apt-get install -y graphviz; "
                                      "`make test` installs it)")


@pytest.fixture(scope="module")
def mirrored() -> gd.ConcreteFunction:
    # An explicit NcclAllReduce: every gradient all-reduced (the collectives these tables and pictures show;
    # the default sums each gradient on the replica that updates it, see test_default_mirrored_plan_...).
    strategy = gd.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=gd.NcclAllReduce())
    step, args = make_step(strategy)
    return step.get_concrete_function(*args)


def test_default_mirrored_plan_shows_the_sums_and_their_transfers() -> None:
    step, args = make_step(gd.MirroredStrategy(["cpu:0", "cpu:1"]))
    plan = step.get_concrete_function(*args).plan
    text = plan.summary()
    comm = text.split("communication:")[1].split("run-time checks")[0].splitlines()
    transfers = [line for line in comm if " Transfer " in line]
    assert transfers and all("->" in line for line in transfers) and "AllReduce" not in text
    assert {"cpu:1 -> cpu:0", "cpu:0 -> cpu:1"} <= {" ".join(line.split()[-3:]) for line in transfers}
    dot = plan.to_dot()
    assert "Transfer" in dot or "transfer" in dot


@pytest.fixture(scope="module")
def central() -> gd.ConcreteFunction:
    strategy = gd.CentralStorageStrategy(["cpu:0", "cpu:1"])
    step, args = make_step(strategy)
    return step.get_concrete_function(*args)


def section(text: str, title: str) -> list[str]:
    """The lines of the table under ``title`` (up to the next unindented line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body = []
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break
        body.append(line)
    return body


# ------------------------------------------------------------- summaries
def test_unplaced_graph_summary_has_no_overview() -> None:
    graph = gd.trace(lambda x: np.tanh(x) * 2, np.ones((2, 3), np.float32))
    text = graph_summary(graph)
    assert "ops per device" not in text and "communication" not in text and "variables" not in text


def test_rewritten_summary_tables(mirrored: gd.ConcreteFunction) -> None:
    text = graph_summary(mirrored.graph("rewritten"))
    devices = section(text, "ops per device:")
    assert devices[0].split()[:4] == ["device", "replicas", "nodes", "comm"]
    rows = {line.split()[0]: line.split() for line in devices[2:]}
    assert set(rows) == {"cpu:0", "cpu:1"}
    assert rows["cpu:0"][1] == "0" and rows["cpu:1"][1] == "1"
    assert sum(int(r[2]) for r in rows.values()) == len(mirrored.graph("rewritten").nodes)

    # 4 gradient all-reduces and the loss reduction (2 nodes each); the labels checks are listed apart
    comm = section(text, "communication (5 collective/transfer group(s), 10 node(s)):")
    kernel = next(line for line in comm if "  8,192 B" in line)  # group keys are numbered per process
    # the first layer's kernel gradient: 64 x 32 float32 = 8,192 B, ring over two devices moves 2 (n-1) S
    assert kernel.split()[1:8] == ["graphdist.AllReduce", "SUM", "ring", "2", "8,192", "B", "16,384"]
    assert "cpu:0, cpu:1" in kernel
    total = 2 * (8192 + 128 + 1280 + 40 + 4)
    assert comm[-1].strip().startswith(f"per step: {total:,} B into collectives")
    assert all("AssertInRange" not in line for line in comm)
    # each replica's labels check (graphdist.AssertInRange), on its replica's device
    checks = section(text, "run-time checks (2):")
    assert [line.split()[-1] for line in checks] == ["cpu:0", "cpu:1"]
    assert all("labels of sparse_softmax_cross_entropy in [0, 10)" in line for line in checks)

    variables = section(text, "variables:")
    row = next(line for line in variables if line.startswith("  mlp/dense_0/kernel"))
    assert "MirroredVariable" in row and "mirrored on cpu:0, cpu:1" in row and "float32[64,32]" in row
    # the listing follows the overview; the outputs section stays last
    assert text.index("variables:") < text.index("\ninputs:") < text.index("\nnodes:") < text.rindex("outputs:")


def test_central_storage_summary_shows_transfers_and_placement(central: gd.ConcreteFunction) -> None:
    text = graph_summary(central.graph("partitioned"))
    comm = "\n".join(section(text, "communication ("))
    assert "graphdist.Transfer" in comm and "cpu:0 -> cpu:1" in comm
    assert "reduce_to_one" in comm and "root=0" in comm
    row = next(line for line in section(text, "variables:") if line.startswith("  mlp/dense_0/kernel"))
    assert "on cpu:0" in row and "(transfers)" in row and row.split()[-1] == "cpu:0"
    assert "segments" in section(text, "ops per device:")[0]


def test_plan_summary_tables(mirrored: gd.ConcreteFunction) -> None:
    plan = mirrored.plan
    text = plan.summary()
    assert text.splitlines()[0] == "Plan 'mlp_train_step': 4 segment(s) on cpu:0, cpu:1  backend=ort"
    devices = section(text, "devices:")
    assert [line.split()[0] for line in devices[2:]] == ["cpu:0", "cpu:1"]
    assert "cpu1.p0, cpu1.p1" in devices[3]
    segments = section(text, "segments (execution order):")
    assert [line.split()[0] for line in segments[2:]] == [s.name for s in plan.segments]
    comm = section(text, "communication:")
    assert comm[0].split()[:5] == ["task", "op", "algorithm", "reduce", "participants"]
    assert len(plan.comms) == 7 and len(plan.collectives) == 5 and len(plan.checks) == 2
    assert len(comm) == 2 + len(plan.collectives) + 1
    assert all(line.split()[1:4] == ["AllReduce", "ring", "SUM"] for line in comm[2:-1])
    assert "per step: 5 task(s), 19,288 B into collectives" in comm[-1]
    checks = section(text, "run-time checks (2):")  # each replica's labels check, apart from the collectives
    assert [line.split()[0] for line in checks] == [f"{c.name}:" for c in plan.checks]
    assert plan.describe_tasks() == "5 communication task(s) and 2 run-time check(s)"
    assert "variables (5, 9,648 B):" in text


def test_moved_bytes_model() -> None:
    assert moved_bytes("AllReduce", 4, 100) == 600
    assert moved_bytes("AllGather", 3, 10) == 60
    assert moved_bytes("Transfer", 1, 10) == 10
    assert moved_bytes("AllReduce", 1, 10) == 0
    assert moved_bytes("AllReduce", 2, None) is None


# ------------------------------------------------------------------ ONNX
@pytest.mark.parametrize("stage", ["traced", "rewritten", "partitioned"])
def test_onnx_export_of_every_stage_passes_the_checker(mirrored: gd.ConcreteFunction, stage: str,
                                                       tmp_path: Path) -> None:
    graph = mirrored.graph(stage)
    model = to_onnx(graph)
    onnx.checker.check_model(model, full_check=True)
    domains = {o.domain: o.version for o in model.opset_import}
    assert domains.get("graphdist") == 1  # collectives (and traced gradients/assigns) are graphdist-domain nodes
    assert {n.domain for n in model.graph.node if n.op_type in ("AllReduce", "Gradient", "AssignVariable")} <= \
        {"graphdist"}
    # typed: every value produced by a node has a tensor type with a shape (Netron shows them)
    typed = {vi.name for vi in [*model.graph.value_info, *model.graph.output]
             if vi.type.tensor_type.elem_type and vi.type.tensor_type.HasField("shape")}
    assert {o for n in model.graph.node for o in n.output} <= typed
    if stage != "traced":
        placed = [n for n in model.graph.node if n.op_type == "AllReduce"]
        assert placed and all({p.key for p in n.metadata_props} >= {"device", "replica"} for n in placed)
    path = tmp_path / f"{stage}.onnx"
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path), full_check=True)


# ------------------------------------------------------------------- DOT
def test_graph_dot_has_device_clusters_and_highlighted_collectives(mirrored: gd.ConcreteFunction) -> None:
    graph = mirrored.graph("partitioned")
    dot = graph_to_dot(graph)
    assert dot == graph_to_dot(graph)
    assert dot.startswith('digraph "mlp_train_step" {') and dot.rstrip().endswith("}")
    assert re.search(r'subgraph cluster_0 \{\n    graph \[label="cpu:0"', dot)
    assert re.search(r'subgraph cluster_1 \{\n    graph \[label="cpu:1"', dot)
    assert 'label="segment cpu1.p1"' in dot  # segments nest inside their device
    collectives = [line for line in dot.splitlines() if 'label="AllReduce SUM ring' in line]
    assert len(collectives) == 10 and all('fillcolor="#ffd8a8"' in line for line in collectives)
    assert dot.count('dir="none", style="dashed"') == 5  # one line joins the two participants of each group
    assert 'shape="cylinder"' in dot and 'label="mlp/dense_0/kernel\\nfloat32[64,32]"' in dot
    assert 'shape="invhouse"' in dot and 'label="arg0_r0\\nfloat32[8,64]"' in dot
    assert 'shape="house"' in dot and 'label="update mlp/dense_0/kernel:0' in dot
    assert dot.count("{") == dot.count("}")


def test_dot_quotes_awkward_names() -> None:
    graph = gd.Graph('we"ird\\name')
    x = graph.add_input('in "x"', np.float32, (2,))
    graph.outputs = graph.add_node("Neg", [x]).outputs
    dot = graph_to_dot(graph, legend=False)
    assert 'digraph "we\\"ird\\\\name"' in dot and 'label="in \\"x\\"\\nfloat32[2]"' in dot


def test_plan_dot(mirrored: gd.ConcreteFunction) -> None:
    dot = mirrored.plan.to_dot()
    assert dot == plan_to_dot(mirrored.plan)
    for seg in mirrored.plan.segments:
        assert f'label="{seg.name}\\n' in dot
    assert dot.count('label="AllReduce SUM ring') == 5
    assert "variables ->" in dot and "-> updates" in dot and "-> outputs" in dot


# ---------------------------------------------------------------- render
@needs_dot
@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_render_graph_and_plan_with_graphviz(mirrored: gd.ConcreteFunction, tmp_path: Path, suffix: str) -> None:
    graph_path = render_graph(mirrored.graph("partitioned"), str(tmp_path / f"graph{suffix}"))
    plan_path = mirrored.plan.render(str(tmp_path / f"plan{suffix}"))
    for path in (graph_path, plan_path):
        data = Path(path).read_bytes()
        if suffix == ".png":
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
        else:
            root = ET.fromstring(data)
            assert root.tag.endswith("svg")
            assert b"cpu:0" in data and b"AllReduce SUM ring" in data
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o044  # readable like any new file, not 0600
    assert not list(tmp_path.glob(".*.tmp"))


def test_render_dot_text_needs_no_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_DOT", str(tmp_path / "no-such-dot"))
    graph = gd.trace(lambda x: x + 1, np.ones(2, np.float32))
    path = render_graph(graph, str(tmp_path / "g.dot"))
    assert Path(path).read_text() == graph_to_dot(graph)


def test_render_without_dot_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDIST_DOT", str(tmp_path / "no-such-dot"))
    graph = gd.trace(lambda x: x + 1, np.ones(2, np.float32))
    with pytest.raises(gd.GraphdistError, match="apt-get install -y graphviz") as info:
        render_graph(graph, str(tmp_path / "g.svg"))
    assert "'dot'" in str(info.value) and "to_dot()" in str(info.value)
    assert not (tmp_path / "g.svg").exists()


def test_render_unknown_suffix(tmp_path: Path) -> None:
    graph = gd.trace(lambda x: x + 1, np.ones(2, np.float32))
    with pytest.raises(gd.InvalidArgumentError, match=r"\.svg or \.png"):
        render_graph(graph, str(tmp_path / "g.jpeg"))
    with pytest.raises(ValueError, match="no suffix"):
        render_dot("digraph {}", tmp_path / "g")


@pytest.mark.skipif(os.name != "posix", reason="uses a shell script as a fake dot")
def test_render_reports_dot_failures_and_timeouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = tmp_path / "failing-dot"
    failing.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 3\n")
    failing.chmod(0o755)
    monkeypatch.setenv("GRAPHDIST_DOT", str(failing))
    with pytest.raises(gd.GraphdistError, match=r"exit 3\): Error: syntax error in line 1"):
        render_dot("digraph {", tmp_path / "g.svg")
    slow = tmp_path / "slow-dot"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("GRAPHDIST_DOT", str(slow))
    with pytest.raises(gd.GraphdistError, match="did not finish"):
        render_dot("digraph {}", tmp_path / "g.svg", timeout=0.5)
    assert not (tmp_path / "g.svg").exists()


@needs_dot
def test_render_into_missing_directory(tmp_path: Path) -> None:
    graph = gd.trace(lambda x: x + 1, np.ones(2, np.float32))
    with pytest.raises(gd.GraphdistError, match="does not exist"):
        render_graph(graph, str(tmp_path / "absent" / "g.svg"))


def test_moved_bytes_between_processes() -> None:
    from graphdist.ir.render import moved_bytes

    # A ring all-reduce among 4 workers sends 2 * 3/4 of the buffer per worker; the plan is one worker's.
    assert moved_bytes("CrossWorkerAllReduce", 1, 4000, {"num_workers": 4}) == 6000
    assert moved_bytes("CrossWorkerAllGather", 1, 4000, {"num_workers": 4}) == 12000
    assert moved_bytes("PSPull", 1, 4000) == moved_bytes("PSPush", 1, 4000) == 4000
    assert moved_bytes("AllReduce", 2, 4000) == 8000  # within a process: every participant's traffic
