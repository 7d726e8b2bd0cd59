"""A benchmark that exits 1 says why, one line per miss (`_report.exit_status`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _report


def _row(what: str, met: bool | None) -> _report.Row:
    return _report.info_row(what, "0.91x", [0.91], unit="x", goal=(">=", 0.95), met=met)


def test_all_goals_met_is_zero_and_silent(capsys: pytest.CaptureFixture[str]) -> None:
    assert _report.exit_status([_row("a", True), _row("b", None)], checks=[(True, "x")]) == 0
    assert capsys.readouterr().err == ""


def test_each_miss_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [_row("SAE step vs hand loop", False), _row("ok", True)]
    assert _report.exit_status(rows, checks=[(False, "the parameters differ")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "goal missed: SAE step vs hand loop: 0.91x (goal >= 0.95 x)",
        "check failed: the parameters differ",
    ]
