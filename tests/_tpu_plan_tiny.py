"""The TPU plan at tiny sizes on the CPU, in two halves that the slow set runs side by side.

`python -m benchmarks --device tpu --tiny --quick` runs every entry of the plan, each a
process of its own, about three minutes on two quiet cores (the library entry alone a
minute), and four beside the rest of the slow set: as one test it was the set's longest
piece. pytest-xdist hands out whole files, so each half is a file of its own (`--only` its
entries) that either worker can take.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import tpu_plan  # noqa: E402

#: The second half starts at this entry (the halves take about as long).
SECOND_HALF_FROM = "sae"


def halves() -> tuple[list[str], list[str]]:
    """The plan's entry names before `SECOND_HALF_FROM` and from it on, in plan order."""
    names = [b.name for b in tpu_plan.TPU_BENCHMARKS]
    cut = names.index(SECOND_HALF_FROM)
    return names[:cut], names[cut:]


def run_tiny(names: list[str], out: Path) -> tuple[dict[str, Any], str]:
    """Run the plan's entries `names` at tiny sizes on one CPU device into `out`; the
    record (`results-tpu.json`) and the table (`results-tpu.md`) it wrote. Skipped where
    an optional package some entry needs is missing."""
    for module in ("lm_eval", "safetensors", "tokenizers"):
        pytest.importorskip(module)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    env["JAX_PLATFORMS"] = "cpu"
    command = [sys.executable, "-m", "benchmarks", "--device", "tpu", "--tiny", "--quick",
               "--only", ",".join(names), "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "results-tpu.json").read_text())
    return record, (out / "results-tpu.md").read_text()


def check(record: dict[str, Any], table: str, names: list[str], out: Path) -> None:
    """Each entry of `names` ran, in order, and passed; the table is the CPU's, tiny."""
    assert [r["name"] for r in record["benchmarks"]] == names
    assert all(r["status"] == "ok" for r in record["benchmarks"])
    assert record["machine"]["device"]["backend"] == "cpu" and record["machine"]["tiny"]
    assert table.startswith("# Benchmarks on 1 cpu (cpu): TINY sizes")
    assert not (out / "results.md").exists()


def run_half(which: int, out: Path) -> str:
    """Run half `which` (0 or 1) of the plan into `out`, check its record and table
    (`check`), and return the table."""
    names = halves()[which]
    record, table = run_tiny(names, out)
    check(record, table, names, out)
    return table
