"""An analysis's settings are checked before anything is written, and a later success
clears an earlier error (issue 46, item 3).

The reference for "nothing was written" is the store itself: every node's values and
every artifact's version and bytes, read before and after the refused command. The
refused settings are the issue's own (`theseus run features ... --over demo
sae.features.width=[16] sae.features.k=32`): they used to record
`analysis/features/status = failed` and an error on the lineage's first node, over a
finished result, which a later walk then skipped.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from theseus.analysis import AnalysisBase
from theseus.analysis.demo import Features
from theseus.cli import main
from theseus.config import ConfigRangeError, field
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.job import store_root
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store
from theseus.training.base import BaseTrainerConfig

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))

#: A small SAE run: a few steps on two forwards of the tiny model (n_embd = 32).
CHEAP = {
    "sae/features/tokens": 256,
    "sae/features/buffer": 2,
    "sae/features/eval_batches": 1,
    "sae/features/contexts": 2,
    "sae/features/expansion": [1],
    "sae/features/k": 4,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT lineage, `trained`, with a checkpoint at nodes 0 and 1."""
    root = tmp_path_factory.mktemp("trained")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "trained")
        settings = {"training/analyze": False, "logging/checkpoint_interval": 1}
        jobs.tiny(q.config, steps=2, **settings)
        q.create()()
    return root


@pytest.fixture
def root(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained root (each test writes its own records)."""
    copy = tmp_path / "root"
    shutil.copytree(trained, copy)
    return copy


def _lineage(root: Path) -> list[Node]:
    with Store(store_root(root)) as store:
        return sorted({c.node for c in store.query().spec(run="trained").checkpoints()})


def _everything(root: Path) -> dict[str, Any]:
    """Every node's values and every artifact's version and bytes."""
    with Store(store_root(root)) as store:
        return {
            n.serialize(): (
                store.values(n),
                {k: (a.version, a.content) for k, a in store.get(n).items()},
            )
            for n in store.query().all()
        }


def _cli(*argv: str) -> Any:
    return CliRunner().invoke(main, [*argv, "--import", "theseus.analysis.demo"])


def test_bad_sae_settings_are_refused_before_anything_is_written(root: Path) -> None:
    first = _lineage(root)[0]
    config = root / "features.yaml"
    assert _cli("configure", "demo/analyze/features", str(config)).exit_code == 0
    cheap = [f"{k.replace('/', '.')}={v}".replace(" ", "") for k, v in CHEAP.items()]
    good = _cli("run", "features", str(config), str(root), "--resume", first.serialize(), *cheap)
    assert good.exit_code == 0, good.output
    with Store(store_root(root)) as store:
        assert store.values(first)["analysis/features/status"] == "finished"
    before = _everything(root)

    refused = {  # command-line settings -> what the one line says
        # the case: k above a width that is given (a rule of the schema)
        ("sae.features.width=[16]", "sae.features.k=32"): (
            "'sae/features/k' must be at most every width in 'sae/features/width' for topk"
        ),
        # a width that is expansion x the site's 32: known when the job sets up
        ("sae.features.expansion=[1]", "sae.features.k=64"): "topk needs 1 <= k <= width (32)",
        # no SAE at all
        ("sae.features.width=[]", "sae.features.expansion=[]"): "are both empty",
    }
    for settings, said in refused.items():
        for where in (("--over", "trained"), ("--resume", first.serialize())):
            ran = _cli("run", "features", str(config), str(root), *where, *cheap, *settings)
            errors = [line for line in ran.output.splitlines() if line.startswith("Error")]
            assert ran.exit_code == 1 and len(errors) == 1, (where, settings, ran.output)
            assert said in errors[0], (where, settings, ran.output)
    assert _everything(root) == before  # the finished result stays as it was, unmarked


def test_a_trainer_refuses_its_tandem_analysis_settings_before_it_starts(root: Path) -> None:
    class Trainer(PretrainGPT):
        ANALYSIS = [Features]

    before = _everything(root)
    with quick(root) as q:
        q.build(Trainer, "tandem")
        jobs.tiny(q.config, steps=2)
        q.config.update({"sae/features/width": [16], "sae/features/k": 32})
        with pytest.raises(ConfigRangeError, match=r"'sae/features/k' must be at most every"):
            q.create()
    assert _everything(root) == before  # no lineage was started


@dataclass
class FlakyConfig(BaseTrainerConfig):
    fail: bool = field("analysis/flaky/fail", default=False, help="plot() raises")


class Flaky(AnalysisBase, PretrainGPT):
    """A JSON result whose plot() fails when `analysis/flaky/fail` is set."""

    CONFIG = FlakyConfig
    TARGET = SelfAttention
    NAME = "flaky"

    def select(self, paths: list[str]) -> str:
        return paths[0]

    def analyze(self, layer: Any, inputs: Any) -> Any:
        return inputs.x.mean()

    def plot(self, results: Any) -> Any:
        if self.args.fail:
            raise RuntimeError("asked to fail")
        return {"mean": float(results)}


def _walk(root: Path, fail: bool) -> Any:
    with quick(root) as q:
        q.build(Flaky, "flaky")
        q.config["analysis/flaky/fail"] = fail
        q.find().spec(run="trained").over()
        return q.create()()


def test_a_later_success_clears_an_earlier_error(root: Path) -> None:
    first = _lineage(root)[0]
    with pytest.raises(RuntimeError, match="asked to fail"):
        _walk(root, fail=True)
    with Store(store_root(root)) as store:
        failed = store.values(first)
    assert failed["analysis/flaky/status"] == "failed"
    assert failed["analysis/flaky/error"] == "RuntimeError: asked to fail"
    assert failed["job/status"] == "finished"  # the training run's record is untouched

    result = _walk(root, fail=False)
    assert [r.node for r in result.results] == _lineage(root)
    with Store(store_root(root)) as store:
        for node in _lineage(root):
            values = store.values(node)
            assert values["analysis/flaky/status"] == "finished"
            assert values.get("analysis/flaky/error") is None, node
            assert values["job/status"] == "finished"
