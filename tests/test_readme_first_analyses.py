"""README "The first analyses": its commands run every first analysis over a lineage.

On a small lineage trained here in place of the demo's: `theseus configure library/first`
writes the library's settings with no `--import`, and `theseus run ... --over` leaves
each analysis's values and figure on every checkpoint. (Part of the README's section may
list further analyses; the commands are the first fenced block.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

ROOT = Path(__file__).resolve().parents[1]
jobs = import_module_or_file(str(ROOT / "packages/theseus-analysis/tests/analysis_jobs.py"))


@pytest.mark.slow  # ~15 s: a training run and a walk over three checkpoints
def test_the_readme_commands_run_the_first_analyses_over_a_lineage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "moving")
        jobs.tiny(
            q.config, steps=3, **{"training/analyze": False, "logging/checkpoint_interval": 1}
        )
        q.create()()
    section = (ROOT / "README.md").read_text().split("## The first analyses", 1)[1]
    commands = re.findall(r"^uv run (theseus.*)$", section.split("```", 2)[1], re.M)
    configure, run, ui = (c.split() for c in commands)
    assert configure == ["theseus", "configure", "library/first", "first.yaml"]
    assert run[:7] == ["theseus", "run", "first", "first.yaml", "theseus-demo", "--over", "demo"]
    assert ui == ["theseus-store", "ui", "theseus-demo"]
    config = tmp_path / "first.yaml"
    runner = CliRunner()
    made = runner.invoke(main, [*configure[1:3], str(config)])
    assert made.exit_code == 0, made.output
    assert "library:\n" in config.read_text()
    argv = ["run", "first", str(config), str(root), "--over", "moving", *run[7:]]
    ran = runner.invoke(main, argv)
    assert ran.exit_code == 0, ran.output
    assert "first-analyses: analyzed 3 of 3 checkpoints" in ran.output
    with Store(root / "store") as store:
        [lineage] = {(n.name, n.nonce) for n in store.query().spec(run="moving").all()}
        for seq in range(3):
            node = Node(*lineage, seq)
            values = store.values(node)
            assert {"dynamics/induction/L1H1", "dynamics/icl/score",
                    "dynamics/logit_lens/L1/kl", "dynamics/loss_by_position/P0",
                    "dynamics/loss_by_frequency/F0"} <= set(values)  # fmt: skip
            held = store.get(node)
            for name in ("induction", "icl", "logit-lens", "loss-by-position", "loss-by-frequency"):
                assert held[name].filename == f"{name}.pdf"
