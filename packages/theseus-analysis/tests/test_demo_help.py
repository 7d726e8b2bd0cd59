"""`theseus demo --help`: ROOT is optional, and the help says where the demo goes without it."""

from __future__ import annotations

from click.testing import CliRunner

from theseus.cli import ROOT_HELP, main


def test_demo_usage_shows_root_optional_and_help_gives_its_default() -> None:
    result = CliRunner().invoke(main, ["demo", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    [usage] = [line for line in result.output.splitlines() if line.startswith("Usage:")]
    assert usage.endswith("demo [OPTIONS] [ROOT]")
    text = " ".join(result.output.split())
    assert "ROOT defaults to ./theseus-demo, in the current folder." in text
    assert " ".join(ROOT_HELP.split()) in text  # what every verb's help says of ROOT
