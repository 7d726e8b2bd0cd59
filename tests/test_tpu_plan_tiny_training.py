"""The TPU plan's first half (training, generation, the analysis engine) at tiny sizes on
the CPU: every entry runs and its rows reach the table (`_tpu_plan_tiny.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from _tpu_plan_tiny import run_half  # noqa: E402


@pytest.mark.slow
def test_the_first_half_of_the_tiny_tpu_plan_runs_on_the_cpu(tmp_path: Path) -> None:
    table = run_half(0, tmp_path)
    assert "MFU of the trainer" in table and "decode tokens/s" in table
