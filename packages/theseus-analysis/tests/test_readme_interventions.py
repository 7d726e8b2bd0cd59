"""The README's intervention example runs as written, and its numbers are what it says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.registry import import_module_or_file
from theseus.store import Store

README = Path(__file__).parents[1] / "README.md"
readme = import_module_or_file(str(Path(__file__).with_name("readme_commands.py")))


@pytest.mark.slow  # trains the default model (2 layers) for 40 steps: about 40 s on 2 cores
def test_the_intervention_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    define, run = readme.blocks(README, "## Interventions", "python")[:2]
    monkeypatch.chdir(tmp_path)
    Synthetic.prepare("results", tokens=120_000, val_tokens=12_000)
    namespace: dict[str, object] = {"__name__": "readme_interventions"}
    exec(compile(define, str(README), "exec"), namespace)
    exec(compile(run, str(README), "exec"), namespace)

    # The sweep ran in tandem after steps 10, 20, 30 and 40, compiled once.
    trainer = namespace["trainer"]
    assert trainer.loop.views[0].traces == 1
    with Store(store_root("results")) as store:
        found = store.query().spec(run="ablating").artifact("ablate-heads").artifacts()
        assert sorted(a.node.seq for a in found) == [9, 19, 29, 39]
        sweeps = [np.asarray(json.loads(a.content)) for a in found]
    assert all(s.shape == (2, 4) for s in sweeps)
    assert not np.allclose(sweeps[0], sweeps[-1])  # the heads' roles changed over training
    assert Path("results/ablate-heads.pdf").read_bytes().startswith(b"%PDF")

    # Patching and its linear estimate, on the last checkpoint: the printed agreement.
    effects = namespace["effects"]
    assert effects["patch-heads"].shape == effects["attribute-heads"].shape == (2, 4)
    assert effects["patch-heads"].min() < -1e-3  # a head put back restores some loss
    agreement = float(namespace["agreement"])
    assert f"correlation {agreement:.2f}" in capsys.readouterr().out
    assert agreement > 0.9  # small effects after 40 steps: measured 0.9999
