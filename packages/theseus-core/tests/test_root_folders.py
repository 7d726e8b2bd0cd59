"""A trainer writes checkpoints only in a lineage folder of its own root.

Two roots that reach one checkpoint folder: a root copied with its symlinks (``cp -a``)
while its ``checkpoints/`` is a symlink to a shared place. Resuming the lineage from the
copy must be refused before anything in the folder changes (before the fix the copy's
trainer set the original's later checkpoints aside as "unregistered"), while the
original resumes as before. The reference is the file system: a SHA-256 of every file
in the shared folder before and after. (Without the store's ownership check the copy's
resume succeeds and writes into the original's folder.)
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.registry import import_module_or_file
from theseus.store import Store

JOBS = str(Path(__file__).with_name("trainer_jobs.py"))
TINY = import_module_or_file(JOBS).TINY
TOKENS_PER_STEP = TINY["training/batch_size"] * TINY["architecture/block_size"]


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()  # the writer lock's file too: a refused run must not even open it
    }


@pytest.mark.slow  # 12 s; the store's own tests cover the same refusal in the default suite
def test_a_copy_sharing_the_checkpoint_folder_cannot_resume_the_originals_lineage(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared-checkpoints"
    shared.mkdir()
    original, config = tmp_path / "original", tmp_path / "tiny.yaml"
    original.mkdir()
    (original / "checkpoints").symlink_to(shared)
    Synthetic.prepare(original, tokens=60_000, val_tokens=8_000)
    runner = CliRunner()
    written = runner.invoke(
        main, ["--import", JOBS, "configure", "test/synthetic/train", str(config)]
    )
    assert written.exit_code == 0, written.output
    settings = [f"{key}={value}" for key, value in TINY.items()]

    def run(root: Path, steps: int, *extra: str) -> object:
        return runner.invoke(
            main,
            ["--import", JOBS, "run", "r", str(config), str(root), *settings,
             f"training/tokens={steps * TOKENS_PER_STEP}", *extra],
        )  # fmt: skip

    first = run(original, 4)
    assert first.exit_code == 0, first.output
    shutil.copytree(original, tmp_path / "copy", symlinks=True)  # the same checkpoints/
    more = run(original, 8, "--resume", "r")  # the original goes on: steps 8 only it lists
    assert more.exit_code == 0, more.output
    before = _digest(shared)

    refused = run(tmp_path / "copy", 12, "--resume", "r")
    assert refused.exit_code != 0
    message = [line for line in refused.output.splitlines() if "belongs to the root" in line]
    assert len(message) == 1 and str(original / "store") in message[0], refused.output
    assert _digest(shared) == before
    with Store(store_root(tmp_path / "copy")) as store:
        report = store.fsck(repair=True)
        assert not report.set_aside and len(report.foreign_folders) == 1, report.render()
    assert _digest(shared) == before
    with Store(store_root(original)) as store:
        steps = [c.step for c in store.query().spec(run="r").checkpoints()]
        assert steps == [4, 8] and store.fsck().clean
