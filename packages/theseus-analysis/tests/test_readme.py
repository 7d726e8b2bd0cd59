"""The engine's worked example in the README runs as written, and does what it says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.registry import import_module_or_file
from theseus.store import Store

README = Path(__file__).parents[1] / "README.md"
readme = import_module_or_file(str(Path(__file__).with_name("readme_commands.py")))


@pytest.mark.slow  # trains the default model for 20 steps: about a minute on 2 cores
def test_the_engine_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    define, run, over = readme.blocks(README, "## The analysis engine", "python")[:3]
    monkeypatch.chdir(tmp_path)
    Synthetic.prepare("results", tokens=60_000, val_tokens=8_000)
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(define, str(README), "exec"), namespace)
    exec(compile(run, str(README), "exec"), namespace)
    result = namespace["result"]
    with Store(store_root("results")) as store:
        trained = store.query().spec(run="train-gpt").artifact("attention").all()
        assert sorted(n.seq for n in trained) == [9, 19]  # after steps 10 and 20
        assert len(store.history(result.node, "attention")) == 2  # tandem + checkpoint
    assert result.node.seq == 19 and result.path.read_bytes().startswith(b"%PDF")
    weights = result.values  # [query, key] attention probabilities of the last layer
    assert weights.shape == (128, 128)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert (tmp_path / "results/analyses/general/default/fresh/attention.pdf").exists()
    # over every checkpoint: the one checkpoint (step 20) already holds the result the
    # resumed run above made with the same settings, so the walk skips it
    exec(compile(over, str(README), "exec"), namespace)
    walk = namespace["walk"]
    assert walk.results == [] and walk.skipped == [result.node]
