"""A lineage reads the tokens it trained on: each checkpoint records their sha256, and a
resume onto tokens prepared again since (`theseus data prepare --replace`) is refused in
one line; a look at its nodes is warned once; a branch reads the new tokens."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from theseus.data import replacing
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store
from theseus.training.base import TrainerError

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))
SIZES = {"tokens": 40_000, "val_tokens": 6_000}


def _sha256(folder: Path) -> str:
    """What the tokens' files hold, hashed here (the header's `digest` is not read)."""
    tokens = (folder / "train.bin").read_bytes() + (folder / "val.bin").read_bytes()
    return "sha256:" + hashlib.sha256(tokens).hexdigest()


def _meta(checkpoint: Path) -> dict:
    """The checkpoint's `meta` item, read from the JSON file orbax wrote on disk."""
    return json.loads((checkpoint / "meta" / "metadata").read_text())


def _lineage(root: Path, run: str) -> tuple[list[int], list[int]]:
    with Store(store_root(root), readonly=True) as store:
        nodes = store.query().spec(run=run).all()
        steps = sorted(c.step for n in nodes for c in store.checkpoints(n))
        return sorted(n.seq for n in nodes), steps


def _resumed(root: Path, nonce: str, steps: int):  # type: ignore[no-untyped-def]
    """Lineage `nonce` of run `r` resumed from its last checkpoint, to `steps` in all."""
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "r")
        jobs.tiny(q.config, steps=steps)
        q.find().nonce(nonce).checkpoint().latest().resume()
        trainer = q.create()
        trainer()
    return trainer


def test_a_lineage_resumes_only_on_the_tokens_it_trained_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = Synthetic.prepare(tmp_path, **SIZES)
    trained = _sha256(folder)
    jobs.train_tiny(tmp_path, jobs.SyntheticTrainer, "r", 4, **{"logging/checkpoint_interval": 2})
    with Store(store_root(tmp_path), readonly=True) as store:
        listed = store.query().spec(run="r").checkpoints()
        saved, saved_nonce = [c.path for c in listed], listed[0].node.nonce
    assert len(saved) == 2
    header = json.loads((folder / "header.json").read_text())
    for path in saved:  # the tokens' sha256 (hashed here) and the settings they came from
        (record,) = _meta(Path(path))["data"].values()
        assert record["digest"] == trained and record["count"] == {"train": 40_000, "val": 6_000}
        assert record["meta"] == header["meta"] and record["meta"]["language"]["seed"] == 0

    with replacing():  # the same dataset, other tokens
        Synthetic.prepare(tmp_path, **SIZES, seed=7)
    assert _sha256(folder) != trained
    before = _lineage(tmp_path, "r")
    with pytest.raises(TrainerError) as refused:
        _resumed(tmp_path, saved_nonce, steps=6)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("cannot resume training from general.default.r~")
    assert f"'synthetic' (sha256 {trained.removeprefix('sha256:')[:12]} then, " in message
    # the setting that changed, so the tokens it trained on can be prepared again
    assert f"{_sha256(folder).removeprefix('sha256:')[:12]} now: " in message
    assert "language.seed 0 -> 7)" in message
    assert "and --replace" in message and "--branch general.default.r~" in message
    assert _lineage(tmp_path, "r") == before  # no node, no checkpoint written

    assert not [r for r in caplog.records if "the tokens of" in r.getMessage()]  # refused alone
    caplog.set_level(logging.WARNING, logger="theseus.training.base")
    looked = _resumed(tmp_path, saved_nonce, steps=4)  # its end: nothing to train, a look
    assert int(looked.state.step) == 4
    looked.batch(), looked.batch("val"), looked.read_batch(0)  # its batches, read on these
    warned = [r.getMessage() for r in caplog.records if "the tokens of" in r.getMessage()]
    assert len(warned) == 1 and "are not the ones its checkpoint trained on" in warned[0]

    with quick(tmp_path) as q:  # a branch is a new lineage: it trains on these tokens
        q.build(jobs.SyntheticTrainer, "r")
        jobs.tiny(q.config, steps=6)
        q.find().spec(run="r").checkpoint().latest().branch()
        branch = q.create()
        branch()
    assert int(branch.state.step) == 6
    with Store(store_root(tmp_path), readonly=True) as store:
        last = store.query().nonce(branch.node.nonce).checkpoints()[-1]
    assert _meta(Path(last.path))["data"]["synthetic"]["digest"] == _sha256(folder)

    with replacing():  # the tokens it trained on, prepared again: it resumes
        Synthetic.prepare(tmp_path, **SIZES)
    assert _sha256(folder) == trained
    resumed = _resumed(tmp_path, saved_nonce, steps=6)
    assert int(resumed.state.step) == 6
    assert resumed.node.nonce == saved_nonce and resumed.node.seq == 5  # the same lineage
