"""The command line drives the trainer: data prepare and run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.store import Node, Store
from theseus.store.cli import main as store_main


def test_data_prepare_synthetic_then_train_with_theseus_run(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "data",
            "prepare",
            "synthetic",
            "--root",
            str(tmp_path),
            "--tokens",
            "30000",
            "--val-tokens",
            "4000",
        ],
    )
    assert result.exit_code == 0, result.output
    assert Synthetic.open(tmp_path).header["count"] == {"train": 30000, "val": 4000}

    config = tmp_path / "gpt.yaml"
    result = runner.invoke(main, ["configure", "gpt/train/pretrain", str(config)])
    assert result.exit_code == 0, result.output
    assert "architecture" in yaml.safe_load(config.read_text())
    overrides = [
        "architecture.n_layers=1",
        "architecture.n_embd=32",
        "architecture.n_head=2",
        "architecture.block_size=32",
        "training.batch_size=8",
        "training.tokens=2048",
        "logging.validation_interval=4",
        "logging.report_interval=2",
        "training.validation_steps=1",
    ]
    # A real process with output redirected: no progress bar, one log line per report.
    exe = Path(sys.executable).with_name("theseus")
    if not exe.is_file():  # installed with pip --target (a TPU host): the script is on PATH
        exe = Path(shutil.which("theseus") or exe)
    done = subprocess.run(
        [
            str(exe),
            "run",
            "cli-run",
            str(config),
            str(tmp_path),
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [line for line in done.stderr.splitlines() if " step " in line and " tok/s " in line]
    assert [line.split(" step ")[1].split()[0] for line in reports] == ["2/8", "4/8", "6/8", "8/8"]
    assert "absl" not in done.stderr and "orbax" not in done.stderr.lower()
    with Store(store_root(tmp_path)) as store:
        last = store.query().spec(run="cli-run").checkpoint().latest().first()
        assert last is not None and last.seq == 7
        assert store.values(last)["train/step"] == 8


def test_unknown_dataset_and_unprepared_data_are_one_paragraph_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["data", "prepare", "synthetik", "--root", str(tmp_path)])
    assert result.exit_code == 1
    assert "synthetic" in result.output and "Traceback" not in result.output
    config = tmp_path / "gpt.yaml"
    runner.invoke(main, ["configure", "gpt/train/pretrain", str(config)])
    result = runner.invoke(main, ["run", "nodata", str(config), str(tmp_path)])
    assert result.exit_code == 1
    assert f"theseus data prepare synthetic --root {tmp_path}" in result.output


def test_a_run_that_failed_while_setting_up_is_listed_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Synthetic.prepare(tmp_path, tokens=30_000, val_tokens=4_000)
    runner = CliRunner()
    config = tmp_path / "gpt.yaml"
    runner.invoke(main, ["configure", "gpt/train/pretrain", str(config)])
    tiny = ["architecture.n_layers=1", "architecture.n_embd=32", "architecture.n_head=2",
            "architecture.block_size=32", "training.batch_size=8", "training.tokens=512",
            "training.validation_steps=1"]  # fmt: skip
    assert runner.invoke(main, ["run", "ok", str(config), str(tmp_path), *tiny]).exit_code == 0
    bad = runner.invoke(
        main, ["run", "big", str(config), str(tmp_path), *tiny, "architecture.vocab_size=8"]
    )
    assert bad.exit_code == 1  # the vocabulary is checked while setting up, before training
    assert store_main(["runs", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    table, _, apart = out.partition("\nnever started (1; failed or killed while setting up")
    assert "general.default.ok~" in table and "general.default.big~" not in table
    (line,) = [row for row in apart.splitlines() if "general.default.big~" in row]
    assert "TrainerError: architecture/vocab_size = 8 is smaller than" in line


def test_a_failed_run_on_a_new_root_leaves_no_empty_store(tmp_path: Path) -> None:
    runner = CliRunner()
    config = tmp_path / "gpt.yaml"
    runner.invoke(main, ["configure", "gpt/train/pretrain", str(config)])
    missing = tmp_path / "new" / "root"
    result = runner.invoke(main, ["run", "r", str(config), str(missing), "bogus/key=1"])
    assert result.exit_code == 1 and "Unknown configuration key 'bogus/key'" in result.output
    assert not (tmp_path / "new").exists()  # neither the store nor the folders made for it

    existing = tmp_path / "existing"
    existing.mkdir()
    runner.invoke(main, ["run", "r", str(config), str(existing), "bogus/key=1"])
    assert list(existing.iterdir()) == []  # the root stays (it was there), the store goes

    with Store(store_root(existing)) as store:  # a store with history is never removed
        store.touch(Node.new("kept"))
    runner.invoke(main, ["run", "r", str(config), str(existing), "bogus/key=1"])
    with Store(store_root(existing), create=False) as store:
        assert [n.name for n in store.query().all()] == ["general.default.kept"]


def test_resume_of_a_lineage_continues_from_its_last_checkpoint(tmp_path: Path) -> None:
    """A run killed between checkpoints has nodes past its last checkpoint: `--resume
    name~nonce` goes on from that checkpoint; `--resume` of an earlier checkpoint refuses."""
    Synthetic.prepare(tmp_path, tokens=30_000, val_tokens=4_000)
    runner = CliRunner()
    config = tmp_path / "gpt.yaml"
    runner.invoke(main, ["configure", "gpt/train/pretrain", str(config)])
    tiny = [
        "architecture.n_layers=1",
        "architecture.n_embd=32",
        "architecture.n_head=2",
        "architecture.block_size=32",
        "training.batch_size=8",
        "training.validation_steps=1",
        "logging.checkpoint_interval=2",
        "logging.report_interval=1",
    ]
    result = runner.invoke(
        main, ["run", "r", str(config), str(tmp_path), *tiny, "training.tokens=1024"]
    )
    assert result.exit_code == 0, result.output
    with Store(store_root(tmp_path)) as store:
        last = store.query().spec(run="r").latest().first()
        assert last is not None and last.seq == 3
        for seq in (4, 5):  # what a run killed at step 6, before its checkpoint, leaves
            store.log(Node(last.name, last.nonce, seq), {"train/loss": 9.0})
    lineage = f"{last.name}~{last.nonce}"

    result = runner.invoke(
        main, ["run", "r", str(config), str(tmp_path), "--resume", lineage, "training.tokens=2048"]
    )
    assert result.exit_code == 0, result.output
    assert f"resume run finished at node {lineage}~7" in result.output
    with Store(store_root(tmp_path)) as store:
        saved = [c.node.seq for c in store.query().nonce(last.nonce).checkpoints()]
        assert saved == [1, 3, 5, 7]
        rewritten = store.values(Node(last.name, last.nonce, 5))
        assert rewritten["train/step"] == 6 and rewritten["train/loss"] != 9.0

    result = runner.invoke(
        main,
        [
            "run",
            "r",
            str(config),
            str(tmp_path),
            "--resume",
            f"{lineage}~3",
            "training.tokens=4096",
        ],
    )
    assert result.exit_code == 1
    assert "2 later checkpoint(s)" in result.output and f"--branch {lineage}~3" in result.output
