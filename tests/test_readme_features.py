"""README "Features over training": its commands chain SAEs over a lineage's checkpoints.

On a small lineage trained here in place of the demo's (the demo's own printed commands
are test_demo's): `theseus configure` writes the SAE settings, `theseus run ... --over`
trains one SAE per block at each checkpoint, each after the first matched to the one
before it.
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


@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
def test_the_readme_commands_chain_features_over_a_lineage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "moving")
        jobs.tiny(
            q.config, steps=3, **{"training/analyze": False, "logging/checkpoint_interval": 1}
        )
        q.create()()
    section = (ROOT / "README.md").read_text().split("## Features over training", 1)[1]
    commands = re.findall(r"^uv run (theseus .*)$", section.split("```", 2)[1], re.M)
    configure, run = (c.split() for c in commands[:2])
    config = tmp_path / "features.yaml"
    runner = CliRunner()
    assert configure[:4] == ["theseus", "configure", "demo/analyze/features", "features.yaml"]
    made = runner.invoke(main, [*configure[1:3], str(config), *configure[4:]])
    assert made.exit_code == 0, made.output
    assert "sae:\n  features:\n" in config.read_text()
    assert run[:7] == [
        "theseus",
        "run",
        "features",
        "features.yaml",
        "theseus-demo",
        "--over",
        "demo",
    ]
    tokens = "sae.features.tokens=2048"  # a short chain: the suite's budget
    argv = ["run", "features", str(config), str(root), "--over", "moving", *run[7:], tokens]
    ran = runner.invoke(main, argv)
    assert ran.exit_code == 0, ran.output
    assert "features: analyzed 3 of 3 checkpoints" in ran.output
    with Store(root / "store") as store:
        [lineage] = {(n.name, n.nonce) for n in store.query().spec(run="moving").all()}
        for seq in range(3):
            values = store.values(Node(*lineage, seq))
            for block in ("blocks_0", "blocks_1"):
                assert values[f"sae/features/{block}/256/tokens"] == 2048
                assert (values[f"sae/features/{block}/256/matched"] is None) == (seq == 0)
