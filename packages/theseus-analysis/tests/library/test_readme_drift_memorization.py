"""The README's "Representation drift and memorization over training" commands run.

On a small lineage trained here in place of the demo's: each `theseus configure` writes
its analysis's settings and each `theseus run ... --over` leaves its values and figure on
every checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import theseus.analysis.library  # noqa: F401  (registers library/drift and library/memorization)
from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

README = Path(__file__).parents[2] / "README.md"
jobs = import_module_or_file(str(Path(__file__).parents[1] / "analysis_jobs.py"))


@pytest.mark.slow  # ~20 s: a training run and two walks over three checkpoints
def test_the_readme_commands_run_both_analyses_over_a_lineage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "moving")
        jobs.tiny(
            q.config, steps=3, **{"training/analyze": False, "logging/checkpoint_interval": 1}
        )
        q.create()()
    section = README.read_text().split("## Representation drift and memorization", 1)[1]
    commands = re.findall(r"^uv run (theseus.*)$", section.split("```", 2)[1], re.M)
    assert commands == [
        "theseus configure library/drift drift.yaml",
        "theseus run drift drift.yaml theseus-demo --over demo",
        "theseus configure library/memorization memorization.yaml",
        "theseus run memorization memorization.yaml theseus-demo --over demo",
        "theseus-store ui theseus-demo",
    ]
    runner = CliRunner()
    shorter = ["library.memorization.prefix=8", "library.memorization.continuation=8"]
    for name, extra, key in (
        ("drift", [], "dynamics/cka/L1"),
        ("memorization", shorter, "dynamics/memorization/share"),  # the tiny block: 32
    ):
        config = tmp_path / f"{name}.yaml"
        made = runner.invoke(main, ["configure", f"library/{name}", str(config)])
        assert made.exit_code == 0, made.output
        ran = runner.invoke(main, ["run", name, str(config), str(root), "--over", "moving", *extra])
        assert ran.exit_code == 0, ran.output
        assert f"{name}: analyzed 3 of 3 checkpoints" in ran.output
        with Store(root / "store") as store:
            [lineage] = {(n.name, n.nonce) for n in store.query().spec(run="moving").all()}
            last = Node(*lineage, 2)
            assert key in store.values(last)
            assert store.get(last)[name].filename == f"{name}.pdf"
