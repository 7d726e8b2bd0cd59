"""A checkpoint written by an earlier version (f16d084: three model configurations, the
attention's cached twins, the loss over whole logits) restores with today's code and
gives the logits that version computed (`data/checkpoint-0.1.0-f16d084`, written by
`make_old_checkpoint.py` with that version's sources), and the configuration that version
saved loads as a file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from theseus.config import UnknownKeyError, load
from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick
from theseus.store import Store

DATA = Path(__file__).with_name("data") / "checkpoint-0.1.0-f16d084"


def test_an_earlier_versions_checkpoint_gives_its_logits(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(DATA / "root", root)  # another place: nothing may depend on where
    with quick(root) as q:
        q.build(PretrainGPT, "again")
        q.find().spec(run="old").checkpoint().latest().resume()
        trainer = q.create()
    x = np.load(DATA / "x.npy")
    logits, _ = trainer.model.apply({"params": trainer.state.params}, x)
    assert trainer.model.config.n_kv_head == 2 and trainer.model.config.attention == "auto"
    np.testing.assert_allclose(
        np.asarray(logits), np.load(DATA / "logits.npy"), rtol=1e-5, atol=1e-5
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The YAML the earlier version recorded with the run (what its `theseus configure`
    wrote too): every setting it declared, `inspection/prompt` and `logging/comet` included.
    Read from a copy: opening a store writes beside it."""
    copy = tmp_path_factory.mktemp("old") / "store"
    shutil.copytree(DATA / "root" / "store", copy)
    with Store(copy, readonly=True) as store:
        texts = [store.job_config(n) for n in store.query().all()]
    text = next(t for t in texts if t is not None)
    assert "  prompt: ''" in text and "  comet: ''" in text
    return text


def test_an_earlier_versions_configuration_file_loads(saved: str) -> None:
    """Loaded as `theseus run` loads a file (every key must be known): the two settings
    theseus-analysis declares now are dropped at the defaults the earlier version wrote,
    and every other value, the optimizer's and schedule's included, keeps its key."""
    values = load(saved)
    tree = PretrainGPT.schema()
    tree.load(values)
    tree.validate()
    flat = _flatten(values)
    now = tree.flat()
    kept = [k for k in flat if k in now]
    assert {k: now[k] for k in kept} == {k: flat[k] for k in kept}  # each value as written
    assert set(flat) - set(kept) == {"job", "inspection/prompt", "logging/comet"}
    assert tree["optimization/lr"] == 1e-3 and tree["optimization/schedule/warmup"] == 0.05


def test_a_setting_the_trainer_no_longer_reads_is_refused_when_it_was_set(saved: str) -> None:
    text = saved.replace("  prompt: ''", "  prompt: 'The cat sat'")
    tree = PretrainGPT.schema()
    with pytest.raises(UnknownKeyError) as refused:
        tree.load(load(text))
    message = str(refused.value)
    assert message.startswith(
        "Configuration key 'inspection/prompt' (set to 'The cat sat') is no longer a setting "
        "of job 'gpt/train/pretrain': it is an analysis setting now, declared by "
        "theseus-analysis"
    )
    assert "\n" not in message
    with pytest.raises(UnknownKeyError, match=r"^Configuration key 'logging.comet' is no longer"):
        tree["logging.comet"] = "my-project"


def _flatten(values: dict[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[prefix + key] = value
    return flat
