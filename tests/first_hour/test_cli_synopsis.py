"""The CLI synopsis in the docs is generated from the argument parser and lists every subcommand."""

from __future__ import annotations

from pathlib import Path

from graphdist.cli.main import main, subcommands, synopsis

REPO = Path(__file__).resolve().parents[2]


def test_synopsis_lists_every_subcommand_with_its_options() -> None:
    text = synopsis()
    starts = [line.split()[1] for line in text.splitlines() if line.startswith("graphdist ")]
    assert starts == list(subcommands())
    assert {"devices", "inspect", "export", "run", "replan", "launch", "bench"} <= set(starts)
    for name, parser in subcommands().items():
        for action in parser._actions:
            if action.option_strings and "-h" not in action.option_strings:
                # argparse's usage shows each option by its first spelling (-o for -o/--output)
                assert action.option_strings[0] in text, f"{name}: {action.option_strings} missing from the synopsis"


def test_the_docs_show_the_current_synopsis() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    holding = [page.name for page in pages if synopsis() in page.read_text()]
    assert holding, "no page shows `graphdist --synopsis`; paste its output into the CLI section"


def test_synopsis_option_prints_it(capsys) -> None:
    assert main(["--synopsis"]) == 0
    assert capsys.readouterr().out == synopsis()
