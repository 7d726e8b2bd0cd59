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


def test_a_terminated_runner_takes_its_benchmark_down(tmp_path: Path) -> None:
    """`timeout python -m benchmarks` once left the benchmark it ran (its own process
    group) holding the TPU, and the next program on the chip failed to start."""
    import contextlib
    import os
    import signal
    import subprocess
    import time

    (tmp_path / "sleeper.py").write_text(
        "import os, sys, time\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    runner = (
        "import sys; from pathlib import Path\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from benchmarks import run\n"
        f"run.HERE = Path({str(tmp_path)!r}); run.ROOT = run.HERE\n"
        "run._stop_on_sigterm()\n"
        f"run.run_one(run.Benchmark('sleeper', 'sleeps'), Path({str(tmp_path / 'out.json')!r}), False)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the benchmark never started"
        time.sleep(0.05)
    child = int((tmp_path / "pid").read_text())
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while True:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break  # gone
            assert time.monotonic() < deadline, (
                "the benchmark outlived the runner that SIGTERM stopped"
            )
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
