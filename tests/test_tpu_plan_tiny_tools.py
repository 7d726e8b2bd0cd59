"""The TPU plan's second half (SAE training, lm-eval, the analysis library, the attention
kernels) at tiny sizes on the CPU: every entry runs and its rows reach the table
(`_tpu_plan_tiny.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from _tpu_plan_tiny import run_half  # noqa: E402


@pytest.mark.slow
def test_the_second_half_of_the_tiny_tpu_plan_runs_on_the_cpu(tmp_path: Path) -> None:
    table = run_half(1, tmp_path)
    assert "lm-eval requests/s: theseus eval's model alone" in table
