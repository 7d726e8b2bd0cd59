"""`theseus sample` reads a checkpoint and nothing else: a trainer with tandem analyses
(which look for their site in a batch of the prepared data when a node is set up)
samples the same text after the root's `data/` is deleted. The reference is the same
greedy sample taken before the deletion."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file

JOBS_FILE = str(Path(__file__).with_name("analysis_jobs.py"))
jobs = import_module_or_file(JOBS_FILE)


def test_sample_needs_no_data_and_builds_no_analyses(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.GPTWithAnalysis, "trained")
        jobs.tiny(q.config, steps=2, **{"logging/checkpoint_interval": 1})
        assert q.config["training/analyze"]  # the views are made wherever a node is set up
        q.create()()
    args = ["sample", str(root), "trained", "abc", "--max-new-tokens", "6", "--temperature", "0",
            "--import", JOBS_FILE]  # fmt: skip
    runner = CliRunner()
    before = runner.invoke(main, args)
    assert before.exit_code == 0, before.output
    shutil.rmtree(root / "data")
    after = runner.invoke(main, args)
    assert after.exit_code == 0, after.output
    assert after.stdout == before.stdout and after.stdout.startswith("abc")
    assert not (root / "data").exists()  # sampling prepared nothing either
