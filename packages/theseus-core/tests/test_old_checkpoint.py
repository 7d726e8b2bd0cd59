"""A checkpoint written by an earlier version (f16d084: three model configurations, the
attention's cached twins, the loss over whole logits) restores with today's code and
gives the logits that version computed (`data/checkpoint-0.1.0-f16d084`, written by
`make_old_checkpoint.py` with that version's sources)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick

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
