"""`make demo` end to end (fewer epochs): Mirrored on 2 devices trains digits, equals OneDevice."""

from __future__ import annotations

from models import demo


def test_demo_trains_and_checks(tmp_path, capsys) -> None:
    assert demo.main(["--epochs", "4", "--checkpoint", str(tmp_path / "demo.npz")]) == 0
    out = capsys.readouterr().out
    assert "graphdist.AllReduce" in out and "Mirrored equals OneDevice" in out
    assert (tmp_path / "demo.npz").is_file()
