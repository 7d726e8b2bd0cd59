"""The README's "Representation drift and memorization over training" commands run.

On a small lineage trained here in place of the demo's: each `theseus configure` writes
its analysis's settings and each `theseus run ... --over` leaves its values and figure on
every checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import theseus.analysis.library  # noqa: F401  (registers library/drift and library/memorization)
from theseus.registry import import_module_or_file
from theseus.store import Store

README = Path(__file__).parents[2] / "README.md"
readme = import_module_or_file(str(Path(__file__).parents[1] / "readme_commands.py"))


@pytest.mark.slow  # ~20 s: a training run and two walks over three checkpoints
def test_the_readme_commands_run_both_analyses_over_a_lineage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    last = readme.train_lineage(root)[-1]
    commands = readme.commands(README, "## Representation drift and memorization")
    assert commands == [
        "theseus configure library/drift drift.yaml",
        "theseus run drift drift.yaml theseus-demo --over demo",
        "theseus configure library/memorization memorization.yaml",
        "theseus run memorization memorization.yaml theseus-demo --over demo",
        "theseus-store ui theseus-demo",
    ]
    drift, memorization = (
        [readme.here(c, tmp_path, root) for c in two] for two in (commands[:2], commands[2:4])
    )
    shorter = ["library.memorization.prefix=8", "library.memorization.continuation=8"]
    for name, (configure, run), extra, key in (  # the tiny block is 32 tokens: shorter
        ("drift", drift, [], "dynamics/cka/L1"),
        ("memorization", memorization, shorter, "dynamics/memorization/share"),
    ):
        readme.invoke(configure)
        assert f"{name}: analyzed 3 of 3 checkpoints" in readme.invoke([*run, *extra])
        with Store(root / "store") as store:
            assert key in store.values(last)
            assert store.get(last)[name].filename == f"{name}.pdf"
