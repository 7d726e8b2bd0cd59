"""README "The first analyses": its commands run every first analysis over a lineage.

On a small lineage trained here in place of the demo's: `theseus configure library/first`
writes the library's settings with no `--import`, and `theseus run ... --over` leaves
each analysis's values and figure on every checkpoint. (Part of the README's section may
list further analyses; the commands are the first fenced block.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from theseus.registry import import_module_or_file
from theseus.store import Store

ROOT = Path(__file__).resolve().parents[1]
readme = import_module_or_file(str(ROOT / "packages/theseus-analysis/tests/readme_commands.py"))


@pytest.mark.slow  # ~15 s: a training run and a walk over three checkpoints
def test_the_readme_commands_run_the_first_analyses_over_a_lineage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    nodes = readme.train_lineage(root)
    commands = readme.commands(ROOT / "README.md", "## The first analyses")
    assert commands[0] == "theseus configure library/first first.yaml"
    assert commands[1].startswith("theseus run first first.yaml theseus-demo --over demo")
    assert commands[2:] == ["theseus-store ui theseus-demo"]
    configure, run = (readme.here(c, tmp_path, root) for c in commands[:2])
    readme.invoke(configure)
    assert "library:\n" in (tmp_path / "first.yaml").read_text()
    assert "first-analyses: analyzed 3 of 3 checkpoints" in readme.invoke(run)
    with Store(root / "store") as store:
        for node in nodes:
            values = store.values(node)
            assert {"dynamics/induction/L1H1", "dynamics/icl/score",
                    "dynamics/logit_lens/L1/kl", "dynamics/loss_by_position/P0",
                    "dynamics/loss_by_frequency/F0"} <= set(values)  # fmt: skip
            held = store.get(node)
            for name in ("induction", "icl", "logit-lens", "loss-by-position", "loss-by-frequency"):
                assert held[name].filename == f"{name}.pdf"
