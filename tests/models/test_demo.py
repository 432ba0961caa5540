"""`make demo` end to end (fewer epochs): gd.keras on digits under Mirrored(2), >= 95%, equals OneDevice."""

from __future__ import annotations

from graphdist.models import demo


def test_demo_trains_saves_and_checks(tmp_path, capsys) -> None:
    assert demo.main(["--epochs", "6", "--save", str(tmp_path / "digits_model")]) == 0
    out = capsys.readouterr().out
    assert "Epoch 6/6" in out and "val_accuracy" in out and "samples/s" in out
    assert "summed on the reader" in out and "MirroredVariable" in out  # the plan summary: gradient sums
    assert "Mirrored equals OneDevice" in out and "predictions equal" in out
    assert (tmp_path / "digits_model" / "model.json").is_file()
    assert (tmp_path / "digits_model" / "serving" / "plan.json").is_file()


def test_demo_fails_below_the_target_accuracy(tmp_path, capsys) -> None:
    # One epoch of two steps (batch 1024) cannot reach 95%: the check must fail, not pass vacuously.
    assert demo.main(["--epochs", "1", "--batch", "1024", "--no-compare", "--save", str(tmp_path / "m")]) == 1
    assert "below 0.95" in capsys.readouterr().err
