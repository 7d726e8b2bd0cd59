"""README "Features over training": its commands chain SAEs over a lineage's checkpoints.

On a small lineage trained here in place of the demo's (the demo's own printed commands
are test_demo's): `theseus configure` writes the SAE settings, `theseus run ... --over`
trains one SAE per block at each checkpoint, each after the first matched to the one
before it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from theseus.registry import import_module_or_file
from theseus.store import Store

ROOT = Path(__file__).resolve().parents[1]
readme = import_module_or_file(str(ROOT / "packages/theseus-analysis/tests/readme_commands.py"))


@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
def test_the_readme_commands_chain_features_over_a_lineage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    nodes = readme.train_lineage(root)
    commands = readme.commands(ROOT / "README.md", "## Features over training")
    assert commands[0].startswith("theseus configure demo/analyze/features features.yaml")
    assert commands[1].startswith("theseus run features features.yaml theseus-demo --over demo")
    configure, run = (readme.here(c, tmp_path, root) for c in commands[:2])
    readme.invoke(configure)
    assert "sae:\n  features:\n" in (tmp_path / "features.yaml").read_text()
    tokens = "sae.features.tokens=2048"  # a short chain: the suite's budget
    assert "features: analyzed 3 of 3 checkpoints" in readme.invoke([*run, tokens])
    with Store(root / "store") as store:
        for node in nodes:
            values = store.values(node)
            for block in ("blocks_0", "blocks_1"):
                assert values[f"sae/features/{block}/256/tokens"] == 2048
                assert (values[f"sae/features/{block}/256/matched"] is None) == (node.seq == 0)
